"""Classical reference features for aligned faces: uniform LBP histograms and PCA.

They give the learned models a floor to beat. Input is a batch of aligned faces
shaped (N, H, W, 3), normally 112x112 RGB uint8.
"""
from __future__ import annotations

import numpy as np

from facecore.errors import FaceCoreError

GRID = 7
N_BINS = 59  # 58 uniform 8-bit patterns + 1 shared bin for all the others
_CHUNK = 256  # faces per chunk: bounds the int64 bin indices to ~25 MB

# Neighbour offsets (dy, dx) of the 3x3 ring; neighbour p sets bit p. With R=1 the
# ring is taken on the pixel grid rather than interpolated on a circle.
NEIGHBOURS: tuple[tuple[int, int], ...] = (
    (-1, -1), (-1, 0), (-1, 1), (0, 1), (1, 1), (1, 0), (1, -1), (0, -1),
)


def _uniform_table() -> np.ndarray:
    codes = np.arange(256)
    bits = (codes[:, None] >> np.arange(8)) & 1
    transitions = np.sum(bits != np.roll(bits, 1, axis=1), axis=1)
    uniform = transitions <= 2
    table = np.full(256, N_BINS - 1, dtype=np.int64)
    table[uniform] = np.arange(int(uniform.sum()))  # uniform codes in increasing order
    return table


UNIFORM_BIN = _uniform_table()


def _check_faces(faces: np.ndarray) -> np.ndarray:
    x = np.asarray(faces)
    if x.ndim != 4 or x.shape[-1] != 3 or x.shape[0] == 0:
        raise FaceCoreError(f"faces must be a non-empty (N, H, W, 3) array, got shape {x.shape}")
    if x.shape[1] < GRID + 2 or x.shape[2] < GRID + 2:
        raise FaceCoreError(f"faces of {x.shape[1]}x{x.shape[2]} are too small for the LBP grid")
    return x


def grayscale(faces: np.ndarray) -> np.ndarray:
    """ITU-R BT.601 luma of (N, H, W, 3) faces as float32 (N, H, W)."""
    x = _check_faces(faces)
    return x.astype(np.float32) @ np.array([0.299, 0.587, 0.114], dtype=np.float32)


def lbp_codes(gray: np.ndarray) -> np.ndarray:
    """Raw 8-bit LBP codes of (N, H, W) images for the interior (N, H-2, W-2).

    Bit p is set when neighbour p (see NEIGHBOURS) is >= the centre pixel.
    """
    g = np.asarray(gray)
    h, w = g.shape[1] - 2, g.shape[2] - 2
    centre = g[:, 1 : 1 + h, 1 : 1 + w]
    codes = np.zeros(centre.shape, dtype=np.uint8)
    for bit, (dy, dx) in enumerate(NEIGHBOURS):
        neighbour = g[:, 1 + dy : 1 + dy + h, 1 + dx : 1 + dx + w]
        codes |= (neighbour >= centre).astype(np.uint8) << bit
    return codes


