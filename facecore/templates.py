"""The owner's class embedding as FedFace starts it: the normalised mean of the normalised features.

Invariants:
- numpy only: enrollment computes it from the ONNX model's features (device_sdk.inference) without
  torch, and the simulator from the torch backbone's; both call this one function, so a simulated
  device starts from exactly the template a phone would.
- The template is a (D,) float32 unit vector, and its length before normalising is kept apart
  (`mean_feature_length`); the mean is taken in float64, so the order of the
  photos does not move it by more than rounding.
"""
from __future__ import annotations

import numpy as np
import numpy.typing as npt

from facecore.errors import FaceCoreError


def _mean_of_unit_rows(features: npt.ArrayLike) -> np.ndarray:
    f = np.asarray(features, dtype=np.float64)
    if f.ndim != 2 or len(f) == 0:
        raise FaceCoreError(f"need (N, D) features of at least one face, got shape {f.shape}")
    return (f / np.linalg.norm(f, axis=1, keepdims=True)).mean(0)


def mean_feature_embedding(features: npt.ArrayLike) -> np.ndarray:
    """FedFace's class-embedding initialisation from (N, D) features (a numpy array, or anything
    np.asarray reads, such as a CPU torch tensor): the L2-normalised mean of the L2-normalised rows."""
    mean = _mean_of_unit_rows(features)
    return (mean / np.linalg.norm(mean)).astype(np.float32)


def mean_feature_length(features: npt.ArrayLike) -> float:
    """The length of the mean of the L2-normalised rows, in (0, 1]: 1 when every photo gives the same
    feature. The template times this length is the mean feature itself, which a loss on centred
    features needs as its target (device_sdk.training.train_local's `template_length`)."""
    return float(np.linalg.norm(_mean_of_unit_rows(features)))


__all__ = ["mean_feature_embedding", "mean_feature_length"]
