"""The default face detector: face-api.js's TinyFaceDetector finds the box, MTCNN's RNet and ONet place the points.

Invariants:
- onnxruntime, numpy and PIL only, never torch. The detector's ONNX file is built once from the
  `@vladmandic/face-api` package's weights by `fedface models fetch` (`export.tinyface_onnx`) and
  checked against the sha256 its folder's manifest records; the point nets are MTCNN's files.
- A photo is padded to a square at its bottom and right and resized to `input_size` (a multiple of
  32), as face-api.js does; the 5 x 5 boxes per grid cell are decoded as its `extractBoxes`, kept
  above `score_threshold`, and suppressed at IoU 0.4; the best face is `pick_face`'s.
- The five points are placed in that box by MTCNN's last two stages (`MtcnnPoints`): they fall where
  MTCNN's would, so one crop geometry serves every detector of the chain, MTCNN itself included.
- All photos of one `detect` call share one detector run and one run of each point net (batched).
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
from PIL import Image

from facecore.align.detector import Detection, pick_face
from facecore.align.detector_files import detector_sessions, verified_files
from facecore.align.mtcnn_points import MTCNN_POINTS_VERSION, MtcnnPoints
from facecore.paths import packages_root

SOURCE = "@vladmandic/face-api 1.7.15: tiny_face_detector_model"
FORMAT = "fedface-tinyface-onnx/2"
NETS = ("detector",)
WHAT = "the default face detector"
# The pixel means the net was trained with; the ONNX graph subtracts them (export.tinyface_onnx).
MEAN_RGB = np.array([117.001, 114.697, 97.404], np.float32)
ANCHORS = np.array([[1.603231, 2.094468], [6.041143, 7.080126], [2.882459, 3.518061], [4.266906, 5.178857],
                    [9.041765, 10.66308]], np.float32)
IOU_THRESHOLD = 0.4


@dataclass(frozen=True)
class TinyFaceConfig:
    """face-api.js defaults to 416 and 0.5; 128 or 160 and 0.3 missed a tenth as many faces on LFW folds 1-5
    and CelebA photos (README "Face detection"): a face that fills a 250px photo is large for the net's anchors.
    The default chain looks at 128 first (fewer misses, and the net's cost falls with the square of the size),
    then at RETRY_INPUT_SIZE, where a face that a black border has shrunk stays large enough to be found."""

    input_size: int = 128
    score_threshold: float = 0.3

    def __post_init__(self) -> None:
        if self.input_size < 64 or self.input_size % 32:
            raise ValueError(f"input_size must be a multiple of 32 and at least 64, got {self.input_size}")
        if not 0 < self.score_threshold < 1:
            raise ValueError(f"score_threshold must lie in (0, 1), got {self.score_threshold}")

    @property
    def key(self) -> str:
        return f"s{self.input_size}-t{self.score_threshold:g}"


def tinyface_version(config: TinyFaceConfig) -> str:
    return f"tinyface-faceapi1.7.15-{config.key}-{MTCNN_POINTS_VERSION}"


RETRY_INPUT_SIZE = 160
TINYFACE_VERSION = tinyface_version(TinyFaceConfig())
RETRY_TINYFACE_VERSION = tinyface_version(TinyFaceConfig(input_size=RETRY_INPUT_SIZE))


def tinyface_dir() -> Path:
    return packages_root() / "tinyface-onnx-face-api-1.7.15"


def tinyface_files(folder: Path | None = None) -> dict[str, Path]:
    """{net: path} of the built nets, each checked against the manifest's sha256."""
    return verified_files(folder or tinyface_dir(), FORMAT, NETS, WHAT)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.clip(x, -60.0, 60.0)))


def decode_grid(grid: np.ndarray, score_threshold: float) -> tuple[np.ndarray, np.ndarray]:
    """One image's (25, g, g) output -> boxes (K, 4) as x1, y1, x2, y2 in [0, 1] of the square input, scores (K,)."""
    cells = grid.shape[-1]
    cell = grid.reshape(len(ANCHORS), 5, cells, cells)
    scores = _sigmoid(cell[:, 4])
    anchor, row, col = np.nonzero(scores > score_threshold)
    t = cell[anchor, :, row, col]
    centre_x = (col + _sigmoid(t[:, 0])) / cells
    centre_y = (row + _sigmoid(t[:, 1])) / cells
    width = np.exp(t[:, 2]) * ANCHORS[anchor, 0] / cells
    height = np.exp(t[:, 3]) * ANCHORS[anchor, 1] / cells
    boxes = np.stack([centre_x - width / 2, centre_y - height / 2, centre_x + width / 2, centre_y + height / 2], axis=1)
    return boxes.astype(np.float64), scores[anchor, row, col].astype(np.float64)


