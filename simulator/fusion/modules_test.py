"""Fusion modules: shapes, the λ box, and the λ = 1 / λ = 0 end points."""
import pytest
import torch

from facecore.fusion import ConvFusion, LambdaFusion, make_fusion
from simulator.fusion.engine import LocalTraining, generator, train_fused_node
from simulator.fusion.model import FusedCNN


def _maps(seed: int = 0, shape: tuple[int, ...] = (4, 6, 5, 5)) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.rand(shape, generator=g), torch.rand(shape, generator=g)


@pytest.mark.parametrize("kind", ["none", "conv", "multi", "single"])
def test_every_fusion_maps_two_c_channel_maps_to_one(kind: str) -> None:
    # Prepare
    local, global_ = _maps()
    fusion = make_fusion(kind, channels=6)
    # Execute
    fused = fusion(local, global_ if fusion.uses_global else None)
    # Assert
    assert fused.shape == (4, 6, 5, 5)


def test_parameter_shapes_follow_the_paper() -> None:
    # Execute
    conv, multi, single = make_fusion("conv", 6), make_fusion("multi", 6), make_fusion("single", 6)
    # Assert: W_conv is 2C→C, λ is per channel for multi and one scalar for single
    assert isinstance(conv, ConvFusion) and conv.conv.weight.shape == (6, 12, 1, 1)
    assert isinstance(multi, LambdaFusion) and multi.lam.shape == (1, 6, 1, 1)
    assert isinstance(single, LambdaFusion) and single.lam.numel() == 1
    assert sum(p.numel() for p in make_fusion("none", 6).parameters()) == 0


@pytest.mark.parametrize("kind", ["conv", "multi", "single"])
def test_every_fusion_starts_as_the_local_path(kind: str) -> None:
    # Prepare
    local, global_ = _maps(1)
    # Execute
    fused = make_fusion(kind, 6)(local, global_)
    # Assert: λ = 0 and the identity-on-E_l 1×1 conv both return E_l(x) (FedAvg's model) at the start
    torch.testing.assert_close(fused, local, rtol=0, atol=1e-7)


@pytest.mark.parametrize("kind", ["multi", "single"])
@pytest.mark.parametrize("direction", [1.0, -1.0])
def test_lambda_is_projected_back_into_the_unit_interval(kind: str, direction: float) -> None:
    # Prepare: a loss whose gradient drives every λ far past 1 (or below 0) in one step
    fusion = make_fusion(kind, 6)
    assert isinstance(fusion, LambdaFusion)
    with torch.no_grad():
        fusion.lam.fill_(0.5)
    optimizer = torch.optim.SGD(fusion.parameters(), lr=10.0)
    # Execute
    for _ in range(3):
        optimizer.zero_grad()
        (-direction * fusion.lam.sum()).backward()
        optimizer.step()
        assert not bool(((fusion.lam >= 0) & (fusion.lam <= 1)).all())  # the step really left the box
        fusion.project_()
    # Assert
    assert torch.all(fusion.lam == (1.0 if direction > 0 else 0.0))


@pytest.mark.parametrize("kind", ["multi", "single"])
def test_local_training_keeps_lambda_in_bounds_at_a_violent_learning_rate(kind: str) -> None:
    # Prepare: E_g differs from E_l, so λ gets real gradients; lr 20 would throw it far out
    model = FusedCNN((1, 16, 16), 3, kind, seed=0)
    assert model.global_extractor is not None
    with torch.no_grad():
        for p in model.global_extractor.parameters():
            p.mul_(-1.5)
    g = torch.Generator().manual_seed(0)
    data = (torch.randn(64, 1, 16, 16, generator=g), torch.randint(0, 3, (64,), generator=g))
    # Execute
    train_fused_node(model, data, LocalTraining(epochs=2, batch=8, lr=20.0, momentum=0.9), generator(0, 1, 0))
    assert isinstance(model.fusion, LambdaFusion)
    lam = model.fusion.lam.detach()
    # Assert: inside [0, 1], and the optimiser did push it to a bound
    assert torch.all((lam >= 0) & (lam <= 1))
    assert bool(((lam == 0) | (lam == 1)).any())


@pytest.mark.parametrize("kind", ["multi", "single"])
def test_lambda_one_is_exactly_the_global_extractor_path(kind: str) -> None:
    # Prepare: a local extractor far from the global one
    model = FusedCNN((3, 20, 20), 5, kind, seed=2).eval()
    assert model.global_extractor is not None
    assert isinstance(model.fusion, LambdaFusion)
    with torch.no_grad():
        model.fusion.lam.fill_(1.0)
        for p in model.extractor.parameters():
            p.add_(torch.randn_like(p))
    x = torch.randn(7, 3, 20, 20, generator=torch.Generator().manual_seed(3))
    # Execute
    with torch.no_grad():
        fused = model(x)
        global_only = model.classifier(model.global_extractor(x))
        local_only = model.classifier(model.extractor(x))
    # Assert
    assert torch.equal(fused, global_only)
    assert not torch.allclose(fused, local_only)
