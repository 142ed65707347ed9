"""Keras-style image classification sets (.npz with x_train, y_train, x_test, y_test)."""
from __future__ import annotations

import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from facecore.errors import DatasetFormatError
from facecore.paths import data_root
from simulator.fusion.config import FusionInputError

KEYS = ("x_train", "y_train", "x_test", "y_test")


@dataclass(frozen=True)
class ImageSet:
    """Images kept as uint8 N×H×W×C (grey sets get C=1); converted to tensors only per subset."""

    x_train: np.ndarray
    y_train: np.ndarray
    x_test: np.ndarray
    y_test: np.ndarray
    classes: int

    @property
    def image_shape(self) -> tuple[int, int, int]:
        """(C, H, W): what the model is built for."""
        n, h, w, c = self.x_train.shape
        return c, h, w


def default_data_path() -> Path:
    return data_root() / "mnist" / "mnist.npz"


def load_npz(path: str | Path | None = None) -> ImageSet:
    """Read and check a .npz; every problem is one DatasetFormatError / FusionInputError line."""
    file = Path(path) if path is not None else default_data_path()
    if not file.is_file():
        raise FusionInputError(f"data file not found: {file}")
    try:
        with np.load(file, allow_pickle=False) as raw:
            missing = [k for k in KEYS if k not in raw.files]
            if missing:
                raise DatasetFormatError(f"{file} lacks {', '.join(missing)} (needs {', '.join(KEYS)})")
            arrays = {k: raw[k] for k in KEYS}
    except (OSError, ValueError, zipfile.BadZipFile) as error:
        raise DatasetFormatError(f"{file} is not a readable .npz: {error}") from error
    images = {}
    for split in ("train", "test"):
        x, y = arrays[f"x_{split}"], arrays[f"y_{split}"]
        if x.dtype != np.uint8 or x.ndim not in (3, 4):
            raise DatasetFormatError(f"{file}: x_{split} must be uint8 N×H×W or N×H×W×C, got {x.dtype} {x.shape}")
        y = y.reshape(-1) if y.ndim == 2 and y.shape[1] == 1 else y  # CIFAR's keras loader gives N×1 labels
        if y.ndim != 1 or len(y) != len(x) or not np.issubdtype(y.dtype, np.integer) or (len(y) and y.min() < 0):
            raise DatasetFormatError(f"{file}: y_{split} must hold one non-negative integer label per image")
        images[split] = (x[..., None] if x.ndim == 3 else x, y.astype(np.int64))
    if images["train"][0].shape[1:] != images["test"][0].shape[1:]:
        raise DatasetFormatError(f"{file}: train and test images differ in shape")
    if len(images["train"][0]) == 0 or len(images["test"][0]) == 0:
        raise DatasetFormatError(f"{file}: empty train or test split")
    classes = int(max(images["train"][1].max(), images["test"][1].max())) + 1
    return ImageSet(*images["train"], *images["test"], classes=classes)


def to_tensors(x: np.ndarray, y: np.ndarray, dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 N×H×W×C → float N×C×H×W in [-1, 1]; a fixed scale, so nodes need no shared statistics."""
    images = torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2))).to(dtype)
    return images.div_(127.5).sub_(1.0), torch.from_numpy(y).long()
