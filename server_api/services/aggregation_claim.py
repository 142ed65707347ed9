"""Claiming a round for aggregation, under its row lock: move a due round to ``aggregating`` (or
``unmasking``, or fail it), or retake one whose lease ran out.

Freezing the round here is what makes the aggregation's inputs stable: uploads check
``status == open`` under the same lock. One transaction per claim, whatever the outcome; the
transitions themselves are services.rounds and services.secure_aggregation.

While a process aggregates, :func:`keep_lease` moves the round's lease forward every third of it, so an
aggregation longer than the lease is not retaken by another process while its holder is alive; a holder
that dies stops renewing, and the round is retaken once the lease runs out.
"""
from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from typing import Literal

from sqlalchemy.orm import Session, sessionmaker

from facecore.federation.status import FINAL_ROUND_STATUSES, ParticipationStatus, RoundStatus
from server_api.core.db import lock_round, session_scope, transaction
from server_api.crud import rounds as round_crud
from server_api.services import rounds, secure_aggregation
from server_api.tables import Round, utcnow

ClaimOutcome = Literal["claimed", "unmasking", "failed", "not_due", "busy", "closed"]


def claim_for_aggregation(session: Session, round_id: int, now: datetime, lease_s: float) -> ClaimOutcome:
    """Move a due round to ``aggregating`` (or fail it), or retake one whose lease ran out.

    Freezing the round here is what makes aggregation inputs stable: uploads check
    ``status == open`` under the same lock. One transaction, whatever the outcome."""
    with transaction(session):
        return _claim(session, round_id, now, lease_s)


def _claim(session: Session, round_id: int, now: datetime, lease_s: float) -> ClaimOutcome:
    round_ = lock_round(session, round_id)
    if round_ is None or round_.status in FINAL_ROUND_STATUSES:
        return "closed"
    if round_.status == RoundStatus.AGGREGATING:
        if round_.lease_until is not None and now < round_.lease_until:
            return "busy"
        rounds.resume_aggregation(session, round_, now, lease_s)
        return "claimed"
    counts = round_crud.participation_counts(session, round_id)
    uploaded = counts.get(ParticipationStatus.UPLOADED, 0)
    if secure_aggregation.settings_of(round_) is not None:
        return _secure_transition(session, round_, uploaded, now, lease_s)
    deadline_passed = now >= round_.deadline_at
    # A Poisson sample can exceed the target: wait for every selected device before closing early.
    everyone_in = uploaded >= round_.target_participants and counts.get(ParticipationStatus.SELECTED, 0) == 0
    if everyone_in or (deadline_passed and uploaded >= round_.min_participants):
        rounds.start_aggregating(session, round_, uploaded, now, lease_s)
        return "claimed"
    if deadline_passed:
        selected = counts.get(ParticipationStatus.SELECTED, 0) + uploaded
        rounds.fail_round(session, round_, now, (
            f"deadline passed with {uploaded} update(s), {round_.min_participants} required "
            f"({selected} selected, {sum(counts.values())} checked in)"
        ))
        return "failed"
    return "not_due"


def _secure_transition(session: Session, round_: Round, uploaded: int, now: datetime, lease_s: float) -> ClaimOutcome:
    step, reason = secure_aggregation.next_transition(session, round_, uploaded, now)
    if step == RoundStatus.AGGREGATING:
        rounds.start_aggregating(session, round_, uploaded, now, lease_s)
        return "claimed"
    if step == RoundStatus.FAILED:
        rounds.fail_round(session, round_, now, reason or "secure aggregation failed")
        return "failed"
    if step == RoundStatus.UNMASKING:
        rounds.start_unmasking(session, round_, uploaded, secure_aggregation.unmask_deadline(round_, now))
        return "unmasking"
    return "not_due"


@contextmanager
def keep_lease(sessions: sessionmaker[Session], round_id: int, lease_s: float) -> Iterator[None]:
    """Renew the round's aggregation lease in a background thread until the block ends."""
    stopped = threading.Event()

    def renew() -> None:
        while not stopped.wait(lease_s / 3):
            try:
                with session_scope(sessions) as session, transaction(session):
                    if not round_crud.extend_lease(session, round_id, utcnow() + timedelta(seconds=lease_s)):
                        return  # finalized, failed, or retaken and finished elsewhere
            except Exception:  # noqa: BLE001 - a database hiccup: the next beat tries again, the lease covers the gap
                continue

    beat = threading.Thread(target=renew, name=f"lease-round-{round_id}", daemon=True)
    beat.start()
    try:
        yield
    finally:
        stopped.set()
        beat.join()
