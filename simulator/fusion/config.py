"""Validated settings of one FedFusion simulation, and the named presets (``PRESETS``)."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from facecore.errors import FaceCoreError
from facecore.fusion import FUSIONS, LAMBDA_BOUNDS

PARTITIONS = ("pathological", "user-specific", "iid")
ARCHS = ("small", "official")  # simulator.fusion.model builds them
NORMALIZATIONS = ("unit", "dataset")  # pixels to [-1, 1], or standardised by the training set's mean and std
AUGMENTATIONS = ("none", "crop-flip")  # crop-flip: the official RandomResizedCrop + RandomHorizontalFlip


class FusionInputError(FaceCoreError, ValueError):
    """A setting or data file the user can fix (one line at the CLI, a ValueError to library callers)."""


@dataclass(frozen=True)
class FusionConfig:
    partition: str = "pathological"
    # conv: the one fusion that uses E_g in the paper-setting grid, and the only one with a gain
    # beyond the seed noise there (FEDFUSION.md, "The paper-setting grid"); multi's λ stays near 0.
    fusion: str = "conv"
    nodes: int = 10
    per_round: int = 5
    rounds: int = 30
    local_epochs: int = 1
    batch: int = 32
    lr: float = 0.05
    momentum: float = 0.5
    # Images per node, drawn from the training split: small enough for a busy 2-core machine.
    per_node: int = 600
    test_size: int = 2000
    # Dirichlet concentration of the user-specific partition; 0.5 gives clearly skewed but
    # still mixed class proportions (every class kept at least once per node, see partition.py).
    alpha: float = 0.5
    target_acc: float = 0.9
    seed: int = 0
    # The late-joining node: its images (few, as a new user has), the local epochs it may spend and
    # the accuracy on its own test images it must reach; 600 images would fit in one epoch whatever the start.
    late_per_node: int = 100
    late_epochs: int = 20
    late_target: float = 0.97
    late_test: int = 500
    # What the `paper` preset changes (see PRESETS); these defaults are the CPU-sized setting.
    arch: str = "small"
    weight_decay: float = 0.0
    # Per round: `if lr > min_lr: lr *= lr_decay` (the official Agent.update_lr); 1.0 keeps lr fixed.
    lr_decay: float = 1.0
    min_lr: float = 0.0
    lambda_bound: str = "unit"  # unit: λ projected onto [0, 1]; none: unbounded (official)
    lambda_mu: float = 0.0  # the server's moving average of λ (official update_shadow, μ = 0.9); 0: none
    normalize: str = "unit"
    augment: str = "none"

    def __post_init__(self) -> None:
        checks = (
            (f"fusion must be one of {', '.join(FUSIONS)}", self.fusion not in FUSIONS),
            (f"partition must be one of {', '.join(PARTITIONS)}", self.partition not in PARTITIONS),
            ("nodes must be >= 1", self.nodes < 1),
            ("per-round must be between 1 and nodes", not 1 <= self.per_round <= self.nodes),
            ("rounds must be >= 0", self.rounds < 0),
            ("local-epochs must be >= 1", self.local_epochs < 1),
            ("batch must be >= 1", self.batch < 1),
            ("lr must be > 0", not self.lr > 0),
            ("momentum must be in [0, 1)", not 0 <= self.momentum < 1),
            ("per-node must be >= 2", self.per_node < 2),
            ("test-size must be >= 1", self.test_size < 1),
            ("alpha must be > 0", not self.alpha > 0),
            ("target-acc must be in (0, 1]", not 0 < self.target_acc <= 1),
            ("late-per-node must be >= 2", self.late_per_node < 2),
            ("late-epochs must be >= 0", self.late_epochs < 0),
            ("late-target must be in (0, 1]", not 0 < self.late_target <= 1),
            ("late-test must be >= 1", self.late_test < 1),
            (f"arch must be one of {', '.join(ARCHS)}", self.arch not in ARCHS),
            ("weight-decay must be >= 0", not self.weight_decay >= 0),
            ("lr-decay must be in (0, 1]", not 0 < self.lr_decay <= 1),
            ("min-lr must be >= 0", not self.min_lr >= 0),
            (f"lambda-bound must be one of {', '.join(LAMBDA_BOUNDS)}", self.lambda_bound not in LAMBDA_BOUNDS),
            ("lambda-mu must be in [0, 1)", not 0 <= self.lambda_mu < 1),
            (f"normalize must be one of {', '.join(NORMALIZATIONS)}", self.normalize not in NORMALIZATIONS),
            (f"augment must be one of {', '.join(AUGMENTATIONS)}", self.augment not in AUGMENTATIONS),
        )
        problems = [message for message, bad in checks if bad]
        if problems:
            raise FusionInputError("; ".join(problems))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


# `cpu`: the CPU-sized setting FEDFUSION.md's first grid used. `paper`: the official code's settings
# (thu-media/FedFusion, mnist_main.py and model/), as far as this simulator can express them;
# FEDFUSION.md lists every remaining difference. Explicit command-line flags override a preset.
PRESETS: dict[str, FusionConfig] = {
    "cpu": FusionConfig(),
    "paper": FusionConfig(
        arch="official", rounds=500, local_epochs=5, batch=64, lr=2e-3, momentum=0.9, weight_decay=5e-4,
        lr_decay=0.99, min_lr=1e-4, lambda_bound="none", lambda_mu=0.9, normalize="dataset", augment="crop-flip",
        # Official: 2 trained nodes per round. Its pathological loop gives digits {2i, 2i+1} to node i,
        # i.e. 5 two-class nodes for 10 classes. 6,000 images per node (official: all of a node's
        # classes, ~12,000): 5 nodes × 6,000 is what the Dirichlet split can still draw from MNIST.
        nodes=5, per_round=2, per_node=6000,
        # Official: all 10,000 test images; 1,000 stay outside for the late-joining node's own test set.
        test_size=9000,
    ),
}

# The fusion the paper reports best on each partition (FEDFUSION.md, "Which paper claims hold").
PAPER_BEST = {"pathological": "multi", "user-specific": "conv"}

# The paper's summary gives no accuracy target; the first of each list is a high one such a paper
# would use (no run here reaches it in 25 rounds), the others are levels this budget reaches. The
# user-specific ones were fixed from two FedAvg pilots before the runs; the pathological ones after
# the seed-0 FedAvg curves of both data sets (and one fused final) showed those partitions ending
# near 55%.
TARGETS = {
    ("mnist", "pathological"): (0.97, 0.50, 0.40, 0.30), ("mnist", "user-specific"): (0.97, 0.90, 0.80, 0.70),
    ("fashion-mnist", "pathological"): (0.85, 0.45, 0.35, 0.25), ("fashion-mnist", "user-specific"): (0.85, 0.75, 0.65, 0.55),
}
