"""Distillation hyper-parameters: PretrainConfig plus the teacher, the views and the loss weights.

Invariant: every field that changes what a step computes is in `resume_key`, so --resume refuses
to continue a run with another recipe.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from facecore.models.dlib_cut import DEPTHS
from pretrain.config import PretrainConfig
from pretrain.distill_views import ViewJitter


@dataclass(frozen=True)
class DistillConfig(PretrainConfig):
    teacher: str = "default"
    init: str = "mobile"  # 'mobile', 'random', a backbone file, or 'cut': the teacher itself, cut to `width` and `depth`
    width: float = 0.5  # init 'cut': the fraction of the teacher's channels kept
    depth: str = "full"  # init 'cut': 'full' keeps every block, 'short' drops one identity block per stage, 'short-last' the last stage's
    inner_width: float | None = None  # init 'cut': the fraction of each block's inner channels kept (`width` when None)
    cut_by: str = "energy"  # init 'cut': how the kept channels are chosen (pretrain.teacher_cut.CRITERIA)
    views: int = 8
    view_seed: int = 0
    rotation_deg: float = 10.0
    jitter_scale: float = 0.08
    shift_px: float = 4.0
    flip: bool = True
    mix: float = 0.0  # the chance that a cached jittered view blends two photos (pretrain.distill_views.ViewJitter.mix)
    colour_jitter: float = 0.2  # brightness and contrast factors in 1 ± this, per face, on the fly
    distill_weight: float = 1.0  # cosine distance to the teacher embedding
    centered: bool = False  # measure that distance about the teacher's mean embedding (distill_loss.centered_cosine_distance)
    relational_weight: float = 0.0  # batch cosine-matrix match
    cosface_weight: float = 0.0  # CosFace on the public labels
    stage_weight: float = 0.0  # init 'cut': its stream at each stage end against the teacher's there (distill_loss.stage_loss)
    rotate_teacher: bool = True  # turn the teacher's space onto the init student's (orthogonal Procrustes)

    def __post_init__(self) -> None:
        super().__post_init__()
        checks = {
            "views must be >= 1": self.views >= 1,
            "loss weights must be >= 0": min(self.distill_weight, self.relational_weight, self.cosface_weight, self.stage_weight) >= 0,
            "at least one loss weight must be > 0": max(self.distill_weight, self.relational_weight, self.cosface_weight) > 0,
            "colour_jitter must be in [0, 1)": 0 <= self.colour_jitter < 1,
            "distillation trains on the public role only": self.role == "public",
            "width must be in (0, 1]": 0 < self.width <= 1,
            "inner_width must be in (0, 1]": self.inner_width is None or 0 < self.inner_width <= 1,
            f"depth must be one of {', '.join(DEPTHS)}": self.depth in DEPTHS,
            "cut_by must be energy or l1": self.cut_by in ("energy", "l1"),
            "mix must be in [0, 1]": 0 <= self.mix <= 1,
            "a blend of two photos has no label: mix needs cosface_weight 0": self.mix == 0 or self.cosface_weight == 0,
            "stage matching needs a student cut from the teacher (init 'cut')": self.stage_weight == 0 or self.init == "cut",
            "stage matching reads the student's blocks through hooks, which a compiled model skips": self.stage_weight == 0 or not self.compile,
        }
        failed = [message for message, ok in checks.items() if not ok]
        if failed:
            raise ValueError("; ".join(failed))

    @property
    def jitter(self) -> ViewJitter:
        return ViewJitter(self.rotation_deg, self.jitter_scale, self.shift_px, self.flip, self.mix)

    def resume_key(self) -> dict[str, Any]:
        same = set(asdict(self)) - set(asdict(PretrainConfig())) | {"lr", "warmup_epochs", "weight_decay", "momentum"}
        return {**super().resume_key(), **{k: v for k, v in asdict(self).items() if k in same}}
