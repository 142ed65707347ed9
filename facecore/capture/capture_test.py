"""Capture models change crops the way their cameras would, reproducibly per (seed, stream, photo)."""
import numpy as np
import pytest

from facecore.align.geometry import ARCFACE_112, FaceGeometry, scaled_arcface
from facecore.capture import CAPTURES, UnknownCapture, get_capture

# Small crops keep every test fast; the physics only reads the geometry's template points.
SMALL = scaled_arcface(48)


def _faces(n: int, geometry: FaceGeometry = SMALL, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(40, 220, size=(n, *geometry.row_shape), dtype=np.uint8)


@pytest.mark.parametrize("name", sorted(CAPTURES))
def test_the_same_seed_stream_and_photo_capture_the_same_and_another_stream_differs(name: str) -> None:
    # Prepare
    model, faces = get_capture(name), _faces(3)
    # Execute
    first = model.capture(faces, SMALL, seed=7, stream=1)
    again = model.capture(faces, SMALL, seed=7, stream=1)
    alone = model.capture(faces[2:], SMALL, seed=7, stream=1)
    other = model.capture(faces, SMALL, seed=7, stream=2)
    # Assert: shape and dtype kept, repeatable, and a photo's draws depend on its index, not its batch-mates
    assert first.shape == faces.shape and first.dtype == np.uint8
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(alone[0], first[2])  # index 0 of another batch draws as photo 0
    assert not np.array_equal(first, other)
    assert not np.array_equal(first, faces)


def test_lowlight_ir_gives_grey_crops() -> None:
    # Prepare: coloured crops
    faces = _faces(2)
    # Execute
    out = get_capture("lowlight-ir").capture(faces, SMALL, seed=0)
    # Assert
    np.testing.assert_array_equal(out[..., 0], out[..., 1])
    np.testing.assert_array_equal(out[..., 0], out[..., 2])


def _light_side(seed: int, index: int) -> float:
    """The `side` that photo `index` of stream 0 draws: `capture` samples first from this generator."""
    model = get_capture("lowlight-ir")
    return model.sample(np.random.default_rng([seed, 0, index]))["side"]


@pytest.mark.parametrize("from_right", [True, False])
def test_lowlight_ir_lit_from_one_side_is_brighter_on_that_side(from_right: bool) -> None:
    # Prepare: a uniform grey face, and a seed whose photo 0 is lit from the wanted side (side >= 0.5: image right)
    seed = next(s for s in range(100) if (_light_side(s, 0) >= 0.5) == from_right)
    face = np.full((1, *ARCFACE_112.row_shape), 128, np.uint8)
    # Execute
    out = get_capture("lowlight-ir").capture(face, ARCFACE_112, seed=seed)[0, ..., 0].astype(np.float64)
    # Assert
    half = ARCFACE_112.size // 2
    left, right = out[:, :half].mean(), out[:, half:].mean()
    assert (right > left + 10) if from_right else (left > right + 10), (left, right)


def _high_frequency_energy(faces: np.ndarray) -> float:
    grey = faces.astype(np.float64).mean(-1)
    spectrum = np.abs(np.fft.fftshift(np.fft.fft2(grey - grey.mean(axis=(1, 2), keepdims=True)), axes=(1, 2))) ** 2
    size = grey.shape[1]
    ys, xs = np.mgrid[0:size, 0:size] - size // 2
    return float(spectrum[:, np.hypot(xs, ys) > size / 4].sum())


def test_far_takes_away_fine_detail() -> None:
    # Prepare: a checkerboard of 2-pixel squares, all fine detail
    squares = (np.indices(ARCFACE_112.row_shape[:2]) // 2).sum(0) % 2
    board = np.repeat((40 + 180 * squares).astype(np.uint8)[None, ..., None], 3, axis=-1).repeat(2, axis=0)
    # Execute
    out = get_capture("far").capture(board, ARCFACE_112, seed=0)
    # Assert: at most a tenth of the high-frequency energy is left
    assert _high_frequency_energy(out) < 0.1 * _high_frequency_energy(board)


def test_an_unknown_capture_is_refused_naming_the_choices() -> None:
    # Execute / Assert
    with pytest.raises(UnknownCapture, match="'nope'.*lowlight-ir.*far"):
        get_capture("nope")


@pytest.mark.parametrize("shape", [(2, 48, 48), (2, 40, 40, 3), (48, 48, 3)])
def test_crops_not_of_the_geometry_are_refused(shape: tuple[int, ...]) -> None:
    # Execute / Assert
    with pytest.raises(ValueError, match="aligned crops of shape"):
        get_capture("far").capture(np.zeros(shape, np.uint8), SMALL, seed=0)
