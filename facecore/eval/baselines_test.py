from __future__ import annotations

import re

import numpy as np
import pytest

from facecore.errors import FaceCoreError
from facecore.eval.baselines import (
    N_BINS,
    UNIFORM_BIN,
    PCABaseline,
    lbp_codes,
    lbp_features,
    lbp_histograms,
)


def _smooth_face(rng: np.random.Generator, size: int = 112) -> np.ndarray:
    """A random smooth RGB image: a sum of low-frequency waves, so LBP codes are stable."""
    yy, xx = np.mgrid[0:size, 0:size] / size
    img = np.zeros((size, size))
    for _ in range(12):
        fy, fx = rng.uniform(-6, 6, size=2)
        img += rng.uniform(0.5, 1.0) * np.sin(2 * np.pi * (fy * yy + fx * xx) + rng.uniform(0, 6.3))
    img = (img - img.min()) / (img.max() - img.min()) * 200 + 25
    return np.repeat(img[:, :, None], 3, axis=2)


def _noisy(face: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    return np.clip(face + rng.normal(0, 2.0, size=face.shape), 0, 255).astype(np.uint8)


def _cos(a: np.ndarray, b: np.ndarray) -> float:
    return float(a @ b / (np.linalg.norm(a) * np.linalg.norm(b)))


def test_lbp_shapes_and_unit_norm() -> None:
    # Prepare
    faces = np.random.default_rng(0).integers(0, 256, size=(3, 112, 112, 3), dtype=np.uint8)
    # Execute
    hist = lbp_histograms(faces)
    feats = lbp_features(faces)
    # Assert: 105x105 central crop -> 15x15 pixels per cell
    assert hist.shape == (3, 49, N_BINS)
    assert np.all(hist.sum(axis=2) == 15 * 15)
    assert feats.shape == (3, 49 * N_BINS) and feats.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(feats, axis=1), 1.0, rtol=1e-5)


def test_uniform_table_has_58_uniform_codes() -> None:
    # Prepare
    uniform_codes = [0, 0b00001111, 0b11110000, 0b10000001, 255]
    # Execute
    bins = UNIFORM_BIN[uniform_codes]
    # Assert
    assert np.sum(UNIFORM_BIN < N_BINS - 1) == 58
    assert np.all(bins < N_BINS - 1) and bins[0] == 0 and bins[-1] == 57
    assert UNIFORM_BIN[0b01010101] == N_BINS - 1


def test_constant_image_puts_all_mass_in_one_bin_per_cell() -> None:
    # Prepare
    faces = np.full((2, 112, 112, 3), 128, dtype=np.uint8)
    # Execute
    hist = lbp_histograms(faces)
    feats = lbp_features(faces)
    # Assert: every neighbour equals the centre, so every code is 255
    assert np.all(hist[:, :, UNIFORM_BIN[255]] == 15 * 15)
    assert np.all(np.count_nonzero(hist, axis=2) == 1)
    assert np.count_nonzero(feats[0]) == 49
    np.testing.assert_allclose(feats[0][feats[0] > 0], 1 / 7, rtol=1e-6)


def test_lbp_code_of_known_pattern() -> None:
    # Prepare: centre 50; bits are set by top-left 60, top-right 50 (tie), bottom-right 70, left 90
    gray = np.array([[[60, 40, 50], [90, 50, 10], [30, 20, 70]]], dtype=np.float32)
    # Execute
    codes = lbp_codes(gray)
    # Assert
    assert codes.shape == (1, 1, 1)
    assert int(codes[0, 0, 0]) == 0b10010101
    assert UNIFORM_BIN[codes[0, 0, 0]] == N_BINS - 1  # six transitions: not uniform


def test_pca_reconstructs_rank_k_data() -> None:
    # Prepare: 60 grey 32x32 faces spanning 5 zero-mean orthonormal directions, so
    # per-image standardisation only rescales each face inside that span
    rng = np.random.default_rng(1)
    basis = rng.normal(size=(1024, 5))
    basis, _ = np.linalg.qr(basis - basis.mean(axis=0))
    vectors = rng.normal(size=(60, 5)) @ basis.T
    faces = np.repeat(vectors.reshape(60, 32, 32, 1), 3, axis=3)
    # Execute
    pca = PCABaseline().fit(faces, n_components=5)
    z = pca.transform(faces)
    rebuilt = pca.inverse_transform(z)
    truncated = PCABaseline().fit(faces, n_components=4)
    rebuilt4 = truncated.inverse_transform(truncated.transform(faces))
    # Assert
    target = PCABaseline.preprocess(faces)
    np.testing.assert_allclose(rebuilt, target, atol=1e-4)
    np.testing.assert_allclose(z.std(axis=0, ddof=1), 1.0, rtol=1e-4)  # whitened
    assert np.abs(rebuilt4 - target).max() > 0.1


def test_noisy_copies_score_higher_than_different_faces() -> None:
    # Prepare
    rng = np.random.default_rng(2)
    face_a, face_b = _smooth_face(rng), _smooth_face(rng)
    a1, a2, b1 = _noisy(face_a, rng), _noisy(face_a, rng), _noisy(face_b, rng)
    train = np.stack([_noisy(_smooth_face(rng), rng) for _ in range(40)])
    # Execute
    lbp = lbp_features(np.stack([a1, a2, b1]))
    pca = PCABaseline().fit(train, n_components=32).transform(np.stack([a1, a2, b1]))
    # Assert
    assert _cos(lbp[0], lbp[1]) > _cos(lbp[0], lbp[2]) + 0.05
    assert _cos(pca[0], pca[1]) > _cos(pca[0], pca[2]) + 0.05


def test_bad_input_raises() -> None:
    # Prepare
    gray_batch = np.zeros((2, 112, 112), dtype=np.uint8)
    # Execute / Assert
    with pytest.raises(FaceCoreError, match=re.escape("faces must be a non-empty (N, H, W, 3) array, got shape (2, 112, 112)")):
        lbp_features(gray_batch)
    with pytest.raises(FaceCoreError, match="fit"):
        PCABaseline().transform(np.zeros((1, 112, 112, 3), dtype=np.uint8))
    with pytest.raises(FaceCoreError, match="n_components"):
        PCABaseline().fit(np.zeros((3, 16, 16, 3)), n_components=10)
