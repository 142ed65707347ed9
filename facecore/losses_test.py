from __future__ import annotations

import dataclasses
import math
from typing import Any

import pytest
import torch
import torch.nn.functional as F

from facecore.losses import (
    ArcFaceHead,
    CosFaceHead,
    MarginHead,
    SpreadoutConfig,
    center_embeddings,
    cosface_loss,
    impostor_loss,
    make_margin_head,
    positive_loss,
    public_negatives_loss,
    spreadout_gradient,
    spreadout_loss,
    spreadout_optimize,
    spreadout_topk_loss,
)

# Three unit vectors with dot products 0.8 (w0.w1), 0.6 (w0.w2) and 0.48 (w1.w2).
UNIT_3 = torch.tensor([[1.0, 0.0, 0.0], [0.8, 0.6, 0.0], [0.6, 0.0, 0.8]], dtype=torch.float64)


def _t(rows: list[list[float]]) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


@pytest.mark.parametrize(
    ("feature", "expected"),
    [
        ([3.0, 0.0], 0.0),  # cos = 1 is past the margin
        ([0.0, 1.0], 0.9**2),  # orthogonal
        ([1.0, 1.0], (0.9 - 1 / math.sqrt(2)) ** 2),  # cos = 1/sqrt(2)
        ([-2.0, 0.0], 1.9**2),  # opposite
    ],
)
def test_positive_loss_single_vector(feature: list[float], expected: float) -> None:
    # Prepare
    features, class_embedding = _t([feature]), torch.tensor([2.0, 0.0], dtype=torch.float64)

    # Execute
    loss = positive_loss(features, class_embedding, margin=0.9)

    # Assert
    assert loss.item() == pytest.approx(expected)


def test_positive_loss_broadcast_and_rowwise() -> None:
    # Prepare
    features = _t([[1.0, 0.0], [0.0, 1.0]])

    # Execute
    shared = positive_loss(features, torch.tensor([1.0, 0.0], dtype=torch.float64))
    rowwise = positive_loss(features, _t([[0.0, 3.0], [1.0, 0.0]]))

    # Assert: shared -> cosines 1, 0 -> (0 + 0.81) / 2; row-wise -> cosines 0, 0
    # (broadcasting the first row instead would give cosines 0, 1)
    assert shared.item() == pytest.approx(0.405)
    assert rowwise.item() == pytest.approx(0.81)


@pytest.mark.parametrize(
    ("W", "expected"),
    [
        # rescaled rows (the loss must normalise them); each unordered pair appears
        # twice among the 6 ordered pairs
        (UNIT_3 * _t([[2.0], [0.5], [7.0]]), 2 * ((0.8 - 0.3) ** 2 + (0.6 - 0.3) ** 2 + (0.48 - 0.3) ** 2) / 6),
        # dots 0.6, -1 and -0.6: only the first exceeds nu
        (_t([[1.0, 0.0], [0.6, 0.8], [-1.0, 0.0]]), 2 * (0.6 - 0.3) ** 2 / 6),
    ],
)
def test_spreadout_loss_hand_computed(W: torch.Tensor, expected: float) -> None:
    # Execute
    loss = spreadout_loss(W, nu=0.3)

    # Assert
    assert loss.item() == pytest.approx(expected)


def test_spreadout_loss_single_class_is_zero_and_differentiable() -> None:
    # Prepare
    W = torch.ones(1, 4, requires_grad=True)

    # Execute
    loss = spreadout_loss(W)
    loss.backward()

    # Assert
    assert loss.item() == 0.0
    assert W.grad is not None and torch.equal(W.grad, torch.zeros(1, 4))


def test_spreadout_topk_excludes_far_pairs() -> None:
    # Execute
    loss = spreadout_topk_loss(UNIT_3, k=1, nu=0.3)

    # Assert: nearest of w0 is w1 (0.8), of w1 is w0 (0.8), of w2 is w0 (0.6);
    # the w1-w2 pair (0.48) is excluded although it is above nu
    assert loss.item() == pytest.approx((0.5**2 + 0.5**2 + 0.3**2) / 3)


@pytest.mark.parametrize("k", [2, 10])
def test_spreadout_topk_with_all_neighbours_equals_full(k: int) -> None:
    # Execute
    topk, full = spreadout_topk_loss(UNIT_3, k=k, nu=0.3), spreadout_loss(UNIT_3, nu=0.3)

    # Assert
    assert topk.item() == pytest.approx(full.item())


