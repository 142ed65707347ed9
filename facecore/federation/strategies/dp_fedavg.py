"""DP-FedAvg (McMahan et al. 2018, "Learning differentially private recurrent language models"):
user-level differential privacy for the backbone. In the chain it is the DP noise stage around norm
clipping around FedAvg by devices (:func:`dp_fedavg` builds the three); the stage refuses anything
else beneath it, because its noise is calibrated to that sum.

Each device's delta is clipped to L2 norm C and the clipped deltas are SUMMED with equal weights
(a sample-count weight is whatever the device claims). The sum is divided by a FIXED denominator,
the expected number of participants q·N, never by the number that took part: with the actual
count n, adding or removing one device would move the mean by up to 2C/(n+1), and noise
z·C/n would be worth only about z/2. With the fixed denominator one device moves the noiseless
estimate by at most C/(qN), and Gaussian noise N(0, (z·C/(qN))²) on every coordinate a device can
influence makes each round the Gaussian mechanism with noise multiplier z.

Amplification by sampling needs q to be true of the selection: devices are chosen by independent
(Poisson) draws at rate q (``poisson_selected``), not by filling a fixed number of slots from
whoever checked in. `dp_epsilon` composes the rounds with Opacus's RDP accountant at that q.

Keys that devices must not change (BatchNorm running statistics and counters: devices train with
frozen BatchNorm) are kept at the base model's values instead of averaged, so they need no noise
and leak nothing. Noise comes from numpy's PCG64 seeded from the OS's CSPRNG; its floating-point
sampling is not hardened against the attacks of Mironov (CCS 2012).
"""
from __future__ import annotations

import hashlib
import hmac
import math
import secrets
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence

import numpy as np

from facecore.federation.strategies.base import AggregateResult, ClientUpdate, Strategy, Wrapper, chain_of
from facecore.federation.strategies.fedavg import FedAvg, RoundSum
from facecore.federation.strategies.norm_bounded import NormClipping

_FROZEN_SUFFIXES = ("running_mean", "running_var", "num_batches_tracked")


def is_frozen_statistic(key: str) -> bool:
    """BatchNorm statistics: devices train with frozen BatchNorm, so these never change."""
    return key.endswith(_FROZEN_SUFFIXES)


class DPFedAvg(Wrapper):
    """The DP noise stage: ``inner`` (norm clipping around an equal-weight FedAvg) sums the clipped
    deltas; this divides the sum by the fixed ``expected_clients`` and adds Gaussian noise."""

    name = "dp_noise"
    inner: NormClipping

    def __init__(self, inner: Strategy, noise_multiplier: float = 1.0, expected_clients: int = 1, seed: int | None = None) -> None:
        # The noise is calibrated to one device moving the sum by at most the clip norm: every update clipped, each counted once.
        if not isinstance(inner, NormClipping) or not isinstance(inner.inner, FedAvg) or not inner.inner.each_client_once:
            raise TypeError(f"DP noise needs norm clipping around FedAvg by devices beneath it, not {' > '.join(chain_of(inner))}: "
                            "its sensitivity is one clipped update")
        if not noise_multiplier >= 0:
            raise ValueError(f"noise_multiplier must be >= 0, got {noise_multiplier}")
        if expected_clients < 1:
            raise ValueError(f"expected_clients (the fixed denominator q·N) must be >= 1, got {expected_clients}")
        super().__init__(inner)
        self.noise_multiplier, self.expected_clients = noise_multiplier, expected_clients
        self.frozen: Callable[[str], bool] = inner.frozen or (lambda key: False)
        self.seed = seed  # None: fresh OS entropy each round; a seed (simulations) fixes each round's noise

    @property
    def clip_norm(self) -> float:
        return self.inner.max_norm

    @property
    def noise_std(self) -> float:
        return self.noise_multiplier * self.clip_norm / self.expected_clients

    def aggregate_train(self, server_round: int, base: Mapping[str, np.ndarray], results: Iterable[ClientUpdate]) -> AggregateResult:
        return self.aggregate_sum(server_round, base, self.inner.summed(server_round, base, results))

    def aggregate_sum(self, server_round: int, base: Mapping[str, np.ndarray], total: RoundSum) -> AggregateResult:
        # Even an empty Poisson sample publishes base + noise: skipping the round would reveal it was empty.
        rng = np.random.default_rng(secrets.randbits(128) if self.seed is None else [self.seed, server_round])
        weights: dict[str, np.ndarray] = {}
        for key, value in base.items():
            like = np.asarray(value)
            if self.frozen(key) or not np.issubdtype(like.dtype, np.floating):
                weights[key] = np.array(like, copy=True)
                continue
            step = total.sums[key] / self.expected_clients if key in total.sums else np.zeros(like.shape)
            if self.noise_std > 0:
                step = step + rng.normal(0.0, self.noise_std, like.shape)
            weights[key] = (like.astype(np.float64) + step).astype(like.dtype)
        metrics = {**total.metrics, "dp_noise_std": self.noise_std,
                   "dp_clipped_fraction": total.clipped / max(total.count, 1), "dp_expected_clients": float(self.expected_clients)}
        return AggregateResult(weights, total.count, total.n_samples, metrics)


def dp_fedavg(clip_norm: float = 1.0, noise_multiplier: float = 1.0, expected_clients: int = 1, seed: int | None = None,
              frozen: Callable[[str], bool] = is_frozen_statistic) -> DPFedAvg:
    """The DP-FedAvg chain: noise around norm clipping (frozen statistics zeroed) around FedAvg by devices."""
    return DPFedAvg(NormClipping(FedAvg("devices"), clip_norm, frozen), noise_multiplier, expected_clients, seed)


def sample_rate_for(expected_clients: int, population: int) -> float:
    """q such that a Poisson draw over `population` devices selects `expected_clients` on average."""
    if population < 1:
        raise ValueError("no enrolled device to sample from")
    return min(1.0, expected_clients / population)


def poisson_selected(key: bytes, device_id: str, sample_rate: float) -> bool:
    """Whether a device is in a round's Poisson sample: an independent draw per device at rate q,
    made reproducible (the same device asking twice gets the same answer) by a keyed hash of its
    id under the round's secret key, which no device sees."""
    digest = hmac.new(key, device_id.encode(), hashlib.sha256).digest()
    return int.from_bytes(digest[:8], "big") < sample_rate * 2**64


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
