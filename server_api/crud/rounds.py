"""Round lifecycle: open -> (selection) -> [unmasking ->] aggregating -> completed | failed.

``unmasking`` only happens in secure-aggregation rounds (services.secure_aggregation).

Selection fills the target slots least-recently-selected first, except in DP-FedAvg rounds: there
every enrolled device is in the round's Poisson sample with probability q = target / enrolled,
independently (strategies.dp_fedavg.poisson_selected), which is what the privacy accountant
assumes. q and the enrolled count are stored on the round when selection runs.

Every transition happens with the round row locked (:func:`lock_round`), so two
workers, the scheduler and the upload that reaches the target can all try the same
transition and exactly one of them makes it. When a round is due for aggregation is decided
by services.aggregation.claim_for_aggregation (secure aggregation's steps included), which
holds the lock and calls the writes here; crud never imports services.
"""
from __future__ import annotations

import os
import random
from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from facecore.federation.status import CHOSEN_STATUSES, ParticipationStatus, RoundStatus
from server_api.core.db import lock_round
from server_api.crud import audit
from server_api.crud.versions import VersionFiles, get_by_hash, new_version_row
from server_api.errors import Conflict, DeviceNotEnrolled, NotFound, StaleRound
from server_api.models import Device, Enrollment, ModelVersion, Participation, Round, Update
from server_api.schemas import RoundCreate, RoundPublic
from server_api.strategies.dp_fedavg import poisson_selected, sample_rate_for

_rng = random.SystemRandom()
# (session, the locked round, now) -> whether its secure-aggregation members are fixed, so a late
# candidate is not selected; False for a plain round (services.secure_aggregation.members_fixed).
MembersFixed = Callable[[Session, Round, datetime], bool]


def get_round(session: Session, round_id: int) -> Round | None:
    return session.get(Round, round_id)


def active_round(session: Session) -> Round | None:
    return session.execute(select(Round).where(Round.active_slot == 1)).scalar_one_or_none()


def latest_round(session: Session) -> Round | None:
    return session.execute(select(Round).order_by(Round.id.desc()).limit(1)).scalar_one_or_none()


def list_rounds(session: Session, limit: int) -> list[Round]:
    return list(session.execute(select(Round).order_by(Round.id.desc()).limit(limit)).scalars())


def completed_rounds(session: Session) -> list[Round]:
    return list(session.execute(select(Round).where(Round.status == RoundStatus.COMPLETED).order_by(Round.id)).scalars())


def participation_counts(session: Session, round_id: int) -> dict[str, int]:
    rows = session.execute(
        select(Participation.status, func.count()).where(Participation.round_id == round_id).group_by(Participation.status)
    ).all()
    return {status: count for status, count in rows}


def open_round(session: Session, config: RoundCreate, base: ModelVersion, now: datetime) -> Round:
    current = active_round(session)
    if current is not None:
        session.rollback()
        raise Conflict(f"round {current.id} is still {current.status}; wait for it to finish")
    round_ = Round(
        status=RoundStatus.OPEN, active_slot=1, config=config.model_dump(mode="json"), strategy=config.strategy,
        target_participants=config.target_participants, min_participants=config.min_participants,
        base_version_id=base.id, selection_at=now + timedelta(seconds=config.selection_window_s),
        deadline_at=now + timedelta(seconds=config.deadline_s),
    )
    session.add(round_)
    session.flush()
    audit.record(session, "admin", "round.opened", round_id=round_.id, target=config.target_participants, min=config.min_participants)
    try:
        session.commit()
    except IntegrityError:  # another worker opened one between our check and insert
        session.rollback()
        raise Conflict("another round was opened concurrently") from None
    return round_


