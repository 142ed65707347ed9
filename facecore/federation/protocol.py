"""The FedFace device protocol (version FEDFACE-V1), as both ends speak it.

A device signs every request with its Ed25519 key. The signed message is the UTF-8 of::

    FEDFACE-V1\\n<device id or "register">\\n<METHOD>\\n<path[?query]>\\n<timestamp>\\n<nonce>\\n<sha256(body) hex>

so method, path, query, time, nonce and body are all bound. The headers carry the device id (absent
when registering), the timestamp (unix seconds), the nonce (single use) and the base64 signature; an
upload also carries the body hash it signed, so the server checks the signature before reading a large
body. An update file is a tensor file of ``backbone.<name>`` deltas (quantised ones with ``scale.<name>``
beside them; or one ``secagg.masked`` vector) plus ``class_embedding``, with JSON metadata under ``fedface``. An error body is
``{"detail": <text for people>, "code": <ErrorCode>}``; programs branch on ``code``, never on ``detail``.

Invariants: every constant here is wire format, shared by the server, the device SDK and the benchmark
clients (protocol_test pins the message layout); no HTTP, no database, no torch.
"""
from __future__ import annotations

import base64
import hashlib
import secrets
import time
from enum import StrEnum
from typing import Protocol

SIGNATURE_SCHEME = "FEDFACE-V1"
REGISTER_SUBJECT = "register"  # the subject of a registration: the device has no id yet

DEVICE_ID_HEADER = "X-Device-Id"
TIMESTAMP_HEADER = "X-Timestamp"
NONCE_HEADER = "X-Nonce"
SIGNATURE_HEADER = "X-Signature"
# Also names the content hash of every model download the server serves.
CONTENT_SHA256_HEADER = "X-Content-SHA256"

BACKBONE_PREFIX = "backbone."
SCALE_PREFIX = "scale."  # a quantised entry's scales (facecore.federation.quantize)
EMBEDDING_KEY = "class_embedding"
MASKED_KEY = "secagg.masked"
METADATA_KEY = "fedface"


class ErrorCode(StrEnum):
    """Machine-readable reason of a refusal, sent as ``code`` beside the human ``detail``.

    One per domain error class of the server (server_api.errors); the framework's own refusals of
    the same kind (a malformed body, an oversized one) reuse that class's code. A client that meets
    a code it does not know falls back to the HTTP status."""

    INTERNAL = "internal"
    AUTHENTICATION_FAILED = "authentication_failed"
    FORBIDDEN = "forbidden"
    NOT_FOUND = "not_found"
    CONFLICT = "conflict"
    STALE_ROUND = "stale_round"  # no round open, or the round no longer takes this request
    NOT_ENROLLED = "not_enrolled"  # the server holds no enrollment for the calling device
    INVALID_INPUT = "invalid_input"
    PAYLOAD_TOO_LARGE = "payload_too_large"
    UNAVAILABLE = "unavailable"
    RATE_LIMITED = "rate_limited"
    REQUEST_TIMEOUT = "request_timeout"
    # Raised on the operator's side, never sent by the server: codes so every domain error has one.
    CONFIG = "config"
    ADMIN_CLIENT = "admin_client"
    LAUNCH_FAILED = "launch_failed"


class Signer(Protocol):
    """An Ed25519 private key, or anything that signs bytes the same way."""

    def sign(self, data: bytes) -> bytes: ...


def body_sha256(body: bytes) -> str:
    """The lowercase hex sha256 a signature covers."""
    return hashlib.sha256(body).hexdigest()


def signing_message(subject: str, method: str, path: str, timestamp: str, nonce: str, content_sha256: str) -> bytes:
    """The bytes a device signs and the server verifies; `path` includes the query exactly as sent."""
    return "\n".join((SIGNATURE_SCHEME, subject, method.upper(), path, timestamp, nonce, content_sha256)).encode()


def signature_headers(
    key: Signer, subject: str, method: str, path: str, content_sha256: str,
    timestamp: int | None = None, nonce: str | None = None,
) -> dict[str, str]:
    """Timestamp, nonce, signature and body-hash headers of one request, signed afresh (a nonce is single
    use). The device-id header is the caller's to add: a registration has none."""
    stamp = str(int(time.time()) if timestamp is None else timestamp)
    nonce = nonce or secrets.token_urlsafe(18)
    signature = base64.b64encode(key.sign(signing_message(subject, method, path, stamp, nonce, content_sha256))).decode()
    return {TIMESTAMP_HEADER: stamp, NONCE_HEADER: nonce, SIGNATURE_HEADER: signature, CONTENT_SHA256_HEADER: content_sha256}
