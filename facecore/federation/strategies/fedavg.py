"""FedAvg (McMahan et al. 2017) as a weighted running sum.

Memory is one float64 copy of the model plus the update being added, whatever the
number of participants, because the server feeds updates one at a time from storage.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import get_args

import numpy as np

from facecore.federation.config import Weighting
from facecore.federation.strategies.base import (
    AggregateResult,
    ClientUpdate,
    Strategy,
    UpdateKind,
    Weights,
)
from facecore.federation.wire import widened


def _wide(value: np.ndarray) -> np.ndarray:
    """float64 of an update's array; fp16 (the wire's) through the exact lookup table, not numpy's slow cast."""
    array = np.asarray(value)
    return (widened(array) if array.dtype == np.float16 else array).astype(np.float64)


class RunningWeightedSum:
    """``sum_i w_i * x_i`` and ``sum_i w_i`` over same-shaped weight dicts, added one at a time."""

    def __init__(self) -> None:
        self._sums: dict[str, np.ndarray] = {}
        self._metric_sums: dict[str, float] = {}
        self._metric_weights: dict[str, float] = {}
        self.total_weight = 0.0
        self.count = 0

    def add(self, weights: Mapping[str, np.ndarray], weight: float, metrics: Mapping[str, float] | None = None) -> None:
        if not weight > 0:
            raise ValueError(f"weight must be positive, got {weight}")
        if self.count == 0:
            self._sums = {k: _wide(v) * weight for k, v in weights.items()}
        else:
            if weights.keys() != self._sums.keys():
                missing, extra = self._sums.keys() - weights.keys(), weights.keys() - self._sums.keys()
                raise ValueError(f"update keys differ from the first update (missing {sorted(missing)[:3]}, extra {sorted(extra)[:3]})")
            for key, value in weights.items():
                if np.shape(value) != self._sums[key].shape:
                    raise ValueError(f"{key}: shape {np.shape(value)} differs from {self._sums[key].shape}")
                self._sums[key] += _wide(value) * weight
        for key, metric in (metrics or {}).items():
            self._metric_sums[key] = self._metric_sums.get(key, 0.0) + float(metric) * weight
            self._metric_weights[key] = self._metric_weights.get(key, 0.0) + weight
        self.total_weight += weight
        self.count += 1

    def mean(self) -> dict[str, np.ndarray]:
        if self.count == 0:
            raise ValueError("no updates were added")
        return {k: v / self.total_weight for k, v in self._sums.items()}

    def sums(self) -> dict[str, np.ndarray]:
        return {k: v.copy() for k, v in self._sums.items()}

    def metric_means(self) -> dict[str, float]:
        return {k: self._metric_sums[k] / self._metric_weights[k] for k in self._metric_sums}


def cast_like(value: np.ndarray, like: np.ndarray) -> np.ndarray:
    """``value`` in ``like``'s dtype; integer buffers (BatchNorm's step count) are rounded, not truncated."""
    if np.issubdtype(like.dtype, np.integer):
        return np.rint(value).astype(like.dtype)
    return value.astype(like.dtype)


class FedAvg(Strategy):
    """Weighted mean of client models (or of their deltas added to the base): by each client's
    samples, or with ``weighting="devices"`` every client once."""

    name = "fedavg"
    each_client_once = False  # subclasses that do not call __init__ weigh by samples

    def __init__(self, weighting: Weighting = "samples") -> None:
        if weighting not in get_args(Weighting):
            raise ValueError(f"weighting must be samples or devices, got {weighting!r}")
        self.each_client_once = weighting == "devices"

    def _weight(self, update: ClientUpdate) -> float:
        """How much one update counts; subclasses (FV's weighted FedAvg) override only this."""
        return 1.0 if self.each_client_once else float(update.n_samples)

    def _prepare(self, update: ClientUpdate) -> Mapping[str, np.ndarray]:
        """The weights that enter the mean; norm-bounded FedAvg clips them here."""
        return update.weights

    def aggregate_train(self, server_round: int, base: Mapping[str, np.ndarray], results: Iterable[ClientUpdate]) -> AggregateResult:
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
                total.add(self._prepare(update), weight, update.metrics)
        if total.count == 0 and n_samples > 0:
            raise ValueError("no client with a positive weight took part in this round")
        mean = total.mean()
        if kind == "delta":
            weights: Weights = {k: cast_like(np.asarray(base[k], dtype=np.float64) + mean[k], np.asarray(base[k])) for k in base}
        else:
            weights = {k: cast_like(mean[k], np.asarray(base[k])) for k in base}
        return AggregateResult(weights=weights, n_clients=total.count, n_samples=n_samples, metrics=total.metric_means())
