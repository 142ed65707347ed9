"""Per-backbone crop geometry: the crop size and where the five landmarks must land in it.

Every backbone declares a :class:`FaceGeometry` (its ``geometry`` attribute; 112x112 ArcFace when
absent). Alignment, the aligned-face cache (one folder per geometry key), the device SDK, export
and evaluation all read it from the backbone, so a backbone never sees a crop made for another.
Pixels always enter a backbone as RGB scaled to [-1, 1]; a backbone trained with other pixel
statistics converts inside its own forward (see ``dlib_resnet``), so the published input
convention stays one pair of numbers.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from facecore.align.template import ARCFACE_TEMPLATE, FACE_SIZE


@dataclass(frozen=True)
class FaceGeometry:
    """A square crop of ``size`` pixels with the five landmarks at ``template`` (x, y rows).

    ``key`` names the geometry in cache folders and manifests: two geometries with the same key
    must produce identical crops.
    """

    key: str
    size: int
    template: tuple[tuple[float, float], ...] = field(repr=False)

    def __post_init__(self) -> None:
        points = np.asarray(self.template, dtype=np.float64)
        if points.shape != (5, 2):
            raise ValueError(f"a face template has 5 (x, y) points, got shape {points.shape}")
        if self.size < 16 or not np.all((points > 0) & (points < self.size)):
            raise ValueError(f"template points of {self.key!r} must lie inside the {self.size}px crop")

    @property
    def points(self) -> np.ndarray:
        return np.asarray(self.template, dtype=np.float64)

    @property
    def row_shape(self) -> tuple[int, int, int]:
        return (self.size, self.size, 3)

    def to_json(self) -> dict[str, Any]:
        """{"key", "size", "template": [[x, y] x 5]}: the form manifests, the API and figures files carry."""
        return {"key": self.key, "size": self.size, "template": [[x, y] for x, y in self.template]}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> FaceGeometry:
        return cls(str(data["key"]), int(data["size"]), tuple((float(x), float(y)) for x, y in data["template"]))

    def describe(self) -> str:
        return f"5-point similarity warp to a {self.size}x{self.size} crop ({self.key})"


def scaled_arcface(size: int, scale: float = 1.0, shift_y: float = 0.0) -> FaceGeometry:
    """The ArcFace template mapped into a ``size`` crop, scaled by ``scale`` about the crop's
    centre and moved up by ``shift_y`` pixels (of the new crop).

    ``scale`` < 1 leaves more context around the face; moving up shows more chin.
    """
    centre = FACE_SIZE / 2.0
    points = (ARCFACE_TEMPLATE - centre) * (size / FACE_SIZE) * scale + size / 2.0
    points[:, 1] -= shift_y
    key = f"arcface{size}" if (scale, shift_y) == (1.0, 0.0) else f"arcface{size}-s{scale:g}-up{shift_y:g}"
    return FaceGeometry(key, size, tuple(map(tuple, points.tolist())))


ARCFACE_112 = scaled_arcface(FACE_SIZE)


def geometry_of(model: object) -> FaceGeometry:
    """The crop a backbone expects; 112x112 ArcFace for backbones that declare none."""
    geometry = getattr(model, "geometry", None)
    return geometry if isinstance(geometry, FaceGeometry) else ARCFACE_112
