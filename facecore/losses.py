"""Training losses: margin softmax heads for centralised pre-training and the
FedFace / FedAwS losses for federated fine-tuning with positive labels only.

Conventions: embeddings and class weights are always L2-normalised before use,
so every similarity below is a cosine.
"""
from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from facecore.spreadout import SpreadoutConfig

MARGIN_LOSSES = ("arcface", "cosface")


class MarginHead(nn.Module):
    """Shared parts: the (num_classes, embedding_dim) weight and cosine logits."""

    def __init__(self, embedding_dim: int, num_classes: int, s: float) -> None:
        super().__init__()
        if embedding_dim < 1 or num_classes < 1:
            raise ValueError(f"embedding_dim and num_classes must be positive, got {embedding_dim}, {num_classes}")
        if not s > 0:
            raise ValueError(f"scale s must be positive, got {s}")
        self.s = s
        # insightface initialisation; the scale is irrelevant after normalisation.
        self.weight = nn.Parameter(torch.empty(num_classes, embedding_dim).normal_(0.0, 0.01))

    def cosine(self, embeddings: Tensor) -> Tensor:
        dtype = torch.promote_types(embeddings.dtype, self.weight.dtype)
        return F.linear(F.normalize(embeddings.to(dtype)), F.normalize(self.weight.to(dtype)))

    def target_margin(self, cos_target: Tensor) -> Tensor:
        raise NotImplementedError

    def logits(self, embeddings: Tensor, labels: Tensor) -> Tensor:
        """``s * cos`` for every class, with the margin applied at each row's label."""
        cos = self.cosine(embeddings)
        index = labels.long().view(-1, 1)
        # Margins only touch the target column, so compute them on (N, 1) not (N, C).
        cos = cos.scatter(1, index, self.target_margin(cos.gather(1, index)))
        return self.s * cos

    def forward(self, embeddings: Tensor, labels: Tensor) -> Tensor:
        return F.cross_entropy(self.logits(embeddings, labels), labels.long())


class CosFaceHead(MarginHead):
    """CosFace / AM-Softmax (Wang et al. 2018): target logit ``s * (cos - m)``."""

    def __init__(self, embedding_dim: int, num_classes: int, s: float = 64.0, m: float = 0.35) -> None:
        super().__init__(embedding_dim, num_classes, s)
        if m < 0:
            raise ValueError(f"margin m must be >= 0, got {m}")
        self.m = m

    def target_margin(self, cos_target: Tensor) -> Tensor:
        return cos_target - self.m


class ArcFaceHead(MarginHead):
    """ArcFace (Deng et al. 2019): target logit ``s * cos(theta + m)``.

    With "easy margin" off (insightface default): ``cos(theta + m)`` stops being
    decreasing in theta once ``theta + m > pi``, which would reward moving away
    from the class. There, i.e. where ``cos(theta) <= cos(pi - m)``, the target
    is the insightface fallback ``cos(theta) - m * sin(m)``: the first-order
    expansion ``cos(theta) - m * sin(theta)`` with ``sin(theta)`` frozen at the
    switch point (``sin(pi - m) = sin(m)``). It is a fixed CosFace-style margin,
    so the target stays monotone in theta and below ``cos(theta)``.
    """

    def __init__(self, embedding_dim: int, num_classes: int, s: float = 64.0, m: float = 0.5) -> None:
        super().__init__(embedding_dim, num_classes, s)
        if not 0 <= m < math.pi:
            raise ValueError(f"margin m must be in [0, pi), got {m}")
        self.m = m
        self.threshold = math.cos(math.pi - m)
        self.fallback = math.sin(math.pi - m) * m

    def target_margin(self, cos_target: Tensor) -> Tensor:
        # Clamp keeps sqrt's gradient finite when cos is exactly +-1.
        sin_target = (1.0 - cos_target * cos_target).clamp_min(1e-12).sqrt()
        shifted = cos_target * math.cos(self.m) - sin_target * math.sin(self.m)
        return torch.where(cos_target > self.threshold, shifted, cos_target - self.fallback)


