"""Keras-style image classification sets (.npz with x_train, y_train, x_test, y_test), their
pixel scaling, and the official code's training augmentation."""
from __future__ import annotations

import math
import zipfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.nn import functional

from facecore.errors import DatasetFormatError
from facecore.paths import data_root
from simulator.fusion.config import FusionInputError

KEYS = ("x_train", "y_train", "x_test", "y_test")
DATASETS = ("mnist", "fashion-mnist")  # names `--data` accepts besides a path


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

    def channel_stats(self) -> tuple[np.ndarray, np.ndarray]:
        """Per-channel mean and std of the training pixels on the [0, 1] scale (exact, from a histogram).

        MNIST gives 0.1307 / 0.3081 and Fashion-MNIST 0.2860 / 0.3530: the official code's constants.
        """
        levels = np.arange(256, dtype=np.float64) / 255.0
        means, stds = [], []
        for c in range(self.x_train.shape[3]):
            counts = np.bincount(self.x_train[..., c].ravel(), minlength=256).astype(np.float64)
            mean = float(counts @ levels / counts.sum())
            means.append(mean)
            stds.append(math.sqrt(max(float(counts @ (levels - mean) ** 2 / counts.sum()), 1e-12)))
        return np.array(means), np.array(stds)


def default_data_path() -> Path:
    return data_root() / "mnist" / "mnist.npz"


def resolve_data(spec: str | None) -> Path:
    """``--data``: None or ``mnist`` → $FEDFACE_DATA/mnist/mnist.npz; ``fashion-mnist`` → the cached
    conversion of Debian's package (fetched on first use); anything else is a path."""
    if spec is None or spec == "mnist":
        return default_data_path()
    if spec == "fashion-mnist":
        from facecore.data.fashion_mnist import fashion_mnist_npz

        return fashion_mnist_npz()
    return Path(spec)


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


def to_tensors(
    x: np.ndarray, y: np.ndarray, dtype: torch.dtype = torch.float32, stats: tuple[np.ndarray, np.ndarray] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """uint8 N×H×W×C → float N×C×H×W: in [-1, 1] (a fixed scale, so nodes need no shared statistics),
    or, given per-channel ``stats`` = (mean, std) on the [0, 1] scale, (x/255 − mean)/std as the official
    code's ``Normalize``."""
    images = torch.from_numpy(np.ascontiguousarray(x.transpose(0, 3, 1, 2))).to(dtype)
    if stats is None:
        return images.div_(127.5).sub_(1.0), torch.from_numpy(y).long()
    mean, std = (torch.as_tensor(v, dtype=dtype).view(1, -1, 1, 1) for v in stats)
    return images.div_(255.0).sub_(mean).div_(std), torch.from_numpy(y).long()


def resized_crop(x: torch.Tensor, area: torch.Tensor, log_ratio: torch.Tensor, cx: torch.Tensor, cy: torch.Tensor,
                 flip: torch.Tensor) -> torch.Tensor:
    """Per image: crop a box of ``area`` (fraction of the image) and aspect exp(``log_ratio``) centred at
    (cx, cy) (in units of the free room, −1..1), resize it bilinearly to the full size, mirror if ``flip``.

    A box that does not fit (width or height above the image's) becomes the whole image, as the
    official RandomResizedCrop's fallback does for a square image. Bilinear weights sum to 1, so
    cropping after per-channel normalisation equals cropping before it.
    """
    ratio = torch.exp(log_ratio)
    w, h = torch.sqrt(area * ratio), torch.sqrt(area / ratio)
    fits = (w <= 1) & (h <= 1)
    w, h = torch.where(fits, w, torch.ones_like(w)), torch.where(fits, h, torch.ones_like(h))
    theta = torch.zeros(len(x), 2, 3, dtype=x.dtype)
    theta[:, 0, 0] = torch.where(flip, -w, w)
    theta[:, 0, 2] = cx * (1 - w)
    theta[:, 1, 1] = h
    theta[:, 1, 2] = cy * (1 - h)
    grid = functional.affine_grid(theta, list(x.shape), align_corners=False)
    return functional.grid_sample(x, grid, mode="bilinear", padding_mode="border", align_corners=False)


def random_crop_flip(x: torch.Tensor, tries: int = 10) -> torch.Tensor:
    """The official training augmentation, torchvision's RandomResizedCrop(size) (area 8–100%,
    aspect 3/4–4/3, up to ``tries`` draws for a box that fits) and RandomHorizontalFlip, batched.
    Draws from torch's global RNG (engine.train_fused_node seeds it per node and round)."""
    n = len(x)
    area = torch.empty(n, tries, dtype=x.dtype).uniform_(0.08, 1.0)
    log_ratio = torch.empty(n, tries, dtype=x.dtype).uniform_(math.log(3 / 4), math.log(4 / 3))
    fits = (area * torch.exp(log_ratio) <= 1) & (area / torch.exp(log_ratio) <= 1)
    first = torch.where(fits.any(1), fits.float().argmax(1), torch.zeros(n, dtype=torch.long))
    pick = torch.arange(n)
    area = torch.where(fits.any(1), area[pick, first], torch.full((n,), 2.0, dtype=x.dtype))  # 2.0: no fit, whole image
    centre = torch.empty(n, 2, dtype=x.dtype).uniform_(-1.0, 1.0)
    return resized_crop(x, area, log_ratio[pick, first], centre[:, 0], centre[:, 1], torch.rand(n) < 0.5)
