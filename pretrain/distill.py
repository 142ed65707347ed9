"""Distillation pretraining: the compact student learns the teacher's embeddings of cached views.

Invariants:
* The training loop, checkpoints and exact resume are the Pretrainer's (pretrain/trainer.py); this
  class only changes what a batch is and what its loss is.
* An epoch is one pass over the photos: each photo contributes ONE of its K cached views, drawn
  with the photo order from the generator seeded by (seed, epoch), so a resumed run replays the
  same views in the same order. Colour jitter draws from the torch RNG saved in the checkpoint.
* The teacher's embeddings may be turned by a fixed orthogonal matrix (`rotation`, saved in the
  checkpoint) onto the init student's space: cosines between faces, hence verification, are unchanged.
* `best.pt` is the epoch with the highest monitored accuracy (LFW folds 1-5, never the test folds);
  `backbone.pt` is the last epoch.
"""
from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import cast

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from facecore.align.geometry import ARCFACE_112, FaceGeometry
from facecore.eval.metrics import all_pairs_scores, threshold_at_far
from facecore.models.checkpoint import save_backbone
from facecore.models.preprocess import PIXEL_MEAN, PIXEL_STD, embed_faces
from pretrain.distill_config import DistillConfig
from pretrain.distill_loss import centered_cosine_distance, cosine_distance, relational_loss, stage_loss
from pretrain.distill_views import ViewCache
from pretrain.teacher_cut import StageTeacher
from pretrain.trainer import EvalFn, Pretrainer

MONITOR_KEY = "lfw_1_5_accuracy"
UNSEEN_KEY = "lfw_1_5_unseen_people_tar_1e-3"


@dataclass(frozen=True)
class DistillData:
    """Cached views of labelled photos; row i of `labels` is photo i of `cache`."""

    cache: ViewCache
    labels: np.ndarray  # (N,) int64 into classes
    classes: tuple[str, ...]

    def __len__(self) -> int:
        return len(self.labels)

    def first_views(self) -> np.ndarray:
        """View 0 (unjittered, unmirrored) of every photo, (N, s, s, 3) uint8."""
        return np.ascontiguousarray(self.cache.student[:: self.cache.views])