def make_margin_head(loss: str, embedding_dim: int, num_classes: int, **kwargs: Any) -> MarginHead:
    """Build the margin head named ``loss`` (``cosface`` or ``arcface``); ``kwargs``
    go to the head (``s``, ``m``)."""
    if loss == "cosface":
        return CosFaceHead(embedding_dim, num_classes, **kwargs)
    if loss == "arcface":
        return ArcFaceHead(embedding_dim, num_classes, **kwargs)
    raise ValueError(f"unknown loss {loss!r}; valid names: {', '.join(MARGIN_LOSSES)}")


def impostor_loss(features: Tensor, class_embedding: Tensor, margin: float = 0.2) -> Tensor:
    """``mean_i max(0, cos(f_i, w) - margin)**2``: impostor faces pushed below ``margin`` of one
    identity's embedding ``w`` (D,). The mirror image of `positive_loss`, for a device that holds
    public impostor faces next to its owner's."""
    if features.dim() != 2 or class_embedding.shape != features.shape[-1:]:
        raise ValueError(f"need (N, D) features and a (D,) embedding, got {tuple(features.shape)} and {tuple(class_embedding.shape)}")
    cos = torch.nn.functional.normalize(features, dim=1) @ torch.nn.functional.normalize(class_embedding, dim=0)
    return torch.clamp(cos - margin, min=0).pow(2).mean()


def public_negatives_loss(features: Tensor, class_embedding: Tensor, negatives: Tensor, s: float = 64.0, m: float = 0.35) -> Tensor:
    """CosFace of a device's faces against its owner's embedding ``w`` (D,) and public identities'
    templates ``negatives`` (K, D): ``mean_i -log softmax(s * [cos(f_i, w) - m, cos(f_i, t_1..K)])_0``.

    The positive-only loss gives a device no negatives; these templates are public faces' identities,
    which the server may ship without any device learning of another device's owner."""
    if features.dim() != 2 or class_embedding.shape != features.shape[-1:] or negatives.dim() != 2 or negatives.shape[1] != features.shape[1]:
        raise ValueError(
            f"need (N, D) features, a (D,) embedding and (K, D) negatives, got {tuple(features.shape)}, "
            f"{tuple(class_embedding.shape)} and {tuple(negatives.shape)}"
        )
    f = F.normalize(features, dim=1)
    target = f @ F.normalize(class_embedding, dim=0) - m
    logits = s * torch.cat([target[:, None], f @ F.normalize(negatives, dim=1).T], dim=1)
    return F.cross_entropy(logits, torch.zeros(len(f), dtype=torch.long, device=f.device))


def cosface_loss(features: Tensor, labels: Tensor, class_embeddings: Tensor, s: float = 64.0, m: float = 0.35) -> Tensor:
    """CosFace against fixed class embeddings (C, D): ``mean_i -log softmax(s * (cos(f_i, w) - m 1[label]))_label``."""
    if features.dim() != 2 or class_embeddings.dim() != 2 or class_embeddings.shape[1] != features.shape[1] or labels.shape != features.shape[:1]:
        raise ValueError(
            f"need (N, D) features, (N,) labels and (C, D) embeddings, got {tuple(features.shape)}, "
            f"{tuple(labels.shape)} and {tuple(class_embeddings.shape)}"
        )
    cos = F.normalize(features, dim=1) @ F.normalize(class_embeddings, dim=1).T
    cos = cos - m * F.one_hot(labels.long(), len(class_embeddings)).to(cos.dtype)
    return F.cross_entropy(s * cos, labels.long())


