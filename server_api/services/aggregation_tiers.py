"""A round's aggregate, its sums shard by shard (facecore.federation.strategies.tiers): in the aggregating process one
after another; with ``FEDFACE_AGGREGATION_PROCESSES`` N in N worker processes that each open the blob store
themselves and read their shards' updates there; or with ``FEDFACE_AGGREGATION_SHARED_SHARDS`` by whichever of the
server's replicas claim them (services.aggregation_shards).

Invariants: shards are consecutive runs of ``FEDFACE_AGGREGATION_SHARD_UPDATES`` updates in the round's order
(update id), and their sums come back in shard order whichever process finished first, so the aggregate is the
same to the bit whatever the number of processes. A worker returns float64 sums of the trained entries, never
an update. Chains with no sum (median, trimmed mean) and secure rounds do not come here.
"""
from __future__ import annotations

import multiprocessing
from collections.abc import Mapping, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from facecore.federation.config import RoundConfig
from facecore.federation.strategies import strategy_for
from facecore.federation.strategies.base import AggregateResult, Strategy
from facecore.federation.strategies.fedavg import RoundSum, SumStrategy
from facecore.federation.strategies.tiers import aggregate_in_shards, aggregate_partials, shards, summing_stage
from server_api.core.db import make_engine
from server_api.services.aggregation_inputs import UpdateRef, stream_updates
from server_api.services.aggregation_shards import sum_shared
from server_api.storage.blobs import BlobStore
from server_api.storage.database_blobs import open_blob_store

if TYPE_CHECKING:  # the context imports torch; an aggregation worker needs neither
    from server_api.services.context import ServerContext


@dataclass(frozen=True)
class BlobSource:
    """How a worker process opens the server's blob store (an engine or a folder handle does not cross processes)."""

    kind: str
    root: Path
    database_url: str

    @classmethod
    def of(cls, ctx: ServerContext) -> BlobSource:
        return cls(ctx.settings.blob_store, Path(ctx.settings.data_dir) / "blobs", ctx.settings.resolved_database_url())

    def open(self) -> BlobStore:
        return open_blob_store(self.kind, self.root, make_engine(self.database_url))


@dataclass(frozen=True)
class _Job:
    server_round: int
    config: RoundConfig
    base: Mapping[str, np.ndarray]  # the trained entries of the round's base

    @property
    def shapes(self) -> dict[str, tuple[int, ...]]:
        return {k: np.shape(v) for k, v in self.base.items()}

    def stage(self) -> SumStrategy:
        stage = summing_stage(strategy_for(self.config))
        assert stage is not None, "only a chain with a sum is aggregated in shards"
        return stage


def aggregate_round(ctx: ServerContext, strategy: Strategy, config: RoundConfig, server_round: int, base: Mapping[str, np.ndarray],
                    updates: Sequence[UpdateRef]) -> AggregateResult:
    """The round's aggregate over the trained entries `base`. A chain that sums has its shards summed by the replicas
    when they share them, by the worker pool when there is one, else here (facecore's aggregate_in_shards, as the
    simulator does); any other chain aggregates here."""
    size, processes = ctx.settings.aggregation_shard_updates, ctx.settings.aggregation_processes
    job, sums = _Job(server_round, config, base), summing_stage(strategy) is not None
    if sums and ctx.settings.aggregation_shared_shards:
        return sum_shared(ctx, strategy, server_round, base, updates)
    if processes < 2 or not sums:
        return aggregate_in_shards(strategy, server_round, base, stream_updates(ctx.store, updates, job.shapes), size)
    context = multiprocessing.get_context("forkserver")
    with ProcessPoolExecutor(processes, mp_context=context, initializer=_start_worker, initargs=(BlobSource.of(ctx), job)) as pool:
        return aggregate_partials(strategy, server_round, base, pool.map(_worker_sum, map(list, shards(updates, size))))


_worker: tuple[BlobStore, _Job, SumStrategy] | None = None


def _start_worker(source: BlobSource, job: _Job) -> None:
    global _worker
    _worker = (source.open(), job, job.stage())


def _worker_sum(part: Sequence[UpdateRef]) -> RoundSum:
    assert _worker is not None, "the pool's initializer opens the store"
    store, job, stage = _worker
    return stage.summed(job.server_round, job.base, stream_updates(store, part, job.shapes))
