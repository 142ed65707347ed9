"""The round state machine: open -> (selection) -> [unmasking ->] aggregating -> completed | failed.

``unmasking`` only happens in secure-aggregation rounds (services.secure_aggregation).

Selection fills the target slots by the shared rule (facecore.federation.selection: least
recently selected first), except in DP-FedAvg rounds: there every enrolled device is in the
round's Poisson sample with probability q = target / enrolled, independently
(strategies.dp_fedavg.poisson_selected), which is what the privacy accountant assumes. q and the
enrolled count are stored on the round when selection runs.

Every transition happens with the round row locked (:func:`lock_round`), so two workers, the
scheduler and the upload that reaches the target can all try the same transition and exactly one
of them makes it. When a round is due for aggregation is decided by
services.aggregation_claim.claim_for_aggregation (secure aggregation's steps included).

Transactions: nothing here commits. Each function runs inside its caller's transaction (services
.round_admin, .participation, .scheduler, .aggregation own them), so the lock taken here and the
writes it protects end in the same commit, and a domain error raised here rolls them all back.
"""
from __future__ import annotations

import os
import random
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy.orm import Session

from facecore.federation.config import RoundConfig
from facecore.federation.selection import least_recently_selected
from facecore.federation.status import ParticipationStatus, RoundStatus
from facecore.federation.strategies.dp_fedavg import poisson_selected, sample_rate_for
from server_api.core.db import lock_round
from server_api.crud import audit
from server_api.crud import devices as device_crud
from server_api.crud import rounds as round_crud
from server_api.crud import versions as version_crud
from server_api.crud.versions import VersionFiles
from server_api.errors import Conflict, DeviceNotEnrolled, InvalidInput, NotFound, StaleRound
from server_api.services.secure_aggregation import members_fixed
from server_api.tables import Device, ModelVersion, Participation, Round

_rng = random.SystemRandom()


def open_round(session: Session, config: RoundConfig, base: ModelVersion, now: datetime) -> Round:
    """A new open round on ``base``. A round still active is a Conflict; so is one opened
    concurrently, which the unique active slot refuses when the row is flushed."""
    current = round_crud.active_round(session)
    if current is not None:
        raise Conflict(f"round {current.id} is still {current.status}; wait for it to finish")
    center = config.local.feature_center
    if center is not None and len(center) != base.embedding_dim:
        raise InvalidInput(f"local.feature_center has {len(center)} values; the current model embeds in {base.embedding_dim}")
    round_ = round_crud.add_round(
        session, status=RoundStatus.OPEN, active_slot=1, config=config.model_dump(mode="json"), strategy=config.strategy,
        target_participants=config.target_participants, min_participants=config.min_participants,
        base_version_id=base.id, selection_at=now + timedelta(seconds=config.selection_window_s),
        deadline_at=now + timedelta(seconds=config.deadline_s),
    )
    audit.record(session, "admin", "round.opened", round_id=round_.id, target=config.target_participants, min=config.min_participants)
    return round_


def check_in(session: Session, device: Device, now: datetime) -> tuple[Round, Participation]:
    """The device joins the active round as a candidate, or learns whether it was selected."""
    active = round_crud.active_round(session)
    if active is None:
        raise StaleRound(None, None)
    round_ = lock_round(session, active.id)
    if round_.status != RoundStatus.OPEN or now >= round_.deadline_at:
        raise StaleRound(round_.id, round_.id, "deadline passed" if round_.status == RoundStatus.OPEN else round_.status)
    if device_crud.get_enrollment(session, device.id) is None:
        raise DeviceNotEnrolled(f"device {device.id} is not enrolled; enroll a class embedding before checking in")
    part = round_crud.get_participation(session, round_.id, device.id)
    if part is None:
        part = round_crud.add_participation(session, round_.id, device.id, ParticipationStatus.CANDIDATE)
    if now >= round_.selection_at:
        if not round_.selection_done:
            _select(session, round_)
        elif part.status == ParticipationStatus.CANDIDATE and members_fixed(session, round_, now):
            part.status = ParticipationStatus.NOT_SELECTED  # the members are fixed: keys are being agreed among them
        elif part.status == ParticipationStatus.CANDIDATE and round_.sample_rate is not None:
            _seat(session, round_, part, _in_sample(round_, device.id))
        elif part.status == ParticipationStatus.CANDIDATE:
            # After the window, free slots go to whoever comes first.
            _seat(session, round_, part, round_crud.chosen_count(session, round_.id) < round_.target_participants)
    return round_, part


def _seat(session: Session, round_: Round, part: Participation, selected: bool) -> None:
    part.status = ParticipationStatus.SELECTED if selected else ParticipationStatus.NOT_SELECTED
    if selected:
        device = device_crud.get_device(session, part.device_id)
        assert device is not None  # a participation's device row stays (removal only revokes its key)
        device.last_selected_round = round_.id


def run_selection_if_due(session: Session, round_id: int, now: datetime) -> bool:
    """Select the round's candidates once its selection window has passed; whether it did now."""
    round_ = lock_round(session, round_id)
    if round_ is None or round_.status != RoundStatus.OPEN or round_.selection_done or now < round_.selection_at:
        return False
    _select(session, round_)
    return True


