"""Choose a backbone's crop geometry by LFW verification on folds that are not the test set.

Each candidate maps the ArcFace template into the backbone's crop with a scale about the centre
and an upward shift (`scaled_arcface`). The detections come from the 112x112 cache, so a
candidate costs one warp and one embedding per photo. Candidates are ranked by TAR@FAR=1e-3 over
all pairs of the chosen folds' people, then by pairs accuracy. Refuses LFW folds 6-10: those are
the test set, and a crop chosen on them would leak it into every figure measured there.
"""
from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from facecore.align.cache import AlignedFaceCache
from facecore.align.geometry import ARCFACE_112, FaceGeometry, scaled_arcface
from facecore.align.pipeline import FaceAligner, default_cache
from facecore.errors import FaceCoreError
from facecore.eval.lfw import evaluate, load_lfw_faces
from facecore.models.preprocess import embed_faces

TEST_FOLDS = frozenset({6, 7, 8, 9, 10})


@dataclass(frozen=True)
class GeometryScore:
    geometry: FaceGeometry
    scale: float
    shift_y: float
    accuracy: float
    accuracy_std: float
    tar_1e3: float
    tar_1e4: float | None

    def row(self) -> dict[str, float | str | None]:
        return {
            "key": self.geometry.key, "scale": self.scale, "shift_y": self.shift_y, "accuracy": round(self.accuracy, 5),
            "accuracy_std": round(self.accuracy_std, 5), "tar_at_far_1e-3": round(self.tar_1e3, 5),
            "tar_at_far_1e-4": None if self.tar_1e4 is None else round(self.tar_1e4, 5),
        }


def search_geometry(
    model: torch.nn.Module, lfw_root: Path, folds: Sequence[int], scales: Sequence[float], shifts: Sequence[float],
    detections: AlignedFaceCache | None = None,
) -> list[GeometryScore]:
    """Score every (scale, shift) on `folds`; best first."""
    if TEST_FOLDS & set(folds):
        raise FaceCoreError(f"folds {sorted(TEST_FOLDS & set(folds))} are the test set: choose a crop on folds 1-5")
    size = int(getattr(model, "input_size", ARCFACE_112.size))
    source = detections or default_cache(ARCFACE_112)
    scores: list[GeometryScore] = []
    for scale in scales:
        for shift in shifts:
            geometry = scaled_arcface(size, scale, shift)
            with tempfile.TemporaryDirectory(prefix="fedface-geometry-") as scratch:
                aligner = FaceAligner(AlignedFaceCache(scratch, size), geometry=geometry, landmark_source=source)
                data = load_lfw_faces(lfw_root, tuple(folds), aligner=aligner)
                report = evaluate(data, lambda faces: embed_faces(model, faces)).report
            scores.append(GeometryScore(
                geometry, scale, shift, report.accuracy, report.accuracy_std, report.tar_at_far["1e-3"], report.tar_at_far.get("1e-4"),
            ))
            print(f"scale {scale:g} up {shift:g}: accuracy {100 * report.accuracy:.2f}%, TAR@1e-3 {100 * report.tar_at_far["1e-3"]:.2f}%", flush=True)
    return sorted(scores, key=lambda s: (s.tar_1e3, s.accuracy), reverse=True)
