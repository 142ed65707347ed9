"""Closing a round: claim (locked) -> compute (unlocked) -> finalize (locked).

Exactly-once across workers and restarts: the claim freezes the inputs (uploads
need ``status == open`` under the same row lock) and takes a lease; compute is a
deterministic function of those inputs that only writes content-addressed blobs;
finalize re-checks ``status == aggregating`` under the lock and commits the version
row, the new embeddings and the round's end in one transaction. A process killed
anywhere leaves either no trace in the database or a finished round; a round
stuck in ``aggregating`` is retaken by any worker once its lease expires.

A completed round's summary records what it changed: ``change_norm``, the L2 norm of the published
backbone minus its base (:func:`published_change_norm`).

Transactions: claim, finalize (or fail) and the clean-up after each own one transaction
(:func:`transaction`); the transitions themselves are services.rounds, run inside them.
"""
from __future__ import annotations

import math
import time
from collections.abc import Iterator
from datetime import datetime
from typing import Any, Literal, NamedTuple

import numpy as np
from sqlalchemy.orm import Session

from facecore.federation.config import AggregationSettings, RoundConfig
from facecore.federation.protocol import BACKBONE_PREFIX, MASKED_KEY
from facecore.federation.secagg import SecAggAborted
from facecore.federation.status import FINAL_ROUND_STATUSES, ParticipationStatus, RoundStatus
from facecore.federation.strategies import ClientUpdate, Strategy, last_step, spreadout_of, strategy_for
from facecore.federation.strategies.base import Weights
from facecore.federation.strategies.dp_fedavg import epsilon_of_history
from facecore.federation.strategies.secure_fedavg import MASKED, UnmaskMaterial
from facecore.models.verification import Verification
from facecore.tensorfile import iter_tensors, read_header, read_tensor
from server_api.core.db import lock_round, session_scope, transaction
from server_api.core.logging import get_logger
from server_api.crud import devices as device_crud
from server_api.crud import rounds as round_crud
from server_api.crud import secagg as secagg_crud
from server_api.crud import updates as update_crud
from server_api.crud import versions as version_crud
from server_api.services import rounds, secure_aggregation
from server_api.services.context import ServerContext
from server_api.services.model_store import build_model, load_weights, store_model
from server_api.tables import Round, utcnow

log = get_logger("aggregation")
ClaimOutcome = Literal["claimed", "unmasking", "failed", "not_due", "busy", "closed"]


class UpdateRef(NamedTuple):
    device_id: str
    blob_sha256: str
    n_samples: int
    metrics: dict[str, float]
    embedding_ciphertext: bytes | None


class EnrolledRef(NamedTuple):
    device_id: str
    ciphertext: bytes
    updated_at: datetime


def try_aggregate(ctx: ServerContext, round_id: int) -> str:
    """Aggregate or fail the round if it is due; returns what happened (for logs and tests)."""
    with session_scope(ctx.sessions) as session:
        outcome = claim_for_aggregation(session, round_id, utcnow(), ctx.settings.aggregation_lease_s)
    if outcome == "failed":
        ctx.metrics.rounds_finished.labels(RoundStatus.FAILED).inc()
        log.warning("round failed", extra={"fields": {"round_id": round_id}})
        _drop_update_blobs(ctx, round_id)
    if outcome != "claimed":
        return outcome
    started = time.perf_counter()
    try:
        done = _compute_and_finalize(ctx, round_id)
    except SecAggAborted as error:
        with session_scope(ctx.sessions) as session, transaction(session):
            rounds.fail_aggregation(session, round_id, utcnow(), f"secure aggregation aborted: {error}")
        ctx.metrics.rounds_finished.labels(RoundStatus.FAILED).inc()
        log.warning("round failed", extra={"fields": {"round_id": round_id, "reason": str(error)}})
        _drop_update_blobs(ctx, round_id)
        return "failed"
    if done:
        ctx.metrics.aggregation_seconds.observe(time.perf_counter() - started)
        ctx.metrics.rounds_finished.labels(RoundStatus.COMPLETED).inc()
        _drop_update_blobs(ctx, round_id)
    return "completed" if done else "lost"


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


def _inherited(verification: Verification | None, parent: str) -> Verification | None:
    """A federated version's threshold: its parent's row as published now (an operator's recalibration
    included, never the parent file's shipped copy), with `calibrated_for` naming the version it was
    calibrated on. No face data lives on the server, so it cannot calibrate; the operator recalibrates
    with `fedface admin model calibrate`."""
    return None if verification is None else verification.inherited(parent)


