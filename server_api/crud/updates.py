"""Accepted updates and the idempotency records that replay their responses: queries only; the
caller owns the transaction (services.uploads decides what may be recorded).

Core statements, not ORM objects, on the upload path: on SQLite its transaction holds the only
connection, so its Python time is every upload's queueing time."""
from __future__ import annotations

from datetime import datetime
from typing import Any, NamedTuple, cast

from sqlalchemy import CursorResult, insert, select, update
from sqlalchemy.orm import Session

from facecore.federation.status import ACTIVE_ROUND_STATUSES, ParticipationStatus
from server_api.tables import Device, Enrollment, IdempotencyRecord, Participation, Round, Update, table_of


class Replay(NamedTuple):
    """What an Idempotency-Key already answered."""

    request_sha256: str
    status_code: int
    response: dict[str, Any]


def get_idempotency(session: Session, device_id: str, key: str) -> Replay | None:
    row = session.execute(
        select(IdempotencyRecord.request_sha256, IdempotencyRecord.status_code, IdempotencyRecord.response)
        .where(IdempotencyRecord.device_id == device_id, IdempotencyRecord.key == key)
    ).one_or_none()
    return None if row is None else Replay(*row)


class RoundState(NamedTuple):
    """What an upload is checked against, read with the round row locked."""

    status: str
    deadline_at: datetime
    target_participants: int


def locked_round_state(session: Session, round_id: int) -> RoundState | None:
    """The round's state, its row locked until the caller's transaction ends."""
    row = session.execute(
        select(Round.status, Round.deadline_at, Round.target_participants).where(Round.id == round_id).with_for_update()
    ).one_or_none()
    return None if row is None else RoundState(*row)


def upload_standing(session: Session, round_id: int, device_id: str) -> tuple[str | None, bool]:
    """(the device's participation status in the round or None, whether it is enrolled): one query."""
    row = session.execute(
        select(Participation.status, Enrollment.device_id)
        .select_from(Device).outerjoin(Participation, (Participation.device_id == Device.id) & (Participation.round_id == round_id))
        .outerjoin(Enrollment, Enrollment.device_id == Device.id).where(Device.id == device_id)
    ).one_or_none()
    return (None, False) if row is None else (row[0], row[1] is not None)


def mark_uploaded(session: Session, round_id: int, device_id: str) -> bool:
    """Selected and enrolled -> uploaded, in one conditional UPDATE; False when it matched no row."""
    enrolled = select(Enrollment.device_id).where(Enrollment.device_id == device_id).exists()
    marked = cast(CursorResult[Any], session.execute(
        update(table_of(Participation))
        .where(Participation.round_id == round_id, Participation.device_id == device_id,
               Participation.status == ParticipationStatus.SELECTED, enrolled)
        .values(status=ParticipationStatus.UPLOADED)
    )).rowcount
    return marked == 1


def insert_update(
    session: Session, *, round_id: int, device_id: str, blob_sha256: str, size_bytes: int, n_samples: int,
    metrics: dict[str, float], embedding_ciphertext: bytes, created_at: datetime,
) -> int:
    """One INSERT executed now; the new update's id."""
    inserted = cast(CursorResult[Any], session.execute(insert(table_of(Update)).values(
        round_id=round_id, device_id=device_id, blob_sha256=blob_sha256, size_bytes=size_bytes,
        n_samples=n_samples, metrics=metrics, embedding_ciphertext=embedding_ciphertext, created_at=created_at,
    )))
    primary_key = inserted.inserted_primary_key
    assert primary_key is not None  # a one-row INSERT has its primary key
    return int(primary_key[0])


def insert_idempotency(
    session: Session, device_id: str, key: str, request_sha256: str, status_code: int, response: dict[str, Any], created_at: datetime,
) -> None:
    """The response an Idempotency-Key answered; (device, key) is unique, so a duplicate fails the INSERT."""
    session.execute(insert(table_of(IdempotencyRecord)).values(
        device_id=device_id, key=key, request_sha256=request_sha256, status_code=status_code, response=response, created_at=created_at,
    ))


def count_upload(session: Session, round_id: int) -> int:
    """Add one to the round's accepted updates (its row is locked by the caller); the new count."""
    return session.execute(
        update(table_of(Round)).where(Round.id == round_id).values(n_uploaded=Round.n_uploaded + 1).returning(Round.n_uploaded)
    ).scalar_one()


def round_updates(session: Session, round_id: int) -> list[Update]:
    return list(session.execute(select(Update).where(Update.round_id == round_id).order_by(Update.id)).scalars())


def round_uploaders(session: Session, round_id: int) -> list[str]:
    """The devices that have an update in the round."""
    return list(session.execute(select(Update.device_id).where(Update.round_id == round_id)).scalars())


def round_blob_digests(session: Session, round_id: int) -> list[str]:
    return list(session.execute(select(Update.blob_sha256).where(Update.round_id == round_id)).scalars())


def open_round_blob_digests(session: Session) -> list[str]:
    """Digests still needed: uploads to rounds that have not ended (a shared blob is kept)."""
    pending = select(Round.id).where(Round.status.in_(ACTIVE_ROUND_STATUSES))
    return list(session.execute(select(Update.blob_sha256).where(Update.round_id.in_(pending))).scalars())
