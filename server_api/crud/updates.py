"""Accepted updates and the idempotency records that replay their responses."""
from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any, NamedTuple, cast

from sqlalchemy import CursorResult, func, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from facecore.federation.status import ACTIVE_ROUND_STATUSES, CHOSEN_STATUSES, ParticipationStatus, RoundStatus
from server_api.crud import audit
from server_api.errors import Conflict, DeviceNotEnrolled, Forbidden, StaleRound
from server_api.models import Device, Enrollment, IdempotencyRecord, Participation, Round, Update, table_of


class Replay(NamedTuple):
    """What an Idempotency-Key already answered."""

    request_sha256: str
    status_code: int
    response: dict[str, Any]


class Recorded(NamedTuple):
    """record_update's outcome: the response to send, whether this request created the update,
    and whether it reached the round's target (the caller then starts aggregation)."""

    status_code: int
    response: dict[str, Any]
    created: bool
    due: bool


def get_idempotency(session: Session, device_id: str, key: str) -> Replay | None:
    row = session.execute(
        select(IdempotencyRecord.request_sha256, IdempotencyRecord.status_code, IdempotencyRecord.response)
        .where(IdempotencyRecord.device_id == device_id, IdempotencyRecord.key == key)
    ).one_or_none()
    return None if row is None else Replay(*row)


def check_can_upload(session: Session, round_: Round, device_id: str, now: datetime) -> None:
    """Early, unlocked check so a stale upload is refused before it is parsed; record_update repeats it under the lock."""
    _refuse_closed(session, round_.id, (round_.status, round_.deadline_at), now)
    problem = _participation_problem(session, round_.id, device_id)
    if problem is not None:
        raise problem


def _refuse_closed(session: Session, round_id: int, state: tuple[str, datetime] | None, now: datetime) -> None:
    from server_api.crud.rounds import active_round

    if state is None or state[0] != RoundStatus.OPEN or now >= state[1]:
        active = active_round(session)
        raise StaleRound(round_id, active.id if active else None, active.status if active else None)


def _participation_problem(session: Session, round_id: int, device_id: str) -> Exception | None:
    """Why this device may not upload to this round, or None: one query for its participation and enrollment."""
    row = session.execute(
        select(Participation.status, Enrollment.device_id)
        .select_from(Device).outerjoin(Participation, (Participation.device_id == Device.id) & (Participation.round_id == round_id))
        .outerjoin(Enrollment, Enrollment.device_id == Device.id).where(Device.id == device_id)
    ).one_or_none()
    status, enrolled = row if row is not None else (None, None)
    if status not in CHOSEN_STATUSES:
        return Forbidden(f"device {device_id} was not selected for round {round_id}")
    if status == ParticipationStatus.UPLOADED:
        return Conflict(f"device {device_id} already uploaded an update for round {round_id}")
    if enrolled is None:
        # An unenrolled device's new embedding would be a template we promised to delete.
        return DeviceNotEnrolled(f"device {device_id} is not enrolled")
    return None


def record_update(
    session: Session, *, round_id: int, device_id: str, blob_sha256: str, size_bytes: int, n_samples: int,
    metrics: dict[str, float], embedding_ciphertext: bytes, idempotency_key: str, request_sha256: str,
    response: Callable[[int], dict[str, Any]], now: datetime, target: int | None = None,
) -> Recorded:
    """Insert the update, mark the participation and store the idempotent response, atomically.

    ``response(update_id)`` builds the 201 body. `target` overrides the round's (secure
    aggregation: the number of devices that shared keys). A concurrent duplicate with the same
    Idempotency-Key gets the first request's response, created=False.

    Core statements, not ORM objects: on SQLite this transaction holds the only connection, so its
    Python time is every upload's queueing time (one conditional UPDATE replaces reading the
    participation and the enrollment and then writing the participation)."""
    try:
        state = session.execute(
            select(Round.status, Round.deadline_at, Round.target_participants).where(Round.id == round_id).with_for_update()
        ).one_or_none()
        _refuse_closed(session, round_id, None if state is None else (state.status, state.deadline_at), now)
        assert state is not None  # _refuse_closed raised for a round that is not there
        enrolled = select(Enrollment.device_id).where(Enrollment.device_id == device_id).exists()
        marked = cast(CursorResult[Any], session.execute(
            update(table_of(Participation))
            .where(Participation.round_id == round_id, Participation.device_id == device_id,
                   Participation.status == ParticipationStatus.SELECTED, enrolled)
            .values(status=ParticipationStatus.UPLOADED)
        )).rowcount
        if marked != 1:
            replay = get_idempotency(session, device_id, idempotency_key)  # the same request, sent twice at once
            if replay is not None and replay.request_sha256 == request_sha256:
                session.rollback()
                return Recorded(replay.status_code, replay.response, created=False, due=False)
            raise _participation_problem(session, round_id, device_id) or Conflict(f"device {device_id} cannot upload to round {round_id}")
    except Exception:
        session.rollback()
        raise
    inserted = cast(CursorResult[Any], session.execute(insert(table_of(Update)).values(
        round_id=round_id, device_id=device_id, blob_sha256=blob_sha256, size_bytes=size_bytes,
        n_samples=n_samples, metrics=metrics, embedding_ciphertext=embedding_ciphertext, created_at=now,
    )))
    primary_key = inserted.inserted_primary_key
    assert primary_key is not None  # a one-row INSERT has its primary key
    update_id = primary_key[0]
    body = response(update_id)
    session.execute(insert(table_of(IdempotencyRecord)).values(
        device_id=device_id, key=idempotency_key, request_sha256=request_sha256, status_code=201, response=body, created_at=now,
    ))
    uploaded = session.scalar(
        select(func.count()).select_from(Participation)
        .where(Participation.round_id == round_id, Participation.status == ParticipationStatus.UPLOADED)
    )
    due = (uploaded or 0) >= (target if target is not None else state.target_participants)
    audit.record_now(session, f"device:{device_id}", "update.accepted", round_id=round_id, device_id=device_id, n_samples=n_samples, bytes=size_bytes)
    try:
        session.commit()
    except IntegrityError:
        session.rollback()
        existing = get_idempotency(session, device_id, idempotency_key)
        if existing is None:
            raise Conflict(f"device {device_id} already uploaded an update for round {round_id}") from None
        return Recorded(existing.status_code, existing.response, created=False, due=False)
    return Recorded(201, body, created=True, due=due)


def round_updates(session: Session, round_id: int) -> list[Update]:
    return list(session.execute(select(Update).where(Update.round_id == round_id).order_by(Update.id)).scalars())


def round_blob_digests(session: Session, round_id: int) -> list[str]:
    return list(session.execute(select(Update.blob_sha256).where(Update.round_id == round_id)).scalars())


def open_round_blob_digests(session: Session) -> list[str]:
    """Digests still needed: uploads to rounds that have not ended (a shared blob is kept)."""
    pending = select(Round.id).where(Round.status.in_(ACTIVE_ROUND_STATUSES))
    return list(session.execute(select(Update.blob_sha256).where(Update.round_id.in_(pending))).scalars())
