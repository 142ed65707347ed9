"""Devices, their encrypted class embeddings, enrollment tokens and signature nonces: queries
only; the caller owns the transaction (services.devices, services.device_admin, services.auth)."""
from __future__ import annotations

import secrets
from datetime import datetime
from typing import Any, cast

from sqlalchemy import CursorResult, delete, func, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from server_api.errors import AuthenticationFailed
from server_api.tables import Device, Enrollment, EnrollmentToken, Nonce, Update, table_of


def get_device(session: Session, device_id: str) -> Device | None:
    return session.get(Device, device_id)


def find_device_by_key(session: Session, public_key: bytes) -> Device | None:
    return session.execute(select(Device).where(Device.public_key == public_key)).scalar_one_or_none()


def add_device(session: Session, public_key: bytes) -> Device:
    """A new device with a random id. The public key is unique: a concurrent registration of the
    same key makes the commit fail with IntegrityError."""
    device = Device(id=secrets.token_hex(16), public_key=public_key)
    session.add(device)
    return device


def consume_nonce(session: Session, subject: str, nonce: str) -> None:
    """Record a used nonce; a replay violates the unique key when the INSERT runs, and the caller's
    transaction, which that failure spoils, must then roll back."""
    try:
        session.execute(insert(table_of(Nonce)).values(subject=subject, nonce=nonce))
    except IntegrityError:
        raise AuthenticationFailed("nonce already used (replayed request)") from None


def prune_nonces(session: Session, older_than: datetime) -> int:
    count = cast(CursorResult[Any], session.execute(delete(Nonce).where(Nonce.created_at < older_than))).rowcount
    return count or 0


def get_enrollment(session: Session, device_id: str) -> Enrollment | None:
    return session.get(Enrollment, device_id)


def add_enrollment(session: Session, device_id: str, ciphertext: bytes) -> Enrollment:
    """The device's template as enrolled (round 0). One per device: a second one fails the commit."""
    enrollment = Enrollment(device_id=device_id, ciphertext=ciphertext, round_id=0)
    session.add(enrollment)
    return enrollment


def active_enrollments(session: Session) -> list[Enrollment]:
    """The templates of active devices (unenrolled and removed ones hold none), by device id."""
    return list(session.execute(
        select(Enrollment).join(Device, Device.id == Enrollment.device_id)
        .where(Device.status == "active").order_by(Enrollment.device_id)
    ).scalars())


def delete_templates(session: Session, device_id: str) -> bool:
    """Delete the device's enrollment and every uploaded copy of its template (the updates' rows
    stay). Returns whether an enrollment was deleted."""
    deleted = cast(CursorResult[Any], session.execute(delete(Enrollment).where(Enrollment.device_id == device_id))).rowcount
    session.execute(update(Update).where(Update.device_id == device_id).values(embedding_ciphertext=None))
    return bool(deleted)


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


def add_enrollment_tokens(session: Session, token_hashes: list[str], expires_at: datetime) -> None:
    session.add_all(EnrollmentToken(token_sha256=digest, expires_at=expires_at) for digest in token_hashes)


def claim_enrollment_token(session: Session, token_sha256: str, now: datetime) -> bool:
    """Mark an unused, unexpired token used; False if there is no such token. The caller commits
    it with the device it registers, so a failed registration leaves it unused."""
    claimed = cast(CursorResult[Any], session.execute(
        update(EnrollmentToken)
        .where(EnrollmentToken.token_sha256 == token_sha256, EnrollmentToken.used_at.is_(None))
        .where(EnrollmentToken.expires_at > now)
        .values(used_at=now)
    )).rowcount
    return claimed == 1


def delete_never_enrolled(session: Session, registered_before: datetime) -> int:
    """Delete devices registered before the cutoff that never enrolled (status still ``active``
    with no template: an unenrolled or removed device keeps its row for past rounds); how many."""
    stale = select(Device.id).where(
        Device.status == "active", Device.created_at < registered_before,
        ~select(Enrollment.device_id).where(Enrollment.device_id == Device.id).exists(),
    )
    return cast(CursorResult[Any], session.execute(delete(Device).where(Device.id.in_(stale)))).rowcount or 0
