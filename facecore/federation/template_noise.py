"""Optional noise on the class embedding (template) a device uploads.

FedFace's spreadout needs every device's template on the server. A device may blur the copy it
uploads: w' = normalise(w + N(0, σ²I)). σ is calibrated by the cosine the noisy copy keeps with
the true template: for a unit w in D dimensions, cos(w, w') ≈ 1 / sqrt(1 + σ²D), so
σ = sqrt((1/c² − 1) / D). The device keeps its clean template for its own verification.

This is obfuscation, not differential privacy: a template's sensitivity is 2 (any two unit
vectors), so the σ that keeps a useful cosine (≈ 0.04 for c = 0.9, D = 128) is a noise multiplier
of ≈ 0.02, which bounds nothing. SECURITY.md says so.
"""
from __future__ import annotations

import math

import numpy as np


def sigma_for_cosine(target_cos: float, dim: int) -> float:
    """Per-coordinate σ whose noisy unit template keeps cosine ≈ target_cos with the clean one."""
    if not 0 < target_cos <= 1:
        raise ValueError(f"target cosine must be in (0, 1], got {target_cos}")
    if dim < 1:
        raise ValueError(f"dim must be >= 1, got {dim}")
    return math.sqrt((1.0 / target_cos**2 - 1.0) / dim)


def noisy_template(embedding: np.ndarray, target_cos: float, rng: np.random.Generator) -> np.ndarray:
    """The unit template blurred to keep cosine ≈ target_cos (1: unchanged)."""
    w = np.asarray(embedding, dtype=np.float64)
    w = w / np.linalg.norm(w)
    if target_cos == 1:
        return w.astype(np.float32)
    noisy = w + rng.normal(0.0, sigma_for_cosine(target_cos, w.size), w.shape)
    return (noisy / np.linalg.norm(noisy)).astype(np.float32)
