"""A photo file as every aligner reads it: RGB uint8 pixels, or None when the file is not an image.

Imports numpy and PIL only: a device's verify reads its photos here without loading the aligned-face
cache (sqlite3) that facecore.align.pipeline brings, which it never uses.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image, UnidentifiedImageError


def load_rgb(path: Path) -> np.ndarray | None:
    """The photo at `path` as (H, W, 3) uint8 RGB; None when it cannot be read as an image."""
    try:
        with Image.open(path) as image:
            return np.asarray(image.convert("RGB"), dtype=np.uint8)
    except (OSError, UnidentifiedImageError, ValueError):
        return None


__all__ = ["load_rgb"]
