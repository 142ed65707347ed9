from __future__ import annotations

import numpy as np
import pytest

from facecore.errors import FaceCoreError
from simulator.cross_device.feature_mean import mean_length


def test_mean_length_is_one_for_coinciding_features_and_zero_for_balanced_ones() -> None:
    # Prepare
    rng = np.random.default_rng(0)
    spread = rng.standard_normal((4000, 64))
    spread /= np.linalg.norm(spread, axis=1, keepdims=True)
    same = np.tile(spread[:1], (10, 1))
    # Execute / Assert
    assert mean_length(same) == pytest.approx(1.0)
    assert mean_length(np.concatenate([spread, -spread])) == pytest.approx(0.0, abs=1e-9)
    assert mean_length(spread) < 0.05  # random directions: about 1/sqrt(N)
    leaning = spread + 0.5 * np.eye(64)[0]
    assert mean_length(leaning / np.linalg.norm(leaning, axis=1, keepdims=True)) > 0.3


def test_mean_length_refuses_what_is_not_a_batch_of_rows() -> None:
    with pytest.raises(FaceCoreError, match="non-empty"):
        mean_length(np.zeros((0, 8)))
    with pytest.raises(FaceCoreError, match="non-empty"):
        mean_length(np.ones(8))
