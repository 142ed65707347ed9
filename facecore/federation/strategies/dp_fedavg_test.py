"""DP-FedAvg: clipping, equal weights, the fixed denominator, frozen statistics, calibrated noise,
Poisson selection and the accountant."""
import math

import numpy as np
import pytest

from facecore.federation.config import AggregationSettings, RoundConfig
from facecore.federation.strategies import layer_of, strategy_for
from facecore.federation.strategies.base import ClientUpdate
from facecore.federation.strategies.dp_fedavg import DPFedAvg, dp_epsilon, dp_fedavg, epsilon_of_history, noise_for_epsilon, poisson_selected, sample_rate_for

BASE = {"w": np.zeros(4, np.float32), "bn.running_var": np.ones(2, np.float32), "bn.num_batches_tracked": np.array(7)}


def _update(w: list[float], n_samples: int, running_var: float = 0.0) -> ClientUpdate:
    weights = {"w": np.array(w, np.float32), "bn.running_var": np.full(2, running_var, np.float32), "bn.num_batches_tracked": np.array(0)}
    return ClientUpdate(weights, n_samples)


def test_without_noise_it_is_the_equal_weight_sum_of_clipped_deltas_over_the_expected_count() -> None:
    # Prepare: a delta of norm 10 (clipped to 1) from a device with 100x the samples of the other; 4 were expected
    updates = [_update([10.0, 0, 0, 0], 1000), _update([0, 0.5, 0, 0], 10)]
    # Execute
    result = dp_fedavg(clip_norm=1.0, noise_multiplier=0.0, expected_clients=4).aggregate_train(1, BASE, updates)
    # Assert: (1, 0.5) / 4, not weighted by samples, not divided by the 2 that came; 1 of 2 updates was clipped
    np.testing.assert_allclose(result.weights["w"], [0.25, 0.125, 0, 0], atol=1e-7)
    assert result.metrics["dp_clipped_fraction"] == 0.5 and result.metrics["dp_noise_std"] == 0.0


def test_one_device_moves_the_noiseless_estimate_by_at_most_clip_over_the_expected_count() -> None:
    # Prepare: 5 devices, then the same 5 plus one adversarial device pushing against their mean
    rng = np.random.default_rng(0)
    base = {"w": np.zeros(50, np.float32)}
    honest = [ClientUpdate({"w": rng.normal(0, 1, 50).astype(np.float32)}, 1) for _ in range(5)]
    adversary = ClientUpdate({"w": -np.sum([u.weights["w"] for u in honest], axis=0) * 100}, 10_000_000)
    strategy = dp_fedavg(clip_norm=1.0, noise_multiplier=0.0, expected_clients=5)
    # Execute
    without = strategy.aggregate_train(1, base, honest).weights["w"]
    with_it = strategy.aggregate_train(1, base, [*honest, adversary]).weights["w"]
    # Assert: the sensitivity the accountant assumes, C / (q N), where the count-based mean gave up to 2C / (n + 1)
    assert np.linalg.norm(with_it.astype(np.float64) - without) <= 1.0 / 5 + 1e-5


def test_batchnorm_statistics_stay_at_the_base_whatever_devices_send() -> None:
    # Execute
    result = dp_fedavg(1.0, 1.0, 1, seed=0).aggregate_train(1, BASE, [_update([0, 0, 0, 0], 5, running_var=-3.0)])
    # Assert: no device influence, so no noise either (a negative variance would be NaN later)
    np.testing.assert_array_equal(result.weights["bn.running_var"], BASE["bn.running_var"])
    assert int(result.weights["bn.num_batches_tracked"]) == 7


def test_noise_std_is_z_times_clip_over_the_expected_count_and_is_seeded() -> None:
    # Prepare: 3 zero deltas over a large tensor in a round that expected 4
    base = {"w": np.zeros(200_000, np.float32)}
    updates = [ClientUpdate({"w": np.zeros(200_000, np.float32)}, 1) for _ in range(3)]
    # Execute
    first = dp_fedavg(clip_norm=2.0, noise_multiplier=1.5, expected_clients=4, seed=3).aggregate_train(1, base, updates)
    again = dp_fedavg(clip_norm=2.0, noise_multiplier=1.5, expected_clients=4, seed=3).aggregate_train(1, base, updates)
    # Assert: std 1.5 * 2 / 4 = 0.75
    assert np.std(first.weights["w"]) == pytest.approx(0.75, rel=0.01)
    assert first.metrics["dp_noise_std"] == pytest.approx(0.75)
    np.testing.assert_array_equal(first.weights["w"], again.weights["w"])


def test_full_models_are_refused_and_the_round_config_builds_it() -> None:
    with pytest.raises(ValueError, match="deltas"):
        dp_fedavg(expected_clients=1).aggregate_train(1, BASE, [ClientUpdate(BASE, 1, kind="full")])
    settings = AggregationSettings(method="dp_fedavg", max_update_norm=0.3, dp_noise_multiplier=0.8)
    built = strategy_for(RoundConfig(target_participants=7, aggregation=settings))
    dp = layer_of(built, DPFedAvg)
    assert dp is not None and (dp.clip_norm, dp.noise_multiplier, dp.expected_clients) == (0.3, 0.8, 7)


def test_poisson_selection_draws_each_device_independently_at_rate_q() -> None:
    # Prepare
    ids = [f"device-{i}" for i in range(20_000)]
    q = sample_rate_for(40, 217)
    # Execute
    first = [poisson_selected(b"k" * 32, i, q) for i in ids]
    again = [poisson_selected(b"k" * 32, i, q) for i in ids]
    other_key = [poisson_selected(b"j" * 32, i, q) for i in ids]
    # Assert: the rate is q within 4 standard errors, a device's draw is stable within a round and
    # independent across rounds (two keys agree as often as independent draws would)
    sd = (q * (1 - q) / len(ids)) ** 0.5
    assert abs(np.mean(first) - q) < 4 * sd and first == again
    both = np.mean(np.logical_and(first, other_key))
    assert abs(both - q * q) < 4 * (q * q * (1 - q * q) / len(ids)) ** 0.5
    assert sample_rate_for(40, 20) == 1.0


def test_epsilon_grows_with_rounds_shrinks_with_noise_and_inverts() -> None:
    # Execute
    eps_10 = dp_epsilon(1.0, 0.1, 10, 1e-5)
    eps_20 = dp_epsilon(1.0, 0.1, 20, 1e-5)
    eps_quiet = dp_epsilon(2.0, 0.1, 10, 1e-5)
    z = noise_for_epsilon(eps_10, 0.1, 10, 1e-5)
    # Assert
    assert 0 < eps_quiet < eps_10 < eps_20
    assert z == pytest.approx(1.0, abs=0.02)  # Opacus searches to 0.01 precision
    assert epsilon_of_history([(1.0, 0.1, 10), (1.0, 0.1, 10)], 1e-5) == pytest.approx(eps_20)
    assert math.isinf(dp_epsilon(0.0, 0.1, 3, 1e-5)) and dp_epsilon(1.0, 0.1, 0, 1e-5) == 0.0
    with pytest.raises(ValueError, match="sample_rate"):
        dp_epsilon(1.0, 1.5, 3, 1e-5)
