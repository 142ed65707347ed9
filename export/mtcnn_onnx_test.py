"""The one-time export of MTCNN to ONNX: a verified folder, made once, refused on other weights."""
from pathlib import Path

import pytest

from export import mtcnn_onnx
from export.mtcnn_onnx import export_mtcnn_onnx
from facecore.align.onnx_detector import OnnxMTCNN, detector_files
from facecore.errors import FaceCoreError


def test_the_export_writes_a_verified_folder_once(tmp_path: Path) -> None:
    # Prepare
    folder = tmp_path / "mtcnn"
    # Execute
    written = export_mtcnn_onnx(folder)
    first = {net: path.stat().st_mtime_ns for net, path in detector_files(folder).items()}
    again = export_mtcnn_onnx(folder)
    # Assert: three verified nets a detector opens; the second call found them and wrote nothing
    assert written == again == folder and set(first) == {"pnet", "rnet", "onet"}
    assert {net: path.stat().st_mtime_ns for net, path in detector_files(folder).items()} == first
    assert not list(tmp_path.glob(".mtcnn-staging-*"))
    OnnxMTCNN(folder=folder)


def test_weights_other_than_the_pinned_release_are_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Prepare: pin a different sha256 for the PNet, as another facenet-pytorch release would have
    monkeypatch.setitem(mtcnn_onnx.SOURCE_SHA256, "pnet", "0" * 64)
    # Execute / Assert
    with pytest.raises(FaceCoreError, match=r"pnet\.pt is not facenet-pytorch 2\.6\.0's pnet .*reinstall"):
        export_mtcnn_onnx(tmp_path / "mtcnn")
    assert not (tmp_path / "mtcnn").exists()