def _compute_and_finalize(ctx: ServerContext, round_id: int) -> bool:
    with session_scope(ctx.sessions) as session:
        round_ = round_crud.get_round(session, round_id)
        assert round_ is not None
        base = version_crud.get(session, round_.base_version_id)
        assert base is not None
        # Plain copies: the rows must not be touched after this session ends.
        updates = [
            UpdateRef(u.device_id, u.blob_sha256, u.n_samples, dict(u.metrics), u.embedding_ciphertext)
            for u in update_crud.round_updates(session, round_id)
        ]
        enrolled = [
            EnrolledRef(e.device_id, e.ciphertext, e.updated_at)
            for e in device_crud.active_enrollments(session)
        ]
        config = round_.settings
        parent_hash = _parent_hash(session, base.round_id) if config.aggregation.server_momentum else None
        base_hash, backbone, dim = base.version_hash, base.backbone, base.embedding_dim
        base_verification = base.verification  # frozen: safe to use after the session ends
        base_center = None if base.feature_center is None else list(base.feature_center)
        secure = secure_aggregation.unmask_inputs(session, round_) if secure_aggregation.settings_of(round_) else None
        # A DP round always ran selection (no upload without it); 1.0 is the safe reading otherwise.
        sampling = (round_.sample_rate if round_.sample_rate is not None else 1.0, round_.population)

    _, base_weights = load_weights(ctx.store, base_hash)
    previous = None if parent_hash is None else last_step(base_weights, load_weights(ctx.store, parent_hash)[1])
    if secure is None:
        strategy = strategy_for(config, previous_step=previous)
        stream = _stream(ctx, updates)
    else:
        strategy = _secure_strategy(config, secure, previous)
        stream = _stream_masked(ctx, updates, secure.index_of)
    del previous
    result = strategy.aggregate_train(round_id, base_weights, stream)
    change_norm = published_change_norm(base_weights, result.weights)
    del base_weights
    model = build_model(backbone, dim, result.weights)
    meta = {"source": f"round {round_id}", "round_id": round_id, "parent": base_hash, "feature_center": base_center}
    blobs = store_model(ctx.store, model, ctx.settings.export_onnx, meta=meta, verification=_inherited(base_verification, base_hash))

    embeddings = _new_embeddings(ctx, strategy, config, updates, enrolled, dim)
    summary = {
        "n_updates": result.n_clients, "n_samples": result.n_samples, "n_embeddings": len(embeddings),
        "metrics": {k: round(v, 6) for k, v in result.metrics.items()},
        "change_norm": change_norm,
    }
    if secure is not None:
        summary["secure_aggregation"] = {
            "members": len(secure.adverts), "key_sharers": len(secure.key_sharers), "answers": len(secure.answers), "threshold": secure.threshold,
        }
    if config.uses_dp:
        summary["privacy"] = _privacy(ctx, round_id, config.aggregation, *sampling, config.target_participants)
    if ctx.settings.aggregation_pause_s:
        time.sleep(ctx.settings.aggregation_pause_s)  # crash-test window: blobs written, nothing committed
    with session_scope(ctx.sessions) as session, transaction(session):
        done = rounds.finalize(session, round_id, blobs, embeddings, summary, utcnow())
    if done:
        log.info("round completed", extra={"fields": {"round_id": round_id, "version": blobs.version_hash, **summary}})
    return done


def published_change_norm(base: Weights, new: Weights) -> float:
    """The L2 norm of what a round changed in the backbone it publishes: new minus base over every
    floating-point tensor, the new one as stored (fp32); integer buffers (BatchNorm's batch counters) are
    left out. Computed here because only the aggregation holds both versions in memory; the operator
    page plots it per round."""
    squared = 0.0
    for name, before in base.items():
        if before.dtype.kind != "f":
            continue
        step = np.asarray(new[name], dtype=np.float32).astype(np.float64) - before.astype(np.float64)
        squared += float(np.dot(step.ravel(), step.ravel()))
    return math.sqrt(squared)


def _secure_strategy(config: RoundConfig, inputs: secure_aggregation.UnmaskInputs, previous_step: Weights | None) -> Strategy:
    material = UnmaskMaterial(inputs.adverts, inputs.key_sharers, inputs.answers, inputs.threshold, inputs.scale, inputs.max_update_norm)
    return strategy_for(config, previous_step=previous_step, secure=material)


def _parent_hash(session: Session, producing_round_id: int | None) -> str | None:
    """The base model of the round that produced a version: server momentum's lineage (None for an imported model)."""
    if producing_round_id is None:
        return None
    producing = round_crud.get_round(session, producing_round_id)
    parent = None if producing is None else version_crud.get(session, producing.base_version_id)
    return None if parent is None else parent.version_hash


