"""The operator's round controls: open a round on the current model, close one early.

Each call is one transaction, committed when the round is written and rolled back by any error;
the caller builds the response from the returned row. Opening a round that downloads int8 on a version
published before int8 files first writes that file and names it in a transaction of its own.
"""
from __future__ import annotations

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from facecore.federation.config import RoundConfig
from server_api.core.db import transaction
from server_api.crud import versions as version_crud
from server_api.errors import Conflict, NotFound
from server_api.services import rounds
from server_api.services.context import ServerContext
from server_api.services.model_store import int8_copy
from server_api.tables import Round, utcnow


def open_round(ctx: ServerContext, session: Session, config: RoundConfig) -> Round:
    """409 while another round is open or aggregating, or when one was opened concurrently. A round that downloads
    int8 (`local.download_bits`) on a version published before int8 files gets that file written first."""
    if config.local.download_bits is not None:
        _write_int8_file(ctx, session)
    try:
        with transaction(session):
            base = version_crud.current_version(session)
            if base is None:
                raise NotFound("no model version yet")
            if config.local.download_bits is not None and base.int8_blob is None:
                raise Conflict("a new model version was published while this round opened; open it again")
            return rounds.open_round(session, config, base, utcnow())
    except IntegrityError:  # another worker opened one between our check and insert
        raise Conflict("another round was opened concurrently") from None


def close_round(session: Session, round_id: int) -> Round:
    with transaction(session):
        return rounds.close_now(session, round_id, utcnow())


def _write_int8_file(ctx: ServerContext, session: Session) -> None:
    """Give the current version its int8 file if it has none: written from its fp32 file outside any transaction
    (it takes a moment), then named in one."""
    with transaction(session):
        base = version_crud.current_version(session)
        missing = None if base is None or base.int8_blob is not None else (base.id, base.version_hash)
    if missing is None:
        return
    digest = int8_copy(ctx.store, missing[1])
    with transaction(session):
        version_crud.set_int8_blob(session, missing[0], digest)
