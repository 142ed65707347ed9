"""Rounds: the server's FedAvg strategy averages exactly the trainable parameters, and nothing else."""
import copy

import numpy as np
import pytest
import torch

from facecore.federation.strategies import ClientUpdate, FedAvg
from facecore.fusion import LambdaFusion
from simulator.fusion.engine import Federation, LocalTraining, generator, train_fused_node
from simulator.fusion.model import FusedCNN, trainable_state
from simulator.fusion.run import bytes_per_round

SHAPE = (1, 16, 16)


def _nodes(count: int = 3, size: int = 24, dtype: torch.dtype = torch.float32) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(11)
    return [(torch.randn(size + i, *SHAPE, generator=g).to(dtype), torch.randint(0, 4, (size + i,), generator=g)) for i in range(count)]


def test_a_round_is_the_shared_fedavg_of_node_models_trained_against_a_frozen_e_g() -> None:
    # Prepare
    model = FusedCNN(SHAPE, 4, "multi", seed=0)
    nodes, local = _nodes(), LocalTraining(epochs=1, batch=8, lr=0.1)
    with torch.no_grad():  # an E_l that differs from E_g, as after any earlier round
        for p in model.extractor.parameters():
            p.add_(0.05)
    sent_extractor = copy.deepcopy(model.extractor.state_dict())
    start = copy.deepcopy(model)
    start.refresh_global()  # what the server broadcasts: E_g = E_l
    federation = Federation(model, nodes, per_round=2, local=local, seed=5)
    # Execute
    federation.round(1)
    # Assert: recompute by hand from what the server broadcast
    updates = []
    for i in federation.choose(1):
        node = copy.deepcopy(start)
        train_fused_node(node, nodes[i], local, generator(5, 1, i))
        updates.append(ClientUpdate(trainable_state(node), len(nodes[i][1]), kind="full"))
        assert not any(k.startswith("global_extractor") for k in updates[-1].weights)  # E_g never travels
    expected = FedAvg().aggregate_train(1, trainable_state(start), updates).weights
    for key, value in trainable_state(model).items():
        np.testing.assert_array_equal(value, expected[key])
    # ... and the evaluated model keeps the broadcast extractor as E_g (the previous global extractor)
    for key, value in sent_extractor.items():
        assert torch.equal(model.global_extractor.state_dict()[key], value)  # type: ignore[union-attr]


@pytest.mark.parametrize("kind,lam", [("multi", 0.0), ("multi", 0.5), ("single", 0.5)])
def test_fusion_with_identical_frozen_extractors_equals_fedavg_on_the_head(kind: str, lam: float) -> None:
    # Prepare: float64, E_l frozen; E_g is refreshed from E_l every round, so the two are identical
    def federation(fusion: str) -> Federation:
        model = FusedCNN(SHAPE, 4, fusion, seed=3, dtype=torch.float64)
        model.extractor.requires_grad_(False)
        if fusion != "none":
            assert isinstance(model.fusion, LambdaFusion)
            with torch.no_grad():
                model.fusion.lam.fill_(lam)
        return Federation(model, _nodes(4, dtype=torch.float64), per_round=3, local=LocalTraining(2, 8, 0.1, 0.5), seed=1)

    fused, plain = federation(kind), federation("none")
    # Execute
    for t in (1, 2, 3):
        fused.round(t)
        plain.round(t)
    # Assert: bit-identical classifiers, λ untouched (its gradient Σ dF·(E_g − E_l) is exactly 0)
    for key, value in plain.model.classifier.state_dict().items():
        assert torch.equal(fused.model.classifier.state_dict()[key], value), key
    assert isinstance(fused.model.fusion, LambdaFusion)
    assert torch.all(fused.model.fusion.lam == lam)


def test_bytes_per_round_counts_trainable_parameters_both_ways_for_each_selected_node() -> None:
    # Prepare
    none, multi, conv = (FusedCNN(SHAPE, 4, kind) for kind in ("none", "multi", "conv"))
    channels = none.feature_shape[0]
    # Execute
    sizes = {kind: bytes_per_round(m, per_round=5) for kind, m in (("none", none), ("multi", multi), ("conv", conv))}
    # Assert: fusion adds only its own parameters; the frozen E_g is never counted
    base = sum(p.numel() for p in none.parameters())
    assert sizes["none"] == 2 * 4 * 5 * base
    assert sizes["multi"] - sizes["none"] == 2 * 4 * 5 * channels
    assert sizes["conv"] - sizes["none"] == 2 * 4 * 5 * (2 * channels * channels + channels)


def test_the_learning_rate_decays_per_round_until_it_first_reaches_min_lr() -> None:
    # Prepare: the official schedule, lr 2e-3 × 0.99 per round while above 1e-4
    local = LocalTraining(lr=2e-3, lr_decay=0.99, min_lr=1e-4)
    # Execute
    rates = {t: local.lr_at(t) for t in (1, 2, 3, 299, 300, 301, 500)}
    # Assert: 2e-3·0.99^298 > 1e-4 ≥ 2e-3·0.99^299, which then stays
    assert rates[1] == 2e-3 and rates[2] == pytest.approx(2e-3 * 0.99) and rates[3] == pytest.approx(2e-3 * 0.99**2)
    assert rates[299] == pytest.approx(2e-3 * 0.99**298) and rates[299] > 1e-4
    assert rates[300] == rates[301] == rates[500] == pytest.approx(2e-3 * 0.99**299) and rates[300] <= 1e-4
    assert LocalTraining(lr=0.05).lr_at(400) == 0.05


@pytest.mark.parametrize("kind", ["multi", "single"])
def test_the_server_smooths_lambda_after_the_shared_fedavg(kind: str) -> None:
    # Prepare: two identical federations with an unbounded λ; E_g differs from E_l so λ trains
    def federation(mu: float) -> Federation:
        model = FusedCNN(SHAPE, 4, kind, seed=0, lambda_bound="none")
        with torch.no_grad():
            for p in model.extractor.parameters():
                p.add_(0.05)
        return Federation(model, _nodes(), per_round=2, local=LocalTraining(1, 8, 0.5), seed=2, lambda_mu=mu)

    smoothed, plain = federation(0.9), federation(0.0)
    # Execute
    record = smoothed.round(1)
    plain.round(1)
    # Assert: same FedAvg λ̄ in both; the server keeps 0.1·λ̄ + 0.9·0 (its shadow starts at λ's start, 0)
    assert isinstance(smoothed.model.fusion, LambdaFusion) and isinstance(plain.model.fusion, LambdaFusion)
    averaged = plain.model.fusion.lam.detach()
    assert float(averaged.abs().max()) > 0
    torch.testing.assert_close(smoothed.model.fusion.lam.detach(), 0.1 * averaged)
    assert record["lambda_mean_averaged"] == pytest.approx(float(averaged.mean()))
    # ... and every other parameter is the plain FedAvg result
    for key, value in trainable_state(plain.model).items():
        if not key.startswith("fusion."):
            np.testing.assert_array_equal(trainable_state(smoothed.model)[key], value)
