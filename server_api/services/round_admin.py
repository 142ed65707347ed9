"""The operator's round controls: open a round on the current model, close one early.

Each call is one transaction, committed when the round is written and rolled back by any error;
the caller builds the response from the returned row.
"""
from __future__ import annotations

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from facecore.federation.config import RoundConfig
from server_api.core.db import transaction
from server_api.crud import versions as version_crud
from server_api.errors import Conflict, NotFound
from server_api.services import rounds
from server_api.tables import Round, utcnow


def open_round(session: Session, config: RoundConfig) -> Round:
    """409 while another round is open or aggregating, or when one was opened concurrently."""
    try:
        with transaction(session):
            base = version_crud.current_version(session)
            if base is None:
                raise NotFound("no model version yet")
            return rounds.open_round(session, config, base, utcnow())
    except IntegrityError:  # another worker opened one between our check and insert
        raise Conflict("another round was opened concurrently") from None


def close_round(session: Session, round_id: int) -> Round:
    with transaction(session):
        return rounds.close_now(session, round_id, utcnow())
