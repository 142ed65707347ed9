"""The one place where domain errors become HTTP status codes.

Every error body is ``{"detail": <text>, "code": <ErrorCode>}``: `detail` is for people and may be
reworded, `code` is what clients branch on (facecore.federation.protocol)."""
from __future__ import annotations

import sqlalchemy.exc
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from facecore.errors import CheckpointError
from facecore.federation.protocol import ErrorCode
from server_api.core.limits import BodyTooLarge
from server_api.errors import (
    AuthenticationFailed,
    Conflict,
    Forbidden,
    InvalidInput,
    NotFound,
    PayloadTooLarge,
    RateLimited,
    RequestTimeout,
    ServerError,
    Unavailable,
)

STATUS: list[tuple[type[Exception], int]] = [
    (AuthenticationFailed, 401),
    (Forbidden, 403),
    (NotFound, 404),
    (Conflict, 409),  # includes StaleRound
    (PayloadTooLarge, 413),
    (InvalidInput, 422),
    (RateLimited, 429),
    (RequestTimeout, 408),
    (Unavailable, 503),
    (CheckpointError, 500),
]


def status_for(error: Exception) -> int:
    for kind, status in STATUS:
        if isinstance(error, kind):
            return status
    return 500


def error_body(detail: object, code: ErrorCode) -> dict[str, object]:
    return {"detail": detail, "code": code}


async def _domain_error(request: Request, error: Exception) -> JSONResponse:
    status = status_for(error)
    headers = {"WWW-Authenticate": 'Signature realm="fedface"'} if status == 401 else None
    if status == 503:
        headers = {"Retry-After": str(BUSY_RETRY_AFTER_S)}
    if isinstance(error, RateLimited):
        headers = {"Retry-After": str(error.retry_after_s)}
    if status == 408:
        headers = {"Connection": "close"}  # the rest of the body is still on its way: do not wait for it
    # CheckpointError comes from facecore and carries no code: a model file the server cannot read is its own fault.
    code = getattr(error, "code", ErrorCode.INTERNAL)
    return JSONResponse(error_body(str(error), code), status_code=status, headers=headers)


async def _request_validation(request: Request, error: RequestValidationError) -> JSONResponse:
    # FastAPI's default echoes each bad input back; for an embedding that is a template
    # (and NaN cannot even be encoded as JSON). Location and reason are enough.
    detail = [{"loc": list(e.get("loc", ())), "msg": e.get("msg", ""), "type": e.get("type", "")} for e in error.errors()]
    return JSONResponse(error_body(detail, ErrorCode.INVALID_INPUT), status_code=422)


async def _body_too_large(request: Request, error: BodyTooLarge) -> JSONResponse:
    # Raised while FastAPI reads the body: without this, its HTTPException handler answers with no code.
    return JSONResponse(error_body(error.detail, ErrorCode.PAYLOAD_TOO_LARGE), status_code=error.status_code, headers=error.headers)


BUSY_RETRY_AFTER_S = 2


def is_database_busy(error: Exception) -> bool:
    """The database could not take this request now (pool exhausted, or SQLite locked by another
    process past busy_timeout): a retry will succeed, so the client must hear 503, not 500."""
    if isinstance(error, sqlalchemy.exc.TimeoutError):
        return True
    return isinstance(error, sqlalchemy.exc.OperationalError) and "database is locked" in str(error.orig)


async def _database_error(request: Request, error: Exception) -> JSONResponse:
    if is_database_busy(error):
        return JSONResponse(error_body("the database is busy; retry", ErrorCode.UNAVAILABLE), status_code=503, headers={"Retry-After": str(BUSY_RETRY_AFTER_S)})
    raise error  # anything else is a real fault: let the server log it as one


def install(app: FastAPI) -> None:
    app.add_exception_handler(sqlalchemy.exc.TimeoutError, _database_error)
    app.add_exception_handler(sqlalchemy.exc.OperationalError, _database_error)
    app.add_exception_handler(RequestValidationError, _request_validation)  # type: ignore[arg-type]
    app.add_exception_handler(BodyTooLarge, _body_too_large)  # type: ignore[arg-type]
    app.add_exception_handler(ServerError, _domain_error)
    app.add_exception_handler(CheckpointError, _domain_error)
