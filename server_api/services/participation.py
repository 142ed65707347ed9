"""A device's view of the active round: check-in and its instructions, in one transaction.
Returns a :class:`Checkin`; the route turns it into the response (with the download URLs)."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy.orm import Session

from facecore.federation.status import ParticipationStatus
from facecore.federation.strategies import strategy_for
from server_api.core.db import transaction
from server_api.crud import versions as version_crud
from server_api.services import rounds
from server_api.services.context import ServerContext
from server_api.tables import Device, utcnow


@dataclass(frozen=True)
class Checkin:
    """Where a device stands in the active round and what it trains with."""

    round_id: int
    device_id: str
    status: str  # a ParticipationStatus; a stored "candidate" is reported as "waiting"
    retry_after_s: float | None  # set while waiting: when selection happens
    deadline_at: datetime
    base_version: str
    has_onnx: bool  # whether the base version has an ONNX export to download
    local: dict[str, Any]  # the strategy's training config for this device
    secure_aggregation: bool


def checkin(ctx: ServerContext, session: Session, device: Device) -> Checkin:
    now = utcnow()
    with transaction(session):
        round_, part = rounds.check_in(session, device, now)
        base = version_crud.get(session, round_.base_version_id)
    assert base is not None
    # The strategy decides what each client trains with (today the same config for everyone).
    config = round_.settings
    instructions = strategy_for(config).configure_train(round_.id, [device.id], config.local.model_dump())[device.id]
    waiting = part.status == ParticipationStatus.CANDIDATE
    status = ParticipationStatus.WAITING if waiting else part.status
    retry = max(0.0, (round_.selection_at - now).total_seconds()) if waiting else None
    local = dict(instructions.config)
    return Checkin(
        round_id=round_.id, device_id=device.id, status=status, retry_after_s=retry, deadline_at=round_.deadline_at,
        base_version=base.version_hash, has_onnx=bool(base.onnx_blob), local=local,
        secure_aggregation=config.secure_aggregation.enabled,
    )
