import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch

from facecore.align.pipeline import FaceAligner
from facecore.data.lfw import LFW
from facecore.models import published
from facecore.models.checkpoint import load_backbone, shipped_verification
from facecore.models.dlib_resnet import DLIB_GEOMETRY
from facecore.models.preprocess import faces_to_tensor
from facecore.paths import PACKAGES_ENV

HARNESS = Path(__file__).with_name("face_api_parity.mjs")


@pytest.fixture()
def copied_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private copy of the verified package, safe to damage."""
    source = published.FACE_API.folder
    published.installed_files()
    monkeypatch.setenv(PACKAGES_ENV, str(tmp_path / "packages"))
    shutil.copytree(source, published.FACE_API.folder)
    return published.FACE_API.folder


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("node") is None, reason="node (Node.js) is needed to run face-api's own JavaScript")
def test_torch_port_matches_face_api_javascript_on_real_faces(real_data: Path, isolated_cache: Path, tmp_path: Path) -> None:
    # Prepare: eight real LFW photos of four people, aligned to the backbone's own 150x150 crop
    lfw = LFW(real_data / "lfw")
    people = ["Aaron_Peirsol", "Abdullah_Gul", "Adrien_Brody", "Alejandro_Toledo"]
    photos = [img.path for name in people for img in lfw.images_of(name, 2)]
    faces = FaceAligner(geometry=DLIB_GEOMETRY).align_paths(photos, progress=False).faces
    assert len(faces) == 8
    faces.astype("<f4").tofile(tmp_path / "faces.f32")
    # Execute: the package's JavaScript under node, and the torch port
    done = subprocess.run(
        ["node", str(HARNESS), str(published.FACE_API.folder), "recognition", str(tmp_path / "faces.f32"), str(len(faces)), str(tmp_path / "out.f32")],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    reference = np.fromfile(tmp_path / "out.f32", "<f4").reshape(len(faces), 128)
    with torch.inference_mode():
        ours = load_backbone("default")(faces_to_tensor(faces)).numpy()
    # Assert: the same descriptor per face, direction and length
    cosine = (ours * reference).sum(1) / np.linalg.norm(ours, axis=1) / np.linalg.norm(reference, axis=1)
    assert cosine.min() >= 0.9999, cosine
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), np.linalg.norm(reference, axis=1), rtol=1e-3)


def test_published_weights_give_dlib_resnet_with_its_threshold() -> None:
    # Prepare / Execute
    model = load_backbone("default")
    # Assert: the architecture the manifest describes, every weight used, a calibrated threshold
    assert model.name == "dlib-resnet" and model.embedding_dim == 128
    assert sum(p.numel() for p in model.parameters()) == 5_607_488
    tensors = published.read_face_api_tensors()
    assert len(tensors) == 117
    verification = shipped_verification(model)
    assert verification is not None and verification.calibration is not None and verification.far_10_point is not None
    assert 0.0 < verification.far_10_point < verification.threshold < 1.0 and "folds 1" in verification.calibration


def test_missing_weights_name_the_command_that_fetches_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Prepare: an empty packages folder
    monkeypatch.setenv(PACKAGES_ENV, str(tmp_path / "empty"))
    # Execute / Assert
    with pytest.raises(published.WeightsMissing, match="run `fedface models fetch`") as error:
        load_backbone("default")
    assert "\n" not in str(error.value)


def test_a_corrupt_weights_file_is_one_clear_error(copied_package: Path) -> None:
    # Prepare: truncate the weights file
    weights = copied_package / "model" / "face_recognition_model.bin"
    weights.write_bytes(weights.read_bytes()[:1000])
    # Execute / Assert
    with pytest.raises(published.WeightsCorrupt, match="does not match .* published sha256") as error:
        load_backbone("default")
    assert "\n" not in str(error.value)


def test_fetch_is_a_no_op_once_the_files_verify(copied_package: Path) -> None:
    # Prepare
    before = {p: p.stat().st_mtime_ns for p in copied_package.rglob("*") if p.is_file()}
    # Execute
    folder = published.fetch()
    # Assert: nothing was downloaded or rewritten
    assert folder == copied_package
    assert before == {p: p.stat().st_mtime_ns for p in copied_package.rglob("*") if p.is_file()}


@pytest.mark.skipif(shutil.which("npm") is None, reason="npm fetches the package")
def test_fetch_replaces_a_corrupt_file_with_the_published_one(copied_package: Path) -> None:
    # Prepare: damage one byte of the weights
    weights = copied_package / "model" / "face_recognition_model.bin"
    data = bytearray(weights.read_bytes())
    data[100] ^= 0xFF
    weights.write_bytes(bytes(data))
    # Execute: npm pack, sha256 of the tarball, unpack the files used
    published.fetch()
    # Assert: every file verifies again, and only the files used were unpacked
    assert set(published.installed_files()) == {relative for relative, _ in published.FACE_API.files}
    assert sorted(p.relative_to(copied_package).as_posix() for p in copied_package.rglob("*") if p.is_file()) == sorted(
        relative for relative, _ in published.FACE_API.files
    )


def test_a_tarball_that_is_not_the_published_one_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Prepare: an empty packages folder and a stranger's tarball
    monkeypatch.setenv(PACKAGES_ENV, str(tmp_path / "packages"))
    stranger = tmp_path / "face-api.tgz"
    stranger.write_bytes(b"\x1f\x8b not the package")
    # Execute / Assert: refused before anything is unpacked
    with pytest.raises(published.WeightsCorrupt, match="is not the @vladmandic/face-api@1.7.15 tarball"):
        published.fetch(tarball=stranger)
    assert not published.FACE_API.folder.exists()