class ViewRows(Dataset[tuple[torch.Tensor, torch.Tensor, int]]):
    def __init__(self, student: np.ndarray, targets: torch.Tensor, labels: np.ndarray, views: int) -> None:
        self.student, self.targets, self.labels, self.views = student, targets, labels, views

    def __len__(self) -> int:
        return len(self.targets)

    def __getitem__(self, row: int) -> tuple[torch.Tensor, torch.Tensor, int]:
        return torch.from_numpy(np.array(self.student[row])), self.targets[row], int(self.labels[row // self.views])


class Distiller(Pretrainer):
    config: DistillConfig
    data: DistillData  # type: ignore[assignment]

    def __init__(
        self, config: DistillConfig, data: DistillData, out_dir: str | Path, evaluate: EvalFn | None = None,
        init_state: dict[str, torch.Tensor] | None = None, init_head: torch.Tensor | None = None,
        rotation: np.ndarray | None = None, stages: StageTeacher | None = None,
    ) -> None:
        super().__init__(config, data, out_dir, evaluate=evaluate, init_state=init_state, init_head=init_head)  # type: ignore[arg-type]
        dim = data.cache.teacher.shape[1]
        self._set_rotation(np.eye(dim, dtype=np.float32) if rotation is None else rotation)
        if (stages is None) != (config.stage_weight == 0):
            raise ValueError("a stage weight needs the teacher's stages, and the teacher's stages need a stage weight")
        self.stages = stages
        self._stage_maps: dict[int, torch.Tensor] = {}  # the student's stream at each stage end, from its last forward pass
        if stages is not None:
            blocks = cast(torch.nn.Sequential, self.model.blocks)
            for end in stages.ends:
                blocks[end.student_block].register_forward_hook(partial(_keep_output, self._stage_maps, end.student_block))

    def _set_rotation(self, rotation: np.ndarray) -> None:
        self.rotation = np.asarray(rotation, dtype=np.float32)
        self.targets = torch.from_numpy(np.asarray(self.data.cache.teacher) @ self.rotation.T)
        self.center = self.targets.mean(0).to(self.device)  # of the unit targets, not renormalised: centred targets average zero

    def _extra_state(self) -> dict[str, object]:
        return {"teacher_rotation": torch.from_numpy(self.rotation), "view_cache": self.data.cache.folder.name}

    def _load_extra_state(self, state: dict[str, object]) -> None:
        self._set_rotation(cast(torch.Tensor, state["teacher_rotation"]).cpu().numpy())  # _extra_state stored a tensor

    def _loader(self, epoch: int) -> DataLoader:  # type: ignore[type-arg]
        generator = torch.Generator().manual_seed(self.config.seed * 100_003 + epoch)
        n, views = len(self.data), self.data.cache.views
        order = torch.randperm(n, generator=generator)
        view = torch.randint(views, (n,), generator=generator)
        rows = (order * views + view[order]).tolist()
        return DataLoader(
            ViewRows(self.data.cache.student, self.targets, self.data.labels, views),
            batch_size=self.config.batch, sampler=rows, drop_last=True, num_workers=self.config.workers,
        )

    def _colour(self, x: torch.Tensor) -> torch.Tensor:
        """Per-face brightness and contrast in 1 ± colour_jitter on (B,3,H,W) floats in [0, 255]."""
        amount = self.config.colour_jitter
        brightness = 1 + amount * (2 * torch.rand(len(x), 1, 1, 1) - 1)
        contrast = 1 + amount * (2 * torch.rand(len(x), 1, 1, 1) - 1)
        mean = x.mean(dim=(1, 2, 3), keepdim=True)
        return (((x - mean) * contrast.to(x) + mean) * brightness.to(x)).clamp_(0, 255)

    def _batch_loss(self, batch: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, int]:
        faces, targets, labels = (t.to(self.device) for t in batch)
        x = faces.permute(0, 3, 1, 2).float()
        if self.config.colour_jitter > 0:
            x = self._colour(x)
        x = x.sub_(PIXEL_MEAN).div_(PIXEL_STD).contiguous(memory_format=torch.channels_last)
        embeddings = self._forward(x).float()
        c = self.config
        loss = embeddings.new_zeros(())
        if c.distill_weight:
            distance = centered_cosine_distance(embeddings, targets, self.center) if c.centered else cosine_distance(embeddings, targets)
            loss = loss + c.distill_weight * distance
        if c.relational_weight:
            loss = loss + c.relational_weight * relational_loss(embeddings, targets)
        if c.cosface_weight:
            loss = loss + c.cosface_weight * self.head(embeddings, labels)
        if self.stages is not None:
            student_maps = [self._stage_maps[end.student_block].float() for end in self.stages.ends]
            loss = loss + c.stage_weight * stage_loss(student_maps, [m.float() for m in self.stages.maps(x)])
        return loss, len(labels)

    def _on_record(self, record: dict[str, float]) -> None:
        if MONITOR_KEY not in record:
            return
        earlier = [h[MONITOR_KEY] for h in self.history[:-1] if MONITOR_KEY in h]
        if not earlier or record[MONITOR_KEY] > max(earlier):
            meta = {"config": self.config.to_dict(), "epoch": self.epoch, "selected_by": MONITOR_KEY, "record": record}
            save_backbone(self.model, self.out / "best.pt", meta=meta)


def _keep_output(store: dict[int, torch.Tensor], key: int, _module: torch.nn.Module, _inputs: object, output: torch.Tensor) -> None:
    store[key] = output


def init_targets(
    model: torch.nn.Module, data: DistillData, rotate: bool, embeddings: np.ndarray | None = None
) -> tuple[np.ndarray | None, torch.Tensor, dict[str, float]]:
    """From the init student's embeddings of view 0: the Procrustes rotation of the teacher's space
    onto the student's (None unless `rotate`), each class's mean embedding (a CosFace head start),
    and the init's mean cosine distance to the raw and to the rotated teacher embeddings.
    `embeddings`: the model's embeddings of `data.first_views()` when already known."""
    from pretrain.distill_loss import procrustes_rotation

    if embeddings is None:
        embeddings = embed_faces(model, data.first_views())
    teacher = np.asarray(data.cache.teacher[:: data.cache.views])
    turn = procrustes_rotation(embeddings, teacher) if teacher.shape[1] == embeddings.shape[1] else None
    distances = {"init_distance_raw": float(np.mean(1 - np.sum(embeddings * teacher, 1))) if turn is not None else float("nan")}
    if turn is not None:
        distances["init_distance_rotated"] = float(np.mean(1 - np.sum(embeddings * (teacher @ turn.T), 1)))
    rotation = turn if rotate else None
    means = np.zeros((len(data.classes), embeddings.shape[1]), np.float32)
    np.add.at(means, data.labels, embeddings)
    means /= np.maximum(np.linalg.norm(means, axis=1, keepdims=True), 1e-12)
    return rotation, torch.from_numpy(means), distances


def lfw_folds_monitor(
    root: Path, folds: tuple[int, ...] = (1, 2, 3, 4, 5), geometry: FaceGeometry = ARCFACE_112, trained_on: Collection[str] = (),
) -> EvalFn:
    """Pairs accuracy and all-pairs TAR@FAR1e-3 on LFW `folds` (1-5: the choosing folds, never 6-10),
    and with `trained_on` (the identities the student learned from) the same TAR on the folds' other
    people, each person's genuine pairs counted as one (`unseen_people_tar`)."""
    from facecore.align.pipeline import FaceAligner
    from facecore.eval.lfw import evaluate, load_lfw_faces

    if set(folds) & {6, 7, 8, 9, 10}:
        raise ValueError(f"the monitor chooses checkpoints: it must not see the test folds 6-10, got {folds}")
    data = load_lfw_faces(root / "lfw", folds, aligner=FaceAligner(geometry=geometry))
    unseen = ~np.isin(data.identities, list(trained_on)) if trained_on else None

    def monitor(model: torch.nn.Module) -> dict[str, float]:
        embeddings = embed_faces(model, data.faces)  # once: the unseen people's faces are rows of the same array
        report = evaluate(data, lambda faces: embeddings).report
        found = {MONITOR_KEY: report.accuracy, "lfw_1_5_tar_1e-3": report.tar_at_far["1e-3"], "lfw_1_5_auc": report.auc}
        if unseen is not None:
            found[UNSEEN_KEY] = unseen_people_tar(embeddings[unseen], data.identities[unseen])
        return found

    return monitor


def unseen_people_tar(embeddings: np.ndarray, identities: np.ndarray, far: float = 1e-3) -> float:
    """TAR (a fraction, as the monitor's other figures) at the threshold where `far` of all impostor pairs
    score above it, as the mean over people of each one's genuine accept rate: one person with many
    photos would otherwise hold most pairs."""
    x = embeddings / np.linalg.norm(embeddings, axis=1, keepdims=True)
    _, impostor = all_pairs_scores(x, identities)
    threshold = threshold_at_far(impostor, far)
    rates = []
    for person in np.unique(identities):
        own = x[identities == person]
        if len(own) > 1:
            genuine = (own @ own.T)[np.triu_indices(len(own), 1)]
            rates.append(float((genuine > threshold).mean()))  # strictly above, as facecore.eval.metrics counts
    return float(np.mean(rates))
