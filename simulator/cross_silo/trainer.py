"""Trainer side of PFM (Alg. 1 lines 5-12) and FedAvg, plus the centralized baseline.

A trainer's classifier (the margin head) and its momentum never leave it; only the
backbone's weights go to the server. Per local step k, with g and h the backbone's and
the classifier's gradients on the trainer's own batch:

    PFM     theta <- theta - eta * (g + beta * M / K)         (eq. 3; M from the server,
            computed as theta - eta * g - (eta * beta * M / K), the bracket once per round)
    FedAvg  m <- beta * m + g;  theta <- theta - eta * m      (local momentum, kept across rounds)
    both    M_w <- beta * M_w + h;  w <- w - eta * M_w        (eqs. 1-2, the classifier)

FedAvg's local backbone momentum survives the server overwriting theta, as it does when
existing momentum-SGD training code is wrapped in FedAvg unchanged; resetting it each round
would make K = 1 plain SGD.
"""
from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from facecore.losses import MarginHead
from facecore.models.preprocess import faces_to_tensor
from simulator.cross_silo.models import backbone_autocast

Batches = Callable[[], tuple[Tensor, Tensor]]


@dataclass(frozen=True)
class SiloData:
    """One party's private training faces; ``labels`` index this party's own classes."""

    name: str
    faces: np.ndarray  # (N, S, S, 3) uint8
    labels: np.ndarray  # (N,) int64 in [0, classes)
    classes: int

    def __post_init__(self) -> None:
        if self.faces.ndim != 4 or self.faces.shape[-1] != 3 or self.faces.dtype != np.uint8:
            raise ValueError(f"{self.name}: faces must be (N, S, S, 3) uint8, got {self.faces.dtype} {self.faces.shape}")
        if len(self.faces) != len(self.labels) or len(self.labels) == 0:
            raise ValueError(f"{self.name}: need as many labels as faces (and at least one), got {len(self.labels)} and {len(self.faces)}")
        if self.labels.min() < 0 or self.labels.max() >= self.classes:
            raise ValueError(f"{self.name}: labels must lie in [0, {self.classes})")


class BatchStream:
    """Endless shuffled batches (a fresh permutation per epoch); the same seed gives the same batches."""

    def __init__(self, data: SiloData, batch: int, seed: int, flip: bool = True, device: str = "cpu") -> None:
        self.data, self.batch, self.flip, self.device = data, batch, flip, device
        self.rng = np.random.default_rng(seed)
        self._order = np.zeros(0, np.int64)
        self._at = 0

    def __call__(self) -> tuple[Tensor, Tensor]:
        picked = []
        need = self.batch
        while need:
            if self._at == len(self._order):
                self._order, self._at = self.rng.permutation(len(self.data.labels)), 0
            take = self._order[self._at : self._at + need]
            picked.append(take)
            self._at += len(take)
            need -= len(take)
        index = np.concatenate(picked)
        faces = self.data.faces[index]
        if self.flip:
            mirror = self.rng.random(len(index)) < 0.5
            faces = np.where(mirror[:, None, None, None], faces[:, :, ::-1], faces)
        return faces_to_tensor(np.ascontiguousarray(faces), self.device), torch.as_tensor(self.data.labels[index], device=self.device)


def _float_embeddings(emb: Tensor) -> Tensor:
    return emb.float() if emb.dtype in (torch.bfloat16, torch.float16) else emb


@dataclass(frozen=True)
class LocalResult:
    weights: dict[str, np.ndarray]  # the trained backbone (a "full" update)
    n_samples: int
    losses: tuple[float, ...]  # one per local step


