"""PFM's server half: the weighted average and M = (Theta_prev - Theta_new) / eta."""
from __future__ import annotations

import re

import numpy as np
import pytest

from facecore.federation.strategies.base import ClientUpdate
from facecore.federation.strategies.fedavg import FedAvg
from facecore.federation.strategies.pfm import PFM, PFMResult, WeightedFedAvg

BASE = {"w": np.array([[1.0, -2.0], [0.5, 3.0]]), "bn.running_mean": np.array([0.1, 0.2]), "bn.num_batches_tracked": np.array(7)}


def full(client: str, shift: float, n: int = 1) -> ClientUpdate:
    weights = {"w": BASE["w"] + shift, "bn.running_mean": BASE["bn.running_mean"] * (1 + shift), "bn.num_batches_tracked": np.array(7 + 3)}
    return ClientUpdate(weights, n, client_id=client, kind="full")


def test_momentum_is_previous_minus_new_over_lr_with_the_weighting() -> None:
    strategy = PFM(lr=0.1, weighting={"a": 0.75, "b": 0.25}, momentum_keys=["w"])
    result = strategy.aggregate_train(1, BASE, [full("a", -0.2), full("b", 0.4)])
    assert isinstance(result, PFMResult)
    expected = 0.75 * (BASE["w"] - 0.2) + 0.25 * (BASE["w"] + 0.4)
    np.testing.assert_array_equal(result.weights["w"], expected)
    np.testing.assert_array_equal(result.momentum["w"], (BASE["w"] - expected) / 0.1)
    # Buffers are averaged but carry no momentum; the integer counter stays an integer.
    assert set(result.momentum) == {"w"} and result.weights["bn.num_batches_tracked"].dtype == BASE["bn.num_batches_tracked"].dtype
    assert result.lr == 0.1 and result.metrics["momentum_norm"] > 0


def test_delta_updates_give_the_same_momentum_and_the_lr_may_follow_a_schedule() -> None:
    strategy = PFM(lr=lambda r: 0.1 if r < 3 else 0.01)
    deltas = [ClientUpdate({k: np.asarray(v, dtype=np.float64) * 0 + s for k, v in BASE.items()}, 1, client_id=c) for c, s in (("a", -0.2), ("b", -0.4))]
    result = strategy.aggregate_train(3, BASE, deltas)
    np.testing.assert_allclose(result.momentum["w"], np.full((2, 2), 0.3 / 0.01))
    assert "bn.num_batches_tracked" not in result.momentum  # default: floating-point entries only
    assert strategy.configure_train(3, ["a"], {"K": 5})["a"].config == {"K": 5, "lr": 0.01, "beta": 0.9}


def test_without_a_weighting_it_is_fedavg_and_zero_weights_drop_a_client() -> None:
    updates = [full("a", -0.2, n=3), full("b", 0.4, n=1)]
    ours, fedavg = WeightedFedAvg().aggregate_train(1, BASE, updates), FedAvg().aggregate_train(1, BASE, updates)
    for key in BASE:
        np.testing.assert_array_equal(ours.weights[key], fedavg.weights[key])
    dropped = WeightedFedAvg({"a": 1.0, "b": 0.0}).aggregate_train(1, BASE, updates)
    np.testing.assert_array_equal(dropped.weights["w"], BASE["w"] - 0.2)


@pytest.mark.parametrize("weighting", [{}, {"a": -1.0}, {"a": 0.0}, {"a": float("nan")}])
def test_bad_weightings_are_refused(weighting: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="^a weighting needs finite weights >= 0 with a positive sum, got "):
        WeightedFedAvg(weighting)


def test_bad_settings_and_unknown_clients_are_refused() -> None:
    with pytest.raises(ValueError, match="^the learning rate must be a positive finite number, got 0.0$"):
        PFM(lr=0.0)
    with pytest.raises(ValueError, match=re.escape("beta must be in [0, 1), got 1.0")):
        PFM(lr=0.1, beta=1.0)
    with pytest.raises(ValueError, match="no weight"):
        PFM(lr=0.1, weighting={"a": 1.0}).aggregate_train(1, BASE, [full("zzz", 0.1)])
    with pytest.raises(ValueError, match="momentum keys"):
        PFM(lr=0.1, momentum_keys=["missing"]).aggregate_train(1, BASE, [full("a", 0.1)])
