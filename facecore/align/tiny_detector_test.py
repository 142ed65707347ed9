"""The default detector on real LFW photos: whole, cut to the face box, padded and shrunk; and its decoding."""
import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from export.tinyface_onnx import export_tinyface_onnx
from facecore.align.detector_files import DetectorCorrupt
from facecore.align.detectors import FaceDetector, TightCropRetry, load_detector
from facecore.align.onnx_detector import OnnxMTCNN, detector_dir
from facecore.align.photos import load_rgb
from facecore.align.tiny_detector import (
    ANCHORS,
    NETS,
    TinyFaceConfig,
    TinyFaceDetector,
    decode_grid,
    tinyface_dir,
    tinyface_files,
)
from facecore.onnx_session import OPTIMIZED_DIR


@pytest.fixture(scope="module")
def tinyface() -> TinyFaceDetector:
    export_tinyface_onnx()  # what `fedface models fetch` does; a no-op when the files verify
    return TinyFaceDetector()


def _lfw_photos(real_data: Path, count: int, offset: int = 0) -> list[np.ndarray]:
    """`count` photos spread evenly over all of LFW (sorted by path)."""
    paths = sorted((real_data / "lfw" / "lfw-deepfunneled").glob("*/*.jpg"))
    chosen = [paths[i] for i in np.linspace(offset, len(paths) - 1, count).astype(int)]
    images = [load_rgb(p) for p in chosen]
    assert all(image is not None for image in images)
    return images  # type: ignore[return-value]


def test_landmarks_agree_with_mtcnns_on_real_lfw_photos(real_data: Path) -> None:
    # Prepare
    photos = _lfw_photos(real_data, 40)
    # Execute
    ours, theirs = load_detector("tinyface").detect(photos), OnnxMTCNN().detect(photos)
    # Assert: every face found, and the five points where MTCNN puts them, to a pixel or two of a 250px photo
    assert all(found is not None for found in ours)
    gaps = np.array([np.abs(a.landmarks - b.landmarks).max() for a, b in zip(ours, theirs) if a and b])
    assert len(gaps) >= 38
    assert np.median(gaps) < 2.5 and gaps.max() < 6.0, gaps


def test_one_batch_gives_what_photos_one_by_one_give(real_data: Path, tinyface: TinyFaceDetector) -> None:
    # Prepare: photos of different sizes in one call
    photos = _lfw_photos(real_data, 6, offset=7)
    photos[2] = np.asarray(Image.fromarray(photos[2]).resize((400, 300)))
    # Execute
    together = tinyface.detect(photos)
    alone = [tinyface.detect([photo])[0] for photo in photos]
    # Assert
    for a, b in zip(together, alone):
        assert a is not None and b is not None
        np.testing.assert_allclose(a.landmarks, b.landmarks, atol=1e-3)


def _cut_to_face_box(photo: np.ndarray, detector: FaceDetector) -> tuple[np.ndarray, np.ndarray]:
    (found,) = detector.detect([photo])
    assert found is not None
    x1, y1, x2, y2 = (int(round(v)) for v in found.box)
    x1, y1 = max(x1, 0), max(y1, 0)
    return photo[y1:y2, x1:x2].copy(), np.array([x1, y1], np.float64)


def test_photos_cut_to_their_face_box_are_found_by_the_retry(real_data: Path, tinyface: TinyFaceDetector) -> None:
    # Prepare: LFW photos cut to MTCNN's face box, and each whole photo's landmarks
    photos = _lfw_photos(real_data, 30, offset=3)
    mtcnn = OnnxMTCNN()
    cuts = [_cut_to_face_box(photo, mtcnn) for photo in photos]
    whole = tinyface.detect(photos)
    larger = tinyface.at_input_size(160)
    # Execute
    bare = larger.detect([cut for cut, _ in cuts])
    retried = TightCropRetry(larger).detect([cut for cut, _ in cuts])
    # Assert: at 160 px the bare detector misses many such crops, the retry nearly none, with landmarks in the
    # cut's own pixels
    assert sum(found is None for found in bare) >= 10
    assert sum(found is not None for found in retried) >= 29
    for found, (_, corner), reference in zip(retried, cuts, whole):
        if found is not None and reference is not None:
            assert np.abs(found.landmarks + corner - reference.landmarks).max() < 12.0


def test_at_128_px_most_photos_cut_to_their_face_box_need_no_retry(real_data: Path, tinyface: TinyFaceDetector) -> None:
    # Prepare
    cuts = [_cut_to_face_box(photo, OnnxMTCNN())[0] for photo in _lfw_photos(real_data, 30, offset=3)]
    # Execute
    found = tinyface.detect(cuts)
    # Assert
    assert sum(f is not None for f in found) >= 27


