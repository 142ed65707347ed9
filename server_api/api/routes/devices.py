"""Device registration, enrollment and template access (all Ed25519-signed), and the operator's
registration controls: enrollment tokens and pruning devices that never enrolled. Responses are
built here from what the service returns; a device's from its row and whether crud finds its
template, after the service's transaction has committed."""
from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Request, Response
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from facecore.federation.messages import DeviceCreate, DevicePublic, EmbeddingPublic, EnrollmentCreate, ErrorPublic
from facecore.federation.protocol import body_sha256
from server_api.api.deps import AdminDep, CtxDep, CurrentDevice, LimitsDep, SessionDep, client_address, signed_path
from server_api.core.limits import off_loop
from server_api.crud import devices as device_crud
from server_api.schemas import DevicesPrunedPublic, EnrollmentTokensCreate, EnrollmentTokensPublic
from server_api.services import devices as service
from server_api.tables import Device

router = APIRouter(prefix="/v1/devices", tags=["devices"])
admin_router = APIRouter(prefix="/v1/admin", tags=["admin"])
_errors: dict[int | str, dict[str, Any]] = {code: {"model": ErrorPublic} for code in (401, 403, 422, 429)}


def _public(session: Session, device: Device) -> DevicePublic:
    return DevicePublic(device_id=device.id, status=device.status, enrolled=device_crud.get_enrollment(session, device.id) is not None)


@router.post("", status_code=201, response_model=DevicePublic, responses={200: {"model": DevicePublic}, **_errors})
async def register_device(
    body: DeviceCreate, request: Request, response: Response, ctx: CtxDep, session: SessionDep, limits: LimitsDep,
) -> DevicePublic:
    """Register an Ed25519 public key; the request must be signed by that key (subject "register").
    Registering a known key again returns its device with 200. A server that requires enrollment
    tokens needs ``enrollment_token``, issued by its operator. Each attempt counts against the
    caller's address (429 with Retry-After past FEDFACE_ADDRESS_BURST)."""
    await off_loop(limits.addresses, limits.addresses.charge, client_address(request))
    digest = body_sha256(await request.body())
    device, created = await run_in_threadpool(
        service.register, ctx, session, body.public_key, request.headers, request.method, signed_path(request), digest,
        body.enrollment_token,
    )
    response.status_code = 201 if created else 200
    return await run_in_threadpool(_public, session, device)  # a query: not on the event loop


@router.get("/{device_id}", response_model=DevicePublic, responses=_errors)
def get_device(device_id: str, device: CurrentDevice, session: SessionDep) -> DevicePublic:
    service._own(device, device_id)
    return _public(session, device)


@router.put("/{device_id}/embedding", response_model=DevicePublic, status_code=201, responses={409: {"model": ErrorPublic}, **_errors})
def enroll(device_id: str, body: EnrollmentCreate, device: CurrentDevice, ctx: CtxDep, session: SessionDep) -> DevicePublic:
    """Enroll the device's initial class embedding (L2-normalised, the model's embedding_dim)."""
    return _public(session, service.enroll(ctx, session, device, device_id, body.embedding))


@router.get("/{device_id}/embedding", response_model=EmbeddingPublic, responses={404: {"model": ErrorPublic}, **_errors})
def get_embedding(device_id: str, device: CurrentDevice, ctx: CtxDep, session: SessionDep) -> EmbeddingPublic:
    """The device's own current class embedding; any other device's is 403."""
    template = service.embedding(ctx, session, device, device_id)
    return EmbeddingPublic(device_id=template.device_id, embedding=template.embedding, round_id=template.round_id)


@router.delete("/{device_id}", status_code=204, responses=_errors)
def unenroll(device_id: str, device: CurrentDevice, session: SessionDep) -> Response:
    """Delete the template; it leaves W from the next aggregation on."""
    service.unenroll(session, device, device_id)
    return Response(status_code=204)


@admin_router.post("/enrollment-tokens", status_code=201, response_model=EnrollmentTokensPublic, responses=_errors)
def issue_enrollment_tokens(
    body: EnrollmentTokensCreate, _: AdminDep, ctx: CtxDep, session: SessionDep,
) -> EnrollmentTokensPublic:
    """One-time registration tokens to hand to devices; each registers one new device before it expires."""
    issued = service.issue_enrollment_tokens(ctx, session, body.count, body.ttl_s)
    return EnrollmentTokensPublic(tokens=issued.tokens, expires_at=issued.expires_at)


@admin_router.post("/devices/prune", response_model=DevicesPrunedPublic, responses=_errors)
def prune_never_enrolled(
    _: AdminDep, ctx: CtxDep, session: SessionDep,
    older_than_s: Annotated[int | None, Query(ge=0, le=10 * 365 * 86400)] = None,
) -> DevicesPrunedPublic:
    """Delete devices registered at least ``older_than_s`` ago (default FEDFACE_PRUNE_UNENROLLED_AFTER_S)
    that never enrolled a template."""
    pruned = service.prune_never_enrolled(ctx, session, older_than_s)
    return DevicesPrunedPublic(pruned=pruned.count, registered_before=pruned.registered_before)
