"""Device side of a round: check in, then upload one signed update. The responses are built here
from the plain values the services return; an upload's 201 and its Idempotency-Key replays are built
by one function (``_update_body``) from the same stored values, so a replay answers the same bytes."""
from __future__ import annotations

import asyncio
import hashlib
from dataclasses import asdict
from pathlib import Path
from typing import Any

from fastapi import APIRouter, BackgroundTasks, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect

from facecore.federation.messages import CheckinPublic, ErrorPublic, UpdatePublic
from facecore.federation.protocol import CONTENT_SHA256_HEADER
from server_api.api.deps import CtxDep, CurrentDevice, LimitsDep, RoundIdPath, SessionDep, client_address, signed_path
from server_api.core.limits import off_loop
from server_api.core.logging import get_logger
from server_api.errors import AuthenticationFailed, RequestTimeout
from server_api.services import participation
from server_api.services.aggregation import try_aggregate
from server_api.services.auth import signed_upload
from server_api.services.participation import Checkin
from server_api.services.uploads import AcceptedUpdate, Recorded, begin_upload, finish_upload

log = get_logger("uploads")
router = APIRouter(prefix="/v1/rounds", tags=["rounds"])
_errors: dict[int | str, dict[str, Any]] = {code: {"model": ErrorPublic} for code in (401, 403, 404, 408, 409, 413, 422, 429, 503)}
UPLOAD_PATH = r"^/v1/rounds/[^/]+/updates$"


def _checkin_public(checkin: Checkin) -> CheckinPublic:
    base = checkin.base_version
    return CheckinPublic(
        round_id=checkin.round_id, status=checkin.status, retry_after_s=checkin.retry_after_s,  # type: ignore[arg-type]
        deadline_at=checkin.deadline_at, base_version=base, backbone_url=f"/v1/models/{base}/backbone",
        onnx_url=f"/v1/models/{base}/onnx" if checkin.has_onnx else None,
        embedding_url=f"/v1/devices/{checkin.device_id}/embedding", upload_url=f"/v1/rounds/{checkin.round_id}/updates",
        local=checkin.local, secagg_url=f"/v1/rounds/{checkin.round_id}/secagg" if checkin.secure_aggregation else None,
    )


def _update_body(accepted: AcceptedUpdate) -> dict[str, Any]:
    return UpdatePublic(**asdict(accepted)).model_dump(mode="json")


def _answer(outcome: Recorded) -> JSONResponse:
    """The upload's answer: the first one, or an Idempotency-Key's replay of it."""
    return JSONResponse(_update_body(outcome.accepted), status_code=outcome.status_code)


@router.post("/current/checkin", response_model=CheckinPublic, responses=_errors)
def checkin(device: CurrentDevice, ctx: CtxDep, session: SessionDep) -> CheckinPublic:
    """Ask to join the open round. ``waiting``: check in again after ``retry_after_s``;
    ``selected``: download the backbone and your embedding, train, upload before the deadline."""
    return _checkin_public(participation.checkin(ctx, session, device))


_BINARY = {"type": "string", "format": "binary"}
_UPLOAD_HEADERS = [
    {"name": CONTENT_SHA256_HEADER, "in": "header", "required": True, "description": "hex sha256 of the body, as signed",
     "schema": {"type": "string", "pattern": "^[0-9a-f]{64}$"}},
    {"name": "Idempotency-Key", "in": "header", "required": True, "description": "a resend returns the first answer",
     "schema": {"type": "string", "pattern": "^[A-Za-z0-9_.:-]{8,128}$"}},
]


@router.post(
    "/{round_id}/updates", status_code=201, response_model=UpdatePublic, responses=_errors,
    openapi_extra={
        "requestBody": {"required": True, "content": {"application/octet-stream": {"schema": _BINARY}}},
        "parameters": _UPLOAD_HEADERS,
    },
)
async def upload_update(
    round_id: RoundIdPath, request: Request, background: BackgroundTasks, ctx: CtxDep, session: SessionDep,
    limits: LimitsDep,
) -> JSONResponse:
    """Upload a tensor file (safetensors layout): ``backbone.*`` deltas, ``class_embedding``,
    metadata ``fedface`` = {base_version, n_samples, metrics}. Needs an ``Idempotency-Key``;
    repeating it returns the first response. Needs ``X-Content-SHA256`` (the signed body hash):
    the signature and the round are checked before the body is read, which is then streamed to
    disk, never held in memory. 429/503/408 carry why and, where a retry helps, ``Retry-After``."""
    address = client_address(request)
    await off_loop(limits.addresses, limits.addresses.check, address)
    try:
        signed = signed_upload(request.headers, request.method, signed_path(request), ctx.settings.signature_window_s)
        key = request.headers.get("idempotency-key")
        ticket = await run_in_threadpool(begin_upload, ctx, session, signed, round_id, key, limits.devices.charge)
    except AuthenticationFailed:
        await off_loop(limits.addresses, limits.addresses.take, address)
        raise
    if ticket.replay is not None:
        return _answer(ticket.replay)
    async with limits.uploads.hold():
        with ctx.store.temp_file() as spool:
            try:
                size = await _receive_body(request, spool, ticket.body_sha256, limits.body_timeout_s)
            except ClientDisconnect:
                # A phone that lost its network mid-upload: nothing was accepted, the spool file goes
                # with this block, and the device resends under the same Idempotency-Key. Not an error.
                fields = {"round_id": round_id, "device_id": ticket.device_id}
                log.info("upload abandoned mid-body", extra={"fields": fields})
                return JSONResponse({"detail": "the client disconnected before the body was complete"}, status_code=400)
            outcome = await run_in_threadpool(finish_upload, ctx, session, ticket, spool, size)
    if outcome.due:
        background.add_task(try_aggregate, ctx, round_id)  # the target-th update; deadlines are the scheduler's
    return _answer(outcome)


async def _receive_body(request: Request, spool: Path, declared_sha256: str, timeout_s: float) -> int:
    """Stream the body to ``spool`` within ``timeout_s``; its size. The size-limit middleware
    stops oversized streams; a body other than the one signed is refused."""
    digest, size = hashlib.sha256(), 0
    try:
        async with asyncio.timeout(timeout_s):
            with spool.open("wb") as out:
                async for chunk in request.stream():
                    digest.update(chunk)
                    out.write(chunk)
                    size += len(chunk)
    except TimeoutError:
        log.info("upload body timed out", extra={"fields": {"bytes": size, "timeout_s": timeout_s}})
        raise RequestTimeout(f"the upload body did not arrive within {timeout_s:g} s") from None
    if digest.hexdigest() != declared_sha256:
        raise AuthenticationFailed("the body does not match its signed X-Content-SHA256")
    return size
