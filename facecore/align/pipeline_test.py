"""Alignment on real LFW photos through each real detector."""
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from facecore.align.cache import AlignedFaceCache
from facecore.align.detectors import DETECTORS, FaceDetector, load_detector
from facecore.align.pipeline import FaceAligner, file_key
from facecore.align.template import ARCFACE_TEMPLATE, apply_transform, similarity_transform

LFW_SAMPLES = [
    "Aaron_Eckhart/Aaron_Eckhart_0001.jpg",
    "Colin_Powell/Colin_Powell_0001.jpg",
    "Serena_Williams/Serena_Williams_0003.jpg",
    "Tony_Blair/Tony_Blair_0010.jpg",
    "Laura_Bush/Laura_Bush_0002.jpg",
    "Hugo_Chavez/Hugo_Chavez_0005.jpg",
]


class RefusingDetector:
    """Stands in for a detector where the test asserts that no detection happens."""

    name, version = "tinyface", "refusing"

    def detect(self, images: list[np.ndarray]) -> list[None]:
        raise AssertionError("the detector ran although every image was cached")


@pytest.fixture(scope="module", params=DETECTORS)
def detector(request: pytest.FixtureRequest) -> FaceDetector:
    return load_detector(request.param)


def _samples(real_data: Path) -> list[Path]:
    return [real_data / "lfw" / "lfw-deepfunneled" / name for name in LFW_SAMPLES]


def test_aligned_landmarks_lie_within_3px_of_the_template(real_data: Path, tmp_path: Path, detector: FaceDetector) -> None:
    # Prepare
    cache = AlignedFaceCache(tmp_path)
    paths = _samples(real_data)
    # Execute
    aligned = FaceAligner(cache, detector).align_paths(paths, progress=False)
    entries = cache.lookup([file_key(p) for p in paths])
    # Assert: the detected landmarks, carried through the warp, sit on the template
    assert aligned.statuses == ("ok",) * len(LFW_SAMPLES)
    warped = [apply_transform(similarity_transform(np.array(e.landmarks), ARCFACE_TEMPLATE), np.array(e.landmarks)) for e in entries.values()]
    errors = [float(np.linalg.norm(w - ARCFACE_TEMPLATE, axis=1).mean()) for w in warped]
    assert float(np.mean(errors)) < 3.0, errors
    # ... and the pixels agree: the detector run again on the crops (padded, since a face that fills the
    # frame is larger than either detector expects) finds the landmarks near the template too
    pad = 56
    redetected = detector.detect([np.pad(f, ((pad, pad), (pad, pad), (0, 0)), mode="edge") for f in aligned.faces])
    again = [float(np.linalg.norm(d.landmarks - pad - ARCFACE_TEMPLATE, axis=1).mean()) for d in redetected if d is not None]
    assert len(again) == len(LFW_SAMPLES) and float(np.mean(again)) < 4.0, again


def test_second_pass_reads_the_cache_without_detecting(real_data: Path, tmp_path: Path, detector: FaceDetector) -> None:
    # Prepare
    first = FaceAligner(AlignedFaceCache(tmp_path), detector).align_paths(_samples(real_data)[:3], progress=False)
    # Execute: a fresh aligner whose detector fails if called
    second = FaceAligner(AlignedFaceCache(tmp_path), RefusingDetector()).align_paths(_samples(real_data)[:3], progress=False)  # type: ignore[arg-type]
    # Assert
    np.testing.assert_array_equal(first.faces, second.faces)


def test_faceless_and_corrupt_images_are_listed_and_the_run_continues(
    real_data: Path, tmp_path: Path, detector: FaceDetector
) -> None:
    # Prepare
    blank = tmp_path / "blank_wall.jpg"
    Image.fromarray(np.full((200, 200, 3), 128, np.uint8)).save(blank)
    corrupt = tmp_path / "truncated.jpg"
    corrupt.write_bytes(b"\xff\xd8\xff\xe0 not really a jpeg")
    paths = [_samples(real_data)[0], blank, corrupt]
    # Execute
    aligned = FaceAligner(AlignedFaceCache(tmp_path / "cache"), detector).align_paths(paths, progress=False)
    # Assert
    assert aligned.statuses == ("ok", "noface", "unreadable")
    assert aligned.with_status("noface") == [blank] and aligned.with_status("unreadable") == [corrupt]
    assert len(aligned.faces) == 1 and list(aligned.kept) == [0]
    assert "1 without a face" in aligned.summary() and "1 unreadable" in aligned.summary()
