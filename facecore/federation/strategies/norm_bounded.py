"""Norm-bounded FedAvg (Sun et al. 2019, "Can you really backdoor federated learning?"): each
delta is scaled down to at most ``max_norm`` in L2, then the clipped deltas are averaged with
EQUAL weights. A sample-count weight is whatever the device claims, so one attacker reporting
millions of samples would otherwise own the mean; with equal weights each device moves it by at
most max_norm / n. It still streams: clipping needs one update at a time."""
from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from facecore.federation.strategies.base import ClientUpdate
from facecore.federation.strategies.fedavg import FedAvg


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


class NormBoundedFedAvg(FedAvg):
    name = "norm_bounded"

    def __init__(self, max_norm: float = 1.0) -> None:
        if not max_norm > 0:
            raise ValueError(f"max_norm must be positive, got {max_norm}")
        self.max_norm = max_norm

    def _weight(self, update: ClientUpdate) -> float:
        return 1.0

    def _prepare(self, update: ClientUpdate) -> Mapping[str, np.ndarray]:
        if update.kind != "delta":
            raise ValueError("norm bounding applies to deltas (trained - base), not full models")
        return clip_to_norm(update.weights, self.max_norm)[0]