def positive_loss(features: Tensor, class_embedding: Tensor, margin: float = 0.9) -> Tensor:
    """FedFace positive-only loss ``mean_i max(0, margin - cos(f_i, w_i))**2``.

    ``class_embedding`` is either one vector ``(D,)`` shared by all rows (a
    client's own identity) or ``(N, D)`` matched row by row.
    """
    if features.dim() != 2:
        raise ValueError(f"features must be (N, D), got shape {tuple(features.shape)}")
    if class_embedding.dim() == 1:
        class_embedding = class_embedding.unsqueeze(0)
    if class_embedding.dim() != 2 or class_embedding.shape[-1] != features.shape[-1] or (
        class_embedding.shape[0] not in (1, features.shape[0])
    ):
        raise ValueError(
            f"class_embedding must be (D,) or (N, D) for features {tuple(features.shape)}, "
            f"got {tuple(class_embedding.shape)}"
        )
    cos = (F.normalize(features, dim=1) * F.normalize(class_embedding, dim=1)).sum(dim=1)
    return (margin - cos).clamp_min(0).pow(2).mean()


def _check_matrix(W: Tensor) -> None:
    if W.dim() != 2:
        raise ValueError(f"W must be (C, D), got shape {tuple(W.shape)}")


def spreadout_loss(W: Tensor, nu: float = 0.3) -> Tensor:
    """Mean over ordered pairs ``j != k`` of ``max(0, w_j . w_k - nu)**2`` on
    L2-normalised rows of ``W`` (FedFace server regulariser). Zero for one class."""
    _check_matrix(W)
    C = W.shape[0]
    if C < 2:
        # Multiply rather than build a constant so backward() still reaches W.
        return (W * 0).sum()
    Wn = F.normalize(W, dim=1)
    off_diagonal = ~torch.eye(C, dtype=torch.bool, device=W.device)
    hinge = (Wn @ Wn.T - nu).clamp_min(0).pow(2)
    return hinge[off_diagonal].mean()


def spreadout_topk_loss(W: Tensor, k: int, nu: float = 0.3) -> Tensor:
    """FedAwS spreadout restricted to nearest neighbours (Yu et al. 2020).

    Implemented formula, with ``w`` the L2-normalised rows of ``W`` and ``N_k(j)``
    the ``k`` classes ``c != j`` with the largest ``w_j . w_c`` (the nearest on
    the unit sphere)::

        L = 1 / (C * k) * sum_j sum_{c in N_k(j)} max(0, w_j . w_c - nu)**2

    FedAwS writes the hinge on squared distances, ``max(0, nu' - |w_j - w_c|**2)``;
    on unit vectors ``|w_j - w_c|**2 = 2 - 2 w_j . w_c``, so that equals
    ``4 * max(0, w_j . w_c - (1 - nu' / 2))**2`` and the cosine form above keeps
    ``nu`` consistent with :func:`spreadout_loss`. ``k`` is capped at ``C - 1``,
    where this equals :func:`spreadout_loss`.
    """
    _check_matrix(W)
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    C = W.shape[0]
    if C < 2:
        return (W * 0).sum()
    k = min(k, C - 1)
    Wn = F.normalize(W, dim=1)
    sim = Wn @ Wn.T
    # Exclude self-similarity from the neighbour search.
    sim = sim.masked_fill(torch.eye(C, dtype=torch.bool, device=W.device), float("-inf"))
    nearest = sim.topk(k, dim=1).values
    return (nearest - nu).clamp_min(0).pow(2).mean()


def center_embeddings(W: Tensor) -> Tensor:
    """The unit rows of ``W`` less their mean, each scaled back to its row's norm.

    A positive-only loss pulls each owner's faces towards that owner's embedding. Whatever
    direction all embeddings share, every device pulls towards it at once, and FedAvg adds those
    pulls up while the owners' own directions partly cancel: the backbone learns to move every face
    the same way. With the shared direction taken out, each pull is, like a softmax gradient, its
    own class against the mean of all. One row has nothing to be centred against and is returned as is.
    """
    _check_matrix(W)
    if W.shape[0] < 2:
        return W.detach().clone()
    norms = W.norm(dim=1, keepdim=True)
    unit = F.normalize(W, dim=1)
    centred = unit - unit.mean(dim=0, keepdim=True)
    return (F.normalize(centred, dim=1) * norms).detach()


