"""Operator endpoints (Bearer admin token)."""
from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query

from server_api.api.deps import AdminDep, RoundIdPath, SessionDep
from server_api.crud import rounds as round_crud
from server_api.crud import versions as version_crud
from server_api.errors import NotFound
from server_api.models import utcnow
from server_api.schemas import DeviceAdminPublic, DeviceRemovedPublic, ErrorPublic, RoundCreate, RoundPublic
from server_api.services import device_admin

router = APIRouter(prefix="/v1/admin", tags=["admin"])
_errors: dict[int | str, dict[str, Any]] = {code: {"model": ErrorPublic} for code in (401, 404, 409, 422)}


@router.post("/rounds", status_code=201, response_model=RoundPublic, responses=_errors)
def open_round(body: RoundCreate, _: AdminDep, session: SessionDep) -> RoundPublic:
    """Open a round on the current model; 409 while another round is open or aggregating."""
    base = version_crud.current_version(session)
    if base is None:
        raise NotFound("no model version yet")
    return round_crud.to_public(session, round_crud.open_round(session, body, base, utcnow()))


@router.get("/rounds/current", response_model=RoundPublic, responses=_errors)
def current_round(_: AdminDep, session: SessionDep) -> RoundPublic:
    """The open or aggregating round, else the most recent one."""
    round_ = round_crud.active_round(session) or round_crud.latest_round(session)
    if round_ is None:
        raise NotFound("no round has been opened yet")
    return round_crud.to_public(session, round_)


@router.get("/rounds", response_model=list[RoundPublic], responses=_errors)
def list_rounds(_: AdminDep, session: SessionDep, limit: Annotated[int, Query(ge=1, le=500)] = 20) -> list[RoundPublic]:
    return [round_crud.to_public(session, r) for r in round_crud.list_rounds(session, limit)]


@router.get("/rounds/{round_id}", response_model=RoundPublic, responses=_errors)
def get_round(round_id: RoundIdPath, _: AdminDep, session: SessionDep) -> RoundPublic:
    round_ = round_crud.get_round(session, round_id)
    if round_ is None:
        raise NotFound(f"round {round_id} does not exist")
    return round_crud.to_public(session, round_)


@router.post("/rounds/{round_id}/close", response_model=RoundPublic, responses=_errors)
def close_round(round_id: RoundIdPath, _: AdminDep, session: SessionDep) -> RoundPublic:
    """End an open round now, as if its deadline had passed: the scheduler's next tick aggregates
    the updates it has when they meet its minimum, else fails it. 409 if the round is not open."""
    return round_crud.to_public(session, round_crud.close_now(session, round_id, utcnow()))


DeviceIdPath = Annotated[str, Path(min_length=1, max_length=64, pattern=r"^[0-9a-f]+$", description="device id")]


@router.get("/devices", response_model=list[DeviceAdminPublic], responses=_errors)
def list_devices(
    _: AdminDep,
    session: SessionDep,
    limit: Annotated[int, Query(ge=1, le=10_000)] = 100,
    offset: Annotated[int, Query(ge=0, le=2**31 - 1)] = 0,
) -> list[DeviceAdminPublic]:
    """Devices in registration order: status, whether the server holds their template, last selection."""
    return device_admin.list_devices(session, limit, offset)


@router.delete("/devices/{device_id}", response_model=DeviceRemovedPublic, responses=_errors)
def remove_device(device_id: DeviceIdPath, _: AdminDep, session: SessionDep) -> DeviceRemovedPublic:
    """Delete the device's stored template and uploaded copies of it, and revoke its key (its requests
    get 401 from now on; the same key may register again as a new device). Idempotent."""
    return device_admin.remove_device(session, device_id)
