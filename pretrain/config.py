"""Pretraining hyper-parameters, validated once at construction."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any


@dataclass(frozen=True)
class PretrainConfig:
    backbone: str = "mobilefacenet"
    embedding_dim: int | None = None  # None: the backbone's default
    loss: str = "cosface"
    scale: float | None = None  # margin-softmax s; None: the loss's default (64)
    margin: float | None = None  # None: the loss's default (CosFace 0.35, ArcFace 0.5)
    epochs: int = 20
    batch: int = 128
    lr: float = 0.1
    momentum: float = 0.9
    optimizer: str = "sgd"  # or "adamw": per-weight step sizes, for a network whose layers' gradients differ in scale by orders
    weight_decay: float = 5e-4
    warmup_epochs: float = 1.0
    schedule: str = "cosine"  # or "step": x0.1 at 60% and 85% of training
    seed: int = 0
    workers: int = 1
    compile: bool = False
    device: str = "cpu"
    role: str = "public"  # the split role trained on; "devices" for the centralized upper bound
    eval_every: int = 5  # epochs between LFW checks (0: only at the end)
    max_steps_per_epoch: int | None = None  # caps an epoch, for smoke tests

    def __post_init__(self) -> None:
        checks = {
            "epochs must be >= 1": self.epochs >= 1,
            "batch must be >= 2": self.batch >= 2,
            "lr must be > 0": self.lr > 0,
            "momentum must be in [0, 1)": 0 <= self.momentum < 1,
            "optimizer must be sgd or adamw": self.optimizer in ("sgd", "adamw"),
            "weight_decay must be >= 0": self.weight_decay >= 0,
            "warmup_epochs must be >= 0": self.warmup_epochs >= 0,
            "schedule must be cosine or step": self.schedule in ("cosine", "step"),
            "loss must be cosface or arcface": self.loss in ("cosface", "arcface"),
            "scale must be > 0": self.scale is None or self.scale > 0,
            "workers must be >= 0": self.workers >= 0,
            "role must be public or devices": self.role in ("public", "devices"),
            "eval_every must be >= 0": self.eval_every >= 0,
        }
        failed = [message for message, ok in checks.items() if not ok]
        if failed:
            raise ValueError("; ".join(failed))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    # What must match for --resume to continue the same run.
    def resume_key(self) -> dict[str, Any]:
        keys = ("backbone", "embedding_dim", "loss", "scale", "margin", "batch", "seed", "role", "schedule", "epochs", "optimizer")
        return {k: v for k, v in asdict(self).items() if k in keys}
