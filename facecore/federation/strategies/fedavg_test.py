"""FedAvg: the running sum, delta and full updates, a stream held one update at a time, its two
weightings, and the round settings that choose between them."""
import gc
import weakref
from collections.abc import Iterator

import numpy as np
import pytest
from pydantic import ValidationError

from facecore.federation.config import AggregationSettings, RoundConfig, SecureAggregationSettings
from facecore.federation.packed import Layout, PackedArrays
from facecore.federation.strategies import ClientUpdate, FedAvg, RunningWeightedSum, strategy_for
from facecore.federation.strategies.fedavg import _Scratch


def _weights(rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {"conv": rng.standard_normal((4, 3)).astype(np.float32), "bn.steps": np.array(10, dtype=np.int64)}


def test_running_sum_equals_direct_weighted_mean() -> None:
    # Prepare
    rng = np.random.default_rng(1)
    updates = [(_weights(rng), int(n)) for n in rng.integers(1, 50, size=7)]
    # Execute
    total = RunningWeightedSum()
    for weights, n in updates:
        total.add(weights, n)
    mean = total.mean()
    # Assert
    direct = sum(w["conv"].astype(np.float64) * n for w, n in updates) / sum(n for _, n in updates)
    np.testing.assert_allclose(mean["conv"], direct, rtol=1e-12)
    assert total.count == 7 and total.total_weight == sum(n for _, n in updates)


def test_fedavg_delta_and_full_updates_and_generator_input() -> None:
    # Prepare
    rng = np.random.default_rng(2)
    base = _weights(rng)
    deltas = [(_weights(rng), n) for n in (1, 3)]
    consumed: list[int] = []

    def stream() -> Iterator[ClientUpdate]:  # the server feeds a generator; nothing may be materialised by the strategy
        for index, (delta, n) in enumerate(deltas):
            consumed.append(index)
            yield ClientUpdate(weights=delta, n_samples=n, metrics={"loss": float(index)})

    # Execute
    result = FedAvg().aggregate_train(1, base, stream())
    full = FedAvg().aggregate_train(1, base, [ClientUpdate({k: base[k] + d[k] for k in base}, n, kind="full") for d, n in deltas])
    # Assert
    expected = base["conv"] + (deltas[0][0]["conv"] * 1 + deltas[1][0]["conv"] * 3) / 4
    np.testing.assert_allclose(result.weights["conv"], expected, atol=1e-6)
    assert result.weights["conv"].dtype == np.float32
    steps = 10 + round((deltas[0][0]["bn.steps"] + 3 * deltas[1][0]["bn.steps"]) / 4)  # integer buffers: rounded mean
    assert result.weights["bn.steps"].dtype == np.int64 and result.weights["bn.steps"] == steps
    np.testing.assert_allclose(full.weights["conv"], expected, atol=1e-6)
    assert (result.n_clients, result.n_samples, result.metrics) == (2, 4, {"loss": 0.75}) and consumed == [0, 1]


def test_fedavg_holds_a_constant_number_of_updates() -> None:
    # Prepare: a stream of fresh updates; weak references tell which are still alive.
    base = _weights(np.random.default_rng(5))
    refs: list[weakref.ref[np.ndarray]] = []

    def stream() -> Iterator[ClientUpdate]:
        for i in range(6):
            gc.collect()
            # Only the update just consumed may still be referenced (by the strategy's loop variable).
            assert all(ref() is None for ref in refs[:-1]), "FedAvg kept an older update alive"
            weights = {k: v + i for k, v in base.items()}
            refs.append(weakref.ref(weights["conv"]))
            yield ClientUpdate(weights, n_samples=i + 1)
            del weights

    # Execute
    result = FedAvg().aggregate_train(1, base, stream())
    # Assert
    assert result.n_clients == 6 and len(refs) == 6


def test_fedavg_rejects_mismatched_updates() -> None:
    # Prepare
    base = _weights(np.random.default_rng(3))
    # Execute / Assert
    with pytest.raises(ValueError, match="mix"):
        FedAvg().aggregate_train(1, base, [ClientUpdate(base, 1), ClientUpdate(base, 1, kind="full")])
    with pytest.raises(ValueError, match="match"):
        FedAvg().aggregate_train(1, base, [ClientUpdate({"conv": base["conv"]}, 1)])
    with pytest.raises(ValueError, match="no updates"):
        FedAvg().aggregate_train(1, base, [])
    with pytest.raises(ValueError, match="n_samples must be a positive integer"):
        ClientUpdate(base, 0)


def _updates() -> list[ClientUpdate]:
    """An owner with 100 photos and three with 4 each, each delta along its own axis."""
    counts = (100, 4, 4, 4)
    return [ClientUpdate({"w": np.eye(4)[i]}, n, client_id=str(i)) for i, n in enumerate(counts)]


def test_samples_weighting_follows_photo_counts_and_devices_weighting_counts_each_once() -> None:
    # Prepare
    base = {"w": np.zeros(4)}
    # Execute
    by_samples = FedAvg().aggregate_train(1, base, iter(_updates()))
    by_devices = FedAvg("devices").aggregate_train(1, base, iter(_updates()))
    # Assert: the heavy owner holds 100/112 of the sample-weighted step and a quarter of the other
    np.testing.assert_allclose(by_samples.weights["w"], np.array([100, 4, 4, 4]) / 112)
    np.testing.assert_allclose(by_devices.weights["w"], np.full(4, 0.25))
    assert by_devices.n_samples == by_samples.n_samples == 112 and by_devices.n_clients == 4


def test_round_settings_build_the_weighting_they_name() -> None:
    # Prepare
    config = RoundConfig(aggregation=AggregationSettings(weighting="devices"))
    # Execute
    step = strategy_for(config).aggregate_train(1, {"w": np.zeros(4)}, iter(_updates()))
    # Assert
    np.testing.assert_allclose(step.weights["w"], np.full(4, 0.25))


def test_devices_weighting_is_refused_where_it_cannot_apply() -> None:
    # Execute / Assert: robust and DP steps weigh updates their own way; secure aggregation sums
    # updates the devices already multiplied by their photo counts
    with pytest.raises(ValidationError, match="weighting 'devices' is fedavg's; median"):
        AggregationSettings(method="median", weighting="devices")
    with pytest.raises(ValidationError, match="use weighting 'samples'"):
        RoundConfig(min_participants=2, aggregation=AggregationSettings(weighting="devices"),
                    secure_aggregation=SecureAggregationSettings(enabled=True))
    with pytest.raises(ValueError, match="samples or devices"):
        FedAvg("photos")  # type: ignore[arg-type]


@pytest.mark.parametrize("dtype", [np.float16, np.float32])
def test_packed_updates_sum_to_the_bits_of_the_same_updates_entry_by_entry(dtype: type) -> None:
    # Prepare: delta-sized values (fp16 subnormals among them) over more than one summing chunk, an integer
    # counter kept aside, weights that are not integers (each fp16 update widened through the one shared table,
    # which one update's weight must not change for the next); then one of the other precision, one plain
    # update and one of another layout
    rng = np.random.default_rng(4)
    layout = Layout.of({"conv": (3, _Scratch.CHUNK // 3 + 5), "bias": (7,)})
    other_dtype = np.float32 if dtype == np.float16 else np.float16
    packs = [PackedArrays(layout, (rng.standard_normal(layout.size) * 1e-5).astype(t), {"steps": np.array(i)})
             for i, t in enumerate([dtype] * 5 + [other_dtype, dtype])]
    plain = {k: v.copy() for k, v in PackedArrays(layout, rng.standard_normal(layout.size).astype(dtype), {"steps": np.array(9)}).items()}
    other = PackedArrays(Layout.of({"bias": (7,), "conv": layout.shapes[0]}), rng.standard_normal(layout.size).astype(dtype), {"steps": np.array(1)})
    updates = [*packs, plain, other]
    weights = [float(w) for w in rng.uniform(0.1, 20.0, len(updates))]
    # Execute: each packed buffer is overwritten once added, as a caller reusing its buffer would
    packed, unpacked = RunningWeightedSum(), RunningWeightedSum()
    for update, weight in zip(updates, weights, strict=True):
        unpacked.add({k: np.array(v) for k, v in update.items()}, weight)
        packed.add(update, weight)
        if isinstance(update, PackedArrays):
            update.flat[:] = 1.0
    # Assert: the same keys, dtypes and bits; the packed sums are views of one buffer
    assert packed.sums().keys() == unpacked.sums().keys()
    for key, value in unpacked.sums().items():
        assert packed.sums()[key].dtype == value.dtype
        np.testing.assert_array_equal(packed.sums()[key].view(np.uint64), value.view(np.uint64))
    assert packed.sums()["conv"].base is packed.sums()["bias"].base is not None
    assert packed.total_weight == unpacked.total_weight and packed.count == len(updates)


def test_packed_updates_make_the_sums_and_the_mean() -> None:
    # Prepare: packed fp16 updates, each weighted by its own value
    layout = Layout.of({"w": (5,)})
    total = RunningWeightedSum()
    for weight in (1.0, 2.0, 3.0):
        total.add(PackedArrays(layout, np.full(5, weight, np.float16)), weight)
    # Execute
    mean, sums = total.mean(), total.sums()
    # Assert: (1 + 4 + 9) / 6 and 14, not the first update's alone
    np.testing.assert_array_equal(mean["w"], np.full(5, 14 / 6))
    np.testing.assert_array_equal(sums["w"], np.full(5, 14.0))


def test_a_packed_update_with_a_counter_missing_or_misshapen_is_refused_like_a_plain_one() -> None:
    # Prepare
    layout = Layout.of({"w": (3,)})
    total = RunningWeightedSum()
    total.add(PackedArrays(layout, np.ones(3, np.float16), {"steps": np.array([1, 2])}), 1.0)
    # Execute, Assert: a counter missing, or of another shape (which numpy would broadcast into the sum)
    with pytest.raises(ValueError, match="missing"):
        total.add(PackedArrays(layout, np.ones(3, np.float16)), 1.0)
    with pytest.raises(ValueError, match="shape"):
        total.add(PackedArrays(layout, np.ones(3, np.float16), {"steps": np.array(1)}), 1.0)
