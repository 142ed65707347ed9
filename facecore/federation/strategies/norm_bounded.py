"""Norm clipping, the chain's per-update stage (Sun et al. 2019, "Can you really backdoor federated
learning?"): each delta is scaled down to at most ``max_norm`` in L2 before it enters the sum.

The configured ``norm_bounded`` aggregation is this stage around FedAvg with EQUAL weights. A
sample-count weight is whatever the device claims, so one attacker reporting millions of samples
would otherwise own the mean; with equal weights each device moves it by at most max_norm / n.

Invariants: clipping sees one update at a time, so the chain still streams. It wraps only a
:class:`~.fedavg.SumStrategy`: a median or trimmed mean bounds a device's influence by itself, and
DP noise (the stage outside this one) needs a sum of clipped updates. ``frozen`` keys (DP's BatchNorm
statistics) enter the sum as zeros and do not count towards the norm.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import replace

import numpy as np

from facecore.federation.strategies.base import AggregateResult, ClientUpdate, Strategy, Wrapper
from facecore.federation.strategies.fedavg import RoundSum, SumStrategy
from facecore.federation.strategies.secure_fedavg import SecureSum


def clip_to_norm(weights: Mapping[str, np.ndarray], max_norm: float) -> tuple[dict[str, np.ndarray], float]:
    """The delta scaled to L2 norm <= max_norm (integer buffers left alone) and its original norm."""
    floats = [np.asarray(v, dtype=np.float64) for v in weights.values() if np.issubdtype(np.asarray(v).dtype, np.floating)]
    norm = math.sqrt(sum(float(v.ravel() @ v.ravel()) for v in floats))
    scale = min(1.0, max_norm / norm) if norm > 0 else 1.0
    clipped = {
        k: np.asarray(v, dtype=np.float64) * scale if np.issubdtype(np.asarray(v).dtype, np.floating) else np.asarray(v)
        for k, v in weights.items()
    }
    return clipped, norm


class NormClipping(SumStrategy, Wrapper):
    """``inner``'s sum over each delta clipped to ``max_norm``; the sum records how many were clipped."""

    name = "norm_clipping"
    inner: SumStrategy

    def __init__(self, inner: Strategy, max_norm: float = 1.0, frozen: Callable[[str], bool] | None = None) -> None:
        if not isinstance(inner, SumStrategy):
            raise TypeError(f"norm clipping feeds a sum, and {inner.name} is not one: a median or trimmed mean bounds a device by itself")
        if isinstance(inner, SecureSum):
            raise TypeError("the server cannot clip updates secure aggregation hides: devices clip, and the secure sum is bounded as a whole")
        if not max_norm > 0:
            raise ValueError(f"max_norm must be positive, got {max_norm}")
        super().__init__(inner)
        self.max_norm, self.frozen = max_norm, frozen

    def summed(self, server_round: int, base: Mapping[str, np.ndarray], results: Iterable[ClientUpdate]) -> RoundSum:
        n_clipped = 0

        def clipped() -> Iterator[ClientUpdate]:
            nonlocal n_clipped
            for update in results:
                bounded, was_clipped = self.clip(update)
                n_clipped += was_clipped
                yield bounded

        total = self.inner.summed(server_round, base, clipped())
        return replace(total, clipped=n_clipped)

    def publish(self, base: Mapping[str, np.ndarray], total: RoundSum) -> AggregateResult:
        return self.inner.publish(base, total)

    def clip(self, update: ClientUpdate) -> tuple[ClientUpdate, bool]:
        """The update with its delta clipped (frozen keys zeroed first), and whether it was over the bound."""
        if update.kind != "delta":
            raise ValueError("norm clipping applies to deltas (trained - base), not full models")
        weights = update.weights
        if self.frozen is not None:
            weights = {k: (np.zeros(np.shape(v)) if self.frozen(k) else v) for k, v in weights.items()}
        bounded, norm = clip_to_norm(weights, self.max_norm)
        return ClientUpdate(bounded, update.n_samples, update.metrics, update.client_id, update.embedding, update.kind), norm > self.max_norm
