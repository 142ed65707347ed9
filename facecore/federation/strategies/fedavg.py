"""FedAvg (McMahan et al. 2017) as a weighted running sum, and the interface of strategies whose
aggregate is such a sum divided by its total weight.

Memory is one float64 copy of the model plus the update being added, whatever the number of
participants, because the server feeds updates one at a time from storage.

Invariants: a :class:`SumStrategy` splits its aggregate into :meth:`~SumStrategy.summed` (consume the
stream, once) and :meth:`~SumStrategy.publish` (divide and apply to the base), so the wrappers that
need the sum itself (DP noise's fixed denominator, secure aggregation's masked sum) reuse both halves
unchanged and the published bits do not depend on which path produced the sum.
"""
from __future__ import annotations

from abc import abstractmethod
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TypeGuard, get_args

import numpy as np

from facecore.federation.config import Weighting
from facecore.federation.packed import Layout, PackedArrays
from facecore.federation.strategies.base import (
    AggregateResult,
    ClientUpdate,
    Strategy,
    UpdateKind,
    Weights,
)
from facecore.federation.wire import widened, widened_table

with np.errstate(invalid="ignore"):  # the table's signalling NaNs come out quiet, as every float64 cast of them does
    _HALF_TO_DOUBLE = widened_table().astype(np.float64)


def _wide(value: np.ndarray) -> np.ndarray:
    """float64 of an update's array; fp16 (the wire's) through the exact lookup table, not numpy's slow cast."""
    array = np.asarray(value)
    return (widened(array) if array.dtype == np.float16 else array).astype(np.float64)


class _Scratch:
    """Cache-sized float64 scratch for summing a packed update one chunk at a time. An fp16 update's values
    are widened by a lookup in a table of every fp16 value (exact, and much faster than numpy's cast), then
    times the update's weight, in the same chunk while it is in cache: the per-entry path's operations
    (``_wide(values) * weight``), so the sums are the same bits.

    The table is shared by every update. A table per update, already times its weight, would spare one
    product per value, but building it writes 65,536 products (half a megabyte) for each update; inside a
    simulated round, where each update arrives on caches that training has just filled, that costs more than
    the products it spares."""

    CHUNK = 1 << 15

    def __init__(self, size: int) -> None:
        self.double = np.empty(min(size, self.CHUNK), np.float64)

    def scaled(self, values: np.ndarray, weight: float) -> np.ndarray:
        """``float64(values) * weight`` as a new buffer."""
        total = np.empty(len(values), np.float64)
        for start in range(0, len(values), self.CHUNK):
            end = min(start + self.CHUNK, len(values))
            self._scaled_chunk(values[start:end], weight, total[start:end])
        return total

    def add(self, values: np.ndarray, weight: float, into: np.ndarray) -> None:
        """``into += float64(values) * weight``."""
        for start in range(0, len(into), self.CHUNK):
            end = min(start + self.CHUNK, len(into))
            target, scaled = into[start:end], self.double[: end - start]
            self._scaled_chunk(values[start:end], weight, scaled)
            np.add(target, scaled, out=target)

    @staticmethod
    def _scaled_chunk(values: np.ndarray, weight: float, out: np.ndarray) -> None:
        if values.dtype == np.float16:
            # "wrap" never wraps (every uint16 indexes the table) and spares the bounds check
            _HALF_TO_DOUBLE.take(values.view(np.uint16), out=out, mode="wrap")
            np.multiply(out, weight, out=out)
        else:
            np.multiply(values, weight, out=out, dtype=np.float64)


@dataclass(frozen=True)
class _PackedSum:
    """The float64 sums of packed entries in their layout (the running sum's dict views ``flat``), and the other keys."""

    layout: Layout
    rest: frozenset[str]
    flat: np.ndarray
    scratch: _Scratch

    def takes(self, weights: Mapping[str, np.ndarray]) -> TypeGuard[PackedArrays]:
        """Whether ``weights`` is packed alike: the same packed entries and shapes, and the same other keys."""
        return isinstance(weights, PackedArrays) and weights.layout == self.layout and weights.rest.keys() == self.rest


class MetricMeans:
    """Each metric's mean over the updates that reported it, weighted like their weights."""

    def __init__(self) -> None:
        self._sums: dict[str, float] = {}
        self._weights: dict[str, float] = {}

    def add(self, metrics: Mapping[str, float], weight: float) -> None:
        for key, metric in metrics.items():
            self._sums[key] = self._sums.get(key, 0.0) + float(metric) * weight
            self._weights[key] = self._weights.get(key, 0.0) + weight

    def means(self) -> dict[str, float]:
        return {k: self._sums[k] / self._weights[k] for k in self._sums}

    def weights(self) -> dict[str, float]:
        return dict(self._weights)


