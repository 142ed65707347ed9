"""Where a simulated round's feature centre comes from."""
from pathlib import Path

import numpy as np
import pytest
import torch

from facecore.errors import FaceCoreError
from simulator.cross_device.config import CrossDeviceConfig
from simulator.cross_device.run import _feature_center


def test_the_model_source_is_the_centre_the_model_publishes_and_a_model_without_one_is_refused() -> None:
    # Prepare: a model that publishes a centre, one that publishes none, and a split that must not be read
    config = CrossDeviceConfig(center_features=True, center_source="model")
    published, bare = torch.nn.Linear(2, 2), torch.nn.Linear(2, 2)
    published.meta = {"feature_center": [0.6, 0.8]}  # type: ignore[assignment]
    # Execute
    center = _feature_center(config, None, Path("unread"), published)  # type: ignore[arg-type]
    # Assert
    np.testing.assert_array_equal(center, np.array([0.6, 0.8], np.float32))
    with pytest.raises(FaceCoreError, match="publishes no feature centre"):
        _feature_center(config, None, Path("unread"), bare)  # type: ignore[arg-type]
