"""Torch-free verification against the torch path, on real LFW photos with the default model."""
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from device_sdk.errors import NoThreshold
from device_sdk.inference import OnnxEmbedder
from device_sdk.personal import PersonalConfig, save_verifier, train_personal_verifier
from device_sdk.scoring import NO_FACE, NOT_AN_IMAGE, PhotoVerifier, Threshold
from device_sdk.state import DeviceState
from device_sdk.training import LocalTrainingConfig
from device_sdk.verify import DeviceModel, open_verifier
from export.detectors import export_detectors
from export.onnx_model import export_fp32
from facecore.align.geometry import ARCFACE_112, geometry_of
from facecore.align.onnx_detector import OnnxMTCNN
from facecore.align.photos import load_rgb
from facecore.align.pipeline import FaceAligner
from facecore.data.synthetic import synthetic_faces
from facecore.models.checkpoint import load_backbone
from facecore.models.preprocess import embed_faces

OWNER = [f"Colin_Powell/Colin_Powell_{n:04d}.jpg" for n in range(1, 7)]
OTHERS = ["Tony_Blair/Tony_Blair_0010.jpg", "Serena_Williams/Serena_Williams_0003.jpg",
          "Laura_Bush/Laura_Bush_0002.jpg"]


@pytest.fixture(scope="module")
def default_model(tmp_path_factory: pytest.TempPathFactory) -> tuple[torch.nn.Module, Path]:
    model = load_backbone("default")
    return model, export_fp32(model, tmp_path_factory.mktemp("onnx") / "model.onnx")


def _lfw(real_data: Path, names: list[str]) -> list[Path]:
    return [real_data / "lfw" / "lfw-deepfunneled" / name for name in names]


@pytest.mark.slow
def test_scores_match_the_torch_path_within_1e_3(real_data: Path, default_model: tuple[torch.nn.Module, Path]) -> None:
    # Prepare: the template from three owner photos, through the torch path (MTCNN in torch, the torch backbone)
    model, onnx_path = default_model
    geometry = geometry_of(model)
    torch_aligner = FaceAligner(geometry=geometry)
    owner, probes = _lfw(real_data, OWNER[:3]), _lfw(real_data, OWNER[3:] + OTHERS)
    def torch_aligned(photo: Path) -> np.ndarray:
        image = load_rgb(photo)
        assert image is not None
        aligned = torch_aligner.align_image(image)
        assert aligned is not None
        return aligned[0]

    def torch_embeddings(photos: list[Path]) -> np.ndarray:
        return embed_faces(model, np.stack([torch_aligned(p) for p in photos]))

    template = torch_embeddings(owner).mean(0)
    expected = torch_embeddings(probes) @ (template / np.linalg.norm(template))
    export_detectors()
    verifier = PhotoVerifier(OnnxEmbedder(onnx_path), template, geometry, Threshold(0.926, "given"), "test")
    # Execute
    results = verifier.verify(probes)
    # Assert
    assert [r.photo for r in results] == [str(p) for p in probes]
    scores = [r.score for r in results if r.score is not None]
    assert len(scores) == len(results)
    np.testing.assert_allclose(scores, expected, atol=1e-3)
    assert [r.match for r in results] == [bool(s >= 0.926) for s in expected]
    assert all(r.match for r in results[:3]) and not any(r.match for r in results[3:])


def test_a_file_that_is_no_image_and_a_photo_without_a_face_are_reported_in_order(
    real_data: Path, default_model: tuple[torch.nn.Module, Path], tmp_path: Path,
) -> None:
    # Prepare
    model, onnx_path = default_model
    text = tmp_path / "notes.jpg"
    text.write_text("not a photo")
    blank = tmp_path / "wall.png"
    Image.new("RGB", (200, 200), (120, 120, 120)).save(blank)
    photo = _lfw(real_data, OWNER[:1])[0]
    export_detectors()
    verifier = PhotoVerifier(OnnxEmbedder(onnx_path), np.ones(128, np.float32), geometry_of(model),
                             Threshold(0.5, "given"), "test", detector=OnnxMTCNN())
    # Execute
    results = verifier.verify([text, photo, blank])
    # Assert
    expected = [(str(text), NOT_AN_IMAGE), (str(photo), None), (str(blank), NO_FACE)]
    assert [(r.photo, r.problem) for r in results] == expected
    assert results[1].score is not None and results[0].score is None and results[2].match is None


def test_a_personal_verifier_without_a_threshold_asks_for_one_and_takes_a_given_one(
        tmp_path: Path, calibrated_backbone: Callable[..., torch.nn.Module]) -> None:
    # Prepare: a personal verifier saved without calibration, sealed in a device state
    model = calibrated_backbone("mobilefacenet_s", seed=0)
    faces, labels = synthetic_faces(2, 4, seed=5)
    config = PersonalConfig("single", LocalTrainingConfig(epochs=1, batch=4, trainable_blocks=2))
    verifier, _ = train_personal_verifier(model, faces[labels == 0], config, seed=1)
    state = DeviceState(tmp_path / "device")
    state.create()
    state.save_personal(save_verifier(verifier, "ab" * 32, calibrate_on_public=False))
    description = {"version": "cd" * 32, "face_geometry": ARCFACE_112.to_json()}
    global_model = DeviceModel(description, tmp_path / "unused.onnx", False)
    # Execute / Assert
    with pytest.raises(NoThreshold, match="no calibrated threshold.*--threshold"):
        open_verifier(state, global_model, personal=True)
    opened = open_verifier(state, global_model, personal=True, threshold=0.5)
    assert opened.threshold == Threshold(0.5, "given") and opened.model_version == "ab" * 32
    np.testing.assert_allclose(opened.scores(faces), verifier.score(faces), atol=1e-5)
