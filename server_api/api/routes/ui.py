"""The read-only operator page `/ui`, behind the admin token.

A script or `curl` sends `Authorization: Bearer <admin token>`; a browser logs in once through the
form at /ui/login, which sets an HttpOnly, SameSite=Strict cookie scoped to /ui (`ui.session`: a
MAC of an expiry, never the token). A wrong bearer token is 401; no credentials redirect to the
login form. Nothing under /ui changes server state except the cookie itself, and only a form posted from
the server's own pages may change that: log in and log out from another site are 403 (`check_same_origin`).
"""

from __future__ import annotations

import time
from typing import Annotated
from urllib.parse import parse_qs

from fastapi import APIRouter, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from server_api.api.deps import CtxDep, SessionDep
from server_api.core.security import check_admin_token, check_same_origin
from server_api.errors import AuthenticationFailed
from server_api.tables import utcnow
from server_api.ui import pages, session, view
from server_api.ui.style import CSS

router = APIRouter(prefix="/ui", include_in_schema=False)
PAGE_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none'"
    ),
    "Cache-Control": "no-store",
    "Referrer-Policy": "no-referrer",
    "X-Content-Type-Options": "nosniff",
}


def _signed_in(request: Request, admin_token: str) -> bool:
    header = request.headers.get("authorization")
    if header is not None:  # an explicit credential must be right: 401, not a login form
        scheme, _, token = header.partition(" ")
        check_admin_token(token.strip() if scheme.lower() == "bearer" else None, admin_token)
        return True
    return session.is_valid(request.cookies.get(session.COOKIE_NAME), admin_token, time.time())


def _same_origin(request: Request) -> None:
    headers = request.headers
    check_same_origin(headers.get("sec-fetch-site"), headers.get("origin"), headers.get("host"))


def _html(text: str, status_code: int = 200) -> HTMLResponse:
    return HTMLResponse(text, status_code=status_code, headers=PAGE_HEADERS)


@router.get("")
def operator_page(
    request: Request,
    ctx: CtxDep,
    db: SessionDep,
    rounds: Annotated[int, Query(ge=1, le=500)] = 50,
) -> Response:
    if not _signed_in(request, ctx.admin_token):
        return RedirectResponse("/ui/login", status_code=303)
    return _html(pages.operator_page(view.build(db, utcnow(), round_limit=rounds)))


@router.get("/login")
def login_form() -> HTMLResponse:
    return _html(pages.login_page())


@router.post("/login")
async def login(request: Request, ctx: CtxDep) -> Response:
    _same_origin(request)  # before the body: another site's form never gets to try a token
    form = parse_qs((await request.body()).decode("utf-8", "replace"))  # bounded by the body-size middleware
    try:
        check_admin_token((form.get("token") or [""])[0].strip(), ctx.admin_token)
    except AuthenticationFailed:
        return _html(pages.login_page("That is not the admin token."), status_code=401)
    response = RedirectResponse("/ui", status_code=303)
    response.set_cookie(
        session.COOKIE_NAME,
        session.issue(ctx.admin_token, time.time()),
        max_age=session.LIFETIME_S,
        path="/ui",
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    return response


@router.post("/logout")
def logout(request: Request) -> Response:
    _same_origin(request)
    response = RedirectResponse("/ui/login", status_code=303)
    response.delete_cookie(session.COOKIE_NAME, path="/ui", httponly=True, samesite="strict")
    return response


@router.get("/style.css")
def stylesheet() -> Response:
    return Response(CSS, media_type="text/css", headers={"Cache-Control": "max-age=3600"})
