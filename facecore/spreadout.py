"""The server's spreadout settings, apart from the torch code that runs them (:func:`facecore.losses.spreadout_optimize`),
so a process that only builds an aggregation chain (an aggregation worker) does not import torch."""
from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class SpreadoutConfig:
    """Server-side spreadout optimisation settings; fields match the keyword
    arguments of :func:`spreadout_optimize` (``spreadout_optimize(W, **asdict(cfg))``)."""

    nu: float = 0.3
    steps: int = 10
    lr: float = 0.01
    momentum: float = 0.9
    center: bool = False

    def __post_init__(self) -> None:
        if not -1.0 <= self.nu <= 1.0:
            raise ValueError(f"nu is a cosine and must be in [-1, 1], got {self.nu}")
        if isinstance(self.steps, bool) or not isinstance(self.steps, int) or self.steps < 0:
            raise ValueError(f"steps must be an integer >= 0, got {self.steps!r}")
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"lr must be a positive finite number, got {self.lr}")
        if not 0.0 <= self.momentum < 1.0:
            raise ValueError(f"momentum must be in [0, 1), got {self.momentum}")
