"""Request-scoped dependencies: context, limits, DB session, signed device, admin token."""
from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated

from fastapi import Depends, Path, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from facecore.federation.protocol import body_sha256
from server_api.core.limits import RequestLimits, off_loop
from server_api.core.security import check_admin_token
from server_api.errors import AuthenticationFailed
from server_api.services.auth import SignedRequest, authenticate_request
from server_api.services.context import ServerContext
from server_api.tables import Device


def get_ctx(request: Request) -> ServerContext:
    return request.app.state.ctx


CtxDep = Annotated[ServerContext, Depends(get_ctx)]


async def get_limits(request: Request) -> RequestLimits:
    """The app's rate buckets and upload slots, made at start-up (async: no thread hop)."""
    return get_ctx(request).limits


LimitsDep = Annotated[RequestLimits, Depends(get_limits)]


def client_address(request: Request) -> str:
    # The connecting address, or the X-Forwarded-For client when the connection comes from a proxy listed in
    # FEDFACE_FORWARDED_ALLOW_IPS (`fedface server` hands uvicorn that list and nothing else; default none).
    return request.client.host if request.client else "unknown"


async def get_session(ctx: CtxDep) -> AsyncIterator[Session]:
    """A session for the request. Async on purpose: a sync generator dependency costs two thread
    hops per request (enter and exit), and creating a session does no I/O (it connects on first
    use, in the route's thread). Closing does I/O only if a transaction is still open (an error
    path), and then it runs in a thread too."""
    session = ctx.sessions()
    try:
        yield session
    finally:
        if session.in_transaction():
            await run_in_threadpool(session.close)
        else:
            session.close()


SessionDep = Annotated[Session, Depends(get_session)]


def signed_path(request: Request) -> str:
    """Path and query exactly as the client sent them: what the signature covers."""
    raw = request.scope.get("raw_path") or request.url.path.encode()
    query = request.scope.get("query_string", b"")
    return raw.decode("latin-1") + ("?" + query.decode("latin-1") if query else "")


async def current_device(request: Request, ctx: CtxDep, session: SessionDep, limits: LimitsDep) -> Device:
    """The signing device. An address that keeps failing authentication is refused (429) before any
    work; a device is charged against its own rate once its signature holds."""
    address = client_address(request)
    await off_loop(limits.addresses, limits.addresses.check, address)
    body = await request.body()  # bounded by the size-limit middleware
    signed = SignedRequest(request.headers, request.method, signed_path(request), body_sha256(body))
    try:
        device = await run_in_threadpool(authenticate_request, session, signed, ctx.settings.signature_window_s)
    except AuthenticationFailed:
        await off_loop(limits.addresses, limits.addresses.take, address)
        raise
    await off_loop(limits.devices, limits.devices.charge, device.id)
    return device


CurrentDevice = Annotated[Device, Depends(current_device)]

_bearer = HTTPBearer(auto_error=False, description="the admin token")


def require_admin(ctx: CtxDep, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> None:
    check_admin_token(credentials.credentials if credentials else None, ctx.admin_token)


AdminDep = Annotated[None, Depends(require_admin)]


# Database ids are 32-bit on every backend we run: a larger id is a 422, never an overflow (500).
RoundIdPath = Annotated[int, Path(ge=1, le=2**31 - 1, description="round id")]
