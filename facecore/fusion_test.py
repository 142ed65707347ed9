"""λ's two bounds and the server's moving average of λ (the official update_shadow)."""
import pytest
import torch

from facecore.fusion import LambdaFusion, LambdaMovingAverage, make_fusion


def _push_down(fusion: LambdaFusion, steps: int = 3) -> None:
    """SGD on loss = Σλ at lr 1: every step lowers each λ by exactly 1."""
    optimizer = torch.optim.SGD(fusion.parameters(), lr=1.0)
    for _ in range(steps):
        optimizer.zero_grad()
        fusion.lam.sum().backward()
        optimizer.step()
        fusion.project_()


@pytest.mark.parametrize("kind", ["multi", "single"])
def test_an_unbounded_lambda_goes_negative_where_the_projected_one_stops_at_zero(kind: str) -> None:
    # Prepare
    unit, free = make_fusion(kind, 4, bound="unit"), make_fusion(kind, 4, bound="none")
    assert isinstance(unit, LambdaFusion) and isinstance(free, LambdaFusion)
    # Execute
    _push_down(unit)
    _push_down(free)
    # Assert
    assert torch.all(unit.lam == 0.0)
    assert torch.all(free.lam == -3.0)


def test_only_the_unit_bound_refuses_a_start_outside_zero_one() -> None:
    # Execute
    free = LambdaFusion(3, per_channel=True, lambda_init=-0.5, bound="none")
    # Assert
    assert torch.all(free.lam == -0.5)
    with pytest.raises(ValueError, match="lambda_init"):
        LambdaFusion(3, per_channel=True, lambda_init=-0.5, bound="unit")
    with pytest.raises(ValueError, match="bound"):
        LambdaFusion(3, per_channel=True, bound="sigmoid")


def test_the_moving_average_follows_the_official_update_shadow_arithmetic() -> None:
    # Prepare: λ starts at 0 (the official start and shadow); the server then sees these FedAvg results
    fusion = LambdaFusion(2, per_channel=True, bound="none")
    average = LambdaMovingAverage(fusion, mu=0.9)
    averaged = [(0.5, -1.0), (0.3, 2.0), (1.0, 0.0)]
    # Execute
    smoothed = []
    for value in averaged:
        with torch.no_grad():
            fusion.lam.copy_(torch.tensor(value).view(1, 2, 1, 1))
        average.update_()
        smoothed.append(fusion.lam.flatten().tolist())
    # Assert: λ_t = 0.1·λ̄_t + 0.9·λ_{t-1}, by hand
    expected = [(0.05, -0.1), (0.075, 0.11), (0.1675, 0.099)]
    for got, want in zip(smoothed, expected):
        assert got == pytest.approx(want, abs=1e-6)
    assert torch.equal(average.shadow, fusion.lam.detach())


def test_a_zero_mu_leaves_the_average_untouched_and_mu_one_is_refused() -> None:
    # Prepare
    fusion = LambdaFusion(1, per_channel=False, lambda_init=0.2)
    average = LambdaMovingAverage(fusion, mu=0.0)
    with torch.no_grad():
        fusion.lam.fill_(0.7)
    # Execute
    average.update_()
    # Assert
    assert float(fusion.lam.detach()) == pytest.approx(0.7)
    with pytest.raises(ValueError, match="mu"):
        LambdaMovingAverage(fusion, mu=1.0)
