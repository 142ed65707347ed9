"""Limits on what one client can make the server do.

- :class:`BodySizeLimitMiddleware`: the request body cap, enforced on the ASGI stream, so it
  holds for chunked uploads that carry no Content-Length (and for a Content-Length that lies).
- :class:`KeyedRateLimiter`: a token bucket per device or per client address (429 + Retry-After).
- :class:`UploadSlots`: a cap on upload bodies in flight (503 + Retry-After).

Invariants: a refusal is always a domain error with its retry time, never a silent drop. On
PostgreSQL the rate and slot state is the database's, shared by every server process behind one
address (:mod:`server_api.core.shared_limits`); on SQLite, whose server is one host, it is held in
memory per worker process (``--workers N`` allows N times the rates) and bounded (the least recently
seen keys are forgotten first).
"""
from __future__ import annotations

import json
import re
import threading
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Protocol, TypeVar

from fastapi import HTTPException
from sqlalchemy import Engine
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from facecore.federation.protocol import ErrorCode
from server_api.core.config import Settings
from server_api.core.db import is_postgres
from server_api.core.shared_limits import SharedRateLimiter, SharedUploadSlots, rate_refusal
from server_api.errors import Unavailable

MAX_TRACKED_KEYS = 100_000
# A slot's lease beyond the body timeout: the time to validate and record a received body.
SLOT_VALIDATION_MARGIN_S = 60.0
T = TypeVar("T")


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
    body = json.dumps({"detail": f"request body exceeds {limit} bytes", "code": ErrorCode.PAYLOAD_TOO_LARGE}).encode()
    # Connection: close, because the rest of the body was never read.
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()), (b"connection", b"close")]
    await send({"type": "http.response.start", "status": 413, "headers": headers})
    await send({"type": "http.response.body", "body": body})


class KeyedRateLimiter:
    """A token bucket per key: ``burst`` requests at once, refilled at ``rate_per_s``; rate 0 is off.

    Thread-safe (routes call it from the event loop and from worker threads)."""

    blocking = False

    def __init__(
        self, rate_per_s: float, burst: int, what: str, max_keys: int = MAX_TRACKED_KEYS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.rate_per_s, self.burst, self.what, self.max_keys, self.clock = rate_per_s, burst, what, max_keys, clock
        self._buckets: OrderedDict[str, tuple[float, float]] = OrderedDict()  # key -> (tokens, at)
        self._lock = threading.Lock()

    def _tokens(self, key: str, now: float) -> float:
        tokens, at = self._buckets.get(key, (float(self.burst), now))
        return min(float(self.burst), tokens + (now - at) * self.rate_per_s)

    def check(self, key: str) -> None:
        """Refuse a key whose bucket is empty, without spending from it."""
        if not self.rate_per_s:
            return
        with self._lock:
            tokens = self._tokens(key, self.clock())
        if tokens < 1.0:
            raise rate_refusal(self.what, tokens, self.rate_per_s)

    def take(self, key: str) -> bool:
        """Spend one token if there is one; False when the bucket is empty."""
        if not self.rate_per_s:
            return True
        with self._lock:
            now = self.clock()
            tokens = self._tokens(key, now)
            taken = tokens >= 1.0
            self._buckets[key] = (tokens - 1.0 if taken else tokens, now)
            self._buckets.move_to_end(key)
            while len(self._buckets) > self.max_keys:
                self._buckets.popitem(last=False)
        return taken

    def charge(self, key: str) -> None:
        """Spend one token, or refuse with the time until the next one."""
        if not self.take(key):
            with self._lock:
                tokens = self._tokens(key, self.clock())
            raise rate_refusal(self.what, tokens, self.rate_per_s)

    def prune(self) -> int:
        return 0  # bounded by max_keys as it goes


class UploadSlots:
    """At most ``capacity`` uploads receive or validate their bodies at once; the next is refused
    rather than queued, so a slow sender can hold a slot but never a growing queue."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.in_use = 0
        self._lock = threading.Lock()

    @asynccontextmanager
    async def hold(self) -> AsyncIterator[None]:
        with self._lock:
            if self.in_use >= self.capacity:
                raise Unavailable(f"{self.capacity} uploads are already in progress; retry")
            self.in_use += 1
        try:
            yield
        finally:
            with self._lock:
                self.in_use -= 1


class RateLimiter(Protocol):
    blocking: bool  # True: it does I/O, so the event loop calls it through a thread

    def check(self, key: str) -> None: ...

    def take(self, key: str) -> bool: ...

    def charge(self, key: str) -> None: ...

    def prune(self) -> int: ...


class Slots(Protocol):
    def hold(self) -> AbstractAsyncContextManager[None]: ...


async def off_loop(limiter: RateLimiter, action: Callable[[str], T], key: str) -> T:
    """``action(key)`` (one of the limiter's methods) from the event loop, through a thread if it does I/O."""
    return await run_in_threadpool(action, key) if limiter.blocking else action(key)


@dataclass
class RequestLimits:
    """One app's limits, built from its settings (FEDFACE_DEVICE_*, FEDFACE_ADDRESS_*, ...): in the
    database on PostgreSQL, so every server process shares them, else in this process's memory."""

    devices: RateLimiter
    addresses: RateLimiter
    uploads: Slots
    body_timeout_s: float

    @classmethod
    def from_settings(cls, settings: Settings, engine: Engine) -> RequestLimits:
        timeout_s = settings.upload_body_timeout_s
        if is_postgres(engine):
            return cls(
                devices=SharedRateLimiter(engine, settings.device_rate_per_s, settings.device_burst, "device"),
                addresses=SharedRateLimiter(engine, settings.address_rate_per_s, settings.address_burst, "address"),
                uploads=SharedUploadSlots(engine, settings.max_concurrent_uploads, timeout_s + SLOT_VALIDATION_MARGIN_S),
                body_timeout_s=timeout_s,
            )
        return cls(
            devices=KeyedRateLimiter(settings.device_rate_per_s, settings.device_burst, "device"),
            addresses=KeyedRateLimiter(settings.address_rate_per_s, settings.address_burst, "address"),
            uploads=UploadSlots(settings.max_concurrent_uploads),
            body_timeout_s=timeout_s,
        )

    def prune(self) -> int:
        """Forget buckets that have refilled; how many."""
        return self.devices.prune() + self.addresses.prune()