def spreadout_optimize(
    W: Tensor, steps: int = 10, lr: float = 0.01, momentum: float = 0.9, nu: float = 0.3, center: bool = False
) -> Tensor:
    """FedFace server step: ``steps`` of SGD with momentum on ``spreadout_loss(W, nu)``, after
    :func:`center_embeddings` when ``center``.

    Uses PyTorch's SGD convention (``v = momentum * v + g``, ``W -= lr * v``, with
    ``v`` starting at the first gradient). Returns an updated detached copy in
    ``W``'s dtype and device; ``W`` itself is untouched. The rows are *not*
    renormalised: every consumer normalises anyway, and keeping the raw update
    lets clients continue from the exact averaged parameters.
    """
    _check_matrix(W)
    SpreadoutConfig(nu=nu, steps=steps, lr=lr, momentum=momentum, center=center)  # validates
    current = center_embeddings(W) if center else W.detach().clone()
    velocity: Tensor | None = None
    step = torch.empty_like(current)
    # In place, with the same operations in the same order as `v = m * v + g; W = W - lr * v`: the same bits in a
    # fixed number of (C, D) buffers, which a server step over many classes would otherwise allocate anew each step.
    with torch.no_grad():
        for _ in range(steps):
            grad = spreadout_gradient(current, nu)
            velocity = grad if velocity is None else velocity.mul_(momentum).add_(grad)
            current.sub_(torch.mul(velocity, lr, out=step))
    return current


# Cosines held at once by spreadout_gradient: 16 MiB in float32, whatever the number of classes.
SPREADOUT_BLOCK_VALUES = 1 << 22


@torch.no_grad()
def spreadout_gradient(W: Tensor, nu: float = 0.3, block_values: int = SPREADOUT_BLOCK_VALUES) -> Tensor:
    """The gradient of :func:`spreadout_loss` with respect to ``W``, worked out in closed form a block of rows at a time,
    so memory holds ``block_values`` cosines instead of all C² (10,000 classes: 400 MB, and autograd keeps several).

    With ``u_j = w_j / |w_j|``, ``s_jk = u_j . u_k`` and ``h = max(0, s - nu)``, each unordered pair enters the
    mean over C(C-1) ordered pairs twice, so ``dL/du_j = 4 / (C(C-1)) * sum_{k != j} h(s_jk) u_k``; the
    normalisation passes it on as ``(dL/du_j - (dL/du_j . u_j) u_j) / |w_j|``."""
    _check_matrix(W)
    classes = W.shape[0]
    if classes < 2:
        return torch.zeros_like(W)
    lengths = W.norm(dim=1, keepdim=True).clamp_min(1e-12)  # F.normalize's floor
    unit = W / lengths
    grad = torch.empty_like(W)
    rows = max(1, block_values // classes)
    cosines = torch.empty(min(rows, classes), classes, dtype=W.dtype, device=W.device)  # one block's, reused by every block
    for start in range(0, classes, rows):
        block = unit[start : start + rows]
        hinge = torch.matmul(block, unit.T, out=cosines[: len(block)]).sub_(nu).clamp_min_(0)
        own = torch.arange(len(block))
        hinge[own, start + own] = 0  # a class is not its own neighbour
        torch.matmul(hinge, unit, out=grad[start : start + rows])
    grad *= 4.0 / (classes * (classes - 1))
    along = torch.mul(grad, unit)  # then reused for the part of grad along unit, removed in place: the same operations as
    torch.mul(along.sum(dim=1, keepdim=True), unit, out=along)  # (grad - (grad * unit).sum(1) * unit) / lengths
    return grad.sub_(along).div_(lengths)
