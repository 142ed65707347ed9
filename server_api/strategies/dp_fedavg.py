"""DP-FedAvg (McMahan et al. 2018, "Learning differentially private recurrent language models"):
user-level differential privacy for the backbone.

Each device's delta is clipped to L2 norm C, the clipped deltas are averaged with EQUAL weights
over the n participants (sample-count weights would let one device move the mean by more than
C/n), and Gaussian noise N(0, (z·C/n)²) is added to every coordinate a device can influence.
Removing or adding one device then changes the noiseless mean by at most C/n, so each round is
the Gaussian mechanism with noise multiplier z; `dp_epsilon` composes the rounds with Opacus's
RDP accountant under Poisson sampling at rate q = participants / enrolled devices.

Keys that devices must not change (BatchNorm running statistics and counters: devices train with
frozen BatchNorm) are kept at the base model's values instead of averaged, so they need no noise
and leak nothing. Noise comes from numpy's PCG64 seeded from the OS's CSPRNG; its floating-point
sampling is not hardened against the attacks of Mironov (CCS 2012).
"""
from __future__ import annotations

import math
import secrets
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence

import numpy as np

from server_api.strategies.base import AggregateResult, ClientUpdate
from server_api.strategies.fedavg import FedAvg
from server_api.strategies.norm_bounded import clip_to_norm

_FROZEN_SUFFIXES = ("running_mean", "running_var", "num_batches_tracked")


def is_frozen_statistic(key: str) -> bool:
    """BatchNorm statistics: devices train with frozen BatchNorm, so these never change."""
    return key.endswith(_FROZEN_SUFFIXES)


class DPFedAvg(FedAvg):
    name = "dp_fedavg"

    def __init__(self, clip_norm: float = 1.0, noise_multiplier: float = 1.0, seed: int | None = None,
                 frozen: Callable[[str], bool] = is_frozen_statistic) -> None:
        if not clip_norm > 0:
            raise ValueError(f"clip_norm must be positive, got {clip_norm}")
        if not noise_multiplier >= 0:
            raise ValueError(f"noise_multiplier must be >= 0, got {noise_multiplier}")
        self.clip_norm, self.noise_multiplier, self.frozen = clip_norm, noise_multiplier, frozen
        self.seed = seed  # None: fresh OS entropy each round; a seed (simulations) fixes each round's noise
        self._clipped = 0

    def _weight(self, update: ClientUpdate) -> float:
        return 1.0

    def _prepare(self, update: ClientUpdate) -> Mapping[str, np.ndarray]:
        if update.kind != "delta":
            raise ValueError("DP-FedAvg clips deltas (trained - base), not full models")
        private = {k: (np.zeros(np.shape(v)) if self.frozen(k) else v) for k, v in update.weights.items()}
        clipped, norm = clip_to_norm(private, self.clip_norm)
        self._clipped += norm > self.clip_norm
        return clipped

    def aggregate_train(self, server_round: int, base: Mapping[str, np.ndarray], results: Iterable[ClientUpdate]) -> AggregateResult:
        self._clipped = 0
        result = super().aggregate_train(server_round, base, results)
        std = self.noise_multiplier * self.clip_norm / result.n_clients
        rng = np.random.default_rng(secrets.randbits(128) if self.seed is None else [self.seed, server_round])
        weights = dict(result.weights)
        for key, value in weights.items():
            if self.frozen(key):
                weights[key] = np.array(base[key], copy=True)
            elif np.issubdtype(value.dtype, np.floating) and std > 0:
                weights[key] = (value.astype(np.float64) + rng.normal(0.0, std, value.shape)).astype(value.dtype)
        metrics = {**result.metrics, "dp_noise_std": std, "dp_clipped_fraction": self._clipped / result.n_clients}
        return AggregateResult(weights, result.n_clients, result.n_samples, metrics)


def dp_epsilon(noise_multiplier: float, sample_rate: float, rounds: int, delta: float) -> float:
    """ε after `rounds` DP-FedAvg rounds (Opacus RDP accountant); inf without noise."""
    return epsilon_of_history([(noise_multiplier, sample_rate, rounds)], delta)


def epsilon_of_history(history: Sequence[tuple[float, float, int]], delta: float) -> float:
    """ε of a sequence of (noise multiplier, sample rate, rounds), composed by RDP."""
    for _, sample_rate, _ in history:
        _check_accounting(sample_rate, delta)
    history = [h for h in history if h[2] > 0]
    if not history:
        return 0.0
    if any(z == 0 for z, _, _ in history):
        return math.inf
    from opacus.accountants import RDPAccountant

    accountant = RDPAccountant()
    accountant.history = [(float(z), float(q), int(n)) for z, q, n in history]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # "optimal order is the largest alpha": a looser bound, not an error
        return float(accountant.get_epsilon(delta))


def noise_for_epsilon(epsilon: float, sample_rate: float, rounds: int, delta: float) -> float:
    """The smallest noise multiplier (to Opacus's 0.01 precision) whose `rounds` stay within ε."""
    _check_accounting(sample_rate, delta)
    if not epsilon > 0 or rounds < 1:
        raise ValueError("need epsilon > 0 and at least one round")
    from opacus.accountants.utils import get_noise_multiplier

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return float(get_noise_multiplier(target_epsilon=epsilon, target_delta=delta, sample_rate=sample_rate, steps=rounds, accountant="rdp"))


def _check_accounting(sample_rate: float, delta: float) -> None:
    if not 0 < sample_rate <= 1:
        raise ValueError(f"sample_rate must be in (0, 1], got {sample_rate}")
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
