"""Device side of secure aggregation: advertise keys, share them, read the step, answer the unmasking.
See server_api/services/secure_aggregation.py for the steps and their deadlines. The responses are
built here from the service's DeviceStep: keys and ciphertexts go out as base64."""
from __future__ import annotations

import base64
from typing import Any

from fastapi import APIRouter, BackgroundTasks

from facecore.federation.messages import ErrorPublic, SecAggAdvertCreate, SecAggMemberPublic, SecAggSharesCreate, SecAggStatePublic, SecAggUnmaskCreate
from server_api.api.deps import CtxDep, CurrentDevice, RoundIdPath, SessionDep
from server_api.services import secure_aggregation as service
from server_api.services.aggregation import try_aggregate
from server_api.services.secure_aggregation import DeviceStep

router = APIRouter(prefix="/v1/rounds/{round_id}/secagg", tags=["secure aggregation"])
_errors: dict[int | str, dict[str, Any]] = {code: {"model": ErrorPublic} for code in (401, 403, 404, 409, 422)}


def _b64(raw: bytes) -> str:
    return base64.b64encode(raw).decode()


def _public(step: DeviceStep) -> SecAggStatePublic:
    members = None if step.members is None else [
        SecAggMemberPublic(index=m.index, c_public=_b64(m.c_public), s_public=_b64(m.s_public)) for m in step.members
    ]
    return SecAggStatePublic(
        round_id=step.round_id, phase=step.phase, retry_after_s=step.retry_after_s, index=step.index,  # type: ignore[arg-type]
        threshold=step.threshold, scale=step.scale, bound=step.bound, max_update_norm=step.max_update_norm, members=members, selected=step.selected,
        key_sharers=step.key_sharers,
        shares=None if step.shares is None else {str(k): _b64(b) for k, b in step.shares.items()},
        survived=step.survived, dropped=step.dropped, answered=step.answered,
    )


@router.get("", response_model=SecAggStatePublic, responses=_errors)
def state(round_id: RoundIdPath, device: CurrentDevice, session: SessionDep) -> SecAggStatePublic:
    """The current step and what this device needs for it (members' keys, shares addressed to it,
    who survived). Poll after ``retry_after_s`` while a step is still collecting."""
    return _public(service.state_for(session, round_id, device))


@router.post("/advert", status_code=201, response_model=SecAggStatePublic, responses=_errors)
def advertise(round_id: RoundIdPath, body: SecAggAdvertCreate, device: CurrentDevice, session: SessionDep) -> SecAggStatePublic:
    """Step 0: this device's two X25519 public keys; its index in the round comes back."""
    return _public(service.advertise(session, round_id, device, body))


@router.post("/shares", response_model=SecAggStatePublic, responses=_errors)
def share_keys(round_id: RoundIdPath, body: SecAggSharesCreate, device: CurrentDevice, session: SessionDep) -> SecAggStatePublic:
    """Step 1: one encrypted share bundle for every other member, keyed by its index."""
    return _public(service.share_keys(session, round_id, device, body))


@router.post("/unmask", response_model=SecAggStatePublic, responses=_errors)
def unmask(
    round_id: RoundIdPath, body: SecAggUnmaskCreate, device: CurrentDevice, session: SessionDep, ctx: CtxDep, background: BackgroundTasks,
) -> SecAggStatePublic:
    """Step 3: shares of the dropped devices' s keys and of the survivors' self-mask seeds."""
    step, everyone = service.answer_unmask(session, round_id, device, body)
    if everyone:
        background.add_task(try_aggregate, ctx, round_id)
    return _public(step)