class SiloTrainer:
    """One trainer: its backbone copy, its private classifier and both momentum states."""

    def __init__(
        self, name: str, backbone: nn.Module, head: nn.Module, batches: Batches, *, beta: float = 0.9, use_pfm: bool = True, device: str = "cpu",
    ) -> None:
        self.name, self.backbone, self.head, self.batches = name, backbone, head, batches
        self.beta, self.use_pfm, self.device = beta, use_pfm, device
        self.params: dict[str, Tensor] = dict(backbone.named_parameters())
        self.head_params: list[Tensor] = list(head.parameters())
        self.head_momentum = [torch.zeros_like(p) for p in self.head_params]  # M_w, private
        self.local_momentum = None if use_pfm else {n: torch.zeros_like(p) for n, p in self.params.items()}
        self.steps = 0

    def load(self, weights: Mapping[str, np.ndarray]) -> None:
        own = self.backbone.state_dict()
        self.backbone.load_state_dict({k: torch.as_tensor(np.asarray(weights[k])).to(own[k]) for k in own})

    def weights(self) -> dict[str, np.ndarray]:
        return {k: v.detach().cpu().numpy().copy() for k, v in self.backbone.state_dict().items()}

    def step(self, lr: float, global_term: Sequence[Tensor] | None) -> Tensor:
        """One local step; ``global_term`` is PFM's ``eta * beta * M / K`` per parameter (fixed within a round)."""
        self.backbone.train()
        self.head.train()
        x, y = self.batches()
        with backbone_autocast(self.device):
            emb = self.backbone(x)
        loss = self.head(_float_embeddings(emb), y)
        params = list(self.params.values())
        grads = torch.autograd.grad(loss, params + self.head_params)
        self.apply_update(list(grads[: len(params)]), list(grads[len(params) :]), lr, global_term)
        self.steps += 1
        return loss.detach()

    @torch.no_grad()
    def apply_update(self, grads: list[Tensor], head_grads: list[Tensor], lr: float, global_term: Sequence[Tensor] | None) -> None:
        """The update rules of the module docstring, as in-place multi-tensor ops (no temporaries)."""
        params = list(self.params.values())
        if self.local_momentum is None:
            if global_term is None:
                raise ValueError(f"{self.name}: a PFM step needs the global term")
            torch._foreach_add_(params, grads, alpha=-lr)  # theta - eta * g ...
            torch._foreach_sub_(params, list(global_term))  # ... - eta * beta * M / K
        else:
            momentum = list(self.local_momentum.values())
            torch._foreach_mul_(momentum, self.beta)
            torch._foreach_add_(momentum, grads)
            torch._foreach_add_(params, momentum, alpha=-lr)
        torch._foreach_mul_(self.head_momentum, self.beta)
        torch._foreach_add_(self.head_momentum, head_grads)
        torch._foreach_add_(self.head_params, self.head_momentum, alpha=-lr)

    def train_round(self, weights: Mapping[str, np.ndarray] | None, momentum: Mapping[str, np.ndarray] | None, lr: float, K: int) -> LocalResult:
        """Start from the global ``weights`` (None: keep the local backbone, as solo training does), take K steps."""
        if weights is not None:
            self.load(weights)
        term = None
        if self.use_pfm:
            if momentum is None:
                raise ValueError(f"{self.name}: PFM needs the server's momentum M (zeros in the first round)")
            # eta and M are fixed within a round, so eta * beta * M / K is computed once per round.
            # copy=True: as_tensor shares the server's array, which other trainers still read.
            term = [torch.as_tensor(np.asarray(momentum[n])).to(p, copy=True).mul_(lr * self.beta / K) for n, p in self.params.items()]
        losses = [self.step(lr, term) for _ in range(K)]
        return LocalResult(self.weights(), K * _batch_size(self.batches), tuple(torch.stack(losses).float().cpu().tolist()))


def _batch_size(batches: Batches) -> int:
    return int(getattr(batches, "batch", 1))


class CentralTrainer:
    """The non-federated baseline: every silo's batch in one step, one classifier over all classes.

    That is what pooling the silos' data would give: a silo's faces also push away every
    other silo's identities, so its loss is not the federated one (the paper's Table 1 shows it).
    """

    def __init__(
        self, backbone: nn.Module, head: MarginHead, streams: Sequence[Batches], class_offsets: Sequence[int], *, beta: float = 0.9, device: str = "cpu",
    ) -> None:
        self.backbone, self.head, self.streams, self.offsets, self.device = backbone, head, list(streams), list(class_offsets), device
        self.optimizer = torch.optim.SGD(list(backbone.parameters()) + list(head.parameters()), lr=0.1, momentum=beta)

    def step(self, lr: float) -> Tensor:
        """One step; returns each silo's mean loss (the silo's rows of the pooled batch)."""
        self.backbone.train()
        self.head.train()
        batches = [stream() for stream in self.streams]
        x = torch.cat([b[0] for b in batches])
        y = torch.cat([b[1] + offset for b, offset in zip(batches, self.offsets)])
        with backbone_autocast(self.device):
            emb = self.backbone(x)
        per_row = F.cross_entropy(self.head.logits(_float_embeddings(emb), y), y, reduction="none")
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.zero_grad(set_to_none=True)
        per_row.mean().backward()
        self.optimizer.step()
        sizes = [len(b[1]) for b in batches]
        return torch.stack([part.mean() for part in per_row.detach().split(sizes)])
