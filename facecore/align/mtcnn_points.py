"""MTCNN's last two stages placing five landmarks in a box that another detector found.

Invariants:
- The box is squared about its centre, moved and squared again by RNet `RNET_PASSES` times (each
  pass as MTCNN's refine stage: a 24 x 24 crop, `bbreg`, `rerec`), then ONet places the five points
  in a 48 x 48 crop as MTCNN's output stage does. The nets' scores are not used: the box's detector
  has already decided that a face is there.
- The landmarks therefore fall where MTCNN's would on the same face, at the cost of two tiny nets
  instead of MTCNN's image pyramid; the model's crop was chosen with MTCNN's points.
- Each crop is the box's pixels as MTCNN takes them (whole pixels, its +1 pixel box), area-averaged
  to the net's size; only those pixels are read, so a 12-megapixel photo costs what its face costs.
  What lies outside the photo is black: a box over the photo's edge is cropped as a square, not
  clipped and stretched as MTCNN's cascade does, so a face that fills its photo (an ID photo) or
  sits inside the tight-crop retry's black border gets the same points.
- onnxruntime, numpy and PIL only; the nets are MTCNN's files, checked against their manifest's sha256.
"""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
from PIL import Image

from facecore.align.detector_files import detector_sessions
from facecore.align.onnx_detector import (
    FORMAT,
    MTCNN_VERSION,
    WHAT,
    detector_dir,
    net_input,
    onet_points,
    regress,
    square,
)

RNET_PASSES = 2
MTCNN_POINTS_VERSION = f"{MTCNN_VERSION}-points-r{RNET_PASSES}-box"


class MtcnnPoints:
    """`place(images, boxes) -> landmarks`: MTCNN's five points for each given box."""

    def __init__(self, folder: Path | None = None, threads: int = 1) -> None:
        self._sessions = detector_sessions(folder or detector_dir(), FORMAT, ("rnet", "onet"), WHAT, threads)

    def place(self, images: list[np.ndarray], boxes: list[np.ndarray]) -> np.ndarray:
        """(N, 5, 2) landmarks in each photo's pixels, one set per (RGB uint8 image, box x1, y1, x2, y2)."""
        current = square(np.asarray(boxes, np.float64).reshape(-1, 4))
        for _ in range(RNET_PASSES):
            offsets, _ = self._sessions["rnet"].run(None, {"image": _crops(images, current, 24)})
            current = square(regress(current, offsets))
        _, landmarks, _ = self._sessions["onet"].run(None, {"image": _crops(images, current, 48)})
        return onet_points(current, landmarks)


def _crops(images: list[np.ndarray], boxes: np.ndarray, size: int) -> np.ndarray:
    """(N, 3, size, size) float32 crops, normalised as MTCNN's nets expect."""
    batch = np.stack([_crop(image, box, size) for image, box in zip(images, boxes)])
    return np.ascontiguousarray(net_input(batch).transpose(0, 3, 1, 2))


def _crop(image: np.ndarray, box: np.ndarray, size: int) -> np.ndarray:
    """MTCNN's pixels of a box (columns trunc(x1) - 1 to trunc(x2) - 1, rows alike), black outside the photo,
    area-averaged to size x size."""
    left, top = math.trunc(box[0]) - 1, math.trunc(box[1]) - 1
    right, bottom = max(math.trunc(box[2]), left + 1), max(math.trunc(box[3]), top + 1)
    height, width = image.shape[:2]
    pixels = np.zeros((bottom - top, right - left, 3), np.uint8)
    x0, y0, x1, y1 = max(left, 0), max(top, 0), min(right, width), min(bottom, height)
    if x1 > x0 and y1 > y0:
        pixels[y0 - top : y1 - top, x0 - left : x1 - left] = image[y0:y1, x0:x1]
    return np.asarray(Image.fromarray(pixels).resize((size, size), Image.Resampling.BOX), np.float32)


__all__ = ["MTCNN_POINTS_VERSION", "RNET_PASSES", "MtcnnPoints"]
