"""The fleet-camera round settings are a valid round config, and refuse a centre that is not one."""
import numpy as np
import pytest

from facecore.federation.config import RoundConfig
from facecore.federation.fleet_camera import fleet_camera_settings


def test_the_settings_make_a_round_that_keeps_templates_and_centres_the_loss() -> None:
    # Prepare
    center = np.ones(128) / np.sqrt(128)
    # Execute
    plain, secure = fleet_camera_settings(center.tolist()), fleet_camera_settings(center.tolist(), secure_aggregation=True)
    config = RoundConfig.model_validate({"target_participants": 2, **plain})
    # Assert: what the recipe needs, as the server reads it; secure aggregation keeps the photo weighting it needs
    assert (config.local.train_embedding, config.local.lr, config.local.trainable_blocks, config.spreadout.steps) == (False, 0.002, 8, 0)
    assert config.local.feature_center == pytest.approx(center.tolist())
    assert (config.aggregation.weighting, config.aggregation.server_momentum) == ("devices", 0.9)
    assert secure["aggregation"]["weighting"] == "samples" and "secure_aggregation" not in plain
    assert config.local.upload_bits == 4 and "upload_bits" not in secure["local"]  # secure aggregation has its own fixed point
    secure_config = RoundConfig.model_validate({"target_participants": 2, **secure, "secure_aggregation": {"enabled": True, **secure["secure_aggregation"]}})
    assert (secure_config.secure_aggregation.scale_bits, secure_config.secure_aggregation.max_update_norm) == (22, 0.25)


def test_a_centre_that_is_not_a_unit_vector_is_refused() -> None:
    with pytest.raises(ValueError, match="unit vector"):
        fleet_camera_settings([0.5] * 128)
