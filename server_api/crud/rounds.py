"""Round and participation rows: queries only; the caller owns the transaction.

The round lifecycle (which transition happens when, and under which lock) is
services.rounds; nothing here commits, decides or changes a round's status.
"""
from __future__ import annotations

from datetime import datetime
from typing import Any, NamedTuple, cast

from sqlalchemy import CursorResult, func, select, update
from sqlalchemy.orm import Session

from facecore.federation.status import CHOSEN_STATUSES, ParticipationStatus, RoundStatus
from server_api.tables import Device, Enrollment, Participation, Round, Update, table_of


class RoundTally(NamedTuple):
    """A round's participations: every check-in, the selected (uploaded included), the uploaded."""

    checked_in: int
    selected: int
    uploaded: int


def get_round(session: Session, round_id: int) -> Round | None:
    return session.get(Round, round_id)


def active_round(session: Session) -> Round | None:
    return session.execute(select(Round).where(Round.active_slot == 1)).scalar_one_or_none()


def latest_round(session: Session) -> Round | None:
    return session.execute(select(Round).order_by(Round.id.desc()).limit(1)).scalar_one_or_none()


def list_rounds(session: Session, limit: int) -> list[Round]:
    return list(session.execute(select(Round).order_by(Round.id.desc()).limit(limit)).scalars())


def status_counts(session: Session) -> dict[str, int]:
    """How many rounds are in each status (a status no round has is absent)."""
    rows = session.execute(select(Round.status, func.count()).group_by(Round.status)).all()
    return {status: count for status, count in rows}


def active_round_id(session: Session) -> int | None:
    return session.execute(select(Round.id).where(Round.active_slot == 1)).scalar_one_or_none()


def completed_rounds(session: Session) -> list[Round]:
    return list(session.execute(select(Round).where(Round.status == RoundStatus.COMPLETED).order_by(Round.id)).scalars())


def participation_counts(session: Session, round_id: int) -> dict[str, int]:
    rows = session.execute(
        select(Participation.status, func.count()).where(Participation.round_id == round_id).group_by(Participation.status)
    ).all()
    return {status: count for status, count in rows}


def tally(session: Session, round_id: int) -> RoundTally:
    counts = participation_counts(session, round_id)
    return RoundTally(
        checked_in=sum(counts.values()), selected=sum(counts.get(status, 0) for status in CHOSEN_STATUSES),
        uploaded=counts.get(ParticipationStatus.UPLOADED, 0),
    )


def chosen_count(session: Session, round_id: int) -> int:
    """Participations holding a slot: selected, or selected and uploaded."""
    return tally(session, round_id).selected


def enrolled_count(session: Session) -> int:
    """Active devices with an enrolled owner: the population a DP round samples from."""
    return int(session.scalar(
        select(func.count()).select_from(Enrollment).join(Device, Device.id == Enrollment.device_id).where(Device.status == "active")
    ) or 0)


def add_round(session: Session, **columns: Any) -> Round:
    """Insert a round; flushed, so it has its id (and a second active round fails here, on the unique active slot)."""
    round_ = Round(**columns)
    session.add(round_)
    session.flush()
    return round_


def get_participation(session: Session, round_id: int, device_id: str) -> Participation | None:
    return session.execute(
        select(Participation).where(Participation.round_id == round_id, Participation.device_id == device_id)
    ).scalar_one_or_none()


def participation_status(session: Session, round_id: int, device_id: str) -> str | None:
    """The device's status in the round, or None; read from the database, never from a row this session holds."""
    return session.scalar(select(Participation.status).where(Participation.round_id == round_id, Participation.device_id == device_id))


def add_participation(session: Session, round_id: int, device_id: str, status: str) -> Participation:
    part = Participation(round_id=round_id, device_id=device_id, status=status)
    session.add(part)
    session.flush()
    return part


def candidates(session: Session, round_id: int) -> list[tuple[Participation, Device]]:
    """The round's participations still waiting for selection, each with its device."""
    rows = session.execute(
        select(Participation, Device).join(Device, Device.id == Participation.device_id)
        .where(Participation.round_id == round_id, Participation.status == ParticipationStatus.CANDIDATE)
    ).all()
    return [(part, device) for part, device in rows]


def drop_uploaded_templates(session: Session, round_id: int) -> None:
    """Forget the embeddings uploaded to a round (its updates' rows stay)."""
    session.execute(update(Update).where(Update.round_id == round_id).values(embedding_ciphertext=None))


def extend_lease(session: Session, round_id: int, until: datetime) -> bool:
    """Move an aggregating round's lease to ``until``; False when the round is no longer aggregating."""
    extended = session.execute(
        update(table_of(Round)).where(Round.id == round_id, Round.status == RoundStatus.AGGREGATING).values(lease_until=until)
    )
    return cast(CursorResult[Any], extended).rowcount == 1
