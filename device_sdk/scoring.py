"""Score photos against a template: detect, align, embed in batches, compare, judge at one threshold.

Invariants:
- A photo is cropped as enrollment crops it: the five landmarks of the detector enrollment's `FaceAligner`
  loads (`facecore.align.detectors.load_detector()`: the default, or $FEDFACE_DETECTOR; never a name fixed
  here) warped by `warp_to_template` onto the model's `FaceGeometry`, the warp `FaceAligner.warp` uses.
- Every photo gets a result, in input order: a score, or why it has none (NOT_AN_IMAGE, NO_FACE).
- This module decides nothing: which model, template and threshold to use is device_sdk.verify's choice.
- Imports numpy, PIL and onnxruntime's detector, never torch (device_sdk.verify's rule).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from facecore.align.detectors import FaceDetector, load_detector
from facecore.align.geometry import FaceGeometry
from facecore.align.photos import load_rgb
from facecore.align.template import warp_to_template

NOT_AN_IMAGE = "not an image"
NO_FACE = "no face found"


class Embedder(Protocol):
    def embed(self, faces: np.ndarray) -> np.ndarray:
        """(N, S, S, 3) uint8 aligned faces -> (N, D) embeddings."""


@dataclass(frozen=True)
class Threshold:
    value: float
    source: str  # "server", "personal" or "given"
    # Its false-accept rate: for the server's, the one it was calibrated for; for the personal
    # verifier's, the one measured on its calibration impostors; None for a given threshold.
    far: float | None = None
    detail: str | None = None  # how it was calibrated


@dataclass(frozen=True)
class PhotoResult:
    photo: str
    score: float | None
    match: bool | None
    problem: str | None = None  # NOT_AN_IMAGE or NO_FACE when there is no score

    def to_json(self) -> dict[str, Any]:
        return {"photo": self.photo, "score": self.score, "match": self.match, "problem": self.problem}


class PhotoVerifier:
    """Detect, align, embed (in batches) and compare with the owner's template. `detector`: one loaded
    already, else `load` loads one at the first photo. `offline`: the model is the one last seen, the
    server being unreachable."""

    def __init__(self, embedder: Embedder, template: np.ndarray, geometry: FaceGeometry, threshold: Threshold,
                 model_version: str, detector: FaceDetector | None = None, batch: int = 16, offline: bool = False,
                 load: Callable[[], FaceDetector] = load_detector) -> None:
        template = np.asarray(template, np.float32)
        self.embedder, self.geometry, self.threshold, self.batch = embedder, geometry, threshold, batch
        self.model_version, self.offline = model_version, offline
        self.template = template / np.linalg.norm(template)
        self._detector, self._load = detector, load

    @property
    def detector(self) -> FaceDetector:
        if self._detector is None:
            self._detector = self._load()
        return self._detector

    def align(self, image: np.ndarray) -> np.ndarray | None:
        (found,) = self.detector.detect([image])
        if found is None:
            return None
        return warp_to_template(image, found.landmarks, self.geometry.size, self.geometry.points)[0]

    def scores(self, faces: np.ndarray) -> np.ndarray:
        features = self.embedder.embed(faces)
        return (features / np.linalg.norm(features, axis=1, keepdims=True)) @ self.template

    def verify(self, photos: Sequence[str | Path]) -> list[PhotoResult]:
        results: list[PhotoResult | None] = [None] * len(photos)
        pending: list[tuple[int, np.ndarray]] = []
        for index, photo in enumerate(photos):
            image = load_rgb(Path(photo))
            face = self.align(image) if image is not None else None
            if face is None:
                results[index] = PhotoResult(str(photo), None, None, NOT_AN_IMAGE if image is None else NO_FACE)
            else:
                pending.append((index, face))
            if len(pending) == self.batch or (index == len(photos) - 1 and pending):
                for (at, _), score in zip(pending, self.scores(np.stack([f for _, f in pending]))):
                    results[at] = PhotoResult(str(photos[at]), float(score), bool(score >= self.threshold.value))
                pending = []
        return [r for r in results if r is not None]


__all__ = ["NOT_AN_IMAGE", "NO_FACE", "Embedder", "PhotoResult", "PhotoVerifier", "Threshold"]