class RunningWeightedSum:
    """``sum_i w_i * x_i`` and ``sum_i w_i`` over same-shaped weight dicts, added one at a time.

    Updates packed in one buffer (:class:`~facecore.federation.packed.PackedArrays`) in the first update's
    layout are added in one pass over that buffer, chunk by chunk through reused scratch that stays in cache,
    instead of one widened, scaled temporary per entry; every value goes through the same float64 operations
    either way, so the sums are the same bits. The sums are then views of one float64 buffer."""

    def __init__(self) -> None:
        self._sums: dict[str, np.ndarray] = {}
        self._metrics = MetricMeans()
        self.total_weight = 0.0
        self.count = 0
        self._packed: _PackedSum | None = None  # when the first update came packed

    def add(self, weights: Mapping[str, np.ndarray], weight: float, metrics: Mapping[str, float] | None = None) -> None:
        if not weight > 0:
            raise ValueError(f"weight must be positive, got {weight}")
        if self.count == 0 and isinstance(weights, PackedArrays):
            scratch = _Scratch(weights.layout.size)
            flat = scratch.scaled(weights.flat, weight)
            self._packed = _PackedSum(weights.layout, frozenset(weights.rest), flat, scratch)
            self._sums = {**weights.layout.views(flat), **{k: _wide(v) * weight for k, v in weights.rest.items()}}
        elif self.count == 0:
            self._sums = {k: _wide(v) * weight for k, v in weights.items()}
        elif self._packed is not None and self._packed.takes(weights):
            self._add_each(weights.rest, weight)
            self._packed.scratch.add(weights.flat, weight, into=self._packed.flat)
        else:
            if weights.keys() != self._sums.keys():
                missing, extra = self._sums.keys() - weights.keys(), weights.keys() - self._sums.keys()
                raise ValueError(f"update keys differ from the first update (missing {sorted(missing)[:3]}, extra {sorted(extra)[:3]})")
            self._add_each(weights, weight)
        self._metrics.add(metrics or {}, weight)
        self.total_weight += weight
        self.count += 1

    def _add_each(self, weights: Mapping[str, np.ndarray], weight: float) -> None:
        for key, value in weights.items():
            if np.shape(value) != self._sums[key].shape:
                raise ValueError(f"{key}: shape {np.shape(value)} differs from {self._sums[key].shape}")
            self._sums[key] += _wide(value) * weight

    def mean(self) -> dict[str, np.ndarray]:
        if self.count == 0:
            raise ValueError("no updates were added")
        return {k: v / self.total_weight for k, v in self._sums.items()}

    def sums(self) -> dict[str, np.ndarray]:
        """The running sums themselves, not copies: whoever is done adding hands them on."""
        return self._sums

    def metric_means(self) -> dict[str, float]:
        return self._metrics.means()

    def metric_weights(self) -> dict[str, float]:
        return self._metrics.weights()


@dataclass(frozen=True)
class RoundSum:
    """A round's weighted sum before it is divided. ``sums`` may leave keys out (secure aggregation
    sums only the float tensors); those keep the base's value. ``kind`` is None when no update came."""

    sums: dict[str, np.ndarray]
    total_weight: float
    count: int
    n_samples: int
    metrics: dict[str, float]
    kind: UpdateKind | None = "delta"
    clipped: int = 0  # updates a clipping stage scaled down (DP reports the fraction)
    metric_weights: dict[str, float] | None = None  # each metric's total weight; None: total_weight for every one


def merge_sums(partials: Iterable[RoundSum]) -> RoundSum:
    """One sum from the partial sums of disjoint shards of a round, added as they come, in the order given (float
    addition is not associative: the order is what makes a merge reproducible to the bit). Holds one running sum,
    not the partials; a single partial is returned as it is, metrics to the bit included."""
    merged: RoundSum | None = None
    for index, partial in enumerate(partials):
        merged = partial if merged is None else _added(merged, partial, owned=index > 1)
    return merged if merged is not None else RoundSum({}, 0.0, 0, 0, {}, None, metric_weights={})


