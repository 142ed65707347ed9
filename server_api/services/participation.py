"""A device's view of the active round: check-in and its instructions, in one transaction."""
from __future__ import annotations

from sqlalchemy.orm import Session

from facecore.federation.status import ParticipationStatus
from facecore.federation.strategies import strategy_for
from server_api.core.db import transaction
from server_api.crud import versions as version_crud
from server_api.models import Device, utcnow
from server_api.schemas import CheckinPublic
from server_api.services import rounds
from server_api.services.context import ServerContext


def checkin(ctx: ServerContext, session: Session, device: Device) -> CheckinPublic:
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
    return CheckinPublic(
        round_id=round_.id, status=status, retry_after_s=retry, deadline_at=round_.deadline_at,  # type: ignore[arg-type]
        base_version=base.version_hash, backbone_url=f"/v1/models/{base.version_hash}/backbone",
        onnx_url=f"/v1/models/{base.version_hash}/onnx" if base.onnx_blob else None,
        embedding_url=f"/v1/devices/{device.id}/embedding", upload_url=f"/v1/rounds/{round_.id}/updates",
        local=dict(instructions.config),
        secagg_url=f"/v1/rounds/{round_.id}/secagg" if config.secure_aggregation.enabled else None,
    )
