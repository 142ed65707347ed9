"""Validated settings of one cross-silo run (defaults: Bai et al. 2021, Sec. 4.2)."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from facecore.federation.strategies.fedval import FVConfig

METHODS = ("central", "solo", "fedavg", "fedavg+fv", "pfm", "pfm+fv")
FEDERATED = ("fedavg", "fedavg+fv", "pfm", "pfm+fv")
BACKBONES = ("iresnet18", "iresnet34", "mobilefacenet", "mobilefacenet_s", "tiny")
FV_MODES = ("sync", "thread")
# Paper: lr 0.1, x0.1 at the end of epochs 10, 18 and 24 of 26; here as fractions of the rounds.
PAPER_MILESTONES = (10 / 26, 18 / 26, 24 / 26)


@dataclass(frozen=True)
class CrossSiloConfig:
    trainers: int = 3  # source silos, in order: lfw-many, lfw-few, celeba
    parties: int | None = None  # trainers after splitting each silo; None = trainers (12 = paper's 12-party)
    validators: int = 2  # 0, 1 (LFW pairs) or 2 (+ CelebA pairs)
    method: str = "pfm+fv"
    K: int = 100
    rounds: int = 10
    batch: int = 64  # per trainer and step
    lr: float = 0.1
    lr_milestones: tuple[float, ...] = PAPER_MILESTONES
    lr_decay: float = 0.1
    beta: float = 0.9
    loss: str = "arcface"
    backbone: str = "iresnet18"
    embedding_dim: int | None = None  # None: the backbone's default
    device: str = "cpu"
    seed: int = 0
    flip: bool = True  # the only augmentation: cheap, and aligned faces must stay aligned
    fv: FVConfig = field(default_factory=FVConfig)
    fv_mode: str = "thread"  # thread: asynchronous beside training; sync: one search every fv_every rounds
    fv_every: int = 1
    eval_folds: tuple[int, ...] = (6, 7, 8, 9, 10)

    def __post_init__(self) -> None:
        parties = self.n_parties
        problems = [
            message for message, bad in (
                ("trainers must be 1, 2 or 3 (the silos are lfw-many, lfw-few, celeba)", not 1 <= self.trainers <= 3),
                ("parties must be a positive multiple of trainers", parties < 1 or parties % self.trainers != 0),
                ("validators must be 0, 1 or 2", not 0 <= self.validators <= 2),
                (f"method must be one of {METHODS}", self.method not in METHODS),
                ("FV needs at least one validator and two trainers", self.uses_fv and (self.validators < 1 or parties < 2)),
                ("K must be >= 1", self.K < 1), ("rounds must be >= 1", self.rounds < 1), ("batch must be >= 2", self.batch < 2),
                ("lr must be positive and finite", not (math.isfinite(self.lr) and self.lr > 0)),
                ("lr_milestones must be fractions in (0, 1]", any(not 0 < m <= 1 for m in self.lr_milestones)),
                ("lr_decay must be in (0, 1]", not 0 < self.lr_decay <= 1),
                ("beta must be in [0, 1)", not 0 <= self.beta < 1),
                ("loss must be arcface or cosface", self.loss not in ("arcface", "cosface")),
                (f"backbone must be one of {BACKBONES}", self.backbone not in BACKBONES),
                ("device must be cpu or cuda", self.device not in ("cpu", "cuda")),
                (f"fv_mode must be one of {FV_MODES}", self.fv_mode not in FV_MODES), ("fv_every must be >= 1", self.fv_every < 1),
                ("eval_folds must be LFW folds 6-10 (folds 1-5 feed trainers and validators)",
                 any(f < 6 or f > 10 for f in self.eval_folds) or len(self.eval_folds) < 2),
            ) if bad
        ]
        if problems:
            raise ValueError("; ".join(problems))

    @property
    def n_parties(self) -> int:
        return self.trainers if self.parties is None else self.parties

    @property
    def uses_fv(self) -> bool:
        return self.method.endswith("+fv")

    @property
    def uses_pfm(self) -> bool:
        return self.method.startswith("pfm")

    @property
    def total_steps(self) -> int:
        """Local steps per trainer over the run; central and solo take this many steps too."""
        return self.rounds * self.K

    def lr_at(self, server_round: int) -> float:
        """``eta_r`` for the 1-based round: constant within a round, as Alg. 1 writes it."""
        done = (server_round - 1) / self.rounds
        return self.lr * self.lr_decay ** sum(done >= m for m in self.lr_milestones)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
