"""The face detectors, by name, behind one contract: RGB uint8 photos in, the best face of each out.

Invariants:
- Every detector gives a `Detection` (box, score, five landmarks: the eye on the image's left, the
  other eye, the nose tip, the mouth corner on the image's left, the other) and feeds the same
  similarity warp, so a crop differs between detectors only by where their landmarks fall.
- Loading one imports onnxruntime and numpy, never torch: the files are made once by
  `fedface models fetch` and each is checked against the sha256 its manifest records.
- `version` names the detector's nets and settings; the aligned-face cache is keyed by it, so a
  crop made by one detector is never read back as another's.
- `tinyface`, the default, looks at each photo at 128 px; what it misses there it looks at again at
  160 px, bare and then inside the borders below, and what it still misses goes to MTCNN
  (`ThenOnMisses`): a few in a thousand in-the-wild photos, which MTCNN's slower cascade finds more
  often than not.
- A miss is retried on the photo inside a black border, at two widths (`TightCropRetry`): photos
  cropped tightly to the face (ID photos, many face data sets) show a face larger than a detector
  trained on whole scenes looks for. The retry's landmarks are mapped back to the photo's own
  pixels; the warp fills what lies outside the photo with black too, as the retry saw it.
  (Borders chosen on LFW folds 1-5 and CelebA photos cut to MTCNN's box: black beat edge-replicated
  and mean-coloured ones; README "Face detection" has the figures.)
"""
from __future__ import annotations

import os
from collections.abc import Callable
from typing import Protocol

import numpy as np

from facecore.align.detector import Detection
from facecore.errors import FaceCoreError

DETECTOR_ENV = "FEDFACE_DETECTOR"
DEFAULT_DETECTOR = "tinyface"
DETECTORS = ("tinyface", "mtcnn")
DETECTOR_HELP = (f"face detector: tinyface (face-api.js's TinyFaceDetector for the box, MTCNN's points; MTCNN for what it "
                 f"misses) or mtcnn (facenet-pytorch's); default ${DETECTOR_ENV} else {DEFAULT_DETECTOR}")


class FaceDetector(Protocol):
    name: str
    version: str

    def detect(self, images: list[np.ndarray]) -> list[Detection | None]:
        """The best face of each RGB uint8 image, or None, in input order."""


class UnknownDetector(FaceCoreError):
    """A detector name that is not one of DETECTORS."""


def detector_name(name: str | None = None) -> str:
    """`name`, else $FEDFACE_DETECTOR, else the default; refused in one line when unknown."""
    chosen = name or os.environ.get(DETECTOR_ENV) or DEFAULT_DETECTOR
    if chosen not in DETECTORS:
        raise UnknownDetector(f"unknown face detector {chosen!r}: choose one of {', '.join(DETECTORS)}")
    return chosen


def detector_version(name: str | None = None) -> str:
    """The cache key part of a detector, known without loading it."""
    from facecore.align.onnx_detector import MTCNN_VERSION
    from facecore.align.tiny_detector import RETRY_TINYFACE_VERSION, TINYFACE_VERSION

    if detector_name(name) == "mtcnn":
        return f"{MTCNN_VERSION}-{RETRY_KEY}"
    return f"{TINYFACE_VERSION}-then-{RETRY_TINYFACE_VERSION}-{RETRY_KEY}-then-{MTCNN_VERSION}"


def load_detector(name: str | None = None, threads: int = 1) -> FaceDetector:
    """The named detector on onnxruntime, with the tight-crop retry around it; `tinyface` looks again at its
    misses at a larger size, then hands what it still misses to MTCNN."""
    from facecore.align.onnx_detector import OnnxMTCNN

    if detector_name(name) == "mtcnn":
        return TightCropRetry(OnnxMTCNN(threads=threads))
    from facecore.align.tiny_detector import RETRY_INPUT_SIZE, TinyFaceDetector

    first = TinyFaceDetector(threads=threads)
    retry = TightCropRetry(first.at_input_size(RETRY_INPUT_SIZE))
    return ThenOnMisses(ThenOnMisses(first, lambda: retry, retry.version), lambda: OnnxMTCNN(threads=threads), OnnxMTCNN.version)


class ThenOnMisses:
    """`first`, then the detector `make_second` builds (on the first miss only) for the photos `first` misses;
    `second_version` is that detector's version, known before it is built."""

    def __init__(self, first: FaceDetector, make_second: Callable[[], FaceDetector], second_version: str) -> None:
        self.first, self._make_second = first, make_second
        self._second: FaceDetector | None = None
        self.name = first.name
        self.version = f"{first.version}-then-{second_version}"

    def detect(self, images: list[np.ndarray]) -> list[Detection | None]:
        found = self.first.detect(images)
        misses = [i for i, f in enumerate(found) if f is None]
        if misses:
            self._second = self._second or self._make_second()
            for i, detection in zip(misses, self._second.detect([images[i] for i in misses])):
                found[i] = detection
        return found


# Border added on every side, as a fraction of the photo's longer side, tried in order after a miss.
RETRY_BORDERS = (0.5, 1.0)
def retry_key(borders: tuple[float, ...]) -> str:
    return "pad" + "-".join(f"{border:g}" for border in borders)


RETRY_KEY = retry_key(RETRY_BORDERS)


class TightCropRetry:
    """A detector that retries each miss on the photo inside a black border of each width in
    RETRY_BORDERS, and reports landmarks in the original photo's coordinates."""

    def __init__(self, inner: FaceDetector, borders: tuple[float, ...] = RETRY_BORDERS) -> None:
        self.inner, self.borders = inner, borders
        self.name = inner.name
        self.version = f"{inner.version}-{retry_key(borders)}"

    def detect(self, images: list[np.ndarray]) -> list[Detection | None]:
        found = self.inner.detect(images)
        for border in self.borders:
            misses = [i for i, f in enumerate(found) if f is None]
            if not misses:
                break
            padded = [pad_photo(images[i], border) for i in misses]
            for i, (_, shift), detection in zip(misses, padded, self.inner.detect([p for p, _ in padded])):
                found[i] = None if detection is None else shifted(detection, -shift)
        return found


def pad_photo(image: np.ndarray, border: float) -> tuple[np.ndarray, int]:
    """The photo inside a black border of `border` x its longer side on each side, and that width."""
    width = max(1, int(round(border * max(image.shape[:2]))))
    return np.pad(image, ((width, width), (width, width), (0, 0))), width


def shifted(detection: Detection, offset: float) -> Detection:
    return Detection(detection.box + offset, detection.score, detection.landmarks + offset)


__all__ = [
    "DEFAULT_DETECTOR", "DETECTORS", "DETECTOR_ENV", "DETECTOR_HELP", "FaceDetector", "ThenOnMisses", "TightCropRetry",
    "UnknownDetector",
    "detector_name", "detector_version", "load_detector", "pad_photo",
]
