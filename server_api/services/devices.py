"""Device registration, enrollment, template access and unenrollment.

Registration may need a one-time enrollment token (``Settings.enrollment_token_required``): the
token is claimed in the same transaction that creates the device, so it is spent exactly when a
new device exists. Registering a key that is already registered needs no token.

Each call is one transaction, except registration: its proof of possession commits the nonce
first, so a registration refused afterwards (bad token, lost race) cannot be replayed.

Calls return the device row or a small result of their own; the routes build the responses.
"""
from __future__ import annotations

import hashlib
import secrets
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

import numpy as np
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from server_api.core.db import transaction
from server_api.core.logging import get_logger
from server_api.core.security import parse_public_key
from server_api.crud import audit
from server_api.crud import devices as device_crud
from server_api.crud import versions as version_crud
from server_api.errors import AuthenticationFailed, Conflict, Forbidden, NotFound
from server_api.services.auth import verify_registration
from server_api.services.context import ServerContext
from server_api.services.validation import check_enrollment_embedding
from server_api.tables import Device, utcnow

log = get_logger("devices")


@dataclass(frozen=True)
class Template:
    """A device's current class embedding, decrypted."""

    device_id: str
    embedding: list[float]
    round_id: int  # the round whose aggregation produced it; 0 = as enrolled


@dataclass(frozen=True)
class IssuedTokens:
    tokens: list[str]  # only their hashes are stored
    expires_at: datetime


@dataclass(frozen=True)
class Pruned:
    count: int
    registered_before: datetime


def register(
    ctx: ServerContext, session: Session, public_key_b64: str, headers: Mapping[str, str], method: str, path: str,
    body_sha256: str, enrollment_token: str | None = None,
) -> tuple[Device, bool]:
    """The device of this key, and whether this call created it."""
    public_key = parse_public_key(public_key_b64)
    with transaction(session):
        verify_registration(session, public_key, headers, method, path, body_sha256, ctx.settings.signature_window_s)
    try:
        with transaction(session):
            known = device_crud.find_device_by_key(session, public_key)
            if known is not None:
                return known, False
            if ctx.settings.enrollment_token_required():
                _claim_token(session, enrollment_token)
            device = device_crud.add_device(session, public_key)  # committed with the claimed token
            audit.record(session, f"device:{device.id}", "device.registered", device_id=device.id)
    except IntegrityError:  # the same key registered concurrently: that row wins, and the token stays unused
        existing = device_crud.find_device_by_key(session, public_key)
        assert existing is not None
        return existing, False
    log.info("device registered", extra={"fields": {"device_id": device.id}})
    return device, True


def _claim_token(session: Session, enrollment_token: str | None) -> None:
    if not enrollment_token:
        raise AuthenticationFailed("this server registers devices only with an enrollment token from its operator")
    if not device_crud.claim_enrollment_token(session, _token_hash(enrollment_token), utcnow()):
        raise AuthenticationFailed("enrollment token is unknown, already used or expired")


def _own(device: Device, device_id: str) -> None:
    # Templates are biometric: a device may only ever touch its own.
    if device.id != device_id:
        raise Forbidden("a device may only access its own record")


def enroll(ctx: ServerContext, session: Session, device: Device, device_id: str, values: list[float]) -> Device:
    _own(device, device_id)
    try:
        with transaction(session):
            version = version_crud.current_version(session)
            assert version is not None
            vector = check_enrollment_embedding(values, version.embedding_dim)
            if device_crud.get_enrollment(session, device.id) is not None:
                raise Conflict(f"device {device.id} is already enrolled; its embedding now changes only through rounds")
            device_crud.add_enrollment(session, device.id, ctx.cipher.encrypt(vector.astype("<f4").tobytes(), device.id, "enrollment"))
            device.status = "active"
            audit.record(session, f"device:{device.id}", "device.enrolled", device_id=device.id)
    except IntegrityError:  # enrolled concurrently
        raise Conflict(f"device {device.id} is already enrolled") from None
    log.info("device enrolled", extra={"fields": {"device_id": device.id}})
    return device


def embedding(ctx: ServerContext, session: Session, device: Device, device_id: str) -> Template:
    _own(device, device_id)
    enrollment = device_crud.get_enrollment(session, device.id)
    if enrollment is None:
        raise NotFound(f"device {device.id} is not enrolled")
    vector = np.frombuffer(ctx.cipher.decrypt(enrollment.ciphertext, device.id, "enrollment"), dtype="<f4")
    return Template(device.id, [float(x) for x in vector], enrollment.round_id)


def unenroll(session: Session, device: Device, device_id: str) -> None:
    """Delete the template and every uploaded copy of it; the device may enroll again later."""
    _own(device, device_id)
    with transaction(session):
        device_crud.delete_templates(session, device.id)
        device.status = "unenrolled"
        audit.record(session, f"device:{device.id}", "device.unenrolled", device_id=device.id)
    log.info("device unenrolled", extra={"fields": {"device_id": device.id}})


def _token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def issue_enrollment_tokens(
    ctx: ServerContext, session: Session, count: int, ttl_s: int | None,
) -> IssuedTokens:
    """``count`` new one-time tokens; only their hashes are kept, so this is the one time they are shown."""
    # Hex, not URL-safe base64: an operator passes a token as `--enrollment-token TOKEN`, and one that began
    # with "-" (1 in 64 base64 tokens) would be read by the command line as an option.
    tokens = [secrets.token_hex(24) for _ in range(count)]
    expires_at = utcnow() + timedelta(seconds=ttl_s or ctx.settings.enrollment_token_ttl_s)
    with transaction(session):
        device_crud.add_enrollment_tokens(session, [_token_hash(t) for t in tokens], expires_at)
        audit.record(session, "admin", "enrollment_tokens.issued", count=count)
    log.info("enrollment tokens issued", extra={"fields": {"count": count}})
    return IssuedTokens(tokens, expires_at)


def prune_never_enrolled(ctx: ServerContext, session: Session, older_than_s: int | None) -> Pruned:
    """Delete devices that registered at least ``older_than_s`` ago (default
    FEDFACE_PRUNE_UNENROLLED_AFTER_S) and never enrolled a template."""
    age_s = ctx.settings.prune_unenrolled_after_s if older_than_s is None else older_than_s
    cutoff = utcnow() - timedelta(seconds=age_s)
    with transaction(session):
        pruned = device_crud.delete_never_enrolled(session, cutoff)
        audit.record(session, "admin", "devices.pruned", count=pruned, registered_before=cutoff.isoformat())
    log.info("never-enrolled devices pruned", extra={"fields": {"count": pruned}})
    return Pruned(pruned, cutoff)
