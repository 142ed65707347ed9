"""Accepted updates and the idempotency records that replay their responses."""
from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from server_api.core.db import lock_round
from server_api.crud import audit
from server_api.errors import Conflict, Forbidden, StaleRound
from server_api.models import Enrollment, IdempotencyRecord, Participation, Round, Update


def get_idempotency(session: Session, device_id: str, key: str) -> IdempotencyRecord | None:
    return session.execute(
        select(IdempotencyRecord).where(IdempotencyRecord.device_id == device_id, IdempotencyRecord.key == key)
    ).scalar_one_or_none()


def check_can_upload(session: Session, round_id: int, device_id: str, now: datetime) -> None:
    """Early, unlocked check so a stale upload is refused before it is parsed; record_update repeats it under the lock."""
    _check(session, round_id, device_id, now, locked=False)
    session.commit()  # ends the read transaction without expiring the caller's objects


def _check(session: Session, round_id: int, device_id: str, now: datetime, locked: bool) -> Participation:
    from server_api.crud.rounds import active_round, get_round

    round_ = lock_round(session, round_id) if locked else get_round(session, round_id)
    if round_ is None or round_.status != "open" or now >= round_.deadline_at:
        active = active_round(session)
        raise StaleRound(round_id, active.id if active else None, active.status if active else None)
    part = session.execute(
        select(Participation).where(Participation.round_id == round_id, Participation.device_id == device_id)
    ).scalar_one_or_none()
    if part is None or part.status not in ("selected", "uploaded"):
        raise Forbidden(f"device {device_id} was not selected for round {round_id}")
    if part.status == "uploaded":
        raise Conflict(f"device {device_id} already uploaded an update for round {round_id}")
    if session.get(Enrollment, device_id) is None:
        # An unenrolled device's new embedding would be a template we promised to delete.
        raise Conflict(f"device {device_id} is not enrolled")
    return part


def record_update(
    session: Session, *, round_id: int, device_id: str, blob_sha256: str, size_bytes: int, n_samples: int,
    metrics: dict[str, float], embedding_ciphertext: bytes, idempotency_key: str, request_sha256: str,
    response: Any, now: datetime, target: int | None = None,
) -> tuple[Update | None, IdempotencyRecord, bool]:
    """Insert the update, mark the participation and store the idempotent response, atomically.

    Returns (update, record, due): due when this update reached the round's target, so the
    caller starts aggregation only then (the scheduler handles deadlines). `target` overrides
    the round's (secure aggregation: the number of devices that shared keys). (None, existing
    record, False) when a concurrent duplicate with the same key won."""
    try:
        part = _check(session, round_id, device_id, now, locked=True)
    except Exception:
        session.rollback()
        raise
    update = Update(
        round_id=round_id, device_id=device_id, blob_sha256=blob_sha256, size_bytes=size_bytes,
        n_samples=n_samples, metrics=metrics, embedding_ciphertext=embedding_ciphertext, created_at=now,
    )
    session.add(update)
    part.status = "uploaded"
    session.flush()
    body = response(update)
    record = IdempotencyRecord(device_id=device_id, key=idempotency_key, request_sha256=request_sha256, status_code=201, response=body)
    session.add(record)
    uploaded = session.scalar(
        select(func.count()).select_from(Participation).where(Participation.round_id == round_id, Participation.status == "uploaded")
    )
    round_ = session.get(Round, round_id)  # locked by _check, already in the identity map
    due = round_ is not None and (uploaded or 0) >= (target if target is not None else round_.target_participants)
    audit.record(session, f"device:{device_id}", "update.accepted", round_id=round_id, device_id=device_id, n_samples=n_samples, bytes=size_bytes)
    try:
        session.commit()
    except IntegrityError:
        session.rollback()
        existing = get_idempotency(session, device_id, idempotency_key)
        if existing is None:
            raise Conflict(f"device {device_id} already uploaded an update for round {round_id}") from None
        return None, existing, False
    return update, record, due


def round_updates(session: Session, round_id: int) -> list[Update]:
    return list(session.execute(select(Update).where(Update.round_id == round_id).order_by(Update.id)).scalars())


def round_blob_digests(session: Session, round_id: int) -> list[str]:
    return list(session.execute(select(Update.blob_sha256).where(Update.round_id == round_id)).scalars())


def open_round_blob_digests(session: Session) -> list[str]:
    """Digests still needed: uploads to rounds that have not ended (a shared blob is kept)."""
    pending = select(Round.id).where(Round.status.in_(("open", "unmasking", "aggregating")))
    return list(session.execute(select(Update.blob_sha256).where(Update.round_id.in_(pending))).scalars())
