"""Request body cap enforced on the ASGI stream, so it holds for chunked uploads
that carry no Content-Length (and for a Content-Length that lies)."""
from __future__ import annotations

import json
import re

from fastapi import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send


class BodyTooLarge(HTTPException):
    # An HTTPException so FastAPI's body parsing re-raises it instead of turning it into a 400.
    def __init__(self, limit: int) -> None:
        super().__init__(status_code=413, detail=f"request body exceeds {limit} bytes")


class BodySizeLimitMiddleware:
    def __init__(self, app: ASGIApp, default_limit: int, large_limit: int, large_paths: str) -> None:
        self.app = app
        self.default_limit = default_limit
        self.large_limit = large_limit
        self.large_paths = re.compile(large_paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.large_limit if self.large_paths.match(scope["path"]) else self.default_limit
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            await _reject(send, limit)
            return
        received = 0
        started = False

        async def limited_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise BodyTooLarge(limit)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except BodyTooLarge:
            # Raised where nothing turned it into a response (e.g. a raw stream reader).
            if not started:
                await _reject(send, limit)


async def _reject(send: Send, limit: int) -> None:
    body = json.dumps({"detail": f"request body exceeds {limit} bytes"}).encode()
    # Connection: close, because the rest of the body was never read.
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), (b"connection", b"close")]
    await send({"type": "http.response.start", "status": 413, "headers": headers})
    await send({"type": "http.response.body", "body": body})