def _select(session: Session, round_: Round) -> None:
    """Fill the free slots from this round's candidates by the shared rule
    (facecore.federation.selection); in a DP round, take exactly the candidates in the round's
    Poisson sample."""
    rows = round_crud.candidates(session, round_.id)
    if round_.settings.uses_dp:
        round_.population = round_crud.enrolled_count(session)
        round_.sample_rate = sample_rate_for(round_.target_participants, max(round_.population, 1))
        round_.sampling_key = os.urandom(32)
        chosen = [row for row in rows if _in_sample(round_, row[1].id)]
    else:
        free = round_.target_participants - round_crud.chosen_count(session, round_.id)
        picked = least_recently_selected([device.last_selected_round for _, device in rows], free, _rng.random)
        chosen = [rows[i] for i in picked]
    chosen_ids = {device.id for _, device in chosen}
    for part, device in rows:
        part.status = ParticipationStatus.SELECTED if device.id in chosen_ids else ParticipationStatus.NOT_SELECTED
        if device.id in chosen_ids:
            device.last_selected_round = round_.id
    round_.selection_done = True
    audit.record(session, "server", "round.selected", round_id=round_.id, candidates=len(rows), selected=len(chosen),
                 sample_rate=round_.sample_rate)


def _in_sample(round_: Round, device_id: str) -> bool:
    assert round_.sampling_key is not None and round_.sample_rate is not None
    return poisson_selected(round_.sampling_key, device_id, round_.sample_rate)


def close_now(session: Session, round_id: int, now: datetime) -> Round:
    """Bring an open round's deadline forward to `now`: it then aggregates with the updates it
    has if they meet its minimum, else fails, exactly as at its deadline. Uploads after this get 409."""
    round_ = lock_round(session, round_id)
    if round_ is None:
        raise NotFound(f"round {round_id} does not exist")
    if round_.status != RoundStatus.OPEN:
        raise Conflict(f"round {round_id} is {round_.status}, only an open round can be closed")
    round_.deadline_at = min(round_.deadline_at, now)
    audit.record(session, "admin", "round.closed_early", round_id=round_id)
    return round_


# ---- steps of services.aggregation_claim.claim_for_aggregation, which holds the round's lock ------------
def resume_aggregation(session: Session, round_: Round, now: datetime, lease_s: float) -> None:
    """Retake a round stuck in ``aggregating`` whose lease ran out."""
    round_.lease_until = now + timedelta(seconds=lease_s)
    audit.record(session, "server", "round.aggregation_resumed", round_id=round_.id)


def start_aggregating(session: Session, round_: Round, uploaded: int, now: datetime, lease_s: float) -> None:
    round_.status = RoundStatus.AGGREGATING
    round_.lease_until = now + timedelta(seconds=lease_s)
    audit.record(session, "server", "round.aggregating", round_id=round_.id, updates=uploaded)


def start_unmasking(session: Session, round_: Round, uploaded: int, unmask_deadline: datetime) -> None:
    round_.status, round_.unmask_deadline_at = RoundStatus.UNMASKING, unmask_deadline
    audit.record(session, "server", "round.unmasking", round_id=round_.id, updates=uploaded)


def fail_round(session: Session, round_: Round, now: datetime, reason: str) -> None:
    round_.status, round_.active_slot, round_.closed_at = RoundStatus.FAILED, None, now
    round_.failure_reason = reason[:500]
    round_crud.drop_uploaded_templates(session, round_.id)
    audit.record(session, "server", "round.failed", round_id=round_.id, reason=round_.failure_reason)


# ---- the end of an aggregation computed outside any lock ---------------------------------------
def fail_aggregation(session: Session, round_id: int, now: datetime, reason: str) -> bool:
    """End a claimed round whose inputs cannot be aggregated (secure aggregation could not unmask)."""
    round_ = lock_round(session, round_id)
    if round_ is None or round_.status != RoundStatus.AGGREGATING:
        return False
    fail_round(session, round_, now, reason)
    return True


def finalize(
    session: Session, round_id: int, blobs: VersionFiles, embeddings: dict[str, tuple[bytes, datetime]], summary: dict[str, Any], now: datetime,
) -> bool:
    """Record a computed aggregation: version row, new embeddings and the round's end, in the
    caller's one transaction. ``embeddings`` maps device id -> (ciphertext, enrollment.updated_at
    seen when W was built); a template changed since (unenrolled, re-enrolled) is left alone.
    False when the round is no longer aggregating (another worker finished it)."""
    round_ = lock_round(session, round_id)
    if round_ is None or round_.status != RoundStatus.AGGREGATING:
        return False
    # identical weights (all-zero deltas) reuse the existing row
    version = version_crud.get_by_hash(session, blobs.version_hash) or version_crud.add_version(session, blobs, round_id)
    for device_id, (ciphertext, seen_at) in embeddings.items():
        enrollment = device_crud.get_enrollment(session, device_id)
        if enrollment is not None and enrollment.updated_at == seen_at:
            enrollment.ciphertext, enrollment.round_id, enrollment.updated_at = ciphertext, round_id, now
    # The uploaded templates were only needed to build W: do not keep extra copies.
    round_crud.drop_uploaded_templates(session, round_id)
    round_.status, round_.active_slot, round_.closed_at = RoundStatus.COMPLETED, None, now
    round_.result_version_id, round_.lease_until, round_.summary = version.id, None, summary
    audit.record(session, "server", "round.completed", round_id=round_id, version=version.version_hash, **summary)
    return True