def test_invalid_shapes_and_k_rejected() -> None:
    # Execute / Assert
    with pytest.raises(ValueError, match="class_embedding"):
        positive_loss(torch.ones(3, 4), torch.ones(2, 4))
    with pytest.raises(ValueError, match="k must be"):
        spreadout_topk_loss(UNIT_3, k=0)
    with pytest.raises(ValueError, match="W must be"):
        spreadout_loss(torch.ones(4))


def _head_with_weight(head: MarginHead, weight: list[list[float]]) -> MarginHead:
    with torch.no_grad():
        head.weight.copy_(torch.tensor(weight))
    return head


def test_cosface_logits_hand_computed() -> None:
    # Prepare: class weights e0, e1 and (0.6, 0.8), rescaled
    head = _head_with_weight(CosFaceHead(2, 3, s=10.0, m=0.35), [[2.0, 0.0], [0.0, 3.0], [0.6, 0.8]])
    embeddings = _t([[1.0, 0.0], [0.0, 2.0]])
    labels = torch.tensor([0, 2])

    # Execute
    logits = head.logits(embeddings, labels)
    loss = head(embeddings, labels)

    # Assert: rows have cosines (1, 0, 0.6) and (0, 1, 0.8)
    expected = _t([[10 * (1 - 0.35), 0.0, 6.0], [0.0, 10.0, 10 * (0.8 - 0.35)]])
    torch.testing.assert_close(logits, expected)
    ce = [math.log(sum(math.exp(v) for v in row)) - row[label] for row, label in zip(expected.tolist(), [0, 2])]
    assert loss.item() == pytest.approx(sum(ce) / 2)


def test_arcface_logit_is_cos_theta_plus_m() -> None:
    # Prepare
    head = _head_with_weight(ArcFaceHead(2, 2, s=8.0, m=0.5), [[0.6, 0.8], [0.0, 1.0]])
    embeddings, labels = _t([[5.0, 0.0]]), torch.tensor([0])

    # Execute
    logits = head.logits(embeddings, labels)

    # Assert: theta = acos(0.6) + 0.5 < pi; the other class keeps s * cos = 0
    assert logits[0, 0].item() == pytest.approx(8.0 * math.cos(math.acos(0.6) + 0.5))
    assert logits[0, 1].item() == pytest.approx(0.0, abs=1e-12)


def test_arcface_falls_back_past_pi() -> None:
    # Prepare: cos = -0.96, so theta ~ 2.86 > pi - 0.5 and theta + m would pass pi
    head = _head_with_weight(ArcFaceHead(2, 1, s=1.0, m=0.5), [[-0.96, 0.28]])

    # Execute
    logit = head.logits(_t([[1.0, 0.0]]), torch.tensor([0]))

    # Assert
    assert math.acos(-0.96) + 0.5 > math.pi
    assert logit.item() == pytest.approx(-0.96 - 0.5 * math.sin(0.5))


@pytest.mark.parametrize("loss_name", ["cosface", "arcface"])
def test_margin_head_gradients_finite_at_cos_extremes(loss_name: str) -> None:
    # Prepare: embeddings exactly on (+1) and opposite (-1) their class weight
    head = _head_with_weight(make_margin_head(loss_name, 2, 2), [[1.0, 0.0], [0.0, 1.0]])
    embeddings = torch.tensor([[1.0, 0.0], [0.0, -1.0]], requires_grad=True)

    # Execute
    loss = head(embeddings, torch.tensor([0, 1]))
    loss.backward()

    # Assert
    assert torch.isfinite(loss)
    assert embeddings.grad is not None and head.weight.grad is not None
    assert torch.isfinite(embeddings.grad).all() and torch.isfinite(head.weight.grad).all()


def test_make_margin_head_types_and_unknown_name() -> None:
    # Execute
    cos, arc = make_margin_head("cosface", 8, 4), make_margin_head("arcface", 8, 4, m=0.3)

    # Assert
    assert isinstance(cos, CosFaceHead) and isinstance(arc, ArcFaceHead) and arc.m == 0.3
    assert cos.weight.shape == (4, 8)
    with pytest.raises(ValueError, match="arcface, cosface"):
        make_margin_head("softmax", 8, 4)


