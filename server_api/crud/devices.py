"""Devices, their encrypted class embeddings, and signature nonces."""
from __future__ import annotations

import secrets
from datetime import datetime, timedelta
from typing import Any, cast

from sqlalchemy import CursorResult, delete, func, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from server_api.crud import audit
from server_api.errors import AuthenticationFailed, Conflict
from server_api.models import Device, Enrollment, EnrollmentToken, Nonce, Update, table_of, utcnow


def get_device(session: Session, device_id: str) -> Device | None:
    return session.get(Device, device_id)


def register_device(session: Session, public_key: bytes) -> tuple[Device, bool]:
    """The device for this key, created if new; the flag says whether it was created."""
    existing = session.execute(select(Device).where(Device.public_key == public_key)).scalar_one_or_none()
    if existing is not None:
        return existing, False
    device = Device(id=secrets.token_hex(16), public_key=public_key)
    session.add(device)
    audit.record(session, f"device:{device.id}", "device.registered", device_id=device.id)
    try:
        session.commit()
    except IntegrityError:  # the same key registered concurrently: that row wins
        session.rollback()
        return session.execute(select(Device).where(Device.public_key == public_key)).scalar_one(), False
    return device, True


def consume_nonce(session: Session, subject: str, nonce: str, commit: bool = True) -> None:
    """Record a used nonce; a replay violates the unique key when the INSERT runs. ``commit=False``
    leaves it in the caller's transaction, whose commit makes it final."""
    try:
        session.execute(insert(table_of(Nonce)).values(subject=subject, nonce=nonce))
        if commit:
            session.commit()
    except IntegrityError:
        session.rollback()
        raise AuthenticationFailed("nonce already used (replayed request)") from None


def prune_nonces(session: Session, older_than: datetime) -> int:
    # Safe: a request that old is rejected by its timestamp before its nonce is looked at.
    count = cast(CursorResult[Any], session.execute(delete(Nonce).where(Nonce.created_at < older_than))).rowcount
    session.commit()
    return count or 0


def get_enrollment(session: Session, device_id: str) -> Enrollment | None:
    return session.get(Enrollment, device_id)


def enroll(session: Session, device: Device, ciphertext: bytes) -> Enrollment:
    if session.get(Enrollment, device.id) is not None:
        raise Conflict(f"device {device.id} is already enrolled; its embedding now changes only through rounds")
    enrollment = Enrollment(device_id=device.id, ciphertext=ciphertext, round_id=0)
    session.add(enrollment)
    device.status = "active"
    audit.record(session, f"device:{device.id}", "device.enrolled", device_id=device.id)
    try:
        session.commit()
    except IntegrityError:
        session.rollback()
        raise Conflict(f"device {device.id} is already enrolled") from None
    return enrollment


def unenroll(session: Session, device: Device) -> None:
    """Delete the template and every uploaded copy of it; the device may enroll again later."""
    session.execute(delete(Enrollment).where(Enrollment.device_id == device.id))
    session.execute(update(Update).where(Update.device_id == device.id).values(embedding_ciphertext=None))
    device.status = "unenrolled"
    audit.record(session, f"device:{device.id}", "device.unenrolled", device_id=device.id)
    session.commit()


def nonce_cutoff(window_s: int) -> datetime:
    return utcnow() - timedelta(seconds=2 * window_s)


def list_devices(session: Session, limit: int, offset: int = 0) -> list[tuple[Device, bool]]:
    """Devices in registration order, each with whether it holds a template now."""
    enrolled = Enrollment.device_id.is_not(None)
    rows = session.execute(
        select(Device, enrolled).outerjoin(Enrollment, Enrollment.device_id == Device.id)
        .order_by(Device.created_at, Device.id).limit(limit).offset(offset)
    ).all()
    return [(device, bool(has_template)) for device, has_template in rows]


def device_counts(session: Session) -> dict[str, int]:
    """How many devices are in each status, and how many hold a template (``enrolled``)."""
    rows = session.execute(select(Device.status, func.count()).group_by(Device.status)).all()
    counts = {status: n for status, n in rows}
    counts["enrolled"] = session.execute(select(func.count()).select_from(Enrollment)).scalar_one()
    return counts


def remove_device(session: Session, device: Device) -> bool:
    """Erase the device's template and every uploaded copy of it, and revoke its key: the row stays
    (as ``removed``) so past rounds keep their participants, but its public key is replaced by random
    bytes nobody holds the private key of, so no request of that device authenticates again.
    Returns whether a template was deleted."""
    had_template = bool(cast(CursorResult[Any], session.execute(delete(Enrollment).where(Enrollment.device_id == device.id))).rowcount)
    session.execute(update(Update).where(Update.device_id == device.id).values(embedding_ciphertext=None))
    device.public_key = secrets.token_bytes(32)
    device.status = "removed"
    audit.record(session, "admin", "device.removed", device_id=device.id, template_deleted=had_template)
    session.commit()
    return had_template


def find_device_by_key(session: Session, public_key: bytes) -> Device | None:
    return session.execute(select(Device).where(Device.public_key == public_key)).scalar_one_or_none()


def add_enrollment_tokens(session: Session, token_hashes: list[str], expires_at: datetime) -> None:
    session.add_all(EnrollmentToken(token_sha256=digest, expires_at=expires_at) for digest in token_hashes)
    audit.record(session, "admin", "enrollment_tokens.issued", count=len(token_hashes))
    session.commit()


def claim_enrollment_token(session: Session, token_sha256: str, now: datetime) -> bool:
    """Mark an unused, unexpired token used, in the caller's transaction (committed with the device
    it registers, so a failed registration leaves it unused); False if there is no such token."""
    claimed = cast(CursorResult[Any], session.execute(
        update(EnrollmentToken)
        .where(EnrollmentToken.token_sha256 == token_sha256, EnrollmentToken.used_at.is_(None))
        .where(EnrollmentToken.expires_at > now)
        .values(used_at=now)
    )).rowcount
    return claimed == 1


def prune_never_enrolled(session: Session, registered_before: datetime) -> int:
    """Delete devices registered before the cutoff that never enrolled (status still ``active``
    with no template: an unenrolled or removed device keeps its row for past rounds)."""
    stale = select(Device.id).where(
        Device.status == "active", Device.created_at < registered_before,
        ~select(Enrollment.device_id).where(Enrollment.device_id == Device.id).exists(),
    )
    pruned = cast(CursorResult[Any], session.execute(delete(Device).where(Device.id.in_(stale)))).rowcount or 0
    audit.record(session, "admin", "devices.pruned", count=pruned, registered_before=registered_before.isoformat())
    session.commit()
    return pruned
