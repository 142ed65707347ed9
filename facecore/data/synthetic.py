"""Synthetic face-like images for fast unit tests ONLY. Never used in accuracy claims.

Each identity is a random set of parameters (skin tone, eye spacing, mouth width, face
shape); each photo of it adds pose jitter, lighting and noise. That is enough structure
for a backbone to learn something in a few steps, which is all tests need.
"""
from __future__ import annotations

import numpy as np

from facecore.align.template import ARCFACE_TEMPLATE, FACE_SIZE


def synthetic_faces(identities: int, per_identity: int, seed: int = 0, size: int = FACE_SIZE) -> tuple[np.ndarray, np.ndarray]:
    """(N,size,size,3) uint8 faces and (N,) int64 labels, identity-major order."""
    rng = np.random.default_rng(seed)
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float32)
    scale = size / FACE_SIZE
    faces, labels = [], []
    for identity in range(identities):
        skin = rng.uniform(80, 220, 3)
        eye_dx, mouth_w, face_w, face_h = rng.uniform(-4, 4), rng.uniform(10, 18), rng.uniform(36, 46), rng.uniform(46, 56)
        for _ in range(per_identity):
            shift = rng.normal(0, 1.5, 2) * scale
            light = rng.uniform(0.8, 1.2)
            cx, cy = 56 * scale + shift[0], 68 * scale + shift[1]
            image = np.full((size, size, 3), rng.uniform(20, 60), np.float32)
            face = ((xx - cx) / (face_w * scale)) ** 2 + ((yy - cy) / (face_h * scale)) ** 2 <= 1
            image[face] = skin * light
            for (tx, ty), r in zip(ARCFACE_TEMPLATE[:2], (4, 4)):
                ex = (tx + (eye_dx if tx > 56 else -eye_dx)) * scale + shift[0]
                image[(xx - ex) ** 2 + (yy - ty * scale - shift[1]) ** 2 <= (r * scale) ** 2] = 15
            mouth_y = ARCFACE_TEMPLATE[3, 1] * scale + shift[1]
            image[(np.abs(yy - mouth_y) <= 2 * scale) & (np.abs(xx - cx) <= mouth_w * scale)] = (150, 40, 40)
            image += rng.normal(0, 8, image.shape)
            faces.append(np.clip(image, 0, 255).astype(np.uint8))
            labels.append(identity)
    return np.stack(faces), np.array(labels, dtype=np.int64)
