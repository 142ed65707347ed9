"""MTCNN without torch: facenet-pytorch's P/R/O-Nets as ONNX files, its cascade in numpy.

Invariants:
- The cascade is facenet-pytorch 2.6.0's `detect_face`, step for step: the image pyramid (factor
  0.709, area resampling), PNet, NMS per scale (IoU 0.5) then over all scales (0.7), RNet on 24x24
  crops, NMS 0.7, ONet on 48x48 crops, landmarks, NMS 'Min' 0.7; box arithmetic in float32 as there.
  With the same `DetectorConfig` (and its one retry) as `MTCNNDetector`, boxes and landmarks agree
  with the torch path up to float rounding (the test on LFW photos holds them within a pixel).
- Nothing here imports torch. The ONNX files are made once, with torch, by `fedface models fetch`
  (`export.mtcnn_onnx`) into `detector_dir()`; every file is checked against the sha256 its folder's
  manifest records, so a truncated or edited file is one clear error, never a silently wrong face.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from facecore.align.detector import Detection, DetectorConfig, pick_face
from facecore.align.detector_files import DetectorCorrupt, DetectorMissing, detector_sessions, verified_files
from facecore.paths import packages_root

SOURCE = "facenet-pytorch 2.6.0"
FORMAT = "fedface-mtcnn-onnx/1"
NETS = ("pnet", "rnet", "onet")
PYRAMID_FACTOR = 0.709  # facenet-pytorch's default, which MTCNNDetector keeps
MTCNN_VERSION = "mtcnn-facenet2.6"
WHAT = "the ONNX MTCNN face detector"


def detector_dir() -> Path:
    """Beside the published weights: a private face cache set for a test does not lose them."""
    return packages_root() / "mtcnn-onnx-facenet-pytorch-2.6.0"


def detector_files(folder: Path | None = None) -> dict[str, Path]:
    """{net: path} of the exported nets, each checked against the manifest's sha256."""
    return verified_files(folder or detector_dir(), FORMAT, NETS, WHAT)