def checkin(session: Session, device: Device, now: datetime, members_fixed: MembersFixed) -> tuple[Round, Participation]:
    active = active_round(session)
    if active is None:
        session.rollback()
        raise StaleRound(None, None)
    round_ = lock_round(session, active.id)
    if round_.status != RoundStatus.OPEN or now >= round_.deadline_at:
        session.rollback()
        raise StaleRound(round_.id, round_.id, "deadline passed" if round_.status == RoundStatus.OPEN else round_.status)
    if session.get(Enrollment, device.id) is None:
        session.rollback()
        raise DeviceNotEnrolled(f"device {device.id} is not enrolled; enroll a class embedding before checking in")
    part = session.execute(
        select(Participation).where(Participation.round_id == round_.id, Participation.device_id == device.id)
    ).scalar_one_or_none()
    if part is None:
        part = Participation(round_id=round_.id, device_id=device.id, status=ParticipationStatus.CANDIDATE)
        session.add(part)
        session.flush()
    if now >= round_.selection_at:
        if not round_.selection_done:
            _select(session, round_)
        elif part.status == ParticipationStatus.CANDIDATE and members_fixed(session, round_, now):
            part.status = ParticipationStatus.NOT_SELECTED  # the members are fixed: keys are being agreed among them
        elif part.status == ParticipationStatus.CANDIDATE and round_.sample_rate is not None:
            part.status = ParticipationStatus.SELECTED if _in_sample(round_, device.id) else ParticipationStatus.NOT_SELECTED
            if part.status == ParticipationStatus.SELECTED:
                session.get(Device, device.id).last_selected_round = round_.id  # type: ignore[union-attr]
        elif part.status == ParticipationStatus.CANDIDATE:
            # After the window, free slots go to whoever comes first.
            taken = _taken(session, round_.id)
            part.status = ParticipationStatus.SELECTED if taken < round_.target_participants else ParticipationStatus.NOT_SELECTED
            if part.status == ParticipationStatus.SELECTED:
                session.get(Device, device.id).last_selected_round = round_.id  # type: ignore[union-attr]
    session.commit()
    return round_, part


def run_selection_if_due(session: Session, round_id: int, now: datetime) -> bool:
    round_ = lock_round(session, round_id)
    if round_ is None or round_.status != RoundStatus.OPEN or round_.selection_done or now < round_.selection_at:
        session.rollback()
        return False
    _select(session, round_)
    session.commit()
    return True


def _taken(session: Session, round_id: int) -> int:
    counts = participation_counts(session, round_id)
    return sum(counts.get(status, 0) for status in CHOSEN_STATUSES)


def _select(session: Session, round_: Round) -> None:
    """Fill the free slots from this round's candidates, least recently selected first
    (never-selected devices before all others), ties broken at random; in a DP round, take
    exactly the candidates in the round's Poisson sample."""
    rows = session.execute(
        select(Participation, Device).join(Device, Device.id == Participation.device_id)
        .where(Participation.round_id == round_.id, Participation.status == ParticipationStatus.CANDIDATE)
    ).all()
    if _uses_dp(round_):
        round_.population = enrolled_count(session)
        round_.sample_rate = sample_rate_for(round_.target_participants, max(round_.population, 1))
        round_.sampling_key = os.urandom(32)
        chosen = [row for row in rows if _in_sample(round_, row[1].id)]
    else:
        free = round_.target_participants - _taken(session, round_.id)
        ordered = sorted(rows, key=lambda row: (-1 if row[1].last_selected_round is None else row[1].last_selected_round, _rng.random()))
        chosen = ordered[:max(free, 0)]
    chosen_ids = {device.id for _, device in chosen}
    for part, device in rows:
        part.status = ParticipationStatus.SELECTED if device.id in chosen_ids else ParticipationStatus.NOT_SELECTED
        if device.id in chosen_ids:
            device.last_selected_round = round_.id
    round_.selection_done = True
    audit.record(session, "server", "round.selected", round_id=round_.id, candidates=len(rows), selected=len(chosen),
                 sample_rate=round_.sample_rate)


def _uses_dp(round_: Round) -> bool:
    return (round_.config.get("aggregation") or {}).get("method") == "dp_fedavg"


def _in_sample(round_: Round, device_id: str) -> bool:
    assert round_.sampling_key is not None and round_.sample_rate is not None
    return poisson_selected(round_.sampling_key, device_id, round_.sample_rate)


def enrolled_count(session: Session) -> int:
    """Active devices with an enrolled owner: the population a DP round samples from."""
    return int(session.scalar(
        select(func.count()).select_from(Enrollment).join(Device, Device.id == Enrollment.device_id).where(Device.status == "active")
    ) or 0)


def close_now(session: Session, round_id: int, now: datetime) -> Round:
    """Bring an open round's deadline forward to `now`: it then aggregates with the updates it
    has if they meet its minimum, else fails, exactly as at its deadline. Uploads after this get 409."""
    round_ = lock_round(session, round_id)
    if round_ is None:
        session.rollback()
        raise NotFound(f"round {round_id} does not exist")
    if round_.status != RoundStatus.OPEN:
        session.rollback()
        raise Conflict(f"round {round_id} is {round_.status}, only an open round can be closed")
    round_.deadline_at = min(round_.deadline_at, now)
    audit.record(session, "admin", "round.closed_early", round_id=round_id)
    session.commit()
    return round_


