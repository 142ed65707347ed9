"""Choosing a detector by name, the tight-crop retry's coordinates, and crops cached per detector."""
from pathlib import Path

import numpy as np
import pytest

from facecore.align.detector import Detection
from facecore.align.detectors import (
    DETECTOR_ENV,
    ThenOnMisses,
    TightCropRetry,
    UnknownDetector,
    detector_name,
    detector_version,
    load_detector,
    pad_photo,
)
from facecore.align.pipeline import FaceAligner, aligner_version


class OnlySmallFaces:
    """Finds a 'face' only when the photo is at least twice as large as the bright square it holds, and puts
    its landmarks on that square's corners and centre: a scene detector that misses a tight crop."""

    name, version = "fake", "fake-1"

    def __init__(self) -> None:
        self.calls: list[list[tuple[int, ...]]] = []

    def detect(self, images: list[np.ndarray]) -> list[Detection | None]:
        self.calls.append([image.shape for image in images])
        found: list[Detection | None] = []
        for image in images:
            rows, cols = np.nonzero(image[..., 0] > 200)
            if not len(rows) or image.shape[0] < 2 * (rows.max() - rows.min() + 1):
                found.append(None)
                continue
            x1, y1, x2, y2 = cols.min(), rows.min(), cols.max(), rows.max()
            points = np.array([[x1, y1], [x2, y1], [(x1 + x2) / 2, (y1 + y2) / 2], [x1, y2], [x2, y2]], np.float64)
            found.append(Detection(np.array([x1, y1, x2, y2], np.float64), 0.9, points))
        return found


def test_a_miss_is_retried_padded_and_its_landmarks_map_back_to_the_photo() -> None:
    # Prepare: a photo that is all 'face' (a tight crop), and one with room around its face
    tight = np.full((40, 40, 3), 255, np.uint8)
    roomy = np.zeros((100, 100, 3), np.uint8)
    roomy[30:50, 30:50] = 255
    inner = OnlySmallFaces()
    # Execute
    found_tight, found_roomy = TightCropRetry(inner, borders=(0.5, 1.0)).detect([tight, roomy])
    # Assert: only the miss went round again, found at the first border wide enough, in the photo's own pixels
    assert inner.calls == [[(40, 40, 3), (100, 100, 3)], [(80, 80, 3)]]
    assert found_tight is not None and found_roomy is not None
    np.testing.assert_allclose(found_tight.landmarks[[0, 4]], [[0, 0], [39, 39]])
    np.testing.assert_allclose(found_tight.box, [0, 0, 39, 39])
    np.testing.assert_allclose(found_roomy.landmarks[0], [30, 30])


def test_a_photo_no_border_rescues_stays_a_miss() -> None:
    # Prepare / Execute
    (found,) = TightCropRetry(OnlySmallFaces()).detect([np.zeros((30, 30, 3), np.uint8)])
    # Assert
    assert found is None


def test_padding_is_black_and_as_wide_as_asked() -> None:
    # Prepare
    photo = np.full((10, 20, 3), 7, np.uint8)
    # Execute
    padded, width = pad_photo(photo, 0.5)
    # Assert
    assert width == 10 and padded.shape == (30, 40, 3)
    assert padded[:10].max() == 0 and (padded[10:20, 10:30] == 7).all()


def test_the_detector_comes_from_the_argument_then_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    # Prepare
    monkeypatch.setenv(DETECTOR_ENV, "mtcnn")
    # Execute / Assert
    assert detector_name() == "mtcnn" and detector_name("tinyface") == "tinyface"
    monkeypatch.delenv(DETECTOR_ENV)
    assert detector_name() == "tinyface"
    with pytest.raises(UnknownDetector, match="unknown face detector 'yolo': choose one of tinyface, mtcnn"):
        detector_name("yolo")


def test_a_loaded_detector_carries_the_version_its_cache_is_keyed_by() -> None:
    for name in ("tinyface", "mtcnn"):
        assert load_detector(name).version == detector_version(name)
    assert detector_version("tinyface") != detector_version("mtcnn")


def test_each_detector_aligns_into_a_cache_of_its_own(real_data: Path, isolated_cache: Path) -> None:
    # Prepare: two real LFW photos
    photos = sorted((real_data / "lfw" / "lfw-deepfunneled").glob("*/*.jpg"))[:2]
    # Execute
    by_tiny = FaceAligner(detector="tinyface").align_paths(photos, progress=False)
    by_mtcnn = FaceAligner(detector="mtcnn").align_paths(photos, progress=False)
    # Assert: two cache folders, each named by its detector, and crops that differ by the landmarks' few pixels
    folders = sorted(p.name for p in isolated_cache.glob("aligned-*"))
    assert folders == sorted(f"aligned-{aligner_version(detector=name)}" for name in ("tinyface", "mtcnn"))
    assert by_tiny.statuses == by_mtcnn.statuses == ("ok", "ok")
    gap = np.abs(by_tiny.faces.astype(int) - by_mtcnn.faces.astype(int)).mean()
    assert 0 < gap < 40


def test_what_the_first_detector_misses_goes_to_the_second_built_on_first_need() -> None:
    # Prepare: a first detector that finds only roomy faces, a second that finds anything, built lazily
    tight = np.full((40, 40, 3), 255, np.uint8)
    roomy = np.zeros((100, 100, 3), np.uint8)
    roomy[30:50, 30:50] = 255
    class FindsAll(OnlySmallFaces):
        def detect(self, images: list[np.ndarray]) -> list[Detection | None]:
            return [Detection(np.zeros(4), 0.5, np.zeros((5, 2))) for _ in images]

    built: list[FindsAll] = []

    def make() -> FindsAll:
        built.append(FindsAll())
        return built[-1]

    chain = ThenOnMisses(OnlySmallFaces(), make, "all-1")
    # Execute
    first_only = chain.detect([roomy])
    both = chain.detect([roomy, tight])
    # Assert: nothing built until a miss; then only the miss is passed on
    assert first_only[0] is not None and first_only[0].score == 0.9
    assert len(built) == 1 and both[0].score == 0.9 and both[1].score == 0.5  # type: ignore[union-attr]
    assert chain.version == "fake-1-then-all-1"
