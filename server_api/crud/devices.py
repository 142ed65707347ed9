"""Devices, their encrypted class embeddings, and signature nonces."""
from __future__ import annotations

import secrets
from datetime import datetime, timedelta

from sqlalchemy import delete, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from server_api.crud import audit
from server_api.errors import AuthenticationFailed, Conflict
from server_api.models import Device, Enrollment, Nonce, Update, utcnow


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
        session.execute(insert(Nonce.__table__).values(subject=subject, nonce=nonce))
        if commit:
            session.commit()
    except IntegrityError:
        session.rollback()
        raise AuthenticationFailed("nonce already used (replayed request)") from None


def prune_nonces(session: Session, older_than: datetime) -> int:
    # Safe: a request that old is rejected by its timestamp before its nonce is looked at.
    count = session.execute(delete(Nonce).where(Nonce.created_at < older_than)).rowcount
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
