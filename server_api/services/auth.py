"""Who is calling: Ed25519-signed device requests (the scheme: facecore.federation.protocol).

A checked request uses up its nonce in the caller's transaction. :func:`authenticate_request`
is that check as a transaction of its own, committed before the route's work: the nonce is spent
whatever the request does next, so a request refused later cannot be replayed either."""
from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy.orm import Session

from facecore.federation.protocol import (
    CONTENT_SHA256_HEADER,
    DEVICE_ID_HEADER,
    NONCE_HEADER,
    REGISTER_SUBJECT,
    SIGNATURE_HEADER,
    TIMESTAMP_HEADER,
    signing_message,
)
from server_api.core.db import transaction
from server_api.core.security import check_nonce_format, check_timestamp, verify_signature
from server_api.crud import devices as device_crud
from server_api.errors import AuthenticationFailed
from server_api.tables import Device, utcnow

# Lowercase, as ASGI delivers them: a plain mapping from a test works like Starlette's case-blind Headers.
_DEVICE_ID, _TIMESTAMP, _NONCE, _SIGNATURE, _CONTENT_SHA256 = (
    h.lower() for h in (DEVICE_ID_HEADER, TIMESTAMP_HEADER, NONCE_HEADER, SIGNATURE_HEADER, CONTENT_SHA256_HEADER)
)
_HEX_SHA256 = re.compile(r"^[0-9a-f]{64}$")


def _signed_headers(headers: Mapping[str, str], window_s: int) -> tuple[str, str, str]:
    timestamp, nonce, signature = headers.get(_TIMESTAMP), headers.get(_NONCE), headers.get(_SIGNATURE)
    if not (timestamp and nonce and signature):
        raise AuthenticationFailed("signed request needs X-Timestamp, X-Nonce and X-Signature headers")
    check_timestamp(timestamp, time.time(), window_s)
    check_nonce_format(nonce)
    return timestamp, nonce, signature


@dataclass(frozen=True)
class SignedRequest:
    """A device request as its signature covers it: signature headers, method, path and query, body hash."""

    headers: Mapping[str, str]
    method: str
    path: str
    body_sha256: str


def authenticate_request(session: Session, request: SignedRequest, window_s: int) -> Device:
    """:func:`authenticate_device` in a transaction of its own, committed before the caller goes on."""
    with transaction(session):
        return authenticate_device(session, request, window_s)


def authenticate_device(session: Session, request: SignedRequest, window_s: int) -> Device:
    """The signing device, its nonce used up in the caller's transaction (final when that commits)."""
    device_id = request.headers.get(_DEVICE_ID)
    if not device_id:
        raise AuthenticationFailed("missing X-Device-Id header")
    timestamp, nonce, signature = _signed_headers(request.headers, window_s)
    device = device_crud.get_device(session, device_id[:64])
    if device is None:
        raise AuthenticationFailed("unknown device")
    message = signing_message(device.id, request.method, request.path, timestamp, nonce, request.body_sha256)
    verify_signature(device.public_key, signature, message)
    # Only after the signature: a forged request must not burn a real device's nonce.
    device_crud.consume_nonce(session, device.id, nonce)
    return device


def verify_registration(
    session: Session, public_key: bytes, headers: Mapping[str, str], method: str, path: str, body_sha256: str, window_s: int
) -> None:
    """Proof of possession: the registration request is signed by the key it registers; its nonce
    is used up in the caller's transaction."""
    timestamp, nonce, signature = _signed_headers(headers, window_s)
    verify_signature(public_key, signature, signing_message(REGISTER_SUBJECT, method, path, timestamp, nonce, body_sha256))
    device_crud.consume_nonce(session, "key:" + hashlib.sha256(public_key).hexdigest()[:56], nonce)


def precheck_device_headers(headers: Mapping[str, str], window_s: int) -> None:
    """Cheap checks before a large body is read: headers present, clock within the window."""
    if not headers.get(_DEVICE_ID):
        raise AuthenticationFailed("missing X-Device-Id header")
    _signed_headers(headers, window_s)


def signed_upload(headers: Mapping[str, str], method: str, path: str, window_s: int) -> SignedRequest:
    """An upload as its signature covers it, before its body is read: the body hash is the one the
    device declares in ``X-Content-SHA256``, so the signature can be checked first and the body
    compared with it as it arrives."""
    precheck_device_headers(headers, window_s)
    declared = headers.get(_CONTENT_SHA256, "")
    if not _HEX_SHA256.match(declared):
        raise AuthenticationFailed("an upload needs X-Content-SHA256: the lowercase hex sha256 of its body, as signed")
    return SignedRequest(headers, method, path, declared)


def nonce_cutoff(window_s: int) -> datetime:
    """Nonces older than this may go: a request that old is refused by its timestamp before its nonce is looked at."""
    return utcnow() - timedelta(seconds=2 * window_s)
