"""Federated Validation, the pure parts (Bai et al., "Federated Face Recognition", Alg. 2).

One search: snapshot the trainers' latest backbones theta'; build T candidate weightings,
the first the weighting in use, the others uniform on the simplex; every validator scores
every candidate aggregate ``w_hat_t . theta'`` (eq. 7) on its private pairs; normalise each
validator's scores (Local Norm, eq. 8, or Moving Norm, eqs. 9-11); pick
``t_hat = argmax_t sum_i S'_{i,t}`` (eq. 12) and smooth ``w <- (1 - phi) w + phi w_hat``
(eq. 13). Nothing here touches data: scoring is a callable the caller wires to validators.
Hyper-parameters default to Sec. 4.2: T = 3, phi = 0.01, gamma = 0.01, eps = 1e-3.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np

from facecore.federation.strategies.base import Weights
from facecore.federation.strategies.fedavg import cast_like

NormName = Literal["local", "moving"]
NORMS = ("local", "moving")


@dataclass(frozen=True)
class FVConfig:
    candidates: int = 3  # T
    phi: float = 0.01
    norm: NormName = "local"  # Local Norm performed best in the paper (Fig. 5)
    gamma: float = 0.01  # Moving Norm only
    eps: float = 1e-3

    def __post_init__(self) -> None:
        if isinstance(self.candidates, bool) or not isinstance(self.candidates, int) or self.candidates < 2:
            raise ValueError(f"candidates (T) must be an integer >= 2, got {self.candidates!r}")
        if not 0.0 < self.phi <= 1.0:
            raise ValueError(f"phi must be in (0, 1], got {self.phi}")
        if self.norm not in NORMS:
            raise ValueError(f"norm must be one of {NORMS}, got {self.norm!r}")
        if not 0.0 < self.gamma <= 1.0:
            raise ValueError(f"gamma must be in (0, 1], got {self.gamma}")
        if not (math.isfinite(self.eps) and self.eps > 0):
            raise ValueError(f"eps must be positive, got {self.eps}")


def uniform_simplex(n: int, rng: np.random.Generator) -> np.ndarray:
    """A weighting drawn uniformly from the probability simplex (Dirichlet(1, ..., 1))."""
    if n < 1:
        raise ValueError(f"need at least one trainer, got {n}")
    return rng.dirichlet(np.ones(n))


def candidate_weightings(w: np.ndarray, count: int, rng: np.random.Generator) -> np.ndarray:
    """``(count, n)``: row 0 is ``w`` itself, so a search never ends worse than the weighting in use."""
    w = check_simplex(w)
    return np.stack([w] + [uniform_simplex(w.size, rng) for _ in range(count - 1)])


def check_simplex(w: Sequence[float] | np.ndarray) -> np.ndarray:
    w = np.asarray(w, dtype=np.float64)
    if w.ndim != 1 or w.size < 1 or not np.all(np.isfinite(w)) or np.any(w < 0) or not math.isclose(float(w.sum()), 1.0, abs_tol=1e-9):
        raise ValueError(f"a weighting must be finite, >= 0 and sum to 1, got {w}")
    return w


def local_norm(scores: np.ndarray, eps: float = 1e-3) -> np.ndarray:
    """Eq. 8: each validator's row divided by ``sqrt(var over this search's candidates + eps)``."""
    S = _scores(scores)
    return S / np.sqrt(S.var(axis=1, keepdims=True) + eps)


class MovingNorm:
    """Eqs. 9-11: each validator's row divided by ``sqrt(nu + eps)``, nu a moving variance.

    ``mu`` and ``nu`` start from the first search's own mean and variance: starting from 0
    would make the first ``gamma``-weighted updates divide by roughly ``sqrt(eps)`` only.
    """

    def __init__(self, gamma: float = 0.01, eps: float = 1e-3) -> None:
        self.gamma, self.eps = gamma, eps
        self.mu: np.ndarray | None = None
        self.nu: np.ndarray | None = None

    def __call__(self, scores: np.ndarray) -> np.ndarray:
        S = _scores(scores)
        if self.mu is None or self.nu is None:
            self.mu, self.nu = S.mean(axis=1), S.var(axis=1)
        else:
            self.mu = (1 - self.gamma) * self.mu + self.gamma * S.mean(axis=1)
            self.nu = (1 - self.gamma) * self.nu + self.gamma * np.mean((S - self.mu[:, None]) ** 2, axis=1)
        return S / np.sqrt(self.nu[:, None] + self.eps)


def _scores(scores: np.ndarray) -> np.ndarray:
    S = np.asarray(scores, dtype=np.float64)
    if S.ndim != 2 or S.shape[0] < 1 or S.shape[1] < 1 or not np.all(np.isfinite(S)):
        raise ValueError(f"scores must be a finite (validators, candidates) array, got shape {S.shape}")
    return S


def mix(weighting: np.ndarray, backbones: Sequence[Mapping[str, np.ndarray]]) -> Weights:
    """Eq. 7: ``sum_i w_i theta_i`` in float64, cast back like FedAvg (integer buffers rounded)."""
    w = check_simplex(weighting)
    if len(backbones) != w.size:
        raise ValueError(f"{w.size} weights for {len(backbones)} backbones")
    first = backbones[0]
    out: Weights = {}
    for key in first:
        total = sum(float(wi) * np.asarray(b[key], dtype=np.float64) for wi, b in zip(w, backbones))
        out[key] = cast_like(np.asarray(total), np.asarray(first[key]))
    return out


@dataclass(frozen=True)
class FVStep:
    candidates: np.ndarray  # (T, n)
    scores: np.ndarray  # (V, T) raw
    normalized: np.ndarray  # (V, T)
    chosen: int  # t_hat; 0 keeps the current weighting
    weighting: np.ndarray  # w after the update


class FederatedValidation:
    """The server's FV state: the weighting ``w``, the normaliser and the sampling RNG."""

    def __init__(self, n_trainers: int, config: FVConfig = FVConfig(), seed: int = 0, initial: Sequence[float] | None = None) -> None:
        self.config = config
        self.weighting = check_simplex(np.full(n_trainers, 1.0 / n_trainers) if initial is None else initial)
        self.rng = np.random.default_rng(seed)
        self._moving = MovingNorm(config.gamma, config.eps) if config.norm == "moving" else None

    def propose(self) -> np.ndarray:
        return candidate_weightings(self.weighting, self.config.candidates, self.rng)

    def normalize(self, scores: np.ndarray) -> np.ndarray:
        return self._moving(scores) if self._moving is not None else local_norm(scores, self.config.eps)

    def apply(self, candidates: np.ndarray, scores: np.ndarray) -> FVStep:
        """Eqs. 12-13 on one search's raw ``scores`` (validators x candidates)."""
        S = _scores(scores)
        if S.shape[1] != len(candidates):
            raise ValueError(f"{S.shape[1]} score columns for {len(candidates)} candidates")
        normalized = self.normalize(S)
        chosen = int(np.argmax(normalized.sum(axis=0)))  # ties go to the first, i.e. to the current w
        if chosen != 0:
            # (1 - phi) w + phi w is w only up to rounding; skipping it keeps w bit-identical.
            w = (1.0 - self.config.phi) * self.weighting + self.config.phi * np.asarray(candidates[chosen], dtype=np.float64)
            self.weighting = w / w.sum()
        return FVStep(np.asarray(candidates), S, normalized, chosen, self.weighting.copy())

    def search(self, backbones: Sequence[Mapping[str, np.ndarray]], score: Callable[[Weights], np.ndarray]) -> FVStep:
        """One whole search, synchronously: ``score(aggregate)`` returns every validator's score."""
        # theta' must not change during the search, even if a trainer writes in place meanwhile.
        snapshot = [{k: np.array(v, copy=True) for k, v in b.items()} for b in backbones]
        candidates = self.propose()
        columns = [np.asarray(score(mix(c, snapshot)), dtype=np.float64).ravel() for c in candidates]
        return self.apply(candidates, np.stack(columns, axis=1))
