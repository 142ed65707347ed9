"""A round's sum shared by the server's replicas (``FEDFACE_AGGREGATION_SHARED_SHARDS``, blobs in the database): the
aggregator publishes the round's shards as rows; it and every other replica's scheduler claim them one at a time
under a lease, sum each where the blobs are (the shared store), and store the partial sum as a blob; the aggregator
merges the partials in shard order.

Invariants:
- The shards are aggregation in tiers' (facecore.federation.strategies.tiers): consecutive runs of
  ``shard_updates`` updates in update order, merged in shard order. The first aggregator to publish them fixes
  ``shard_updates``, and one that retakes the round keeps it, so the aggregate is the same bits whoever sums which
  shard, and the same as one process summing those shards itself.
- A partial sum is a function of the round's frozen inputs only. Its blob is written before its row names it; a
  shard whose holder died is claimed again when its lease runs out, and a shard summed twice gives the same bytes.
  Partials already summed survive an aggregator's death: the process that retakes the round merges them.
- The aggregator sums shards itself while any is free, so a round completes with no other replica alive.
- A partial is an ``.npz`` without pickles (float64 sums; counts and metrics as JSON), so reading one back runs no
  code from the store.
- The rows and the partials go when the round ends (services.aggregation), like the updates they sum.
- Importing this module loads no torch: aggregation_tiers, which the aggregation worker processes import, decides
  here whether a round's shards are shared. Helping another process's aggregation loads its base model, so that
  entry point is services.aggregation's ``help_aggregate``.
"""
from __future__ import annotations

import io
import json
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import numpy as np

from facecore.federation.strategies.base import AggregateResult, Strategy
from facecore.federation.strategies.fedavg import RoundSum, SumStrategy
from facecore.federation.strategies.tiers import aggregate_partials, summing_stage
from server_api.core.db import session_scope, transaction
from server_api.crud import shards as shard_crud
from server_api.services.aggregation_inputs import UpdateRef, stream_updates
from server_api.tables import utcnow

if TYPE_CHECKING:  # the context imports torch
    from server_api.services.context import ServerContext

PROCESS_ID = uuid.uuid4().hex  # who holds a shard: this process, whichever host it runs on
WAIT_S = 0.2  # how often the aggregator looks again while other replicas hold the last shards
_META = "meta"
_SUM = "sum_"


@dataclass(frozen=True)
class Shards:
    """What summing any shard of a round needs."""

    round_id: int
    stage: SumStrategy
    base: Mapping[str, np.ndarray]  # the trained entries of the round's base
    updates: Sequence[UpdateRef]
    shard_updates: int

    def sum(self, ctx: ServerContext, shard: int) -> str:
        """Shard `shard`'s partial sum, stored; its digest."""
        part = self.updates[shard * self.shard_updates:(shard + 1) * self.shard_updates]
        shapes = {k: np.shape(v) for k, v in self.base.items()}
        partial = self.stage.summed(self.round_id, self.base, stream_updates(ctx.store, part, shapes))
        return ctx.store.put(partial_bytes(partial))


def sum_shared(ctx: ServerContext, strategy: Strategy, round_id: int, base: Mapping[str, np.ndarray],
               updates: Sequence[UpdateRef]) -> AggregateResult:
    """The round's aggregate, its shards summed by whichever replicas claim them: this process publishes them,
    sums every one it can claim, waits for the others' partials, and merges them all in shard order."""
    stage = summing_stage(strategy)
    assert stage is not None, "only a chain with a sum shares its shards"
    shard_updates = _publish(ctx, round_id, len(updates), ctx.settings.aggregation_shard_updates)
    shards = Shards(round_id, stage, base, updates, shard_updates)
    while True:
        sum_free_shards(ctx, shards, PROCESS_ID)
        with session_scope(ctx.sessions) as session:
            digests = [state.partial_sha256 for state in shard_crud.shard_states(session, round_id)]
        if all(digests):
            break
        time.sleep(WAIT_S)  # another replica holds a shard; its lease frees it if that replica died
    return aggregate_partials(strategy, round_id, base, _read_partials(ctx, [d for d in digests if d]))


def sum_free_shards(ctx: ServerContext, shards: Shards, holder: str) -> int:
    """Claim, sum and record the round's shards until none is free; how many this call summed."""
    summed = 0
    while True:
        with session_scope(ctx.sessions) as session, transaction(session):
            now = utcnow()
            shard = shard_crud.claim_shard(session, shards.round_id, holder, now, now + timedelta(seconds=ctx.settings.aggregation_lease_s))
        if shard is None:
            return summed
        digest = shards.sum(ctx, shard)
        with session_scope(ctx.sessions) as session, transaction(session):
            kept = shard_crud.record_partial(session, shards.round_id, shard, holder, digest)
        if not kept:  # the round ended while this shard was summed again: its partial has no use and no owner
            ctx.store.delete(digest)
            return summed
        summed += 1
        if ctx.settings.aggregation_shard_pause_s:
            time.sleep(ctx.settings.aggregation_shard_pause_s)  # crash-test window: between two shards


def shard_summary(ctx: ServerContext, round_id: int) -> dict[str, int] | None:
    """How many shards the round's sum was cut into and how many processes summed them; None when not shared."""
    with session_scope(ctx.sessions) as session:
        states = shard_crud.shard_states(session, round_id)
    return {"count": len(states), "processes": len({s.holder for s in states})} if states else None


def _publish(ctx: ServerContext, round_id: int, n_updates: int, shard_updates: int) -> int:
    """The round's shard rows, added unless an earlier aggregator of the round added them; the shard size in force."""
    with session_scope(ctx.sessions) as session, transaction(session):
        states = shard_crud.shard_states(session, round_id)
        if states:
            return states[0].shard_updates
        shard_crud.add_shards(session, round_id, max(1, -(-n_updates // shard_updates)), shard_updates)
        return shard_updates


def _read_partials(ctx: ServerContext, digests: Sequence[str]) -> Iterator[RoundSum]:
    for digest in digests:
        yield partial_from_bytes(ctx.store.get(digest))


def partial_bytes(partial: RoundSum) -> bytes:
    """A partial sum as an ``.npz`` of its float64 sums and a JSON record of the rest."""
    meta: dict[str, Any] = {
        "total_weight": partial.total_weight, "count": partial.count, "n_samples": partial.n_samples,
        "metrics": partial.metrics, "kind": partial.kind, "clipped": partial.clipped, "metric_weights": partial.metric_weights,
        "keys": list(partial.sums),
    }
    arrays: dict[str, Any] = {f"{_SUM}{index}": value for index, value in enumerate(partial.sums.values())}
    arrays[_META] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    return buffer.getvalue()


def partial_from_bytes(data: bytes) -> RoundSum:
    with np.load(io.BytesIO(data), allow_pickle=False) as archive:
        meta = json.loads(archive[_META].tobytes())
        sums = {key: archive[f"{_SUM}{index}"] for index, key in enumerate(meta["keys"])}
    return RoundSum(sums, meta["total_weight"], meta["count"], meta["n_samples"], meta["metrics"], meta["kind"], meta["clipped"],
                    meta["metric_weights"])
