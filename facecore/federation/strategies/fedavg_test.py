"""FedAvg's two weightings, and the round settings that choose between them."""
import numpy as np
import pytest
from pydantic import ValidationError

from facecore.federation.config import AggregationSettings, RoundConfig, SecureAggregationSettings
from facecore.federation.strategies import ClientUpdate, FedAvg, strategy_for


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
