"""App factory: ``create_app(settings)`` for tests and embedding,
``create_app_from_env`` for uvicorn workers (``--factory``), which read FEDFACE_* variables."""
from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

import anyio
from fastapi import FastAPI

from server_api.api import handlers
from server_api.api.routes import admin, devices, docs, health, models, rounds, secagg, ui
from server_api.core.config import Secrets, Settings, resolve_secrets
from server_api.core.limits import BodySizeLimitMiddleware
from server_api.core.logging import configure_logging
from server_api.services import scheduler
from server_api.services.context import ServerContext

API_VERSION = "1"


def create_app(settings: Settings | None = None, secrets: Secrets | None = None, run_scheduler: bool = True) -> FastAPI:
    """Build the app. Secrets are checked here, so a misconfigured server fails before it
    listens; migrations and the bootstrap model run at startup (lifespan).

    ``run_scheduler=False`` leaves deadlines and stuck aggregations to explicit
    ``scheduler.tick(app.state.ctx)`` calls (deterministic tests)."""
    settings = settings or Settings()
    ctx = ServerContext.create(settings, secrets or resolve_secrets(settings))

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await anyio.to_thread.run_sync(ctx.startup)
        task = asyncio.create_task(scheduler.run_forever(ctx)) if run_scheduler else None
        try:
            yield
        finally:
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
            ctx.close()

    app = FastAPI(
        title="FedFace round server",
        version=API_VERSION,
        description=docs.DESCRIPTION,
        lifespan=lifespan,
        docs_url=None,  # docs.install serves /docs and /redoc from local assets
        redoc_url=None,
    )
    app.state.ctx = ctx
    app.add_middleware(
        BodySizeLimitMiddleware, default_limit=settings.max_request_bytes, large_limit=settings.max_upload_bytes,
        large_paths=rounds.UPLOAD_PATH,
    )
    handlers.install(app)
    routers = (health.router, devices.router, devices.admin_router, rounds.router, secagg.router, models.router, models.admin_router, admin.router)
    for router in (*routers, ui.router):
        app.include_router(router)
    docs.install(app)
    return app


def create_app_from_env() -> FastAPI:
    settings = Settings()
    configure_logging(settings.log_level, human=settings.dev)
    return create_app(settings)