def test_positive_and_spreadout_gradients_finite() -> None:
    # Prepare: identical rows are the worst case for the spreadout hinge
    features = torch.randn(4, 8, requires_grad=True)
    W = torch.ones(3, 8, requires_grad=True)

    # Execute
    (positive_loss(features, W[0]) + spreadout_loss(W) + spreadout_topk_loss(W, k=1)).backward()

    # Assert
    assert features.grad is not None and W.grad is not None
    assert torch.isfinite(features.grad).all() and torch.isfinite(W.grad).all()
    assert W.grad.abs().sum() > 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_spreadout_optimize_reduces_loss_and_keeps_input(dtype: torch.dtype) -> None:
    # Prepare: clustered classes so the hinge is active
    torch.manual_seed(0)
    W = (torch.randn(1, 16) + 0.3 * torch.randn(10, 16)).to(dtype)
    original = W.clone()

    # Execute
    updated = spreadout_optimize(W, steps=20, lr=0.5, momentum=0.9, nu=0.3)

    # Assert
    assert torch.equal(W, original)
    assert updated.dtype == dtype and updated.shape == W.shape and not updated.requires_grad
    assert spreadout_loss(updated).item() < spreadout_loss(W).item()
    torch.testing.assert_close(updated, spreadout_optimize(W, steps=20, lr=0.5, momentum=0.9, nu=0.3), rtol=0, atol=0)


def test_the_server_step_in_reused_buffers_is_its_formulas_out_of_place_to_the_bit() -> None:
    # Prepare: the step written as its formulas, each result a new tensor
    torch.manual_seed(3)
    W = torch.randn(1, 8) + 0.5 * torch.randn(12, 8)
    steps, lr, momentum, nu = 6, 0.5, 0.9, 0.2
    current, velocity = W.clone(), None
    for _ in range(steps):
        lengths = current.norm(dim=1, keepdim=True).clamp_min(1e-12)
        unit = current / lengths
        hinge = (unit @ unit.T - nu).clamp_min(0)
        hinge.fill_diagonal_(0)
        grad = (hinge @ unit) * (4.0 / (len(W) * (len(W) - 1)))
        grad = (grad - (grad * unit).sum(dim=1, keepdim=True) * unit) / lengths
        velocity = grad if velocity is None else momentum * velocity + grad
        current = current - lr * velocity

    # Execute
    updated = spreadout_optimize(W, steps=steps, lr=lr, momentum=momentum, nu=nu)

    # Assert
    assert torch.equal(updated, current)
    assert not torch.equal(updated, W)


def test_spreadout_optimize_matches_torch_sgd() -> None:
    # Prepare
    torch.manual_seed(1)
    W = torch.randn(6, 4, dtype=torch.float64)
    reference = W.clone().requires_grad_(True)
    optimizer = torch.optim.SGD([reference], lr=0.1, momentum=0.9)
    for _ in range(5):
        optimizer.zero_grad()
        spreadout_loss(reference, nu=0.0).backward()
        optimizer.step()

    # Execute
    updated = spreadout_optimize(W, steps=5, lr=0.1, momentum=0.9, nu=0.0)

    # Assert
    torch.testing.assert_close(updated, reference.detach())


@pytest.mark.parametrize("block_values", [1, 7 * 3, 1 << 24])
@pytest.mark.parametrize("nu", [0.0, 0.3])
def test_the_blockwise_spreadout_gradient_is_autograds(block_values: int, nu: float) -> None:
    # Prepare: some pairs inside the hinge, some outside, rows of several lengths
    torch.manual_seed(2)
    W = (torch.randn(1, 5) + 0.6 * torch.randn(7, 5)).to(torch.float64) * torch.linspace(0.5, 2.0, 7)[:, None].double()
    reference = W.clone().requires_grad_(True)
    spreadout_loss(reference, nu=nu).backward()

    # Execute: one row per block, three rows per block, and all rows at once
    grad = spreadout_gradient(W, nu=nu, block_values=block_values)

    # Assert
    assert reference.grad is not None and reference.grad.abs().max() > 0
    torch.testing.assert_close(grad, reference.grad, rtol=1e-12, atol=1e-15)


def test_the_spreadout_gradient_of_one_class_is_zero() -> None:
    assert torch.equal(spreadout_gradient(torch.randn(1, 4)), torch.zeros(1, 4))


def test_spreadout_optimize_zero_steps_returns_copy() -> None:
    # Prepare
    W = torch.randn(3, 4)

    # Execute
    updated = spreadout_optimize(W, steps=0)

    # Assert
    assert torch.equal(updated, W) and updated.data_ptr() != W.data_ptr()


