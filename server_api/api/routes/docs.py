"""API documentation that works offline, and the OpenAPI description of how clients authenticate.

Invariants:
- `/docs` (Swagger UI) and `/redoc` load every asset from this server (`/docs/assets`, files of the
  `fastapi-offline` package): no CDN, no web font, no validator badge.
- Every `/v1/admin/...` operation declares the admin bearer token; every other `/v1/...` operation
  declares the four device signature headers, except registration, which is signed by the key it
  registers and so has no `X-Device-Id`. The rule is by path, because the upload route and
  registration check signatures in their services, not through a dependency.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import fastapi_offline
from fastapi import APIRouter, FastAPI
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.openapi.utils import get_openapi
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

from facecore.federation.protocol import (
    DEVICE_ID_HEADER,
    NONCE_HEADER,
    REGISTER_SUBJECT,
    SIGNATURE_HEADER,
    SIGNATURE_SCHEME,
    TIMESTAMP_HEADER,
)

ASSETS_URL = "/docs/assets"
ASSETS_DIR = Path(fastapi_offline.__file__).parent / "static"
ADMIN_PREFIX = "/v1/admin/"
REGISTRATION = ("/v1/devices", "post")

_SIGNED = (
    "the base64 Ed25519 signature, by the device's key, of the UTF-8 text "
    f"`{SIGNATURE_SCHEME}\\n<device id>\\n<METHOD>\\n"
    f"<path[?query]>\\n<{TIMESTAMP_HEADER}>\\n<{NONCE_HEADER}>\\n<hex sha256 of the body>` "
    f"(device id `{REGISTER_SUBJECT}` when registering)"
)
SECURITY_SCHEMES: dict[str, dict[str, Any]] = {
    "DeviceId": {
        "type": "apiKey",
        "in": "header",
        "name": DEVICE_ID_HEADER,
        "description": "the id registration returned",
    },
    "Timestamp": {
        "type": "apiKey",
        "in": "header",
        "name": TIMESTAMP_HEADER,
        "description": "unix seconds, within 300 s of the server's clock",
    },
    "Nonce": {
        "type": "apiKey",
        "in": "header",
        "name": NONCE_HEADER,
        "description": "16-64 url-safe characters, never used before by this device",
    },
    "Signature": {"type": "apiKey", "in": "header", "name": SIGNATURE_HEADER, "description": _SIGNED},
    "AdminToken": {
        "type": "http",
        "scheme": "bearer",
        "description": "the operator's token: FEDFACE_ADMIN_TOKEN, or `<data dir>/admin_token` of a --dev server",
    },
}
SecurityRequirements = list[dict[str, list[str]]]  # OpenAPI: scheme name -> scopes (none here)
DEVICE: SecurityRequirements = [{"DeviceId": [], "Timestamp": [], "Nonce": [], "Signature": []}]
REGISTERING_KEY: SecurityRequirements = [{"Timestamp": [], "Nonce": [], "Signature": []}]
ADMIN: SecurityRequirements = [{"AdminToken": []}]
DESCRIPTION = """Cross-device FedFace rounds: signed devices, FedAvg + spreadout aggregation.

**Devices** sign every request with their Ed25519 key: headers `X-Device-Id`, `X-Timestamp`, `X-Nonce` and
`X-Signature` (see the security schemes). Registration (`POST /v1/devices`) is signed by the key it registers,
without `X-Device-Id`. An upload also sends `X-Content-SHA256`, the body hash it signed, so the server checks the
signature before it reads the body. The device SDK (`device_sdk`) does all of this.

**Operators** send `Authorization: Bearer <admin token>` to `/v1/admin/...`; `fedface admin` does it for you.
"""


def security_for(path: str, method: str) -> SecurityRequirements | None:
    if path.startswith(ADMIN_PREFIX):
        return ADMIN
    if (path, method) == REGISTRATION:
        return REGISTERING_KEY
    return DEVICE if path.startswith("/v1/") else None


def build_openapi(app: FastAPI) -> dict[str, Any]:
    if app.openapi_schema:
        return app.openapi_schema
    schema = get_openapi(title=app.title, version=app.version, description=app.description, routes=app.routes)
    components = schema.setdefault("components", {})
    components["securitySchemes"] = SECURITY_SCHEMES  # replaces FastAPI's anonymous "HTTPBearer"
    for path, operations in schema["paths"].items():
        for method, operation in operations.items():
            requirement = security_for(path, method)
            if requirement is None:
                operation.pop("security", None)
            else:
                operation["security"] = requirement
    app.openapi_schema = schema
    return schema


router = APIRouter(include_in_schema=False)
# The browser itself refuses anything from another origin: ReDoc's footer logo (a CDN image) included.
# Inline script and style: FastAPI's pages configure Swagger UI and ReDoc inline; blob: is ReDoc's search worker.
DOCS_HEADERS = {
    "Content-Security-Policy": "default-src 'self'; script-src 'self' 'unsafe-inline' blob:; "
    "style-src 'self' 'unsafe-inline'; "
    "img-src 'self' data:; worker-src 'self' blob:; frame-ancestors 'none'",
}


def _with_policy(page: HTMLResponse) -> HTMLResponse:
    page.headers.update(DOCS_HEADERS)
    return page


@router.get("/docs")
def swagger_ui() -> HTMLResponse:
    return _with_policy(
        get_swagger_ui_html(
            openapi_url="/openapi.json",
            title="FedFace round server: API",
            oauth2_redirect_url="/docs/oauth2-redirect",
            swagger_js_url=f"{ASSETS_URL}/swagger-ui-bundle.js",
            swagger_css_url=f"{ASSETS_URL}/swagger-ui.css",
            swagger_favicon_url=f"{ASSETS_URL}/favicon.png",
            swagger_ui_parameters={"validatorUrl": None, "persistAuthorization": False},
        )
    )


@router.get("/docs/oauth2-redirect")
def swagger_ui_redirect() -> HTMLResponse:
    return get_swagger_ui_oauth2_redirect_html()


@router.get("/redoc")
def redoc() -> HTMLResponse:
    return _with_policy(
        get_redoc_html(
            openapi_url="/openapi.json",
            title="FedFace round server: API",
            redoc_js_url=f"{ASSETS_URL}/redoc.standalone.js",
            redoc_favicon_url=f"{ASSETS_URL}/favicon.png",
            with_google_fonts=False,
        )
    )


def install(app: FastAPI) -> None:
    """Serve the documentation pages and their assets; describe authentication in the OpenAPI document."""
    app.openapi = lambda: build_openapi(app)  # type: ignore[method-assign]
    app.include_router(router)
    app.mount(ASSETS_URL, StaticFiles(directory=ASSETS_DIR), name="docs-assets")