class IntegralImage:
    """Summed-area table of an (H, W, C) uint8 image: any box's pixel sum in four lookups, so every
    pyramid level and every crop is resampled without another pass over the photo.

    uint32 with wrap-around: a box's sum comes out exact whenever it is below 2**32, i.e. for any
    box under 16.8 million pixels, whatever the photo's size."""

    def __init__(self, image: np.ndarray) -> None:
        height, width, channels = image.shape
        self.sums = np.zeros((height + 1, width + 1, channels), np.uint32)
        np.cumsum(np.cumsum(image, axis=0, dtype=np.uint32), axis=1, dtype=np.uint32, out=self.sums[1:, 1:])

    def area_resize(self, top: int, left: int, height: int, width: int, out_height: int, out_width: int) -> np.ndarray:
        """The box (top, left, height, width) -> (out_height, out_width, C) float32, as torch's
        `interpolate(mode="area")` (adaptive average pooling: output row i averages input rows
        floor(i*height/out_height) to ceil((i+1)*height/out_height), and likewise for columns)."""
        rows = _bins(np.array([top]), np.array([height]), out_height)
        cols = _bins(np.array([left]), np.array([width]), out_width)
        return self._average(rows, cols)[0]

    def area_resize_boxes(self, tops: np.ndarray, lefts: np.ndarray, heights: np.ndarray, widths: np.ndarray,
                          size: int) -> np.ndarray:
        """Many boxes at once -> (K, size, size, C) float32, each as `area_resize`."""
        return self._average(_bins(tops, heights, size), _bins(lefts, widths, size))

    def _average(self, rows: tuple[np.ndarray, np.ndarray], cols: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
        (r0, r1), (c0, c1) = (rows[0][:, :, None], rows[1][:, :, None]), (cols[0][:, None, :], cols[1][:, None, :])
        total = self.sums[r1, c1] - self.sums[r0, c1] - self.sums[r1, c0] + self.sums[r0, c0]
        return (total / ((r1 - r0) * (c1 - c0))[..., None]).astype(np.float32)


def _bins(starts: np.ndarray, lengths: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """(K, size) first and one-past-last input index of each output cell of each box."""
    index = np.arange(size)[None, :]
    lengths, starts = np.asarray(lengths, np.int64)[:, None], np.asarray(starts, np.int64)[:, None]
    return starts + (index * lengths) // size, starts - ((-(index + 1) * lengths) // size)


def area_resize(image: np.ndarray, height: int, width: int) -> np.ndarray:
    """A whole (H, W, C) uint8 image -> (height, width, C) float32 by area averaging (see IntegralImage)."""
    return IntegralImage(image).area_resize(0, 0, image.shape[0], image.shape[1], height, width)


def nms(boxes: np.ndarray, scores: np.ndarray, threshold: float) -> np.ndarray:
    """torchvision's `nms`: highest score first, drop boxes whose IoU with a kept one is > threshold."""
    x1, y1, x2, y2 = boxes[:, 0], boxes[:, 1], boxes[:, 2], boxes[:, 3]
    areas = (x2 - x1) * (y2 - y1)
    order = np.argsort(-scores, kind="stable")
    keep = []
    while order.size:
        best, rest = order[0], order[1:]
        keep.append(best)
        width = np.maximum(0.0, np.minimum(x2[best], x2[rest]) - np.maximum(x1[best], x1[rest]))
        height = np.maximum(0.0, np.minimum(y2[best], y2[rest]) - np.maximum(y1[best], y1[rest]))
        inter = width * height
        order = rest[inter / (areas[best] + areas[rest] - inter) <= threshold]
    return np.asarray(keep, dtype=np.int64)


def nms_min(boxes: np.ndarray, scores: np.ndarray, threshold: float) -> np.ndarray:
    """facenet-pytorch's `nms_numpy(..., 'Min')`: overlap over the smaller box, +1 pixel areas."""
    x1, y1, x2, y2 = (boxes[:, i].astype(np.float32) for i in range(4))
    areas = (x2 - x1 + 1) * (y2 - y1 + 1)
    order = np.argsort(scores)
    keep = []
    while order.size:
        best, rest = order[-1], order[:-1]
        keep.append(best)
        width = np.maximum(0.0, np.minimum(x2[best], x2[rest]) - np.maximum(x1[best], x1[rest]) + 1)
        height = np.maximum(0.0, np.minimum(y2[best], y2[rest]) - np.maximum(y1[best], y1[rest]) + 1)
        order = rest[width * height / np.minimum(areas[best], areas[rest]) <= threshold]
    return np.asarray(keep, dtype=np.int64)


def square(boxes: np.ndarray) -> np.ndarray:
    """`rerec`: each box grown to a square about its centre."""
    boxes = boxes.copy()
    height, width = boxes[:, 3] - boxes[:, 1], boxes[:, 2] - boxes[:, 0]
    side = np.maximum(width, height)
    boxes[:, 0] = boxes[:, 0] + width * 0.5 - side * 0.5
    boxes[:, 1] = boxes[:, 1] + height * 0.5 - side * 0.5
    boxes[:, 2] = boxes[:, 0] + side
    boxes[:, 3] = boxes[:, 1] + side
    return boxes


def regress(boxes: np.ndarray, offsets: np.ndarray) -> np.ndarray:
    """`bbreg`: move each corner by its offset times the box's +1 pixel size."""
    boxes = boxes.copy()
    width = boxes[:, 2] - boxes[:, 0] + 1
    height = boxes[:, 3] - boxes[:, 1] + 1
    boxes[:, 0] += offsets[:, 0] * width
    boxes[:, 1] += offsets[:, 1] * height
    boxes[:, 2] += offsets[:, 2] * width
    boxes[:, 3] += offsets[:, 3] * height
    return boxes


def crops(integral: IntegralImage, boxes: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """(N, 3, size, size) normalised crops of the boxes (clipped to the image, 1-based as `pad`),
    and the indices of the boxes that had any pixels."""
    height, width = integral.sums.shape[0] - 1, integral.sums.shape[1] - 1
    corners = np.trunc(boxes[:, :4]).astype(np.int32)
    x, y = np.maximum(corners[:, 0], 1), np.maximum(corners[:, 1], 1)
    ex, ey = np.minimum(corners[:, 2], width), np.minimum(corners[:, 3], height)
    kept = np.flatnonzero((ey > y - 1) & (ex > x - 1))
    x, y, ex, ey = x[kept], y[kept], ex[kept], ey[kept]
    batch = integral.area_resize_boxes(y - 1, x - 1, ey - y + 1, ex - x + 1, size)
    return np.ascontiguousarray(net_input(batch).transpose(0, 3, 1, 2)), kept


def net_input(pixels: np.ndarray) -> np.ndarray:
    """Pixels in [0, 255] as MTCNN's nets take them: (pixels - 127.5) / 128, float32."""
    return (pixels - np.float32(127.5)) * np.float32(0.0078125)


class OnnxMTCNN:
    """Drop-in for `MTCNNDetector` (`detect(images) -> [Detection | None]`) on onnxruntime."""

    name = "mtcnn"
    version = MTCNN_VERSION

    def __init__(self, config: DetectorConfig = DetectorConfig(), folder: Path | None = None, threads: int = 1) -> None:
        self.config = config
        self._sessions = detector_sessions(folder or detector_dir(), FORMAT, NETS, WHAT, threads)

    def detect(self, images: list[np.ndarray]) -> list[Detection | None]:
        """Best face per RGB uint8 image, or None; a miss is retried with the looser settings."""
        results = []
        for image in images:
            found = self._best(image, self.config.min_face_size, self.config.thresholds)
            if found is None:
                found = self._best(image, self.config.retry_min_face_size, self.config.retry_thresholds)
            results.append(found)
        return results

    def _best(self, image: np.ndarray, min_face_size: int, thresholds: tuple[float, float, float]) -> Detection | None:
        boxes, points = self.detect_all(image, min_face_size, thresholds)
        if len(boxes) == 0:
            return None
        candidates = [Detection(b[:4].astype(np.float64), float(b[4]), p.astype(np.float64))
                      for b, p in zip(boxes, points)]
        return pick_face(candidates, image.shape[1], image.shape[0])

    def detect_all(
        self, image: np.ndarray, min_face_size: int, thresholds: tuple[float, float, float]
    ) -> tuple[np.ndarray, np.ndarray]:
        """Every face in one RGB uint8 image: (K, 5) boxes x1, y1, x2, y2, score and (K, 5, 2) landmarks."""
        integral = IntegralImage(np.asarray(image, dtype=np.uint8))
        boxes = self._proposals(integral, min_face_size, thresholds[0])
        if len(boxes):
            boxes = self._refine(integral, boxes, thresholds[1])
        if not len(boxes):
            return np.zeros((0, 5), np.float32), np.zeros((0, 5, 2), np.float32)
        return self._output(integral, boxes, thresholds[2])

    def _proposals(self, integral: IntegralImage, min_face_size: int, threshold: float) -> np.ndarray:
        """PNet over the pyramid: squared candidate boxes (K, 5)."""
        height, width = integral.sums.shape[0] - 1, integral.sums.shape[1] - 1
        scale = 12.0 / min_face_size
        shortest = min(height, width) * scale
        found = []
        while shortest >= 12:
            resized = integral.area_resize(0, 0, height, width, int(height * scale + 1), int(width * scale + 1))
            batch = net_input(resized).transpose(2, 0, 1)[None]
            offsets, probabilities = self._sessions["pnet"].run(None, {"image": batch})
            candidates = _grid_boxes(offsets[0], probabilities[0, 1], scale, threshold)
            found.append(candidates[nms(candidates[:, :4], candidates[:, 4], 0.5)])
            scale *= PYRAMID_FACTOR
            shortest *= PYRAMID_FACTOR
        boxes = np.concatenate(found) if found else np.zeros((0, 9), np.float32)
        boxes = boxes[nms(boxes[:, :4], boxes[:, 4], 0.7)]
        width_, height_ = boxes[:, 2] - boxes[:, 0], boxes[:, 3] - boxes[:, 1]
        moved = np.stack([boxes[:, 0] + boxes[:, 5] * width_, boxes[:, 1] + boxes[:, 6] * height_,
                          boxes[:, 2] + boxes[:, 7] * width_, boxes[:, 3] + boxes[:, 8] * height_, boxes[:, 4]], axis=1)
        return square(moved)

    def _refine(self, integral: IntegralImage, boxes: np.ndarray, threshold: float) -> np.ndarray:
        """RNet on 24x24 crops: the candidates it keeps, regressed and squared."""
        batch, kept = crops(integral, boxes, 24)
        if not len(kept):
            return boxes[:0]
        offsets, probabilities = self._sessions["rnet"].run(None, {"image": batch})
        score = probabilities[:, 1]
        passed = score > threshold
        boxes = np.concatenate([boxes[kept][passed, :4], score[passed, None]], axis=1)
        offsets = offsets[passed]
        pick = nms(boxes[:, :4], boxes[:, 4], 0.7)
        return square(regress(boxes[pick], offsets[pick]))

    def _output(self, integral: IntegralImage, boxes: np.ndarray, threshold: float) -> tuple[np.ndarray, np.ndarray]:
        """ONet on 48x48 crops: final boxes and their five landmarks."""
        batch, kept = crops(integral, boxes, 48)
        if not len(kept):
            return np.zeros((0, 5), np.float32), np.zeros((0, 5, 2), np.float32)
        offsets, landmarks, probabilities = self._sessions["onet"].run(None, {"image": batch})
        score = probabilities[:, 1]
        passed = score > threshold
        boxes = np.concatenate([boxes[kept][passed, :4], score[passed, None]], axis=1)
        landmarks, offsets = landmarks[passed], offsets[passed]
        points = onet_points(boxes, landmarks)
        boxes = regress(boxes, offsets)
        pick = nms_min(boxes[:, :4], boxes[:, 4], 0.7)
        return boxes[pick], points[pick]


def onet_points(boxes: np.ndarray, landmarks: np.ndarray) -> np.ndarray:
    """ONet's (K, 10) outputs (five x, then five y, as fractions of its +1 pixel box) -> (K, 5, 2) pixels."""
    width = (boxes[:, 2] - boxes[:, 0] + 1)[:, None]
    height = (boxes[:, 3] - boxes[:, 1] + 1)[:, None]
    return np.stack([width * landmarks[:, :5] + boxes[:, :1] - 1, height * landmarks[:, 5:] + boxes[:, 1:2] - 1], axis=2)


def _grid_boxes(offsets: np.ndarray, probability: np.ndarray, scale: float, threshold: float) -> np.ndarray:
    """`generateBoundingBox`: one 12x12 window (stride 2) per PNet cell scoring >= threshold,
    as rows x1, y1, x2, y2, score, 4 offsets (float32, as the torch code computes them)."""
    rows, cols = np.nonzero(probability >= threshold)
    cells = np.stack([cols, rows], axis=1).astype(np.float32)
    top_left = np.floor((2 * cells + 1) / np.float32(scale))
    bottom_right = np.floor((2 * cells + 12) / np.float32(scale))
    return np.concatenate(
        [top_left, bottom_right, probability[rows, cols][:, None], offsets[:, rows, cols].T], axis=1
    ).astype(np.float32)


__all__ = [
    "MTCNN_VERSION", "DetectorCorrupt", "DetectorMissing", "IntegralImage", "OnnxMTCNN", "area_resize", "detector_dir", "detector_files",
    "net_input", "nms", "nms_min", "onet_points",
]