def _added(total: RoundSum, partial: RoundSum, owned: bool) -> RoundSum:
    """``total`` + ``partial``; ``owned``: ``total``'s arrays are this merge's own, so they are added to in place."""
    if None not in (total.kind, partial.kind) and total.kind != partial.kind:
        raise ValueError("a round cannot mix delta and full updates")
    sums = total.sums if owned else {k: np.array(v, dtype=np.float64, copy=True) for k, v in total.sums.items()}
    for key, value in partial.sums.items():
        if key in sums:
            sums[key] += value
        else:
            sums[key] = np.array(value, dtype=np.float64, copy=True)
    metric_sums: dict[str, float] = {}
    metric_weights: dict[str, float] = {}
    for part in (total, partial):
        for key, mean in part.metrics.items():
            weight = (part.metric_weights or {}).get(key, part.total_weight)
            metric_sums[key] = metric_sums.get(key, 0.0) + mean * weight
            metric_weights[key] = metric_weights.get(key, 0.0) + weight
    return RoundSum(
        sums, total.total_weight + partial.total_weight, total.count + partial.count, total.n_samples + partial.n_samples,
        {k: metric_sums[k] / metric_weights[k] for k in metric_sums if metric_weights[k] > 0},
        total.kind if total.kind is not None else partial.kind, total.clipped + partial.clipped, metric_weights,
    )


def cast_like(value: np.ndarray, like: np.ndarray) -> np.ndarray:
    """``value`` in ``like``'s dtype; integer buffers (BatchNorm's step count) are rounded, not truncated."""
    if np.issubdtype(like.dtype, np.integer):
        return np.rint(value).astype(like.dtype)
    return value.astype(like.dtype)


def apply_step(base: Mapping[str, np.ndarray], step: Mapping[str, np.ndarray]) -> Weights:
    """``base + step`` in the base's dtypes; a key the step leaves out keeps the base's value."""
    return {k: cast_like(np.asarray(base[k], np.float64) + step[k], np.asarray(base[k])) if k in step else np.array(base[k], copy=True)
            for k in base}


class SumStrategy(Strategy):
    """A strategy whose aggregate is a weighted sum of the updates divided by its total weight."""

    @abstractmethod
    def summed(self, server_round: int, base: Mapping[str, np.ndarray], results: Iterable[ClientUpdate]) -> RoundSum:
        """Consume the round's stream once into its weighted sum."""

    @abstractmethod
    def publish(self, base: Mapping[str, np.ndarray], total: RoundSum) -> AggregateResult:
        """The new weights from the sum: its mean added to the base (deltas) or taken as is (full models)."""

    def aggregate_train(self, server_round: int, base: Mapping[str, np.ndarray], results: Iterable[ClientUpdate]) -> AggregateResult:
        return self.publish(base, self.summed(server_round, base, results))

    def aggregate_sum(self, server_round: int, base: Mapping[str, np.ndarray], total: RoundSum) -> AggregateResult:
        return self.publish(base, total)


class FedAvg(SumStrategy):
    """Weighted mean of client models (or of their deltas added to the base): by each client's
    samples, or with ``weighting="devices"`` every client once."""

    name = "fedavg_by_samples"
    each_client_once = False  # subclasses that do not call __init__ weigh by samples

    def __init__(self, weighting: Weighting = "samples") -> None:
        if weighting not in get_args(Weighting):
            raise ValueError(f"weighting must be samples or devices, got {weighting!r}")
        self.each_client_once = weighting == "devices"
        self.name = f"fedavg_by_{weighting}"

    def _weight(self, update: ClientUpdate) -> float:
        """How much one update counts; subclasses (FV's weighted FedAvg) override only this."""
        return 1.0 if self.each_client_once else float(update.n_samples)

    def summed(self, server_round: int, base: Mapping[str, np.ndarray], results: Iterable[ClientUpdate]) -> RoundSum:
        total = RunningWeightedSum()
        kind: UpdateKind | None = None
        n_samples = 0
        for update in results:
            if kind is not None and update.kind != kind:
                raise ValueError("a round cannot mix delta and full updates")
            kind = update.kind
            if update.weights.keys() != base.keys():
                raise ValueError(f"update from {update.client_id or '?'} does not match the base model's parameters")
            weight = self._weight(update)
            n_samples += update.n_samples
            if weight > 0:  # a zero weight (FV) leaves a client out of this aggregate
                total.add(update.weights, weight, update.metrics)
        if total.count == 0 and n_samples > 0:
            raise ValueError("no client with a positive weight took part in this round")
        return RoundSum(total.sums(), total.total_weight, total.count, n_samples, total.metric_means(), kind,
                        metric_weights=total.metric_weights())

    def publish(self, base: Mapping[str, np.ndarray], total: RoundSum) -> AggregateResult:
        if total.count == 0:
            raise ValueError("no updates were added")
        mean = {k: v / total.total_weight for k, v in total.sums.items()}
        if total.kind == "full":
            weights: Weights = {k: cast_like(mean[k], np.asarray(base[k])) for k in base}
        else:
            weights = apply_step(base, mean)
        return AggregateResult(weights=weights, n_clients=total.count, n_samples=total.n_samples, metrics=total.metrics)
