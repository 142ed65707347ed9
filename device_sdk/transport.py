"""Signed HTTP to the round server: timeouts, retries with backoff and jitter, typed errors.

Every attempt is signed afresh (new timestamp and nonce), since the server refuses a nonce it
has seen; an upload keeps its Idempotency-Key across attempts, so a retried upload counts once.
"""
from __future__ import annotations

import base64
import hashlib
import json
import random
import secrets
import time
from typing import Any

import httpx
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from device_sdk.errors import AuthError, DeviceError, NotEnrolled, RoundClosed, ServerUnavailable

SCHEME = "FEDFACE-V1"
RETRY_STATUS = {500, 502, 503, 504}


def signature_headers(key: Ed25519PrivateKey, subject: str, method: str, path: str, body: bytes) -> dict[str, str]:
    timestamp, nonce = str(int(time.time())), secrets.token_urlsafe(18)
    message = "\n".join((SCHEME, subject, method.upper(), path, timestamp, nonce, hashlib.sha256(body).hexdigest()))
    return {"X-Timestamp": timestamp, "X-Nonce": nonce, "X-Signature": base64.b64encode(key.sign(message.encode())).decode()}


class Transport:
    def __init__(self, server_url: str, timeout: float = 30.0, retries: int = 4, backoff: float = 0.5, verify: bool | str = True) -> None:
        self.http = httpx.Client(base_url=server_url.rstrip("/"), timeout=timeout, verify=verify)
        self.retries = retries
        self.backoff = backoff
        self.bytes_up = 0
        self.bytes_down = 0

    def close(self) -> None:
        self.http.close()

    def request(
        self, method: str, path: str, key: Ed25519PrivateKey, device_id: str | None, body: bytes | dict[str, Any] | None = None,
        headers: dict[str, str] | None = None, expect: tuple[int, ...] = (200,),
    ) -> httpx.Response:
        raw = json.dumps(body).encode() if isinstance(body, dict) else (body or b"")
        extra = {"Content-Type": "application/json"} if isinstance(body, dict) else {}
        for attempt in range(self.retries + 1):
            signed = signature_headers(key, device_id or "register", method, path, raw)
            if device_id:
                signed["X-Device-Id"] = device_id
            try:
                response = self.http.request(method, path, content=raw, headers={**extra, **(headers or {}), **signed})
            except httpx.TransportError as error:
                if attempt == self.retries:
                    raise ServerUnavailable(f"cannot reach {self.http.base_url}: {type(error).__name__}: {error}") from None
                self._sleep(attempt)
                continue
            self.bytes_up += len(raw)
            self.bytes_down += len(response.content)
            if response.status_code in RETRY_STATUS and attempt < self.retries:
                self._sleep(attempt)
                continue
            return self._check(response, expect)
        raise AssertionError("unreachable")

    def _sleep(self, attempt: int) -> None:
        # full jitter: many devices retrying after one outage must not hammer the server in lockstep
        time.sleep(random.uniform(0, self.backoff * 2**attempt))

    @staticmethod
    def _check(response: httpx.Response, expect: tuple[int, ...]) -> httpx.Response:
        if response.status_code in expect:
            return response
        try:
            detail = response.json().get("detail", response.text)
        except ValueError:
            detail = response.text
        status = response.status_code
        if status in (401, 403):
            raise AuthError(f"server refused the request ({status}): {detail}")
        if status == 409 and "not enrolled" in str(detail):
            raise NotEnrolled(str(detail))
        if status == 409:
            raise RoundClosed(str(detail))
        if status == 404 and "enroll" in str(detail).lower():
            raise NotEnrolled(str(detail))
        if status >= 500:
            raise ServerUnavailable(f"server error {status} after retries: {detail}")
        raise DeviceError(f"server answered {status}: {detail}")
