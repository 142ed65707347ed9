"""Aggregation in tiers: a round's updates in fixed shards, each shard's weighted sum computed on its own (by
another process, where the updates are), the partial sums merged in shard order by the round's aggregator.

Invariants:
- The shards are consecutive runs of ``shard_size`` updates in the round's order, and the partial sums are
  merged in shard order, whoever computed them. So the aggregate is the same to the bit however many
  processes take part, and one process summing the shards one after another is the flat aggregation.
- A shard's sum is the chain's summing stage (:func:`summing_stage`: the outermost stage that is a
  :class:`~.fedavg.SumStrategy`, with its per-update stages such as clipping); the stages outside it
  (DP noise, server momentum, spreadout) run once, on the merged sum (:meth:`~.base.Strategy.aggregate_sum`).
- Against one running sum over the whole round, only the order of float64 additions changes (a relative
  difference near 1e-16); a round of at most ``shard_size`` updates is one shard and the same to the bit.
- A median or a trimmed mean has no summing stage: a median of shard medians is not the round's median, and a
  trimmed mean of shards trims other updates, so they aggregate flat (:func:`summing_stage` is None), as does a
  secure sum, unmasked only whole. :func:`aggregate_in_shards` takes either path.
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from itertools import chain, islice
from typing import TypeVar

import numpy as np

from facecore.federation.strategies.base import AggregateResult, ClientUpdate, Strategy, layers
from facecore.federation.strategies.fedavg import RoundSum, SumStrategy, merge_sums
from facecore.federation.strategies.secure_fedavg import SecureSum

SHARD_SIZE = 256
T = TypeVar("T")


def summing_stage(strategy: Strategy) -> SumStrategy | None:
    """The stage whose sum a shard computes, or None when the chain cannot aggregate in tiers: no sum (median,
    trimmed mean), or a secure sum, which is unmasked only as the whole round's."""
    stage = next((layer for layer in layers(strategy) if isinstance(layer, SumStrategy)), None)
    return None if stage is None or isinstance(stage, SecureSum) else stage


def shards(items: Iterable[T], shard_size: int = SHARD_SIZE) -> Iterator[Iterator[T]]:
    """Consecutive runs of ``shard_size`` items, each read lazily: one item in memory at a time when the caller
    consumes each shard before asking for the next."""
    if shard_size < 1:
        raise ValueError(f"shard_size must be >= 1, got {shard_size}")
    iterator = iter(items)
    for first in iterator:
        yield chain([first], islice(iterator, shard_size - 1))


def aggregate_partials(strategy: Strategy, server_round: int, base: Mapping[str, np.ndarray], partials: Iterable[RoundSum]) -> AggregateResult:
    """The round's aggregate from its shards' partial sums, given in shard order."""
    return strategy.aggregate_sum(server_round, base, merge_sums(partials))


def aggregate_in_shards(
    strategy: Strategy, server_round: int, base: Mapping[str, np.ndarray], updates: Iterable[ClientUpdate], shard_size: int = SHARD_SIZE,
) -> AggregateResult:
    """A round's aggregate as the server computes it, here: a chain with a sum shard by shard, one update in memory
    at a time; a median, trimmed mean or secure sum in one pass over every update. The simulator and the server
    both aggregate through this, so a round publishes the same bits in both."""
    stage = summing_stage(strategy)
    if stage is None:
        return strategy.aggregate_train(server_round, base, updates)
    return aggregate_partials(strategy, server_round, base, (stage.summed(server_round, base, shard) for shard in shards(updates, shard_size)))
