"""Aggregation in tiers: partial sums of shards, merged in order, publish what one pass over the round does,
for every configured chain that sums its updates; the others have no sum to shard."""
from __future__ import annotations

import numpy as np
import pytest

from facecore.federation.strategies import ClientUpdate, Strategy, strategy_for
from facecore.federation.strategies.chain_equivalence_test import CONFIGS, SEED, _base, _config, _deltas
from facecore.federation.strategies.fedavg import RoundSum, merge_sums
from facecore.federation.strategies.tiers import aggregate_in_shards, aggregate_partials, shards, summing_stage

PLAIN = {name: spec for name, spec in CONFIGS.items() if not spec[4]}
SUMMING = {name: spec for name, spec in PLAIN.items() if spec[1] not in ("median", "trimmed_mean")}


def _round(rng: np.random.Generator) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], list[ClientUpdate]]:
    base = _base(rng)
    previous = {k: (0.05 * rng.standard_normal(v.shape)).astype(np.float64) for k, v in base.items() if v.dtype.kind == "f"}
    deltas = _deltas(rng, base) + _deltas(rng, base) + _deltas(rng, base)  # 15 updates
    updates = [ClientUpdate(delta, n, metrics, client_id=f"device-{index}") for index, (delta, n, metrics) in enumerate(deltas)]
    return base, previous, updates


@pytest.mark.parametrize("name", sorted(SUMMING))
def test_shards_publish_what_one_pass_does(name: str) -> None:
    # Prepare
    base, previous, updates = _round(np.random.default_rng(SEED))
    config = _config(*SUMMING[name])

    def fresh() -> Strategy:  # the server builds one strategy per round
        return strategy_for(config, seed=SEED, previous_step=previous)

    # Execute
    one_pass = fresh().aggregate_train(1, base, iter(updates))
    one_shard = aggregate_in_shards(fresh(), 1, base, updates, shard_size=len(updates))
    in_shards = aggregate_in_shards(fresh(), 1, base, updates, shard_size=4)
    again = aggregate_in_shards(fresh(), 1, base, updates, shard_size=4)
    # Assert: one shard is the same to the bit; four differ only in the order of float64 additions
    for key in base:
        assert one_shard.weights[key].tobytes() == one_pass.weights[key].tobytes(), key
        assert in_shards.weights[key].tobytes() == again.weights[key].tobytes(), key
        np.testing.assert_allclose(in_shards.weights[key], one_pass.weights[key], rtol=1e-6, atol=1e-7, err_msg=key)
    assert one_shard.metrics == one_pass.metrics
    assert (in_shards.n_clients, in_shards.n_samples) == (one_pass.n_clients, one_pass.n_samples)
    assert in_shards.metrics.keys() == one_pass.metrics.keys()
    for key, value in one_pass.metrics.items():
        assert in_shards.metrics[key] == pytest.approx(value, rel=1e-12), key


def test_partial_sums_merge_in_shard_order_whoever_computed_them() -> None:
    # Prepare: the shards' sums computed in reverse (as processes might finish), merged in shard order
    base, previous, updates = _round(np.random.default_rng(SEED + 1))
    config = _config("fedface", "norm_bounded", "samples", 0.9, False)
    stage = summing_stage(strategy_for(config, previous_step=previous))
    assert stage is not None
    parts = [list(part) for part in shards(updates, 4)]
    # Execute
    computed = {index: stage.summed(1, base, part) for index, part in reversed(list(enumerate(parts)))}
    merged = aggregate_partials(strategy_for(config, previous_step=previous), 1, base, (computed[i] for i in range(len(parts))))
    flat = aggregate_in_shards(strategy_for(config, previous_step=previous), 1, base, updates, shard_size=4)
    # Assert
    assert [len(part) for part in parts] == [4, 4, 4, 3]
    assert all(merged.weights[key].tobytes() == flat.weights[key].tobytes() for key in base)
    assert merged.metrics == flat.metrics and merged.n_clients == len(updates)


def test_a_metric_only_some_updates_report_is_weighted_by_those() -> None:
    # Prepare
    first = RoundSum({"w": np.ones(2)}, 3.0, 1, 3, {"loss": 1.0, "acc": 0.5}, metric_weights={"loss": 3.0, "acc": 3.0})
    second = RoundSum({"w": np.ones(2)}, 1.0, 1, 1, {"loss": 5.0}, clipped=1, metric_weights={"loss": 1.0})
    # Execute
    merged = merge_sums([first, second])
    # Assert
    assert merged.metrics == {"loss": 2.0, "acc": 0.5} and merged.total_weight == 4.0 and merged.clipped == 1
    assert merged.sums["w"].tolist() == [2.0, 2.0] and (merged.count, merged.n_samples) == (2, 4)


@pytest.mark.parametrize("method", ["median", "trimmed_mean"])
def test_a_median_or_trimmed_mean_has_no_sum_to_shard_and_aggregates_in_one_pass(method: str) -> None:
    # Prepare
    base, _, updates = _round(np.random.default_rng(SEED))
    strategy = strategy_for(_config("fedface", method, "samples", 0.0, False))
    # Execute
    flat = aggregate_in_shards(strategy, 1, base, iter(updates), shard_size=4)
    one_pass = strategy_for(_config("fedface", method, "samples", 0.0, False)).aggregate_train(1, base, iter(updates))
    # Assert: no shards, so one pass over every update
    assert summing_stage(strategy) is None
    assert all(flat.weights[key].tobytes() == one_pass.weights[key].tobytes() for key in base)
    with pytest.raises(TypeError, match="does not aggregate a sum of its updates"):
        strategy.aggregate_sum(1, base, merge_sums([RoundSum({}, 1.0, 1, 1, {})]))


def test_a_secure_sum_is_unmasked_whole_so_it_has_no_shards() -> None:
    # Prepare
    strategy = strategy_for(_config("fedavg", "fedavg", "samples", 0.0, True), secure=None)
    # Execute / Assert
    assert summing_stage(strategy) is None
