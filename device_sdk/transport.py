"""Signed HTTP to the round server: timeouts, retries with backoff and jitter, typed errors.

Every attempt is signed afresh (new timestamp and nonce), since the server refuses a nonce it
has seen; an upload keeps its Idempotency-Key across attempts, so a retried upload counts once.
Errors are typed by HTTP status and, when the body carries one, its machine-readable `code`
(device_sdk.errors.refusal), never by the wording of `detail`: the caller, which knows what it
asked for, says what a refusal means (device_sdk.device). The signed message and header names are
the protocol's (facecore.federation.protocol).

Every response body is streamed and capped (`max_bytes`, by default MAX_MODEL_BYTES: nothing the server
sends is larger than a model file): a declared Content-Length over the cap is refused before the body is
read, and a body that passes the cap is refused as it does, so an endless download holds at most the cap
(plus one chunk) in memory. Bodies are asked for unencoded, and counted after any decoding.
"""
from __future__ import annotations

import json
import random
import time
from typing import Any

import httpx
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from device_sdk.errors import AuthError, BadServerResponse, DeviceError, ServerUnavailable, refusal
from device_sdk.server_limits import MAX_MODEL_BYTES
from facecore.federation import protocol

RETRY_STATUS = {408, 429, 500, 502, 503, 504}
MAX_RETRY_AFTER_S = 30.0
MAX_RESPONSE_BYTES = MAX_MODEL_BYTES  # the default cap on a response body
# Headers of a streamed response that describe its encoded body, not the bytes read from it.
_BODY_HEADERS = ("content-encoding", "content-length", "transfer-encoding")


def signature_headers(key: Ed25519PrivateKey, device_id: str | None, method: str, path: str, body: bytes) -> dict[str, str]:
    """The signed headers of one request by this device; `device_id` None while registering."""
    # The body hash header lets the server check the signature before it reads a large body (uploads).
    subject = device_id or protocol.REGISTER_SUBJECT
    signed = protocol.signature_headers(key, subject, method, path, protocol.body_sha256(body))
    return (signed | {protocol.DEVICE_ID_HEADER: device_id}) if device_id else signed


class Transport:
    def __init__(self, server_url: str, timeout: float = 30.0, retries: int = 4, backoff: float = 0.5, verify: bool | str = True) -> None:
        """A server URL httpx cannot read, or a CA file (`verify` as a path) that cannot be read as
        certificates, is a DeviceError naming it, before any request."""
        try:
            self.http = httpx.Client(base_url=server_url.rstrip("/"), timeout=timeout, verify=verify)
        except httpx.InvalidURL as error:
            raise DeviceError(f"the server URL {server_url!r} is not a valid URL ({error}): give one like "
                              "https://host:8443") from None
        except (OSError, ValueError) as error:  # ssl.SSLError is an OSError
            if not isinstance(verify, str):
                raise
            why = error.strerror if isinstance(error, OSError) and error.strerror else str(error)
            raise DeviceError(f"the CA certificate file {verify} cannot be used: {why}") from None
        self.retries = retries
        self.backoff = backoff
        self.bytes_up = 0
        self.bytes_down = 0

    def close(self) -> None:
        self.http.close()

    def request(
        self, method: str, path: str, key: Ed25519PrivateKey, device_id: str | None, body: bytes | dict[str, Any] | None = None,
        headers: dict[str, str] | None = None, expect: tuple[int, ...] = (200,), max_bytes: int = MAX_RESPONSE_BYTES,
    ) -> httpx.Response:
        """`max_bytes`: the most the response body may hold; more is a BadServerResponse (not retried)."""
        raw = json.dumps(body).encode() if isinstance(body, dict) else (body or b"")
        extra = {"Content-Type": "application/json"} if isinstance(body, dict) else {}
        for attempt in range(self.retries + 1):
            signed = signature_headers(key, device_id, method, path, raw)
            try:
                response = self._send(method, path, raw, {**extra, **(headers or {}), **signed}, max_bytes)
            except httpx.TransportError as error:
                if attempt == self.retries:
                    reason = " ".join(f"{type(error).__name__}: {error}".split())
                    raise ServerUnavailable(f"cannot reach the server at {self.http.base_url} ({reason}) after "
                                            f"{self.retries + 1} attempt(s): is it running, and is --server right?"
                                            ) from None
                self._sleep(attempt)
                continue
            self.bytes_up += len(raw)
            self.bytes_down += len(response.content)
            if response.status_code in RETRY_STATUS and attempt < self.retries:
                self._sleep(attempt, response.headers.get("Retry-After"))
                continue
            return self._check(response, expect)
        raise AssertionError("unreachable")

    def _send(self, method: str, path: str, content: bytes, headers: dict[str, str], max_bytes: int) -> httpx.Response:
        """One attempt, its body read whole only up to `max_bytes`."""
        with self.http.stream(method, path, content=content, headers={"Accept-Encoding": "identity", **headers}) as streamed:
            body = read_capped(streamed, max_bytes, f"response to {method} {path.split('?')[0]}")
        kept = [(name, value) for name, value in streamed.headers.multi_items() if name.lower() not in _BODY_HEADERS]
        return httpx.Response(streamed.status_code, headers=kept, content=body, request=streamed.request)

    def _sleep(self, attempt: int, retry_after: str | None = None) -> None:
        # full jitter: many devices retrying after one outage must not hammer the server in lockstep
        delay = random.uniform(0, self.backoff * 2**attempt)
        try:
            delay = max(delay, min(float(retry_after or 0), MAX_RETRY_AFTER_S))
        except ValueError:
            pass  # an HTTP-date Retry-After: the backoff alone will do
        time.sleep(delay)

    @staticmethod
    def _check(response: httpx.Response, expect: tuple[int, ...]) -> httpx.Response:
        if response.status_code in expect:
            return response
        detail, code = error_body(response)
        status = response.status_code
        if status in (401, 403):
            raise AuthError(f"server refused this device ({status}): {detail}", status, detail)
        if status >= 500:
            raise ServerUnavailable(f"server error {status} after retries: {detail}")
        raise refusal(status, detail, code)


def read_capped(response: httpx.Response, max_bytes: int, what: str) -> bytes:
    """A streamed response's body, refused (BadServerResponse) once it declares or passes `max_bytes`."""
    declared = response.headers.get("Content-Length", "")
    if declared.isdigit() and int(declared) > max_bytes:
        raise BadServerResponse(f"the server's {what} is refused: its Content-Length {int(declared)} is over the "
                                f"{max_bytes}-byte limit")
    body = bytearray()
    for chunk in response.iter_bytes():
        body += chunk
        if len(body) > max_bytes:
            raise BadServerResponse(f"the server's {what} is refused: it passed the {max_bytes}-byte limit "
                                    "(an endless or oversized body); stopped reading")
    return bytes(body)


def error_body(response: httpx.Response) -> tuple[str, str | None]:
    """(detail, code) of an error response; `code` is None when the server sends none."""
    try:
        body = response.json()
    except ValueError:
        return response.text.strip()[:300] or response.reason_phrase, None
    if not isinstance(body, dict):
        return str(body)[:300], None
    detail = body.get("detail", response.reason_phrase)
    if isinstance(detail, list):  # a validation error: where and why, one line
        detail = "; ".join(f"{'.'.join(map(str, d.get('loc', ())))}: {d.get('msg', '')}"
                           for d in detail if isinstance(d, dict))
    code = body.get("code")
    return str(detail)[:300], code if isinstance(code, str) else None
