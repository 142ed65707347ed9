import json
from pathlib import Path

import numpy as np
import pytest

from facecore.align.cache import AlignedFaceCache
from facecore.align.geometry import ARCFACE_112, FaceGeometry, geometry_of, scaled_arcface
from facecore.align.photos import load_rgb
from facecore.align.pipeline import FaceAligner, file_key
from facecore.align.template import ARCFACE_TEMPLATE
from facecore.models.dlib_resnet import DLIB_GEOMETRY
from facecore.models.registry import get_backbone


def _blob_image(points: np.ndarray, size: int = 300, sigma: float = 2.0) -> np.ndarray:
    yy, xx = np.mgrid[0:size, 0:size].astype(np.float64)
    # Pixel centres sit at integer coordinates, as the warp's matrices assume.
    intensity = sum(np.exp(-((xx - x) ** 2 + (yy - y) ** 2) / (2 * sigma**2)) for x, y in points)
    return np.repeat((255 * np.clip(intensity, 0, 1)).astype(np.uint8)[..., None], 3, axis=2)


def _centroid_near(channel: np.ndarray, x: float, y: float, radius: int = 6) -> tuple[float, float]:
    x0, y0 = int(round(x)) - radius, int(round(y)) - radius
    window = channel[y0 : y0 + 2 * radius + 1, x0 : x0 + 2 * radius + 1].astype(np.float64)
    window = np.where(window > 0.3 * window.max(), window, 0.0)
    yy, xx = np.mgrid[0 : window.shape[0], 0 : window.shape[1]]
    return float((xx * window).sum() / window.sum() + x0), float((yy * window).sum() / window.sum() + y0)


@pytest.mark.parametrize("geometry", [ARCFACE_112, DLIB_GEOMETRY, scaled_arcface(150, 0.9, 5.0)], ids=lambda g: g.key)
def test_landmarks_land_on_the_declared_template_within_one_pixel(geometry: FaceGeometry) -> None:
    # Prepare: five marks at a rotated, scaled, shifted copy of the ArcFace points in a larger photo
    angle, scale, shift = 0.25, 1.6, np.array([70.0, 40.0])
    rotation = np.array([[np.cos(angle), -np.sin(angle)], [np.sin(angle), np.cos(angle)]])
    landmarks = scale * ARCFACE_TEMPLATE @ rotation.T + shift
    image = _blob_image(landmarks)
    # Execute
    face = FaceAligner(geometry=geometry).warp(image, landmarks)
    # Assert
    assert face.shape == geometry.row_shape
    for expected in geometry.points:
        found = _centroid_near(face[..., 0], *expected)
        assert np.hypot(found[0] - expected[0], found[1] - expected[1]) < 1.0, (geometry.key, expected, found)


def test_scaled_arcface_keeps_the_template_shape_and_names_its_parameters() -> None:
    # Prepare / Execute
    plain, moved = scaled_arcface(150), scaled_arcface(150, 1.2, 10.0)
    # Assert: same shape as ArcFace up to scale and shift, keys that tell the crops apart
    np.testing.assert_allclose(plain.points, ARCFACE_TEMPLATE * 150 / 112, atol=1e-9)
    centre = np.array([75.0, 75.0])
    np.testing.assert_allclose(moved.points + [0.0, 10.0] - centre, (plain.points - centre) * 1.2, atol=1e-9)
    assert ARCFACE_112.key == "arcface112" and moved.key == "arcface150-s1.2-up10"
    with pytest.raises(ValueError, match="^template points of 'arcface112-s3-up0' must lie inside the 112px crop$"):
        scaled_arcface(112, 3.0)  # points outside the crop


def test_each_backbone_declares_its_crop() -> None:
    # Prepare / Execute / Assert
    assert geometry_of(get_backbone("mobilefacenet")) == ARCFACE_112
    dlib = get_backbone("dlib-resnet")
    assert geometry_of(dlib) == DLIB_GEOMETRY and DLIB_GEOMETRY.size == dlib.input_size == 150


@pytest.mark.slow
def test_a_new_geometry_reuses_the_112_detections_without_running_the_detector(real_data: Path, tmp_path: Path) -> None:
    # Prepare: four LFW photos detected once into a 112 cache
    photos = sorted((real_data / "lfw").glob("lfw*/Aaron_Peirsol/*.jpg"))[:4]
    detections = AlignedFaceCache(tmp_path / "a112")
    first = FaceAligner(detections).align_paths(photos, progress=False)
    # Execute
    aligner = FaceAligner(AlignedFaceCache(tmp_path / "dlib", DLIB_GEOMETRY.size), geometry=DLIB_GEOMETRY, landmark_source=detections)
    second = aligner.align_paths(photos, progress=False)
    # Assert: same verdicts, crops of the new size, and MTCNN was never loaded for them
    assert first.statuses == second.statuses and len(second.kept) == len(first.kept) > 0
    assert second.faces.shape[1:] == DLIB_GEOMETRY.row_shape
    assert aligner._detector is None
    photo = photos[int(second.kept[0])]
    (entry,) = detections.lookup([file_key(photo)]).values()
    image = load_rgb(photo)
    assert image is not None
    np.testing.assert_array_equal(aligner.warp(image, np.asarray(entry.landmarks)), second.faces[0])


@pytest.mark.slow
def test_detections_made_for_a_new_geometry_also_fill_the_112_cache(real_data: Path, tmp_path: Path) -> None:
    # Prepare: two of four photos already detected
    photos = sorted((real_data / "lfw").glob("lfw*/Aaron_Peirsol/*.jpg"))[:4]
    detections = AlignedFaceCache(tmp_path / "a112")
    FaceAligner(detections).align_paths(photos[:2], progress=False)
    # Execute
    FaceAligner(AlignedFaceCache(tmp_path / "dlib", DLIB_GEOMETRY.size), geometry=DLIB_GEOMETRY, landmark_source=detections).align_paths(photos, progress=False)
    # Assert: the 112 cache now knows all four, with the crops a 112 aligner makes
    known = detections.lookup([file_key(p) for p in photos])
    assert len(known) == 4
    fresh = FaceAligner(AlignedFaceCache(tmp_path / "fresh")).align_paths(photos[2:], progress=False)
    np.testing.assert_array_equal(detections.faces([known[file_key(p)].row for p in photos[2:]]), fresh.faces)


def test_a_geometry_survives_its_json_form() -> None:
    # Prepare / Execute: what manifests, /v1/models and the figures files carry
    restored = FaceGeometry.from_json(json.loads(json.dumps(DLIB_GEOMETRY.to_json())))
    # Assert
    assert restored == DLIB_GEOMETRY and restored.row_shape == (150, 150, 3)
