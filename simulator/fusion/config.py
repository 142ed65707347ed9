"""Validated settings of one FedFusion simulation."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from facecore.errors import FaceCoreError
from facecore.fusion import FUSIONS

PARTITIONS = ("pathological", "user-specific", "iid")


class FusionInputError(FaceCoreError, ValueError):
    """A setting or data file the user can fix (one line at the CLI, a ValueError to library callers)."""


@dataclass(frozen=True)
class FusionConfig:
    partition: str = "pathological"
    fusion: str = "multi"
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
        )
        problems = [message for message, bad in checks if bad]
        if problems:
            raise FusionInputError("; ".join(problems))

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
