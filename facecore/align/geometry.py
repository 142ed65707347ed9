"""Per-backbone crop geometry: the crop size and where the five landmarks must land in it.

Every backbone declares a :class:`FaceGeometry` (its ``geometry`` attribute; 112x112 ArcFace when
absent). Alignment, the aligned-face cache (one folder per geometry key), the device SDK, export
and evaluation all read it from the backbone, so a backbone never sees a crop made for another.
Pixels always enter a backbone as RGB scaled to [-1, 1]; a backbone trained with other pixel
statistics converts inside its own forward (see ``dlib_resnet``), so the published input
convention stays one pair of numbers.
"""
from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from facecore.align.template import ARCFACE_TEMPLATE, FACE_SIZE

# What `from_json` accepts (it reads geometries a round server sends devices, as well as manifests). The
# registered backbones crop 112 or 150 px and face recognisers in use crop 96-224 px: 256 leaves room while
# bounding one crop at 192 KiB (a device holds up to 500) and one warp at a few milliseconds.
MIN_CROP_SIZE = 16
MAX_CROP_SIZE = 256
# The eyes of a usable template lie at least this share of the crop apart (ArcFace's: 0.31); closer, the
# similarity warp squeezes the whole face into a few pixels.
MIN_EYE_DISTANCE = 0.1
GEOMETRY_KEY = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}")  # it names cache folders


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
        """The inverse of `to_json`, refusing anything outside sane declared ranges (a server may send
        this): ValueError, one line naming the field and its limit."""
        if not isinstance(data, Mapping):
            raise ValueError(f"a face geometry is an object with key, size and template, got {type(data).__name__}")
        key, size, template = data.get("key"), data.get("size"), data.get("template")
        if not isinstance(key, str) or not GEOMETRY_KEY.fullmatch(key):
            raise ValueError(f"key {str(key)[:40]!r} is not 1-64 letters, digits, '.', '_' or '-'")
        if isinstance(size, bool) or not isinstance(size, int) or not MIN_CROP_SIZE <= size <= MAX_CROP_SIZE:
            raise ValueError(f"size {repr(size)[:40]} is not an integer in {MIN_CROP_SIZE}..{MAX_CROP_SIZE} pixels")
        if not isinstance(template, list | tuple) or len(template) != 5:
            raise ValueError("template is not a list of 5 (x, y) points")
        points: list[tuple[float, float]] = []
        for index, point in enumerate(template):
            if (not isinstance(point, list | tuple) or len(point) != 2
                    or not all(isinstance(v, int | float) and not isinstance(v, bool) for v in point)):
                raise ValueError(f"template point {index} is not a pair of numbers")
            x, y = float(point[0]), float(point[1])
            if not (math.isfinite(x) and math.isfinite(y) and 0 < x < size and 0 < y < size):
                raise ValueError(f"template point {index} ({x:g}, {y:g}) is not inside the {size}px crop")
            points.append((x, y))
        if math.dist(points[0], points[1]) < MIN_EYE_DISTANCE * size:
            raise ValueError(f"template's eyes are {math.dist(points[0], points[1]):.3g}px apart, under "
                             f"{MIN_EYE_DISTANCE:g} of the {size}px crop")
        return cls(key, size, tuple(points))

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
