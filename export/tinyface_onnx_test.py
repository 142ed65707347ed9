"""The ONNX detector net against face-api.js's own JavaScript, on real LFW photos."""
import shutil
import subprocess
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest

from export.tinyface_onnx import export_tinyface_onnx
from facecore.align.detector_files import DetectorMissing
from facecore.align.photos import load_rgb
from facecore.align.tiny_detector import square_input, tinyface_files
from facecore.models import published

HARNESS = Path(__file__).parents[1] / "facecore" / "models" / "face_api_parity.mjs"


def _face_api(net: str, images: np.ndarray, tmp_path: Path) -> np.ndarray:
    images.astype("<f4").tofile(tmp_path / f"{net}.f32")
    done = subprocess.run(
        ["node", str(HARNESS), str(published.FACE_API.folder), net, str(tmp_path / f"{net}.f32"), str(len(images)),
         str(tmp_path / f"{net}.out")],
        capture_output=True, text=True, timeout=300, check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return np.fromfile(tmp_path / f"{net}.out", "<f4")


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("node") is None, reason="node (Node.js) is needed to run face-api's own JavaScript")
def test_onnx_detector_matches_face_api_javascript_on_real_photos(real_data: Path, tmp_path: Path) -> None:
    # Prepare: four LFW photos as the detector's 224px input
    photos = sorted((real_data / "lfw" / "lfw-deepfunneled").glob("*/*.jpg"))[::3000][:4]
    inputs = np.stack([square_input(load_rgb(p), 224)[0] for p in photos])  # type: ignore[arg-type]
    files = tinyface_files(export_tinyface_onnx())
    # Execute
    grids = ort.InferenceSession(str(files["detector"])).run(None, {"image": inputs})[0]
    reference_grids = _face_api("detector", inputs, tmp_path).reshape(4, 7, 7, 25)
    # Assert: the same raw outputs (TF.js's NHWC grid against ONNX's NCHW)
    np.testing.assert_allclose(grids.transpose(0, 2, 3, 1), reference_grids, atol=5e-4)


def test_a_missing_build_names_the_command_that_makes_it(tmp_path: Path) -> None:
    with pytest.raises(DetectorMissing, match="fedface models fetch"):
        tinyface_files(tmp_path / "nothing")


def test_building_again_gives_the_same_files(tmp_path: Path) -> None:
    # Prepare
    first = tinyface_files(export_tinyface_onnx(tmp_path / "a"))
    # Execute
    second = tinyface_files(export_tinyface_onnx(tmp_path / "b"))
    # Assert: the build is deterministic, so the manifest's sha256s name the nets
    assert {n: p.read_bytes() for n, p in first.items()} == {n: p.read_bytes() for n, p in second.items()}
