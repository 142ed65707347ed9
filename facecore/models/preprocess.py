"""The one input convention every backbone, exporter and device shares: RGB scaled to [-1, 1]."""
from __future__ import annotations

import numpy as np
import torch

# RGB uint8 -> float in [-1, 1]; the numbers live in facecore.pixels, which devices read without torch.
from facecore.pixels import PIXEL_MEAN, PIXEL_STD  # noqa: F401  re-exported


def faces_to_tensor(faces: np.ndarray | torch.Tensor, device: str | torch.device = "cpu") -> torch.Tensor:
    """(N,S,S,3) uint8 aligned faces (S: the backbone's crop size) -> (N,3,S,S) float32 in [-1, 1], channels_last."""
    tensor = torch.as_tensor(faces, device=device)
    if tensor.dtype != torch.uint8 or tensor.ndim != 4 or tensor.shape[-1] != 3:
        raise ValueError(f"faces must be uint8 (N,H,W,3), got {tensor.dtype} {tuple(tensor.shape)}")
    # permute keeps the NHWC storage, which is exactly channels_last for the NCHW view
    return tensor.permute(0, 3, 1, 2).float().sub_(PIXEL_MEAN).div_(PIXEL_STD).contiguous(memory_format=torch.channels_last)


@torch.inference_mode()
def embed_faces(model: torch.nn.Module, faces: np.ndarray, batch_size: int = 128, flip: bool = False) -> np.ndarray:
    """L2-normalised embeddings of aligned faces; with `flip`, the sum of the image's and its mirror's."""
    model.eval()
    out: list[np.ndarray] = []
    for start in range(0, len(faces), batch_size):
        batch = faces_to_tensor(faces[start : start + batch_size])
        features = model(batch)
        if flip:
            features = features + model(batch.flip(3))
        out.append(torch.nn.functional.normalize(features.float(), dim=1).numpy())
    return np.concatenate(out) if out else np.zeros((0, getattr(model, "embedding_dim", 0)), np.float32)


def normalize_nchw(batch: torch.Tensor) -> torch.Tensor:
    """(N,3,H,W) uint8 (as a DataLoader yields) -> normalised float32, channels_last."""
    return batch.float().sub_(PIXEL_MEAN).div_(PIXEL_STD).contiguous(memory_format=torch.channels_last)