def _drop_update_blobs(ctx: ServerContext, round_id: int) -> None:
    """Delete an ended round's individual deltas (rows keep their digests as a record) and its
    secure-aggregation shares. Runs after the commit, so a crash in between only leaves files
    behind, never a round without its inputs."""
    with session_scope(ctx.sessions) as session, transaction(session):
        secagg_crud.forget_round(session, round_id)
    if ctx.settings.keep_update_blobs:
        return
    with session_scope(ctx.sessions) as session:
        digests = set(update_crud.round_blob_digests(session, round_id)) - set(update_crud.open_round_blob_digests(session))
    for digest in digests:
        ctx.store.delete(digest)


def _privacy(ctx: ServerContext, round_id: int, settings: AggregationSettings, sample_rate: float, population: int | None, expected: int) -> dict[str, Any]:
    """This round's DP-FedAvg parameters and ε over every completed DP round so far, this one
    included, composed by RDP at this round's δ. The sample rate is the one the round's Poisson
    selection used (target / enrolled devices at selection), and the mean's denominator is the
    fixed expected count (the target), so the accountant's assumptions are what the round did."""
    this = (settings.dp_noise_multiplier, sample_rate, 1)
    with session_scope(ctx.sessions) as session:
        history = [
            (r.summary["privacy"]["noise_multiplier"], r.summary["privacy"]["sample_rate"], 1)
            for r in round_crud.completed_rounds(session) if r.id != round_id and r.summary and "privacy" in r.summary
        ]
    delta = settings.dp_delta
    return {
        "noise_multiplier": this[0], "clip_norm": settings.max_update_norm, "sample_rate": sample_rate,
        "population": population, "expected_clients": expected, "selection": "poisson",
        "delta": delta, "dp_rounds": len(history) + 1, "epsilon": _finite(epsilon_of_history([*history, this], delta)),
    }


def _finite(epsilon: float) -> float | None:
    """JSON (and PostgreSQL's json) has no infinity: no noise means no guarantee, stored as null."""
    return None if math.isinf(epsilon) else round(epsilon, 4)


def _stream(ctx: ServerContext, updates: list[UpdateRef]) -> Iterator[ClientUpdate]:
    """One update in memory at a time, read back from the blob store."""
    for update in updates:
        with ctx.store.open(update.blob_sha256) as handle:
            header = read_header(handle, ctx.store.size(update.blob_sha256))
            weights = dict(iter_tensors(handle, header, prefix=BACKBONE_PREFIX))
        yield ClientUpdate(weights=weights, n_samples=update.n_samples, metrics=update.metrics, client_id=update.device_id)


def _stream_masked(ctx: ServerContext, updates: list[UpdateRef], index_of: dict[str, int]) -> Iterator[ClientUpdate]:
    for update in updates:
        with ctx.store.open(update.blob_sha256) as handle:
            header = read_header(handle, ctx.store.size(update.blob_sha256))
            masked = read_tensor(handle, header, MASKED_KEY)
        yield ClientUpdate(weights={MASKED: masked}, n_samples=update.n_samples, metrics=update.metrics, client_id=str(index_of[update.device_id]))


def _new_embeddings(
    ctx: ServerContext, strategy: Strategy, config: RoundConfig, updates: list[UpdateRef], enrolled: list[EnrolledRef], dim: int
) -> dict[str, tuple[bytes, datetime]]:
    """W = every enrolled identity's embedding (this round's upload if it sent one), through the strategy."""
    if not enrolled:
        return {}
    uploaded = {u.device_id: u.embedding_ciphertext for u in updates if u.embedding_ciphertext is not None}
    rows = []
    for enrollment in enrolled:
        device_id = enrollment.device_id
        if device_id in uploaded:
            raw = ctx.cipher.decrypt(uploaded[device_id], device_id, "update")
        else:
            raw = ctx.cipher.decrypt(enrollment.ciphertext, device_id, "enrollment")
        rows.append(np.frombuffer(raw, dtype="<f4").astype(np.float32))
    W = np.stack(rows)
    assert W.shape[1] == dim
    W_new = strategy.aggregate_embeddings(W, spreadout_of(config.spreadout))
    return {
        e.device_id: (ctx.cipher.encrypt(W_new[i].astype("<f4").tobytes(), e.device_id, "enrollment"), e.updated_at)
        for i, e in enumerate(enrolled)
    }
