"""Rounds of FedFusion: nodes train locally, the server averages with the shared FedAvg strategy.

Round t, as in the paper's Algorithm 1 and the official code:
1. the server's model refreshes E_g := E_l, i.e. E_g becomes the extractor of the model it broadcasts;
2. each selected node trains a copy (E_l, fusion, classifier) with E_g frozen;
3. `FedAvg.aggregate_train` averages those trainable parameters, weighted by node sample counts;
4. optionally (``lambda_mu`` > 0, the official μ = 0.9) the server smooths the averaged λ with its
   moving average (`facecore.fusion.LambdaMovingAverage`, the official ``update_shadow``).
After step 3 (and 4) the server model holds the new averaged E_l next to the E_g it sent (the previous
round's extractor); that pair, with the averaged fusion and classifier, is "the global model" whose
test accuracy a round reports (``acc``). The report's ``final_acc_refreshed`` is the final model
after step 1 of a next round (E_g = E_l = last average): what a node downloading it would hold.
"""
from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from torch import nn

from facecore.federation.strategies.base import ClientUpdate, Strategy
from facecore.federation.strategies.fedavg import FedAvg
from facecore.fusion import LambdaFusion, LambdaMovingAverage
from simulator.fusion.data import random_crop_flip
from simulator.fusion.model import FusedCNN, load_trainable, trainable_state

NodeData = tuple[torch.Tensor, torch.Tensor]  # images B×C×H×W, labels B


@dataclass(frozen=True)
class LocalTraining:
    """A node's SGD; ``lr_decay`` and ``min_lr`` give the per-round schedule (``lr_at``)."""

    epochs: int = 1
    batch: int = 32
    lr: float = 0.05
    momentum: float = 0.5
    weight_decay: float = 0.0
    lr_decay: float = 1.0
    min_lr: float = 0.0
    augment: bool = False  # the official random resized crop + horizontal flip on every training batch

    def __post_init__(self) -> None:
        if (self.epochs < 0 or self.batch < 1 or not self.lr > 0 or not 0 <= self.momentum < 1 or self.weight_decay < 0
                or not 0 < self.lr_decay <= 1 or self.min_lr < 0):
            raise ValueError(f"invalid local training settings: {self}")

    def lr_at(self, t: int) -> float:
        """The learning rate of round t (1-based), the official ``Agent.update_lr`` rule.

        After every round, ``if lr > min_lr: lr *= decay``: round 1 trains at ``lr``, round t at
        lr·decay^(t−1) until the first value at or below ``min_lr``, which then stays.
        """
        lr = self.lr
        for _ in range(t - 1):
            if lr <= self.min_lr or self.lr_decay == 1.0:
                break
            lr *= self.lr_decay
        return lr


def generator(*key: int) -> torch.Generator:
    """A torch RNG fixed by (seed, round, node, ...): batch order never depends on the fusion kind."""
    return torch.Generator().manual_seed(int(np.random.SeedSequence(list(key)).generate_state(1)[0]))


def train_fused_node(model: FusedCNN, data: NodeData, settings: LocalTraining, rng: torch.Generator) -> float:
    """SGD on the node's data, in place; returns the mean training loss (nan if no step ran)."""
    x, y = data
    params = [p for p in model.parameters() if p.requires_grad]
    # Weight decay applies to every trainable parameter, λ and the 1×1 conv included, as in the official code.
    optimizer = torch.optim.SGD(params, lr=settings.lr, momentum=settings.momentum, weight_decay=settings.weight_decay)
    dtype = next(model.parameters()).dtype
    model.train()
    losses: list[float] = []
    # Dropout (official net) and the augmentation draw from torch's global RNG: fix it by the same key as the batch
    # order, without disturbing the caller's state.
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(rng.initial_seed() ^ 0x5EED)
        for _ in range(settings.epochs):
            order = torch.randperm(len(y), generator=rng)
            for start in range(0, len(y), settings.batch):
                batch = order[start : start + settings.batch]
                images = x[batch].to(dtype)
                loss = nn.functional.cross_entropy(model(random_crop_flip(images) if settings.augment else images), y[batch])
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                model.fusion.project_()  # a no-op for an unbounded λ
                losses.append(float(loss.detach()))
    return float(np.mean(losses)) if losses else float("nan")


@torch.no_grad()
def accuracy(model: nn.Module, data: NodeData, batch: int = 1000) -> float:
    x, y = data
    dtype = next(model.parameters()).dtype
    model.eval()
    correct = sum(int((model(x[i : i + batch].to(dtype)).argmax(1) == y[i : i + batch]).sum()) for i in range(0, len(y), batch))
    return correct / len(y)


def refreshed(model: FusedCNN) -> FusedCNN:
    copy_ = copy.deepcopy(model)
    copy_.refresh_global()
    return copy_


class Federation:
    """The server's model and the nodes' data; ``round(t)`` runs one round in place.

    ``lambda_mu`` > 0 turns on the server's moving average of λ (multi and single only).
    """

    def __init__(
        self, model: FusedCNN, nodes: Sequence[NodeData], per_round: int, local: LocalTraining,
        seed: int = 0, strategy: Strategy | None = None, lambda_mu: float = 0.0,
    ) -> None:
        if not 1 <= per_round <= len(nodes):
            raise ValueError(f"per_round must be between 1 and {len(nodes)}")
        self.model, self.nodes, self.per_round, self.local, self.seed = model, list(nodes), per_round, local, seed
        self.strategy = strategy or FedAvg()
        fusion = model.fusion
        self.lambda_average = LambdaMovingAverage(fusion, lambda_mu) if lambda_mu > 0 and isinstance(fusion, LambdaFusion) else None

    def choose(self, t: int) -> list[int]:
        return sorted(np.random.default_rng([self.seed, t]).choice(len(self.nodes), self.per_round, replace=False).tolist())

    def round(self, t: int) -> dict[str, Any]:
        self.model.refresh_global()
        chosen = self.choose(t)
        settings = replace(self.local, lr=self.local.lr_at(t))

        def updates() -> Iterator[ClientUpdate]:
            # A generator, so the strategy sees one node's model at a time, as the server streams them.
            for i in chosen:
                local = copy.deepcopy(self.model)
                loss = train_fused_node(local, self.nodes[i], settings, generator(self.seed, t, i))
                yield ClientUpdate(trainable_state(local), n_samples=len(self.nodes[i][1]), metrics={"loss": loss},
                                   client_id=str(i), kind="full")

        result = self.strategy.aggregate_train(t, trainable_state(self.model), updates())
        load_trainable(self.model, result.weights)
        record: dict[str, Any] = {"round": t, "nodes": chosen, "train_loss": result.metrics.get("loss"), "lr": settings.lr}
        if self.lambda_average is not None:
            record["lambda_mean_averaged"] = float(self.lambda_average.fusion.lam.detach().mean())  # FedAvg's λ, before smoothing
            self.lambda_average.update_()
        return record


def fit_new_node(model: FusedCNN, train: NodeData, test: NodeData, local: LocalTraining, epochs: int, seed: int) -> list[float]:
    """A node that joins after training: it downloads the model (E_g := E_l) and fits alone.

    Returns its test accuracy before training and after each local epoch, every epoch at ``local.lr``.
    """
    node = refreshed(model)
    one_epoch = replace(local, epochs=1)
    curve = [accuracy(node, test)]
    for epoch in range(1, epochs + 1):
        train_fused_node(node, train, one_epoch, generator(seed, 0, 1_000_000 + epoch))  # round 0 never trains: no clash with rounds
        curve.append(accuracy(node, test))
    return curve
