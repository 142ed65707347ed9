"""The ArcFace 112x112 five-point template and the similarity warp onto it."""
from __future__ import annotations

import numpy as np
from PIL import Image

FACE_SIZE = 112
# Left eye, right eye, nose tip, left and right mouth corners, in the 112x112 crop used by
# insightface / ArcFace; every backbone here is trained on crops made with it.
ARCFACE_TEMPLATE = np.array(
    [[38.2946, 51.6963], [73.5318, 51.5014], [56.0252, 71.7366], [41.5493, 92.3655], [70.7299, 92.2041]],
    dtype=np.float64,
)


def similarity_transform(src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """Least-squares similarity (rotation, uniform scale, translation) taking src points to dst.

    Umeyama (1991), restricted to a proper rotation. Returns the 2x3 matrix M with
    dst ≈ M @ [x, y, 1].
    """
    src = np.asarray(src, dtype=np.float64)
    dst = np.asarray(dst, dtype=np.float64)
    src_mean, dst_mean = src.mean(0), dst.mean(0)
    src_c, dst_c = src - src_mean, dst - dst_mean
    cov = dst_c.T @ src_c / len(src)
    u, s, vt = np.linalg.svd(cov)
    d = np.ones(2)
    if np.linalg.det(u) * np.linalg.det(vt) < 0:
        d[-1] = -1.0
    rotation = u @ np.diag(d) @ vt
    scale = (s * d).sum() / src_c.var(0).sum()
    matrix = np.zeros((2, 3))
    matrix[:, :2] = scale * rotation
    matrix[:, 2] = dst_mean - scale * rotation @ src_mean
    return matrix


def apply_transform(matrix: np.ndarray, points: np.ndarray) -> np.ndarray:
    points = np.asarray(points, dtype=np.float64)
    return points @ matrix[:, :2].T + matrix[:, 2]


def warp_to_template(
    image: np.ndarray, landmarks: np.ndarray, size: int = FACE_SIZE, template: np.ndarray | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Warp an RGB uint8 image so its five landmarks land on `template` (the ArcFace one scaled to
    `size` when None) in a `size` x `size` crop. Returns (face, matrix)."""
    if template is None:
        template = ARCFACE_TEMPLATE * (size / FACE_SIZE)
    matrix = similarity_transform(landmarks, template)
    # PIL wants the inverse map: output pixel -> input pixel.
    inverse = np.linalg.inv(np.vstack([matrix, [0.0, 0.0, 1.0]]))[:2]
    face = Image.fromarray(image).transform(
        (size, size), Image.Transform.AFFINE, data=tuple(inverse.ravel()), resample=Image.Resampling.BILINEAR
    )
    return np.asarray(face, dtype=np.uint8), matrix