def lbp_histograms(faces: np.ndarray) -> np.ndarray:
    """Raw counts (N, 49, 59) of uniform-LBP bins per cell of the 7x7 grid.

    The code map is cropped to its central region whose sides divide by 7 (105x105
    for 112x112 faces), so every cell has the same pixel count.
    """
    x = _check_faces(faces)
    n = x.shape[0]
    ch, cw = (x.shape[1] - 2) // GRID, (x.shape[2] - 2) // GRID
    top, left = (x.shape[1] - 2 - ch * GRID) // 2, (x.shape[2] - 2 - cw * GRID) // 2
    # Cell index of every pixel of the cropped code map, row-major over the grid.
    cell = (np.arange(GRID * ch)[:, None] // ch) * GRID + np.arange(GRID * cw)[None, :] // cw
    out = np.empty((n, GRID * GRID, N_BINS), dtype=np.int64)
    for start in range(0, n, _CHUNK):
        stop = min(start + _CHUNK, n)
        codes = lbp_codes(grayscale(x[start:stop]))
        codes = codes[:, top : top + GRID * ch, left : left + GRID * cw]
        face = np.arange(stop - start)[:, None, None]
        # One bincount over (face, cell, bin) replaces a Python loop over cells.
        flat = (face * GRID * GRID + cell[None]) * N_BINS + UNIFORM_BIN[codes]
        counts = np.bincount(flat.ravel(), minlength=(stop - start) * GRID * GRID * N_BINS)
        out[start:stop] = counts.reshape(stop - start, GRID * GRID, N_BINS)
    return out


def lbp_features(faces: np.ndarray) -> np.ndarray:
    """(N, 2891) float32 LBP descriptors, square-rooted (Hellinger) and L2-normalised.

    After the square root, the dot product of two unit descriptors is the
    Bhattacharyya coefficient of their histograms, so cosine similarity is a
    meaningful face-matching score.
    """
    hist = lbp_histograms(faces).reshape(len(faces), -1).astype(np.float32)
    feats = np.sqrt(hist)
    return feats / np.maximum(np.linalg.norm(feats, axis=1, keepdims=True), 1e-12)


def _top_singular(xc: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Top-k singular values and right singular vectors (k, D) of a centred matrix.

    A full SVD of 2,000 x 12,544 takes a minute or more on 2 cores; eigendecomposing
    the smaller Gram (or covariance) matrix gives the same leading subspace in seconds.
    """
    if xc.shape[0] <= xc.shape[1]:
        evals, u = np.linalg.eigh(xc @ xc.T)
        order = np.argsort(evals)[::-1][:k]
        s = np.sqrt(np.clip(evals[order], 0.0, None))
        vt = u[:, order].T @ xc
        # Gram eigenvalues carry ~1e-16 * max absolute error, so singular values
        # below ~1e-8 * max are noise: zero those directions instead of amplifying it.
        ok = s > 1e-6 * max(float(s[0]), 1e-300)
        vt[ok] /= s[ok, None]
        vt[~ok] = 0.0
        return s, vt
    evals, v = np.linalg.eigh(xc.T @ xc)
    order = np.argsort(evals)[::-1][:k]
    return np.sqrt(np.clip(evals[order], 0.0, None)), v[:, order].T


class PCABaseline:
    """Eigenfaces with whitening.

    Each face becomes a grayscale vector standardised per image (zero mean, unit
    std), which removes global brightness and contrast; PCA is then fit on those
    vectors, centred by the training mean.
    """

    def __init__(self) -> None:
        self.mean_: np.ndarray | None = None
        self.components_: np.ndarray | None = None  # (k, H*W), orthonormal rows
        self.scales_: np.ndarray | None = None  # per-component std of projections

    @staticmethod
    def preprocess(faces: np.ndarray) -> np.ndarray:
        """(N, H*W) float64 grayscale vectors, standardised per image."""
        v = grayscale(faces).reshape(len(faces), -1).astype(np.float64)
        v -= v.mean(axis=1, keepdims=True)
        # A flat image has std 0; leave it all zeros rather than dividing by 0.
        return v / np.maximum(v.std(axis=1, keepdims=True), 1e-8)

    def fit(
        self, faces: np.ndarray, n_components: int = 128, max_samples: int = 2000, seed: int = 0
    ) -> PCABaseline:
        """Fit on at most ``max_samples`` faces (a seeded random subsample) and return self."""
        x = _check_faces(faces)
        if len(x) > max_samples:
            x = x[np.sort(np.random.default_rng(seed).choice(len(x), max_samples, replace=False))]
        v = self.preprocess(x)
        if not 1 <= n_components <= min(v.shape):
            raise FaceCoreError(
                f"n_components must lie in [1, {min(v.shape)}] for {v.shape[0]} faces "
                f"of {v.shape[1]} pixels, got {n_components}"
            )
        self.mean_ = v.mean(axis=0)
        s, vt = _top_singular(v - self.mean_, n_components)
        self.components_ = vt
        std = s / np.sqrt(max(len(v) - 1, 1))
        # Floor near-zero variances so whitening does not blow up rank-deficient data.
        self.scales_ = np.maximum(std, 1e-6 * max(float(std[0]), 1e-12))
        return self

    def _fitted(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self.mean_ is None or self.components_ is None or self.scales_ is None:
            raise FaceCoreError("PCABaseline must be fit before use")
        return self.mean_, self.components_, self.scales_

    def transform(self, faces: np.ndarray) -> np.ndarray:
        """Whitened projections (N, k) as float32: unit variance on the training set."""
        mean, comps, scales = self._fitted()
        v = self.preprocess(_check_faces(faces))
        if v.shape[1] != mean.size:
            raise FaceCoreError(f"faces have {v.shape[1]} pixels, PCA was fit on {mean.size}")
        return (((v - mean) @ comps.T) / scales).astype(np.float32)

    def inverse_transform(self, projections: np.ndarray) -> np.ndarray:
        """Standardised grayscale vectors (N, H*W) rebuilt from whitened projections."""
        mean, comps, scales = self._fitted()
        return (np.asarray(projections, dtype=np.float64) * scales) @ comps + mean
