"""The official-size network: its shapes, and a federated round on a synthetic 32×32×3 set."""
import numpy as np
import pytest
import torch

from simulator.fusion.engine import Federation, LocalTraining
from simulator.fusion.model import FusedCNN, count_trainable, extractor_gap, trainable_state


def test_the_official_network_has_the_official_layer_sizes_on_mnist() -> None:
    # Execute
    model = FusedCNN((1, 28, 28), 10, "none", arch="official")
    # Assert: conv 1→32 (5×5) and 32→64 (3×3), 64×7×7 features, FC 3136→512→10
    assert model.feature_shape == (64, 7, 7)
    assert count_trainable(model) == (25 * 32 + 32) + (9 * 32 * 64 + 64) + (3136 * 512 + 512) + (512 * 10 + 10)
    assert any(isinstance(m, torch.nn.Dropout) for m in model.classifier)


@pytest.mark.parametrize("kind", ["none", "conv", "multi", "single"])
def test_a_round_of_the_official_network_runs_on_32x32x3_images(kind: str) -> None:
    # Prepare: a synthetic CIFAR-shaped set, 3 nodes, the paper's optimiser and λ settings
    g = torch.Generator().manual_seed(0)
    nodes = [(torch.randn(20, 3, 32, 32, generator=g), torch.randint(0, 10, (20,), generator=g)) for _ in range(3)]
    local = LocalTraining(epochs=1, batch=8, lr=2e-3, momentum=0.9, weight_decay=5e-4, lr_decay=0.99, min_lr=1e-4, augment=True)

    def one_round() -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], tuple[int, ...]]:
        model = FusedCNN((3, 32, 32), 10, kind, seed=1, arch="official", lambda_bound="none")
        before = trainable_state(model)
        Federation(model, nodes, per_round=2, local=local, seed=0, lambda_mu=0.9).round(1)
        with torch.no_grad():
            assert model.eval()(nodes[0][0]).shape == (20, 10)
        return before, trainable_state(model), model.feature_shape

    # Execute
    (before, after, shape), (_, again, _) = one_round(), one_round()
    # Assert: 64×8×8 features, every layer trained, and dropout/augmentation draws are reproducible
    assert shape == (64, 8, 8)
    changed = [k for k in after if not np.array_equal(after[k], before[k])]
    assert {k for k in after if k.startswith(("extractor.", "classifier."))} <= set(changed)
    for key, value in after.items():
        np.testing.assert_array_equal(again[key], value)


def test_the_extractor_gap_is_zero_at_a_rounds_start_and_grows_as_the_local_extractor_trains() -> None:
    # Prepare: a fused model and a FedAvg one on a small synthetic grey set
    g = torch.Generator().manual_seed(0)
    nodes = [(torch.randn(32, 1, 28, 28, generator=g), torch.randint(0, 10, (32,), generator=g)) for _ in range(2)]
    fused, plain = FusedCNN((1, 28, 28), 10, "multi", seed=0), FusedCNN((1, 28, 28), 10, "none", seed=0)
    local = LocalTraining(epochs=2, batch=8, lr=0.05, momentum=0.5)
    # Execute
    at_start = extractor_gap(fused, nodes[0][0])
    Federation(fused, nodes, per_round=2, local=local, seed=0).round(1)
    after_round = extractor_gap(fused, nodes[0][0])
    # Assert: E_g is the extractor broadcast at the start of the round; FedAvg has none to compare
    assert at_start == 0.0 and after_round is not None and after_round > 0.01
    assert extractor_gap(plain, nodes[0][0]) is None