def resume_aggregation(session: Session, round_: Round, now: datetime, lease_s: float) -> None:
    """Retake a round stuck in ``aggregating`` whose lease ran out (the caller holds its lock)."""
    round_.lease_until = now + timedelta(seconds=lease_s)
    audit.record(session, "server", "round.aggregation_resumed", round_id=round_.id)
    session.commit()


def start_aggregating(session: Session, round_: Round, uploaded: int, now: datetime, lease_s: float) -> None:
    round_.status = RoundStatus.AGGREGATING
    round_.lease_until = now + timedelta(seconds=lease_s)
    audit.record(session, "server", "round.aggregating", round_id=round_.id, updates=uploaded)
    session.commit()


def start_unmasking(session: Session, round_: Round, uploaded: int, unmask_deadline: datetime) -> None:
    round_.status, round_.unmask_deadline_at = RoundStatus.UNMASKING, unmask_deadline
    audit.record(session, "server", "round.unmasking", round_id=round_.id, updates=uploaded)
    session.commit()


def fail_round(session: Session, round_: Round, now: datetime, reason: str) -> None:
    round_.status, round_.active_slot, round_.closed_at = RoundStatus.FAILED, None, now
    round_.failure_reason = reason[:500]
    session.execute(update(Update).where(Update.round_id == round_.id).values(embedding_ciphertext=None))
    audit.record(session, "server", "round.failed", round_id=round_.id, reason=round_.failure_reason)
    session.commit()


def fail_aggregation(session: Session, round_id: int, now: datetime, reason: str) -> bool:
    """End a claimed round whose inputs cannot be aggregated (secure aggregation could not unmask)."""
    round_ = lock_round(session, round_id)
    if round_ is None or round_.status != RoundStatus.AGGREGATING:
        session.rollback()
        return False
    fail_round(session, round_, now, reason)
    return True


def finalize(
    session: Session, round_id: int, blobs: VersionFiles, embeddings: dict[str, tuple[bytes, datetime]], summary: dict[str, Any], now: datetime,
) -> bool:
    """Commit a computed aggregation: version row, new embeddings and the round's end, in
    one transaction. ``embeddings`` maps device id -> (ciphertext, enrollment.updated_at
    seen when W was built); a template changed since (unenrolled, re-enrolled) is left alone."""
    round_ = lock_round(session, round_id)
    if round_ is None or round_.status != RoundStatus.AGGREGATING:
        session.rollback()
        return False
    version = get_by_hash(session, blobs.version_hash)
    if version is None:  # identical weights (all-zero deltas) reuse the existing row
        version = new_version_row(blobs, round_id)
        session.add(version)
        session.flush()
    for device_id, (ciphertext, seen_at) in embeddings.items():
        enrollment = session.get(Enrollment, device_id)
        if enrollment is not None and enrollment.updated_at == seen_at:
            enrollment.ciphertext, enrollment.round_id, enrollment.updated_at = ciphertext, round_id, now
    # The uploaded templates were only needed to build W: do not keep extra copies.
    session.execute(update(Update).where(Update.round_id == round_id).values(embedding_ciphertext=None))
    round_.status, round_.active_slot, round_.closed_at = RoundStatus.COMPLETED, None, now
    round_.result_version_id, round_.lease_until, round_.summary = version.id, None, summary
    audit.record(session, "server", "round.completed", round_id=round_id, version=version.version_hash, **summary)
    session.commit()
    return True


def to_public(session: Session, round_: Round) -> RoundPublic:
    counts = participation_counts(session, round_.id)
    base = session.get(ModelVersion, round_.base_version_id)
    result = session.get(ModelVersion, round_.result_version_id) if round_.result_version_id else None
    return RoundPublic(
        id=round_.id, status=round_.status, strategy=round_.strategy,  # type: ignore[arg-type]
        target_participants=round_.target_participants, min_participants=round_.min_participants,
        created_at=round_.created_at, selection_at=round_.selection_at, deadline_at=round_.deadline_at,
        closed_at=round_.closed_at, failure_reason=round_.failure_reason,
        base_version=base.version_hash if base else "", result_version=result.version_hash if result else None,
        n_checked_in=sum(counts.values()), n_selected=sum(counts.get(status, 0) for status in CHOSEN_STATUSES),
        n_uploaded=counts.get(ParticipationStatus.UPLOADED, 0), config=round_.config, summary=round_.summary,
    )