def test_centering_takes_out_the_shared_direction_and_keeps_each_rows_norm() -> None:
    # Prepare: 50 embeddings that all lean towards one direction, with norms 1 to 3.
    generator = torch.Generator().manual_seed(0)
    shared = torch.zeros(16)
    shared[0] = 2.0
    W = (torch.randn(50, 16, generator=generator) + shared) * torch.linspace(1, 3, 50)[:, None]
    mean_cos = lambda M: (F.normalize(M, dim=1) @ F.normalize(M, dim=1).T)[~torch.eye(len(M), dtype=torch.bool)].mean()  # noqa: E731

    # Execute
    centred = center_embeddings(W)
    through_the_server_step = spreadout_optimize(W, steps=0, center=True)

    # Assert
    assert mean_cos(W) > 0.15
    assert abs(float(mean_cos(centred))) < 0.05
    torch.testing.assert_close(centred.norm(dim=1), W.norm(dim=1))
    torch.testing.assert_close(through_the_server_step, centred)
    assert torch.equal(center_embeddings(W[:1]), W[:1])


def test_spreadout_config_defaults_and_frozen() -> None:
    # Prepare
    cfg = SpreadoutConfig()

    # Execute / Assert
    assert dataclasses.asdict(cfg) == {"nu": 0.3, "steps": 10, "lr": 0.01, "momentum": 0.9, "center": False}
    with pytest.raises(dataclasses.FrozenInstanceError, match="^cannot assign to field 'steps'$"):
        cfg.steps = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    "kwargs",
    [
        {"steps": -1}, {"steps": 2.5}, {"lr": 0.0}, {"lr": -0.1}, {"lr": math.inf},
        {"nu": 1.5}, {"nu": -1.01}, {"momentum": 1.0}, {"momentum": -0.1},
    ],
)
def test_spreadout_config_rejects_bad_values(kwargs: dict[str, Any]) -> None:
    # Prepare: the error names the bad setting first, for both the config and the function that builds one
    names_it = rf"^{next(iter(kwargs))} .*must be"
    # Execute / Assert
    with pytest.raises(ValueError, match=names_it):
        SpreadoutConfig(**kwargs)
    with pytest.raises(ValueError, match=names_it):
        spreadout_optimize(torch.randn(3, 4), **kwargs)


def test_impostor_loss_is_zero_below_the_margin_and_squared_above_it() -> None:
    # Prepare: cosines 0.0 and 0.8 with w = x axis
    w = torch.tensor([1.0, 0.0])
    features = torch.tensor([[0.0, 2.0], [0.8, 0.6]])
    # Execute
    loss = impostor_loss(features, w, margin=0.2)
    # Assert: mean(0, (0.8 - 0.2)^2) = 0.18
    assert float(loss) == pytest.approx(0.18, abs=1e-6)
    with pytest.raises(ValueError, match="embedding"):
        impostor_loss(features, torch.ones(3))


def test_public_negatives_loss_is_cosface_against_the_owner_and_the_templates() -> None:
    # Prepare: a face at cosine 0.8 to its owner's w and 0.6 and 0.0 to two public templates
    w = torch.tensor([1.0, 0.0])
    features = torch.tensor([[0.8, 0.6]])
    negatives = torch.tensor([[0.0, 1.0], [-0.6, 0.8]])  # cosines 0.6 and 0.0
    # Execute
    loss = public_negatives_loss(features, w, negatives, s=10.0, m=0.2)
    # Assert: -log(e^{10*0.6} / (e^{10*0.6} + e^{10*0.6} + e^{0}))
    expected = -math.log(math.exp(6.0) / (2 * math.exp(6.0) + 1.0))
    assert float(loss) == pytest.approx(expected, rel=1e-5)


def test_public_negatives_loss_pulls_the_face_from_the_templates_and_checks_shapes() -> None:
    # Prepare
    torch.manual_seed(0)
    features = torch.randn(4, 8, requires_grad=True)
    w, negatives = torch.randn(8), torch.randn(5, 8)
    # Execute: one small gradient step on the features
    loss = public_negatives_loss(features, w, negatives)
    (grad,) = torch.autograd.grad(loss, features)
    stepped = public_negatives_loss(features.detach() - 1e-3 * grad, w, negatives)
    # Assert
    assert float(stepped) < float(loss.detach())
    with pytest.raises(ValueError, match="negatives"):
        public_negatives_loss(features, w, torch.randn(5, 7))


def test_cosface_loss_matches_the_cosface_head_with_the_same_weights() -> None:
    # Prepare
    torch.manual_seed(1)
    features, labels = torch.randn(6, 8), torch.tensor([0, 1, 2, 0, 1, 2])
    head = CosFaceHead(8, 3, s=30.0, m=0.2)
    # Execute
    loss = cosface_loss(features, labels, head.weight.detach(), s=30.0, m=0.2)
    # Assert
    assert float(loss) == pytest.approx(float(head(features, labels)), rel=1e-5)
    with pytest.raises(ValueError, match="labels"):
        cosface_loss(features, labels[:3], head.weight.detach())