def test_a_padded_and_shrunk_photo_is_found(real_data: Path) -> None:
    # Prepare: the face a sixth of a 120px photo
    photo = _lfw_photos(real_data, 1, offset=11)[0]
    small = np.asarray(Image.fromarray(np.pad(photo, ((125, 125), (125, 125), (0, 0)), mode="edge")).resize((120, 120)))
    # Execute
    (found,) = load_detector("tinyface").detect([small])
    # Assert: both eyes inside the photo, left of right, above the mouth
    assert found is not None
    eyes, mouth = found.landmarks[:2], found.landmarks[3:]
    assert ((eyes > 0) & (eyes < 120)).all() and eyes[0, 0] < eyes[1, 0] and eyes[:, 1].max() < mouth[:, 1].min()


def test_an_image_without_a_face_has_no_detection(tinyface: TinyFaceDetector) -> None:
    # Prepare
    flat = np.full((240, 320, 3), 128, np.uint8)
    # Execute / Assert
    assert load_detector("tinyface").detect([flat]) == [None]
    assert tinyface.detect([]) == []


def test_a_grid_decodes_to_the_cell_and_anchor_that_fired() -> None:
    # Prepare: a 7x7 grid where only anchor 2 of the cell at row 3, column 5 scores, centred in its cell
    grid = np.full((25, 7, 7), -20.0, np.float32)
    grid[2 * 5 : 2 * 5 + 4, 3, 5] = 0.0  # offsets 0: sigmoid 0.5 is the cell's centre, exp(0) the anchor's size
    grid[2 * 5 + 4, 3, 5] = 3.0
    # Execute
    boxes, scores = decode_grid(grid, 0.5)
    # Assert
    width, height = ANCHORS[2] / 7
    np.testing.assert_allclose(boxes, [[5.5 / 7 - width / 2, 3.5 / 7 - height / 2, 5.5 / 7 + width / 2, 3.5 / 7 + height / 2]],
                               rtol=1e-6)
    assert scores == pytest.approx([1 / (1 + np.exp(-3.0))])


def test_a_second_look_at_a_larger_size_shares_the_nets_and_finds_the_same_face(real_data: Path,
                                                                               tinyface: TinyFaceDetector) -> None:
    # Prepare
    photos = _lfw_photos(real_data, 4, offset=11)
    # Execute
    larger = tinyface.at_input_size(160)
    small, large = tinyface.detect(photos), larger.detect(photos)
    # Assert: one set of sessions, two versions (two caches), and the same faces to a few pixels
    assert larger._sessions is tinyface._sessions
    assert (tinyface.config.input_size, larger.config.input_size) == (128, 160)
    assert "-s128-" in tinyface.version + "-" and "-s160-" in larger.version + "-"
    for a, b in zip(small, large):
        assert a is not None and b is not None
        assert np.abs(a.landmarks - b.landmarks).max() < 6.0


def test_later_detectors_start_from_the_saved_optimised_nets_and_find_the_same_points(real_data: Path,
                                                                                    isolated_cache: Path) -> None:
    # Prepare
    photos = _lfw_photos(real_data, 6, offset=5)
    first = TinyFaceDetector()
    saved = sorted(p.name for p in (isolated_cache / OPTIMIZED_DIR).iterdir())
    # Execute: a second detector, as the next process makes one
    again = TinyFaceDetector()
    # Assert: one saved graph per net (the detector's, and MTCNN's two point nets), named by its manifest's sha256;
    # the same points, bit for bit
    digests = [json.loads((folder / "manifest.json").read_text())["files"] for folder in (tinyface_dir(), detector_dir())]
    expected = {digests[0][net]["sha256"][:32] for net in NETS} | {digests[1][net]["sha256"][:32] for net in ("rnet", "onet")}
    assert len(saved) == 3 and {name[:32] for name in saved} == expected
    assert sorted(p.name for p in (isolated_cache / OPTIMIZED_DIR).iterdir()) == saved
    for a, b in zip(first.detect(photos), again.detect(photos)):
        assert a is not None and b is not None and np.array_equal(a.landmarks, b.landmarks)


def test_config_refuses_sizes_the_net_cannot_take() -> None:
    with pytest.raises(ValueError, match="multiple of 32"):
        TinyFaceConfig(input_size=200)
    with pytest.raises(ValueError, match="score_threshold"):
        TinyFaceConfig(score_threshold=1.0)


def test_an_edited_net_is_refused_in_one_line(tmp_path: Path, tinyface: TinyFaceDetector) -> None:
    # Prepare: a copy of the built folder with one byte of the detector net changed
    folder = tmp_path / "tinyface"
    folder.mkdir()
    for path in tinyface_files().values():
        (folder / path.name).write_bytes(path.read_bytes())
    (folder / "manifest.json").write_bytes((tinyface_files()["detector"].parent / "manifest.json").read_bytes())
    damaged = bytearray((folder / "detector.onnx").read_bytes())
    damaged[-1] ^= 1
    (folder / "detector.onnx").write_bytes(bytes(damaged))
    # Execute / Assert
    with pytest.raises(DetectorCorrupt, match="detector.onnx does not match the sha256"):
        TinyFaceDetector(folder=folder)
