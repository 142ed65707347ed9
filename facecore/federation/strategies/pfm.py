"""Partially Federated Momentum, server side (Bai et al., "Federated Face Recognition", Alg. 1).

Only the backbone is federated; every trainer keeps its classifier and the classifier's
momentum to itself. Per round r with learning rate eta_r the server computes

    Theta_r = sum_i w_i * theta_i                        (eq. 4, Alg. 1 line 15)
    M_r     = (Theta_{r-1} - Theta_r) / eta_r            (eq. 6, Alg. 1 line 16)

and sends (Theta_r, M_r) to every trainer, which then takes K local steps

    theta <- theta - eta_{r+1} * (g + beta * M_r / K)    (eq. 3, Alg. 1 line 8).

Sign: M_r is a gradient-like quantity (it points uphill, like PyTorch's momentum buffer)
and trainers subtract it. In Alg. 1 the primed Theta' is the *previous* global model, so
``(Theta' - Theta) / eta`` there is exactly ``(Theta_{r-1} - Theta_r) / eta_r`` here.
Eq. 6 shows why: M_r = beta * M_{r-1} + G_r with G_r the estimated global gradient (eq. 5),
i.e. the centralized momentum buffer; with one trainer and K = 1 this is momentum SGD.

``w`` is the volatile weighting that Federated Validation tunes (see :mod:`.fedval`);
without one, clients are weighted by sample count as in FedAvg.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass

import numpy as np

from facecore.federation.strategies.base import (
    AggregateResult,
    ClientUpdate,
    TrainInstructions,
    Weights,
)
from facecore.federation.strategies.fedavg import FedAvg, cast_like

LearningRate = float | Callable[[int], float]


def check_weighting(weighting: Mapping[str, float]) -> dict[str, float]:
    """A copy of ``weighting`` after checking it is a non-empty set of finite weights >= 0 with a positive sum."""
    out = {str(k): float(v) for k, v in weighting.items()}
    if not out or any(not math.isfinite(v) or v < 0 for v in out.values()) or not sum(out.values()) > 0:
        raise ValueError(f"a weighting needs finite weights >= 0 with a positive sum, got {out}")
    return out


class WeightedFedAvg(FedAvg):
    """FedAvg with an explicit per-client weighting ``w`` (normalised over the round's clients).

    FV changes ``w`` while training runs, so it is held here and replaced with
    :meth:`set_weighting`; with no weighting this is exactly FedAvg (sample-weighted).
    A client whose weight is 0 is skipped: the aggregate is then the same as without it.
    """

    name = "weighted-fedavg"

    def __init__(self, weighting: Mapping[str, float] | None = None) -> None:
        self.weighting: dict[str, float] | None = None if weighting is None else check_weighting(weighting)

    def set_weighting(self, weighting: Mapping[str, float] | None) -> None:
        self.weighting = None if weighting is None else check_weighting(weighting)

    def _weight(self, update: ClientUpdate) -> float:
        if self.weighting is None:
            return float(update.n_samples)
        if update.client_id not in self.weighting:
            raise ValueError(f"client {update.client_id!r} has no weight in the weighting {sorted(self.weighting)}")
        return self.weighting[update.client_id]


@dataclass(frozen=True)
class PFMResult(AggregateResult):
    """The aggregate plus the global momentum ``M_r`` and the ``eta_r`` it was divided by."""

    momentum: Weights
    lr: float


class PFM(WeightedFedAvg):
    """Server half of PFM: weighted average of the backbones, then ``M = (Theta_prev - Theta_new) / eta``.

    Args:
        lr: ``eta_r``, a constant or a function of the (1-based) round.
        beta: the momentum parameter, sent to trainers with each round's instructions.
        weighting: FV's ``w`` keyed by client id; ``None`` weights by sample count.
        momentum_keys: which weights are optimised parameters. BatchNorm running
            statistics are averaged like FedAvg does but get no momentum, because no
            optimizer step moves them. ``None``: every floating-point entry.
    """

    name = "pfm"

    def __init__(
        self, lr: LearningRate, beta: float = 0.9, weighting: Mapping[str, float] | None = None,
        momentum_keys: Collection[str] | None = None,
    ) -> None:
        super().__init__(weighting)
        if not 0.0 <= beta < 1.0:
            raise ValueError(f"beta must be in [0, 1), got {beta}")
        if not callable(lr):
            _check_lr(lr)
        self._lr = lr
        self.beta = beta
        self.momentum_keys = None if momentum_keys is None else frozenset(momentum_keys)

    def lr(self, server_round: int) -> float:
        return _check_lr(self._lr(server_round) if callable(self._lr) else self._lr)

    def configure_train(self, server_round: int, clients, config):  # type: ignore[no-untyped-def]
        """Adds ``lr`` (eta_r) and ``beta`` to every client's config; the caller sends ``M`` with the weights."""
        extra = {"lr": self.lr(server_round), "beta": self.beta}
        return {client: TrainInstructions(server_round, {**dict(config), **extra}) for client in clients}

    def momentum_names(self, base: Mapping[str, np.ndarray]) -> list[str]:
        if self.momentum_keys is not None:
            missing = self.momentum_keys - base.keys()
            if missing:
                raise ValueError(f"momentum keys not in the model: {sorted(missing)[:3]}")
            return [k for k in base if k in self.momentum_keys]
        return [k for k in base if np.issubdtype(np.asarray(base[k]).dtype, np.floating)]

    def initial_momentum(self, base: Mapping[str, np.ndarray]) -> Weights:
        """``M_0 = 0`` (Alg. 1 line 1), shaped like the momentum entries of ``base``."""
        return {k: np.zeros_like(np.asarray(base[k])) for k in self.momentum_names(base)}

    def aggregate_train(self, server_round: int, base: Mapping[str, np.ndarray], results: Iterable[ClientUpdate]) -> PFMResult:
        eta = self.lr(server_round)
        averaged = super().aggregate_train(server_round, base, results)
        # From the cast weights the trainers will actually receive, so M matches Theta_r exactly.
        momentum = {
            k: cast_like((np.asarray(base[k], dtype=np.float64) - np.asarray(averaged.weights[k], dtype=np.float64)) / eta, np.asarray(base[k]))
            for k in self.momentum_names(base)
        }
        norm = math.sqrt(sum(float(np.sum(np.square(v, dtype=np.float64))) for v in momentum.values()))
        return PFMResult(
            weights=averaged.weights, n_clients=averaged.n_clients, n_samples=averaged.n_samples,
            metrics={**averaged.metrics, "momentum_norm": norm, "lr": eta}, momentum=momentum, lr=eta,
        )


def _check_lr(value: float) -> float:
    value = float(value)
    if not (math.isfinite(value) and value > 0):
        raise ValueError(f"the learning rate must be a positive finite number, got {value}")
    return value
