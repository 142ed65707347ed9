"""Build every face detector's ONNX files once (`fedface models fetch`): a no-op for the ones that verify."""
from __future__ import annotations

from pathlib import Path

from export.mtcnn_onnx import export_mtcnn_onnx
from export.tinyface_onnx import export_tinyface_onnx


def export_detectors(force: bool = False) -> dict[str, Path]:
    """{detector name: the folder of its verified ONNX files}, for both detectors (the default one places its
    points with MTCNN's nets and hands its misses to MTCNN, so it needs both)."""
    return {"tinyface": export_tinyface_onnx(force=force), "mtcnn": export_mtcnn_onnx(force=force)}
