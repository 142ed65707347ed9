"""Device side of a round: check in, then upload one signed update."""
from __future__ import annotations

import hashlib
import logging

from fastapi import APIRouter, BackgroundTasks, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool
from starlette.requests import ClientDisconnect

from server_api.api.deps import CtxDep, CurrentDevice, RoundIdPath, SessionDep, signed_path
from server_api.schemas import CheckinPublic, ErrorPublic, UpdatePublic
from server_api.services import participation
from server_api.services.aggregation import try_aggregate
from server_api.services.auth import SignedRequest, precheck_device_headers
from server_api.services.uploads import accept_upload

log = logging.getLogger(__name__)
router = APIRouter(prefix="/v1/rounds", tags=["rounds"])
_errors = {code: {"model": ErrorPublic} for code in (401, 403, 404, 409, 413, 422)}
UPLOAD_PATH = r"^/v1/rounds/[^/]+/updates$"


@router.post("/current/checkin", response_model=CheckinPublic, responses=_errors)
def checkin(device: CurrentDevice, ctx: CtxDep, session: SessionDep) -> CheckinPublic:
    """Ask to join the open round. ``waiting``: check in again after ``retry_after_s``;
    ``selected``: download the backbone and your embedding, train, upload before the deadline."""
    return participation.checkin(ctx, session, device)


@router.post(
    "/{round_id}/updates", status_code=201, response_model=UpdatePublic, responses=_errors,
    openapi_extra={"requestBody": {"required": True, "content": {"application/octet-stream": {"schema": {"type": "string", "format": "binary"}}}}},
)
async def upload_update(round_id: RoundIdPath, request: Request, background: BackgroundTasks, ctx: CtxDep, session: SessionDep) -> JSONResponse:
    """Upload a tensor file (safetensors layout): ``backbone.*`` deltas, ``class_embedding``,
    metadata ``fedface`` = {base_version, n_samples, metrics}. Needs an ``Idempotency-Key``;
    repeating it returns the first response. The body is streamed to disk, never held in memory."""
    precheck_device_headers(request.headers, ctx.settings.signature_window_s)
    with ctx.store.temp_file() as spool:
        digest, size = hashlib.sha256(), 0
        try:
            with spool.open("wb") as out:
                async for chunk in request.stream():  # the size-limit middleware stops oversized streams
                    digest.update(chunk)
                    out.write(chunk)
                    size += len(chunk)
        except ClientDisconnect:
            # A phone that lost its network mid-upload: nothing was accepted, the spool file goes
            # with this block, and the device resends under the same Idempotency-Key. Not an error.
            log.info("upload abandoned mid-body", extra={"fields": {"round_id": round_id, "bytes": size}})
            return JSONResponse({"detail": "the client disconnected before the body was complete"}, status_code=400)
        signed = SignedRequest(request.headers, request.method, signed_path(request), digest.hexdigest())
        outcome = await run_in_threadpool(accept_upload, ctx, session, signed, round_id, spool, size, request.headers.get("idempotency-key"))
    if outcome.due:
        background.add_task(try_aggregate, ctx, round_id)  # the target-th update; deadlines are the scheduler's
    return JSONResponse(outcome.response, status_code=outcome.status_code)
