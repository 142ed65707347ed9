"""Choose a backbone's crop geometry by LFW verification on folds that are not the test set.

Each candidate maps the ArcFace template into the backbone's crop with a scale about the centre
and an upward shift (`scaled_arcface`). The detections come from the 112x112 cache and each photo
is decoded once, so a candidate costs one warp and one embedding per photo. Candidates are ranked by View-2 pairs
accuracy (balanced over people), then by TAR@FAR=1e-3 over all pairs of the folds' people (which
a few people with hundreds of photos dominate). Refuses LFW folds 6-10: those are
the test set, and a crop chosen on them would leak it into every figure measured there.
"""
from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from facecore.align.cache import STATUS_FALLBACK, STATUS_OK, AlignedFaceCache
from facecore.align.geometry import ARCFACE_112, FaceGeometry, scaled_arcface
from facecore.align.photos import load_rgb
from facecore.align.pipeline import AlignedSet, FaceAligner, default_cache, file_key
from facecore.errors import FaceCoreError
from facecore.eval.lfw import evaluate, load_lfw_faces, refuse_test_folds
from facecore.models.preprocess import embed_faces


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


class _Rewarper:
    """`align_paths` over photos decoded once, warped to whichever geometry is being scored."""

    def __init__(self, detections: AlignedFaceCache) -> None:
        self.detections = detections
        self.geometry = ARCFACE_112
        self._photos: dict[Path, tuple[str, np.ndarray | None, np.ndarray | None]] = {}

    def align_paths(self, paths: Sequence[Path], allow_fallback: bool = True, desc: str = "") -> AlignedSet:
        missing = {Path(p): file_key(Path(p)) for p in paths if Path(p) not in self._photos}
        known = self.detections.lookup(list(missing.values()))
        for path, key in tqdm(missing.items(), desc=f"decoding {desc.removeprefix('aligning ')}", unit="img", disable=not missing):
            entry = known.get(key)
            if entry is None:
                raise FaceCoreError(f"{path} has no detection in {self.detections.folder}: run `fedface eval lfw` on these folds first")
            landmarks = np.asarray(entry.landmarks) if entry.landmarks else None
            self._photos[path] = (entry.status, load_rgb(path) if landmarks is not None else None, landmarks)
        usable = {STATUS_OK, STATUS_FALLBACK} if allow_fallback else {STATUS_OK}
        statuses = tuple(self._photos[Path(p)][0] for p in paths)
        kept = np.array([i for i, s in enumerate(statuses) if s in usable], dtype=np.int64)
        warper = FaceAligner(geometry=self.geometry)

        def warped(path: Path) -> np.ndarray:
            _, image, landmarks = self._photos[path]
            assert image is not None and landmarks is not None  # a usable photo has landmarks, so it was decoded
            return warper.warp(image, landmarks)

        faces = np.stack([warped(Path(paths[i])) for i in kept]) if len(kept) else np.zeros((0, *self.geometry.row_shape), np.uint8)
        return AlignedSet(tuple(Path(p) for p in paths), statuses, faces, kept)


def search_geometry(
    model: torch.nn.Module, lfw_root: Path, folds: Sequence[int], scales: Sequence[float], shifts: Sequence[float],
    detections: AlignedFaceCache | None = None,
) -> list[GeometryScore]:
    """Score every (scale, shift) on `folds`; best first. Needs the folds' detections in the 112 cache."""
    refuse_test_folds(list(folds), "a crop")
    size = int(getattr(model, "input_size", ARCFACE_112.size))
    rewarper = _Rewarper(detections or default_cache(ARCFACE_112))
    scores: list[GeometryScore] = []
    for scale in scales:
        for shift in shifts:
            rewarper.geometry = geometry = scaled_arcface(size, scale, shift)
            data = load_lfw_faces(lfw_root, tuple(folds), aligner=rewarper)  # type: ignore[arg-type]
            report = evaluate(data, lambda faces: embed_faces(model, faces)).report
            scores.append(GeometryScore(
                geometry, scale, shift, report.accuracy, report.accuracy_std, report.tar_at_far["1e-3"], report.tar_at_far.get("1e-4"),
            ))
            print(f"scale {scale:g} up {shift:g}: accuracy {100 * report.accuracy:.2f}%, TAR@1e-3 {100 * report.tar_at_far['1e-3']:.2f}%",
                  file=sys.stderr, flush=True)
    return sorted(scores, key=lambda s: (s.accuracy, s.tar_1e3), reverse=True)
