"""Aligned faces of a split role, as arrays: what training code consumes."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from facecore.align.pipeline import FaceAligner
from facecore.data.records import FaceImage


@dataclass(frozen=True)
class LabelledFaces:
    faces: np.ndarray  # (N,S,S,3) uint8 in the aligner's crop
    labels: np.ndarray  # (N,) int64 into `classes`
    classes: tuple[str, ...]  # identity names
    sources: tuple[Path, ...]  # source file of each row
    excluded: tuple[tuple[Path, str], ...]  # (file, status) of photos without a usable face

    def __len__(self) -> int:
        return len(self.labels)

    def describe(self) -> str:
        return f"{len(self.classes)} identities, {len(self)} faces ({len(self.excluded)} photos without a face excluded)"


def load_labelled_faces(images: list[FaceImage], aligner: FaceAligner | None = None, desc: str = "aligning faces") -> LabelledFaces:
    """Align (or read from the cache) and label. Photos with no detected face are excluded and
    listed, never mis-cropped into training; identities left with no face disappear from `classes`."""
    aligned = (aligner or FaceAligner()).align_paths([img.path for img in images], allow_fallback=False, desc=desc)
    kept_images = [images[k] for k in aligned.kept]
    classes = tuple(sorted({img.identity for img in kept_images}))
    index = {name: i for i, name in enumerate(classes)}
    excluded = tuple((p, s) for p, s in zip(aligned.paths, aligned.statuses) if s != "ok")
    return LabelledFaces(
        aligned.faces,
        np.array([index[img.identity] for img in kept_images], dtype=np.int64),
        classes,
        tuple(img.path for img in kept_images),
        excluded,
    )
