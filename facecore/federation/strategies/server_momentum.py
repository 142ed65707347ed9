"""Server momentum (FedAvgM; Hsu, Qi & Brown 2019): the chain's stage around any backbone step.

The inner strategy's step ``d`` (its new weights minus the base) becomes ``v = momentum * v_prev + d``
and the round publishes ``base + v``. A round without it takes the single step the inner strategy
asks for, which a sharp loss (a strong pretrained model) only allows at a learning rate too small to
go anywhere in a few rounds; momentum lets the rounds add up, as a centralised optimiser's does.

Invariants:
- ``v_prev`` is the step that produced the base: the base minus its parent. A live server needs no
  state beyond its model lineage; a base without a parent (an imported model) starts at zero.
- Only the inner step's keys move; ``v_prev`` entries for other keys are ignored, and a missing one
  counts as zero.
- ``momentum == 0`` publishes exactly what the inner strategy does.
- It sits outside DP noise: momentum is then post-processing of what the noise stage published, at no
  privacy cost, and the lineage it reads is the published models.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping

import numpy as np

from facecore.federation.strategies.base import AggregateResult, ClientUpdate, Strategy, Weights, Wrapper
from facecore.federation.strategies.fedavg import RoundSum, cast_like


def last_step(base: Mapping[str, np.ndarray], parent: Mapping[str, np.ndarray] | None) -> Weights:
    """The step that turned `parent` into `base` (float64), on the keys both hold; empty without a parent."""
    if parent is None:
        return {}
    return {k: np.asarray(base[k], np.float64) - np.asarray(parent[k], np.float64) for k in base.keys() & parent.keys()
            if np.issubdtype(np.asarray(base[k]).dtype, np.floating)}


class ServerMomentum(Wrapper):
    """``inner``'s backbone step with heavy-ball momentum; ``previous`` is the base's own step (last_step)."""

    name = "server_momentum"

    def __init__(self, inner: Strategy, momentum: float, previous: Mapping[str, np.ndarray] | None = None) -> None:
        if not 0 <= momentum < 1:
            raise ValueError(f"server momentum must be in [0, 1), got {momentum}")
        super().__init__(inner)
        self.momentum = momentum
        self.previous: Weights = {k: np.asarray(v, np.float64) for k, v in (previous or {}).items()}

    def aggregate_train(self, server_round: int, base: Mapping[str, np.ndarray], results: Iterable[ClientUpdate]) -> AggregateResult:
        return self._stepped(base, self.inner.aggregate_train(server_round, base, results))

    def aggregate_sum(self, server_round: int, base: Mapping[str, np.ndarray], total: RoundSum) -> AggregateResult:
        return self._stepped(base, self.inner.aggregate_sum(server_round, base, total))

    def _stepped(self, base: Mapping[str, np.ndarray], result: AggregateResult) -> AggregateResult:
        if self.momentum == 0:
            return result
        weights, steps = {}, {}
        for key, new in result.weights.items():
            new_array, base_array = np.asarray(new), np.asarray(base[key])
            if not np.issubdtype(base_array.dtype, np.floating):
                weights[key] = new_array  # integer buffers (BatchNorm's counters) are not stepped
                continue
            step = new_array.astype(np.float64) - base_array
            if key in self.previous:
                step = step + self.momentum * self.previous[key]
            steps[key] = step
            weights[key] = cast_like(base_array + step, base_array)
        self.previous = steps  # the simulator keeps one strategy across rounds; the server builds one per round
        return AggregateResult(weights, result.n_clients, result.n_samples, result.metrics)
