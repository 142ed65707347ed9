"""FedFace's spreadout stage: it spreads the class embeddings and leaves the backbone step to its inner strategy."""
import numpy as np
import pytest
import torch

from facecore.federation.strategies import ClientUpdate, FedAvg, FedFace
from facecore.losses import spreadout_loss, spreadout_optimize


def test_fedface_applies_spreadout_and_fedavg_leaves_embeddings() -> None:
    # Prepare: crowded identities, so spreadout has work to do.
    rng = np.random.default_rng(4)
    W = (np.ones((6, 16)) + 0.1 * rng.standard_normal((6, 16))).astype(np.float32)
    # Execute
    spread = FedFace().aggregate_embeddings(W)
    unchanged = FedAvg().aggregate_embeddings(W)
    # Assert
    expected = spreadout_optimize(torch.from_numpy(W), steps=10, lr=0.01, momentum=0.9, nu=0.3).numpy()
    np.testing.assert_allclose(spread, expected, atol=1e-7)
    assert spreadout_loss(torch.from_numpy(spread)) < spreadout_loss(torch.from_numpy(W))
    np.testing.assert_array_equal(unchanged, W)


def test_the_backbone_step_is_the_inner_strategys_and_a_flat_matrix_is_refused() -> None:
    # Prepare
    base = {"w": np.zeros(2, np.float32)}
    updates = [ClientUpdate({"w": np.array([1.0, 0.0], np.float32)}, 1), ClientUpdate({"w": np.array([0.0, 1.0], np.float32)}, 3)]
    # Execute
    wrapped = FedFace(FedAvg("devices")).aggregate_train(1, base, iter(updates))
    # Assert
    np.testing.assert_array_equal(wrapped.weights["w"], FedAvg("devices").aggregate_train(1, base, iter(updates)).weights["w"])
    with pytest.raises(ValueError, match=r"W must be \(C, D\)"):
        FedFace().aggregate_embeddings(np.ones(4, np.float32))