def suppress(boxes: np.ndarray, scores: np.ndarray, threshold: float = IOU_THRESHOLD) -> np.ndarray:
    """Indices kept by greedy non-maximum suppression, highest score first."""
    areas = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    order, keep = np.argsort(-scores, kind="stable"), []
    while order.size:
        best, rest = order[0], order[1:]
        keep.append(best)
        width = np.clip(np.minimum(boxes[best, 2], boxes[rest, 2]) - np.maximum(boxes[best, 0], boxes[rest, 0]), 0, None)
        height = np.clip(np.minimum(boxes[best, 3], boxes[rest, 3]) - np.maximum(boxes[best, 1], boxes[rest, 1]), 0, None)
        inter = width * height
        order = rest[inter / (areas[best] + areas[rest] - inter) <= threshold]
    return np.asarray(keep, np.int64)


def square_input(image: np.ndarray, size: int) -> tuple[np.ndarray, float]:
    """The photo padded to a square at its bottom and right, resized to `size`: (size, size, 3) uint8, and
    the scale from photo pixels to input pixels."""
    height, width = image.shape[:2]
    side = max(height, width)
    scale = size / side
    resized = Image.fromarray(image).resize((max(1, round(width * scale)), max(1, round(height * scale))),
                                            Image.Resampling.BILINEAR)
    canvas = np.zeros((size, size, 3), np.uint8)
    canvas[: resized.height, : resized.width] = np.asarray(resized, np.uint8)
    return canvas, scale


class TinyFaceDetector:
    """`detect(images) -> [Detection | None]` on onnxruntime (see the module's invariants)."""

    name = "tinyface"

    def __init__(self, config: TinyFaceConfig = TinyFaceConfig(), folder: Path | None = None, threads: int = 1) -> None:
        self.config = config
        self.version = tinyface_version(config)
        self._sessions = detector_sessions(folder or tinyface_dir(), FORMAT, NETS, WHAT, threads)
        self._points = MtcnnPoints(threads=threads)

    def at_input_size(self, input_size: int) -> TinyFaceDetector:
        """This detector seeing photos at another size, sharing its sessions (the net takes any size)."""
        twin = copy.copy(self)
        twin.config = replace(self.config, input_size=input_size)
        twin.version = tinyface_version(twin.config)
        return twin

    def detect(self, images: list[np.ndarray]) -> list[Detection | None]:
        if not images:
            return []
        size = self.config.input_size
        inputs, scales = zip(*(square_input(np.asarray(image, np.uint8), size) for image in images))
        (grids,) = self._sessions["detector"].run(None, {"image": np.stack(inputs)})
        boxes: list[tuple[np.ndarray, float] | None] = []
        for image, grid, scale in zip(images, grids, scales):
            found, scores = decode_grid(grid, self.config.score_threshold)
            if not len(found):
                boxes.append(None)
                continue
            kept = suppress(found, scores)
            height, width = image.shape[:2]
            candidates = [Detection(found[k] * size / scale, float(scores[k]), np.zeros((5, 2))) for k in kept]
            best = pick_face(candidates, width, height)
            boxes.append((best.box, best.score))
        return self._with_landmarks(images, boxes)

    def _with_landmarks(self, images: list[np.ndarray], boxes: list[tuple[np.ndarray, float] | None]) -> list[Detection | None]:
        found = [(i, box) for i, box in enumerate(boxes) if box is not None]
        results: list[Detection | None] = [None] * len(images)
        if not found:
            return results
        points = self._points.place([np.asarray(images[i], np.uint8) for i, _ in found], [box for _, (box, _) in found])
        for (i, (box, score)), five in zip(found, points):
            results[i] = Detection(np.asarray(box, np.float64), score, five)
        return results


__all__ = [
    "RETRY_INPUT_SIZE", "RETRY_TINYFACE_VERSION", "TINYFACE_VERSION", "TinyFaceConfig", "TinyFaceDetector", "decode_grid",
    "square_input", "tinyface_dir", "tinyface_files",
]
