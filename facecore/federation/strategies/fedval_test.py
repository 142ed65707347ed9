"""Federated Validation's pure parts (Alg. 2, eqs. 7-13)."""
from __future__ import annotations

import re

import numpy as np
import pytest

from facecore.federation.strategies.fedval import (
    FederatedValidation,
    FVConfig,
    MovingNorm,
    candidate_weightings,
    local_norm,
    mix,
)


def test_keeps_the_current_weighting_when_every_candidate_scores_lower() -> None:
    for norm in ("local", "moving"):
        fv = FederatedValidation(3, FVConfig(norm=norm), seed=1, initial=[0.5, 0.3, 0.2])
        before = fv.weighting.copy()
        for _ in range(5):
            candidates = fv.propose()
            scores = np.array([[0.9, 0.8, 0.7], [0.6, 0.55, 0.5]])  # column 0 is w itself
            step = fv.apply(candidates, scores)
            assert step.chosen == 0
        np.testing.assert_array_equal(fv.weighting, before)


def test_moves_the_weighting_toward_the_trainer_a_validator_prefers() -> None:
    fv = FederatedValidation(3, FVConfig(phi=0.01), seed=0)
    backbones = [{"x": np.eye(3)[i]} for i in range(3)]  # so the aggregate's x is w_hat itself
    # Validator 1 scores higher the more of trainer 0 the model holds; validator 2 is indifferent.
    prefers_trainer_0 = lambda weights: np.array([weights["x"][0], 0.5])  # noqa: E731
    history = [fv.weighting[0]]
    for _ in range(50):
        before = fv.weighting.copy()
        step = fv.search(backbones, prefers_trainer_0)
        if step.chosen:
            # Eq. 13 exactly, with the best-scoring candidate.
            np.testing.assert_allclose(step.weighting, 0.99 * before + 0.01 * step.candidates[step.chosen], rtol=0, atol=1e-15)
        history.append(fv.weighting[0])
    assert all(b >= a for a, b in zip(history, history[1:])) and history[-1] > history[0] + 0.05
    np.testing.assert_allclose(fv.weighting.sum(), 1.0)


def test_candidates_start_with_the_current_weighting_and_lie_on_the_simplex() -> None:
    w = np.array([0.2, 0.8])
    c = candidate_weightings(w, 4, np.random.default_rng(0))
    np.testing.assert_array_equal(c[0], w)
    assert c.shape == (4, 2) and np.all(c >= 0)
    np.testing.assert_allclose(c.sum(axis=1), 1.0)


def test_local_and_moving_norm_follow_the_equations() -> None:
    S = np.array([[0.9, 0.7, 0.8], [0.2, 0.4, 0.3]])
    np.testing.assert_allclose(local_norm(S, 1e-3), S / np.sqrt(S.var(axis=1, keepdims=True) + 1e-3))
    norm = MovingNorm(gamma=0.01, eps=1e-3)
    norm(S)  # the first search initialises mu and nu
    assert norm.mu is not None and norm.nu is not None
    mu, nu = norm.mu.copy(), norm.nu.copy()
    S2 = S[:, ::-1] + 0.05
    out = norm(S2)
    mu2 = 0.99 * mu + 0.01 * S2.mean(axis=1)
    nu2 = 0.99 * nu + 0.01 * ((S2 - mu2[:, None]) ** 2).mean(axis=1)
    np.testing.assert_allclose(out, S2 / np.sqrt(nu2[:, None] + 1e-3))


def test_mix_is_the_weighted_sum_of_backbones() -> None:
    a, b = {"w": np.array([1.0, 3.0], np.float32), "n": np.array(4)}, {"w": np.array([3.0, 5.0], np.float32), "n": np.array(6)}
    out = mix(np.array([0.25, 0.75]), [a, b])
    np.testing.assert_array_equal(out["w"], np.array([2.5, 4.5], np.float32))
    assert out["w"].dtype == np.float32 and out["n"] == 6 and out["n"].dtype == a["n"].dtype  # 5.5 rounds half to even


def test_bad_configs_and_scores_are_refused() -> None:
    for bad in ({"candidates": 1}, {"phi": 0.0}, {"norm": "global"}, {"gamma": 0.0}, {"eps": 0.0}):
        with pytest.raises(ValueError, match=rf"^{next(iter(bad))}\b.* must be"):  # names the setting it refuses
            FVConfig(**bad)
    fv = FederatedValidation(2)
    with pytest.raises(ValueError, match=re.escape("scores must be a finite (validators, candidates) array, got shape (1, 3)")):
        fv.apply(fv.propose(), np.array([[0.1, float("nan"), 0.2]]))
    with pytest.raises(ValueError, match=re.escape("a weighting must be finite, >= 0 and sum to 1, got [0.7 0.7]")):
        FederatedValidation(2, initial=[0.7, 0.7])
