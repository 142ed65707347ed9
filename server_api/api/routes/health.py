"""Liveness, readiness and Prometheus metrics (unauthenticated: keep them off the public internet)."""
from __future__ import annotations

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sqlalchemy import text

from server_api.api.deps import CtxDep

router = APIRouter(tags=["health"])


@router.get("/healthz")
def healthz() -> dict[str, str]:
    return {"status": "ok"}


@router.get("/readyz")
def readyz(ctx: CtxDep) -> JSONResponse:
    try:
        with ctx.engine.connect() as connection:
            connection.execute(text("SELECT 1"))
    except Exception as error:  # any driver error means "not ready"
        return JSONResponse({"status": "unavailable", "database": type(error).__name__}, status_code=503)
    return JSONResponse({"status": "ready"})


@router.get("/metrics")
def metrics(ctx: CtxDep) -> Response:
    return Response(generate_latest(ctx.metrics.registry), media_type=CONTENT_TYPE_LATEST)
