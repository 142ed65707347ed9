"""Device registration, enrollment and template access (all Ed25519-signed)."""
from __future__ import annotations

from fastapi import APIRouter, Request, Response
from starlette.concurrency import run_in_threadpool

from server_api.api.deps import CtxDep, CurrentDevice, SessionDep, signed_path
from server_api.core.security import body_digest
from server_api.schemas import DeviceCreate, DevicePublic, EmbeddingPublic, EnrollmentCreate, ErrorPublic
from server_api.services import devices as service

router = APIRouter(prefix="/v1/devices", tags=["devices"])
_errors = {401: {"model": ErrorPublic}, 403: {"model": ErrorPublic}, 422: {"model": ErrorPublic}}


@router.post("", status_code=201, response_model=DevicePublic, responses={200: {"model": DevicePublic}, **_errors})
async def register_device(body: DeviceCreate, request: Request, response: Response, ctx: CtxDep, session: SessionDep) -> DevicePublic:
    """Register an Ed25519 public key; the request must be signed by that key (subject "register").
    Registering a known key again returns its device with 200."""
    digest = body_digest(await request.body())
    device, created = await run_in_threadpool(
        service.register, ctx, session, body.public_key, request.headers, request.method, signed_path(request), digest
    )
    response.status_code = 201 if created else 200
    return device


@router.get("/{device_id}", response_model=DevicePublic, responses=_errors)
def get_device(device_id: str, device: CurrentDevice, session: SessionDep) -> DevicePublic:
    service._own(device, device_id)
    return service.public(session, device)


@router.put("/{device_id}/embedding", response_model=DevicePublic, status_code=201, responses={409: {"model": ErrorPublic}, **_errors})
def enroll(device_id: str, body: EnrollmentCreate, device: CurrentDevice, ctx: CtxDep, session: SessionDep) -> DevicePublic:
    """Enroll the device's initial class embedding (L2-normalised, the model's embedding_dim)."""
    return service.enroll(ctx, session, device, device_id, body.embedding)


@router.get("/{device_id}/embedding", response_model=EmbeddingPublic, responses={404: {"model": ErrorPublic}, **_errors})
def get_embedding(device_id: str, device: CurrentDevice, ctx: CtxDep, session: SessionDep) -> EmbeddingPublic:
    """The device's own current class embedding; any other device's is 403."""
    return service.embedding(ctx, session, device, device_id)


@router.delete("/{device_id}", status_code=204, responses=_errors)
def unenroll(device_id: str, device: CurrentDevice, session: SessionDep) -> Response:
    """Delete the template; it leaves W from the next aggregation on."""
    service.unenroll(session, device, device_id)
    return Response(status_code=204)
