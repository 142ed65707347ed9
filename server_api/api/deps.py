"""Request-scoped dependencies: context, DB session, signed device, admin token."""
from __future__ import annotations

from collections.abc import Iterator
from typing import Annotated

from fastapi import Depends, Path, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from server_api.core.security import body_digest, check_admin_token
from server_api.models import Device
from server_api.services.auth import authenticate_device
from server_api.services.context import ServerContext


def get_ctx(request: Request) -> ServerContext:
    return request.app.state.ctx


CtxDep = Annotated[ServerContext, Depends(get_ctx)]


def get_session(ctx: CtxDep) -> Iterator[Session]:
    session = ctx.sessions()
    try:
        yield session
    finally:
        session.close()


SessionDep = Annotated[Session, Depends(get_session)]


def signed_path(request: Request) -> str:
    """Path and query exactly as the client sent them: what the signature covers."""
    raw = request.scope.get("raw_path") or request.url.path.encode()
    query = request.scope.get("query_string", b"")
    return raw.decode("latin-1") + ("?" + query.decode("latin-1") if query else "")


async def current_device(request: Request, ctx: CtxDep, session: SessionDep) -> Device:
    body = await request.body()  # bounded by the size-limit middleware
    return await run_in_threadpool(
        authenticate_device, session, request.headers, request.method, signed_path(request), body_digest(body),
        ctx.settings.signature_window_s,
    )


CurrentDevice = Annotated[Device, Depends(current_device)]

_bearer = HTTPBearer(auto_error=False, description="the admin token")


def require_admin(ctx: CtxDep, credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> None:
    check_admin_token(credentials.credentials if credentials else None, ctx.admin_token)


AdminDep = Annotated[None, Depends(require_admin)]


# Database ids are 32-bit on every backend we run: a larger id is a 422, never an overflow (500).
RoundIdPath = Annotated[int, Path(ge=1, le=2**31 - 1, description="round id")]
