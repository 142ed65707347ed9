"""Operator endpoints (Bearer admin token). Responses are built here from what the services and
crud return: a round from its row and crud's tally of its participations, after the service's
transaction has committed; a device from its row."""
from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query
from sqlalchemy.orm import Session

from facecore.federation.messages import ErrorPublic
from server_api.api.deps import AdminDep, CtxDep, RoundIdPath, SessionDep
from server_api.crud import devices as device_crud
from server_api.crud import rounds as round_crud
from server_api.crud import versions as version_crud
from server_api.errors import NotFound
from server_api.schemas import DeviceAdminPublic, DeviceRemovedPublic, RoundCreate, RoundPublic
from server_api.services import device_admin, round_admin
from server_api.tables import Device, Round

router = APIRouter(prefix="/v1/admin", tags=["admin"])
_errors: dict[int | str, dict[str, Any]] = {code: {"model": ErrorPublic} for code in (401, 404, 409, 422)}


def _public(session: Session, round_: Round) -> RoundPublic:
    tally = round_crud.tally(session, round_.id)
    base = version_crud.get(session, round_.base_version_id)
    result = version_crud.get(session, round_.result_version_id) if round_.result_version_id else None
    return RoundPublic(
        id=round_.id, status=round_.status, strategy=round_.strategy,  # type: ignore[arg-type]
        target_participants=round_.target_participants, min_participants=round_.min_participants,
        created_at=round_.created_at, selection_at=round_.selection_at, deadline_at=round_.deadline_at,
        closed_at=round_.closed_at, failure_reason=round_.failure_reason,
        base_version=base.version_hash if base else "", result_version=result.version_hash if result else None,
        n_checked_in=tally.checked_in, n_selected=tally.selected, n_uploaded=tally.uploaded, config=round_.config, summary=round_.summary,
    )


@router.post("/rounds", status_code=201, response_model=RoundPublic, responses=_errors)
def open_round(body: RoundCreate, _: AdminDep, ctx: CtxDep, session: SessionDep) -> RoundPublic:
    """Open a round on the current model; 409 while another round is open or aggregating."""
    return _public(session, round_admin.open_round(ctx, session, body))


@router.get("/rounds/current", response_model=RoundPublic, responses=_errors)
def current_round(_: AdminDep, session: SessionDep) -> RoundPublic:
    """The open or aggregating round, else the most recent one."""
    round_ = round_crud.active_round(session) or round_crud.latest_round(session)
    if round_ is None:
        raise NotFound("no round has been opened yet")
    return _public(session, round_)


@router.get("/rounds", response_model=list[RoundPublic], responses=_errors)
def list_rounds(_: AdminDep, session: SessionDep, limit: Annotated[int, Query(ge=1, le=500)] = 20) -> list[RoundPublic]:
    return [_public(session, r) for r in round_crud.list_rounds(session, limit)]


@router.get("/rounds/{round_id}", response_model=RoundPublic, responses=_errors)
def get_round(round_id: RoundIdPath, _: AdminDep, session: SessionDep) -> RoundPublic:
    round_ = round_crud.get_round(session, round_id)
    if round_ is None:
        raise NotFound(f"round {round_id} does not exist")
    return _public(session, round_)


@router.post("/rounds/{round_id}/close", response_model=RoundPublic, responses=_errors)
def close_round(round_id: RoundIdPath, _: AdminDep, session: SessionDep) -> RoundPublic:
    """End an open round now, as if its deadline had passed: the scheduler's next tick aggregates
    the updates it has when they meet its minimum, else fails it. 409 if the round is not open."""
    return _public(session, round_admin.close_round(session, round_id))


DeviceIdPath = Annotated[str, Path(min_length=1, max_length=64, pattern=r"^[0-9a-f]+$", description="device id")]


def _device_public(device: Device, enrolled: bool) -> DeviceAdminPublic:
    return DeviceAdminPublic(
        device_id=device.id, status=device.status, enrolled=enrolled, created_at=device.created_at,
        last_selected_round=device.last_selected_round,
    )


@router.get("/devices", response_model=list[DeviceAdminPublic], responses=_errors)
def list_devices(
    _: AdminDep,
    session: SessionDep,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 100,
    offset: Annotated[int, Query(ge=0, le=2**31 - 1)] = 0,
) -> list[DeviceAdminPublic]:
    """Devices in registration order: status, whether the server holds their template, last selection."""
    return [_device_public(device, enrolled) for device, enrolled in device_crud.list_devices(session, limit, offset)]


@router.delete("/devices/{device_id}", response_model=DeviceRemovedPublic, responses=_errors)
def remove_device(device_id: DeviceIdPath, _: AdminDep, session: SessionDep) -> DeviceRemovedPublic:
    """Delete the device's stored template and uploaded copies of it, and revoke its key (its requests
    get 401 from now on; the same key may register again as a new device). Idempotent."""
    removal = device_admin.remove_device(session, device_id)
    return DeviceRemovedPublic(device_id=removal.device_id, status=removal.status, template_deleted=removal.template_deleted)
