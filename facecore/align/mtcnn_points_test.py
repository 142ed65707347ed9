"""MTCNN's point nets on boxes found by another detector, on real LFW photos."""
from pathlib import Path

import numpy as np
import pytest

from facecore.align.mtcnn_points import MtcnnPoints
from facecore.align.onnx_detector import OnnxMTCNN
from facecore.align.photos import load_rgb


@pytest.fixture(scope="module")
def photos(real_data: Path) -> list[np.ndarray]:
    paths = sorted((real_data / "lfw" / "lfw-deepfunneled").glob("*/*.jpg"))
    return [load_rgb(paths[i]) for i in np.linspace(17, len(paths) - 1, 8).astype(int)]  # type: ignore[misc]


def test_a_loose_box_gets_mtcnns_points(photos: list[np.ndarray]) -> None:
    # Prepare: MTCNN's own box of each face, grown by a fifth and moved by a tenth of its side
    found = OnnxMTCNN().detect(photos)
    assert all(f is not None for f in found)
    grown, moved = np.array([-0.1, -0.1, 0.1, 0.1]), np.array([0.1, 0.0, 0.1, 0.0])
    loose = [f.box + (f.box[2] - f.box[0]) * (grown + moved) for f in found]  # type: ignore[union-attr]
    # Execute
    points = MtcnnPoints().place(photos, loose)
    # Assert: RNet's two passes move the box back, so the points land within a pixel or two of MTCNN's
    # (bounds that ONet alone, or a single RNet pass, does not meet)
    gaps = np.array([np.abs(p - f.landmarks).max() for p, f in zip(points, found)])  # type: ignore[union-attr]
    assert np.median(gaps) < 2.0 and gaps.max() < 4.0, gaps


def test_only_the_region_around_the_box_matters(photos: list[np.ndarray]) -> None:
    # Prepare: the same photo alone, and placed in a much larger grey canvas (as a face far from a phone's camera)
    photo = photos[3]
    canvas = np.full((1200, 1600, 3), 90, np.uint8)
    canvas[500:750, 700:950] = photo
    box = np.array([70.0, 70.0, 180.0, 185.0])
    points = MtcnnPoints()
    # Execute
    alone, placed = points.place([photo, canvas], [box, box + np.array([700.0, 500.0, 700.0, 500.0])])
    # Assert: the same points, shifted by where the photo lies in the canvas
    np.testing.assert_allclose(placed - [700.0, 500.0], alone, atol=1e-3)


def test_one_batch_gives_what_boxes_one_by_one_give(photos: list[np.ndarray]) -> None:
    # Prepare
    boxes = [np.array([60.0, 55.0, 190.0, 195.0])] * len(photos)
    points = MtcnnPoints()
    # Execute
    together = points.place(photos, boxes)
    alone = np.concatenate([points.place([photo], [box]) for photo, box in zip(photos, boxes)])
    # Assert
    np.testing.assert_allclose(together, alone, atol=1e-4)


def test_a_box_over_the_photos_corner_still_gets_five_points(photos: list[np.ndarray]) -> None:
    # Prepare: a box hanging over the top-left corner
    box = np.array([-40.0, -30.0, 90.0, 100.0])
    # Execute
    (five,) = MtcnnPoints().place([photos[0]], [box])
    # Assert
    assert five.shape == (5, 2) and np.isfinite(five).all()
