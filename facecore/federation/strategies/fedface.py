"""FedFace (Aggarwal, Zhou & Jain, IJCB 2021): any backbone step, then spreadout on the matrix of
every enrolled identity's class embedding so identities stay apart.

Invariants: the spreadout stage is the outermost of a chain. It passes the backbone step through
untouched and changes only the class embeddings, which no other stage reads.
"""
from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import asdict

import numpy as np

from facecore.federation.strategies.base import AggregateResult, ClientUpdate, Strategy, Wrapper
from facecore.federation.strategies.fedavg import FedAvg
from facecore.spreadout import SpreadoutConfig


class FedFace(Wrapper):
    """The spreadout stage around ``inner``, the backbone step (FedAvg by samples when None)."""

    name = "spreadout"

    def __init__(self, inner: Strategy | None = None, spreadout: SpreadoutConfig | None = None) -> None:
        super().__init__(inner if inner is not None else FedAvg())
        self.spreadout = spreadout or SpreadoutConfig()

    @property
    def backbone(self) -> Strategy:
        """The backbone step: what FedFace runs on the network's weights."""
        return self.inner

    def aggregate_train(self, server_round: int, base: Mapping[str, np.ndarray], results: Iterable[ClientUpdate]) -> AggregateResult:
        return self.inner.aggregate_train(server_round, base, results)

    def aggregate_embeddings(self, W: np.ndarray, config: SpreadoutConfig | None = None) -> np.ndarray:
        """``spreadout_optimize`` on ``W`` (C, D); rows are returned un-normalised, like the core does."""
        import torch  # here, not at the top: a process that only sums updates builds this chain without torch

        from facecore.losses import spreadout_optimize

        W = np.asarray(W, dtype=np.float32)
        if W.ndim != 2:
            raise ValueError(f"W must be (C, D), got shape {W.shape}")
        cfg = config or self.spreadout
        return spreadout_optimize(torch.from_numpy(W.copy()), **asdict(cfg)).numpy()
