"""What every detector returns (`Detection`) and how the one face of a photo is picked (`pick_face`); and
facenet-pytorch's torch MTCNN (weights in its wheel), kept as the reference the ONNX MTCNN is tested against.
Devices and evaluations load a detector through `facecore.align.detectors`."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Detection:
    box: np.ndarray  # x1, y1, x2, y2
    score: float
    landmarks: np.ndarray  # 5x2: eyes, nose, mouth corners


@dataclass(frozen=True)
class DetectorConfig:
    min_face_size: int = 40
    thresholds: tuple[float, float, float] = (0.6, 0.7, 0.7)
    # A miss is retried once with a smaller minimum face and looser thresholds, because
    # small or blurred faces are common on phones and a false miss costs the user a photo.
    retry_min_face_size: int = 20
    retry_thresholds: tuple[float, float, float] = (0.5, 0.6, 0.6)


def pick_face(detections: list[Detection], width: int, height: int) -> Detection:
    """The largest face, penalised by its distance from the image centre (insightface's rule)."""
    centre = np.array([width / 2.0, height / 2.0])

    def value(d: Detection) -> float:
        area = float((d.box[2] - d.box[0]) * (d.box[3] - d.box[1]))
        offset = (d.box[:2] + d.box[2:]) / 2.0 - centre
        return area - 2.0 * float(offset @ offset)

    return max(detections, key=value)


class MTCNNDetector:
    def __init__(self, config: DetectorConfig = DetectorConfig(), device: str = "cpu") -> None:
        from facenet_pytorch import MTCNN  # heavy import, only when detection is needed

        self.config = config
        self._primary = MTCNN(keep_all=True, min_face_size=config.min_face_size, thresholds=list(config.thresholds), device=device)
        self._retry = MTCNN(
            keep_all=True, min_face_size=config.retry_min_face_size, thresholds=list(config.retry_thresholds), device=device
        )

    def detect(self, images: list[np.ndarray]) -> list[Detection | None]:
        """Best face per RGB uint8 image, or None. Same-size images are batched."""
        import torch  # here, so Detection and pick_face stay importable without torch (onnx_detector)

        with torch.inference_mode():
            return self._detect(images)

    def _detect(self, images: list[np.ndarray]) -> list[Detection | None]:
        results: list[Detection | None] = [None] * len(images)
        by_size: dict[tuple[int, ...], list[int]] = {}
        for index, image in enumerate(images):
            by_size.setdefault(image.shape, []).append(index)
        for indices in by_size.values():
            found = self._run(self._primary, [images[i] for i in indices])
            misses = [i for i, f in zip(indices, found) if f is None]
            for i, f in zip(indices, found):
                results[i] = f
            if misses:
                for i, f in zip(misses, self._run(self._retry, [images[i] for i in misses])):
                    results[i] = f
        return results

    @staticmethod
    def _run(mtcnn: object, images: list[np.ndarray]) -> list[Detection | None]:
        batch = np.stack(images)
        boxes, scores, points = mtcnn.detect(batch, landmarks=True)  # type: ignore[attr-defined]
        height, width = images[0].shape[:2]
        out: list[Detection | None] = []
        for b, s, p in zip(boxes, scores, points):
            if b is None or len(b) == 0:
                out.append(None)
                continue
            candidates = [Detection(np.asarray(bb, np.float64), float(ss), np.asarray(pp, np.float64)) for bb, ss, pp in zip(b, s, p)]
            out.append(pick_face(candidates, width, height))
        return out
