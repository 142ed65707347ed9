"""The torch-free MTCNN against facenet-pytorch's, on real LFW photos and on its building blocks."""
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from torchvision.ops import nms as torchvision_nms

from export.mtcnn_onnx import export_mtcnn_onnx
from facecore.align.detector import MTCNNDetector
from facecore.align.onnx_detector import DetectorCorrupt, DetectorMissing, OnnxMTCNN, area_resize, detector_files, nms
from facecore.align.photos import load_rgb


@pytest.fixture(scope="module")
def onnx_detector() -> OnnxMTCNN:
    export_mtcnn_onnx()  # what `fedface models fetch` does; a no-op when the files verify
    return OnnxMTCNN()


def _lfw_photos(real_data: Path, count: int) -> list[Path]:
    """`count` photos spread evenly over all of LFW (sorted by path)."""
    photos = sorted((real_data / "lfw" / "lfw-deepfunneled").glob("*/*.jpg"))
    return [photos[i] for i in np.linspace(0, len(photos) - 1, count).astype(int)]


@pytest.mark.slow
def test_landmarks_and_boxes_match_facenet_pytorch_on_real_lfw_photos(real_data: Path,
                                                                      onnx_detector: OnnxMTCNN) -> None:
    # Prepare: LFW photos as they are, plus two re-framed ones (a larger, non-square image has a deeper pyramid)
    loaded = [load_rgb(p) for p in _lfw_photos(real_data, 40)]
    images = [image for image in loaded if image is not None]
    assert len(images) == len(loaded)
    images.append(np.asarray(Image.fromarray(images[0]).resize((400, 310))))
    images.append(np.pad(images[1], ((60, 0), (0, 90), (0, 0)), mode="edge"))
    reference = MTCNNDetector()
    # Execute
    ours = onnx_detector.detect(images)
    theirs = [reference.detect([image])[0] for image in images]
    # Assert
    assert [d is None for d in ours] == [d is None for d in theirs]
    pairs = [(a, b) for a, b in zip(ours, theirs) if a is not None and b is not None]
    assert len(pairs) >= 40
    for a, b in pairs:
        assert np.abs(a.landmarks - b.landmarks).max() < 1.0
        assert np.abs(a.box - b.box).max() < 1.0
        assert a.score == pytest.approx(b.score, abs=1e-4)


def test_an_image_without_a_face_has_no_detection(onnx_detector: OnnxMTCNN) -> None:
    # Prepare
    flat = np.full((240, 320, 3), 128, np.uint8)
    # Execute
    (found,) = onnx_detector.detect([flat])
    # Assert
    assert found is None


@pytest.mark.parametrize("size", [(61, 47), (24, 24), (13, 90)])
def test_area_resize_is_torch_area_interpolation(size: tuple[int, int]) -> None:
    # Prepare
    image = np.random.default_rng(0).integers(0, 256, (97, 83, 3)).astype(np.uint8)
    # Execute
    ours = area_resize(image, *size)
    # Assert
    batch = torch.from_numpy(image).float().permute(2, 0, 1)[None]
    expected = torch.nn.functional.interpolate(batch, size=size, mode="area")
    np.testing.assert_allclose(ours, expected[0].permute(1, 2, 0).numpy(), atol=1e-3)


def test_nms_keeps_what_torchvision_keeps() -> None:
    # Prepare: clustered boxes, so that many overlap
    rng = np.random.default_rng(1)
    corners = rng.uniform(0, 100, (300, 2)).astype(np.float32)
    boxes = np.concatenate([corners, corners + rng.uniform(5, 40, (300, 2)).astype(np.float32)], axis=1)
    scores = rng.uniform(0, 1, 300).astype(np.float32)
    # Execute
    ours = nms(boxes, scores, 0.5)
    # Assert
    np.testing.assert_array_equal(ours, torchvision_nms(torch.from_numpy(boxes), torch.from_numpy(scores), 0.5).numpy())


def test_missing_or_edited_detector_files_are_one_clear_error(tmp_path: Path, onnx_detector: OnnxMTCNN) -> None:
    # Prepare: a copy of the exported folder with one byte of the ONet changed
    copy = tmp_path / "mtcnn"
    copy.mkdir()
    for path in [*detector_files().values(), detector_files()["pnet"].with_name("manifest.json")]:
        (copy / path.name).write_bytes(path.read_bytes())
    onet = bytearray((copy / "onet.onnx").read_bytes())
    onet[len(onet) // 2] ^= 0xFF
    (copy / "onet.onnx").write_bytes(bytes(onet))
    # Execute / Assert
    with pytest.raises(DetectorMissing, match="fedface models fetch"):
        OnnxMTCNN(folder=tmp_path / "nothing here")
    with pytest.raises(DetectorCorrupt, match=r"onet\.onnx does not match the sha256 .*`fedface models fetch --force`"):
        OnnxMTCNN(folder=copy)
