"""Training augmentation on uint8 aligned faces: horizontal flip, mild crop, colour jitter.

Mild on purpose: the faces are aligned to a template, and heavy crops would undo that.
"""
from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import Dataset
from torchvision.transforms import v2


def train_transform(size: int = 112) -> v2.Compose:
    return v2.Compose(
        [
            v2.RandomHorizontalFlip(),
            v2.RandomResizedCrop(size, scale=(0.85, 1.0), ratio=(0.95, 1.05), antialias=True),
            v2.ColorJitter(brightness=0.2, contrast=0.2, saturation=0.2),
        ]
    )


class AugmentedFaces(Dataset[tuple[torch.Tensor, int]]):
    """Yields (3,size,size) uint8 tensors, the faces' own crop size; normalisation happens on the
    batch (see faces_to_tensor)."""

    def __init__(self, faces: np.ndarray, labels: np.ndarray, augment: bool = True) -> None:
        self.faces = torch.from_numpy(faces).permute(0, 3, 1, 2)  # a view: no copy of the pixels
        self.labels = torch.from_numpy(labels)
        self.transform = train_transform(faces.shape[1]) if augment else None

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        face = self.faces[index]
        if self.transform is not None:
            face = self.transform(face)
        return face, int(self.labels[index])
