"""Closing a round: claim (locked, services.aggregation_claim) -> compute (unlocked) -> finalize (locked).

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
(:func:`transaction`); the transitions themselves are services.rounds, run inside them. What compute
reads is services.aggregation_inputs; a DP round's privacy record, services.privacy. A chain that sums its
updates sums them in shards (services.aggregation_tiers), in this process, in worker processes or, shared, in every
replica (services.aggregation_shards; :func:`help_aggregate` is the other replicas' part), to the same bits.
"""
from __future__ import annotations

import math
import time

import numpy as np

from facecore.federation.config import RoundConfig
from facecore.federation.secagg import SecAggAborted
from facecore.federation.status import RoundStatus
from facecore.federation.strategies import Strategy, last_step, strategy_for
from facecore.federation.strategies.base import Weights
from facecore.federation.strategies.secure_fedavg import UnmaskMaterial
from facecore.federation.strategies.tiers import summing_stage
from facecore.federation.wire import trained_entries
from facecore.models.verification import Verification
from server_api.core.db import session_scope, transaction
from server_api.core.logging import get_logger
from server_api.crud import devices as device_crud
from server_api.crud import rounds as round_crud
from server_api.crud import secagg as secagg_crud
from server_api.crud import shards as shard_crud
from server_api.crud import updates as update_crud
from server_api.crud import versions as version_crud
from server_api.services import rounds, secure_aggregation
from server_api.services.aggregation_claim import claim_for_aggregation, keep_lease
from server_api.services.aggregation_inputs import EnrolledRef, new_embeddings, parent_hash, round_update_refs, stream_masked
from server_api.services.aggregation_shards import PROCESS_ID, Shards, shard_summary, sum_free_shards
from server_api.services.aggregation_tiers import aggregate_round
from server_api.services.context import ServerContext
from server_api.services.model_store import build_model, load_weights, store_model
from server_api.services.privacy import round_privacy
from server_api.tables import utcnow

log = get_logger("aggregation")


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
        with keep_lease(ctx.sessions, round_id, ctx.settings.aggregation_lease_s):
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


def help_aggregate(ctx: ServerContext, round_id: int, holder: str = PROCESS_ID) -> int:
    """Sum the free shards of a round that another process aggregates and shares (services.aggregation_shards);
    how many this call summed."""
    with session_scope(ctx.sessions) as session:
        shard_updates = shard_crud.free_shard_size(session, round_id, utcnow())
        round_ = round_crud.get_round(session, round_id)
        if shard_updates is None or round_ is None or round_.status != RoundStatus.AGGREGATING:
            return 0
        config, updates = round_.settings, round_update_refs(session, round_id)
        base = version_crud.get(session, round_.base_version_id)
        assert base is not None
        base_hash = base.version_hash
    _, weights = load_weights(ctx.store, base_hash)
    trained = _trained(weights, config)
    stage = summing_stage(strategy_for(config))
    assert stage is not None, "a round shares its shards only when its chain sums"
    return sum_free_shards(ctx, Shards(round_id, stage, trained, updates, shard_updates), holder)


def _trained(weights: Weights, config: RoundConfig) -> Weights:
    """The entries of the base that the round trains (wire.trained_entries): what a round's sum covers."""
    return {k: weights[k] for k in trained_entries(list(weights), config.local.trainable_blocks)}


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
        updates = round_update_refs(session, round_id)
        enrolled = [
            EnrolledRef(e.device_id, e.ciphertext, e.updated_at)
            for e in device_crud.active_enrollments(session)
        ]
        config = round_.settings
        parent = parent_hash(session, base.round_id) if config.aggregation.server_momentum else None
        base_hash, backbone, dim = base.version_hash, base.backbone, base.embedding_dim
        base_verification = base.verification  # frozen: safe to use after the session ends
        base_center = None if base.feature_center is None else list(base.feature_center)
        secure = secure_aggregation.unmask_inputs(session, round_) if secure_aggregation.settings_of(round_) else None
        # A DP round always ran selection (no upload without it); 1.0 is the safe reading otherwise.
        sampling = (round_.sample_rate if round_.sample_rate is not None else 1.0, round_.population)

    _, base_weights = load_weights(ctx.store, base_hash)
    previous = None if parent is None else last_step(base_weights, load_weights(ctx.store, parent)[1])
    if secure is None:
        # The frozen prefix takes no part: the strategy sees the trained entries, as in the simulator.
        trained = _trained(base_weights, config)
        strategy = strategy_for(config, previous_step=previous)
        result = aggregate_round(ctx, strategy, config, round_id, trained, updates)
    else:
        strategy = _secure_strategy(config, secure, previous)
        result = strategy.aggregate_train(round_id, base_weights, stream_masked(ctx.store, updates, secure.index_of))
    del previous
    published = {**base_weights, **result.weights}
    change_norm = published_change_norm(base_weights, published)
    del base_weights
    model = build_model(backbone, dim, published)
    meta = {"source": f"round {round_id}", "round_id": round_id, "parent": base_hash, "feature_center": base_center}
    blobs = store_model(ctx.store, model, ctx.settings.export_onnx, meta=meta, verification=_inherited(base_verification, base_hash))

    embeddings = new_embeddings(ctx, strategy, config, updates, enrolled, dim)
    summary = {
        "n_updates": result.n_clients, "n_samples": result.n_samples, "n_embeddings": len(embeddings),
        "metrics": {k: round(v, 6) for k, v in result.metrics.items()},
        "change_norm": change_norm,
    }
    shards = shard_summary(ctx, round_id)
    if shards is not None:
        summary["shards"] = shards
    if secure is not None:
        summary["secure_aggregation"] = {
            "members": len(secure.adverts), "key_sharers": len(secure.key_sharers), "answers": len(secure.answers), "threshold": secure.threshold,
        }
    if config.uses_dp:
        summary["privacy"] = round_privacy(ctx, round_id, config.aggregation, *sampling, config.target_participants)
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


def _drop_update_blobs(ctx: ServerContext, round_id: int) -> None:
    """Delete an ended round's individual deltas (rows keep their digests as a record), the partial sums of its
    shards and its secure-aggregation shares. Runs after the commit, so a crash in between only leaves files
    behind, never a round without its inputs."""
    with session_scope(ctx.sessions) as session, transaction(session):
        secagg_crud.forget_round(session, round_id)
        partials = shard_crud.drop_shards(session, round_id)
    for digest in partials:
        ctx.store.delete(digest)
    if ctx.settings.keep_update_blobs:
        return
    with session_scope(ctx.sessions) as session:
        digests = set(update_crud.round_blob_digests(session, round_id)) - set(update_crud.open_round_blob_digests(session))
    for digest in digests:
        ctx.store.delete(digest)


