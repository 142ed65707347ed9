"""FedFace (Aggarwal, Zhou & Jain, IJCB 2021): FedAvg on the backbone, then spreadout
on the matrix of every enrolled identity's class embedding so identities stay apart."""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict

import numpy as np
import torch

from facecore.federation.strategies.base import AggregateResult, ClientUpdate, Strategy
from facecore.federation.strategies.fedavg import FedAvg
from facecore.losses import SpreadoutConfig, spreadout_optimize


class FedFace(FedAvg):
    """``backbone``: another strategy for the backbone step (a robust one); FedAvg when None."""

    name = "fedface"

    def __init__(self, spreadout: SpreadoutConfig | None = None, backbone: Strategy | None = None) -> None:
        self.spreadout = spreadout or SpreadoutConfig()
        self.backbone = backbone

    def aggregate_train(self, server_round: int, base: Mapping[str, np.ndarray], results: Iterable[ClientUpdate]) -> AggregateResult:
        if self.backbone is None:
            return super().aggregate_train(server_round, base, results)
        return self.backbone.aggregate_train(server_round, base, results)

    def aggregate_embeddings(self, W: np.ndarray, config: SpreadoutConfig | None = None) -> np.ndarray:
        """``spreadout_optimize`` on ``W`` (C, D); rows are returned un-normalised, like the core does."""
        W = np.asarray(W, dtype=np.float32)
        if W.ndim != 2:
            raise ValueError(f"W must be (C, D), got shape {W.shape}")
        cfg = config or self.spreadout
        return spreadout_optimize(torch.from_numpy(W.copy()), **asdict(cfg)).numpy()
