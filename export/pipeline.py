"""`fedface export`: write model.onnx, model.int8.onnx, backbone.pt and manifest.json, checked for parity.

Parity faces come from the evaluation identities, calibration faces from the public ones, so
the two sets never share a photo or a person. Every face (calibration, parity, LFW) is aligned to
the backbone's own crop (`geometry_of(model)`), and the manifest carries that geometry (crop size
and the five template points), so a device aligns without knowing the architecture.
"""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from export.onnx_model import INPUT_NAME, OPSET, OUTPUT_NAME, export_fp32, ort_embed, ort_session, quantize_int8
from facecore.align.geometry import ARCFACE_112, FaceGeometry, geometry_of
from facecore.align.pipeline import FaceAligner, aligner_version
from facecore.data.split import SplitConfig, build_split
from facecore.errors import FaceCoreError
from facecore.eval.lfw import evaluate, load_lfw_faces
from facecore.models.checkpoint import load_backbone, model_source, save_backbone
from facecore.models.preprocess import PIXEL_MEAN, PIXEL_STD, embed_faces

CALIBRATION_FACES = 300
PARITY_FACES = 256
# The order of the template's rows (facecore.align.template.ARCFACE_TEMPLATE), in the image's own left/right.
LANDMARKS = ("left_eye", "right_eye", "nose_tip", "mouth_left", "mouth_right")


class ExportError(FaceCoreError):
    pass


@dataclass(frozen=True)
class ExportResult:
    out_dir: Path
    manifest: dict[str, Any]
    metrics: dict[str, float | int | None]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def prepare_out_dir(out_dir: Path) -> None:
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise ExportError(f"cannot create output directory {out_dir}: {error.strerror}") from None
    if not os.access(out_dir, os.W_OK | os.X_OK):
        raise ExportError(f"output directory {out_dir} is not writable")


def real_faces(root: Path, seed: int = 0, geometry: FaceGeometry = ARCFACE_112) -> tuple[np.ndarray, np.ndarray]:
    """(calibration faces from public identities, parity faces from evaluation identities),
    aligned to `geometry`."""
    split = build_split(root, SplitConfig(seed=seed))
    rng = np.random.default_rng(seed)
    aligner = FaceAligner(geometry=geometry)

    def sample(role: str, count: int) -> np.ndarray:
        images = split.images(role, root)
        chosen = [images[i].path for i in sorted(rng.choice(len(images), min(count + 32, len(images)), replace=False))]
        return aligner.align_paths(chosen, desc=f"aligning {role} faces").faces[:count]

    return sample("public", CALIBRATION_FACES), sample("evaluation", PARITY_FACES)


def geometry_manifest(geometry: FaceGeometry) -> dict[str, Any]:
    """What a device needs to make the backbone's crop: warp the five detected landmarks onto
    `template` (x, y in pixels of the `size` x `size` crop) with a least-squares similarity."""
    return {**geometry.to_json(), "landmarks": list(LANDMARKS), "aligner": aligner_version(geometry)}


def _cosines(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a / np.linalg.norm(a, axis=1, keepdims=True)
    b = b / np.linalg.norm(b, axis=1, keepdims=True)
    return (a * b).sum(1)


def export_model(spec: str, out_dir: Path, root: Path, int8: bool = True, lfw_folds: tuple[int, ...] = (6, 7, 8, 9, 10)) -> ExportResult:
    """Everything is built in a staging folder beside `out_dir` and moved in only once all
    checks ran, manifest last, so a failure never leaves a partial export behind."""
    model = load_backbone(spec)
    prepare_out_dir(out_dir)
    with tempfile.TemporaryDirectory(dir=out_dir, prefix=".staging-") as staging:
        result = _export(model, spec, Path(staging), root, int8, lfw_folds)
        for name in [*(f["path"] for f in result.manifest["files"].values()), "manifest.json"]:
            os.replace(Path(staging) / name, out_dir / name)
    return ExportResult(out_dir, result.manifest, result.metrics)


def _export(model: torch.nn.Module, spec: str, out_dir: Path, root: Path, int8: bool, lfw_folds: tuple[int, ...]) -> ExportResult:
    geometry = geometry_of(model)
    if getattr(model, "input_size", geometry.size) != geometry.size:
        raise ExportError(f"backbone {model.name!r} takes {model.input_size}px inputs but declares a {geometry.size}px crop ({geometry.key})")
    torch_file = save_backbone(model, out_dir / "backbone.pt", meta=getattr(model, "meta", {}), half=True)
    fp32_path = export_fp32(model, out_dir / "model.onnx")
    calibration, parity = real_faces(root, geometry=geometry)
    reference = embed_faces(model, parity)
    fp32_cos = _cosines(reference, ort_embed(ort_session(fp32_path, threads=2), parity))
    metrics: dict[str, float | int | None] = {
        "fp32_min_cos": float(fp32_cos.min()), "fp32_bytes": fp32_path.stat().st_size,
        "int8_mean_cos": None, "int8_min_cos": None, "int8_lfw_drop": None, "int8_bytes": None,
        "parity_faces": len(parity), "calibration_faces": len(calibration),
    }
    files = {"fp32": fp32_path, "torch_state_dict": torch_file}
    if int8:
        int8_path = quantize_int8(fp32_path, out_dir / "model.int8.onnx", calibration)
        session = ort_session(int8_path, threads=2)
        int8_cos = _cosines(reference, ort_embed(session, parity))
        lfw = load_lfw_faces(root / "lfw", lfw_folds, aligner=FaceAligner(geometry=geometry), all_people=False)
        torch_acc = evaluate(lfw, lambda f: embed_faces(model, f)).report.accuracy
        int8_acc = evaluate(lfw, lambda f: ort_embed(session, f)).report.accuracy
        metrics.update(
            int8_mean_cos=float(int8_cos.mean()), int8_min_cos=float(int8_cos.min()), int8_bytes=int8_path.stat().st_size,
            int8_lfw_drop=round(100 * (torch_acc - int8_acc), 3), lfw_accuracy_torch=torch_acc, lfw_accuracy_int8=int8_acc,
        )
        files["int8"] = int8_path
    manifest = {
        "format": "fedface-export/1",
        "model_version": sha256(torch_file)[:16],
        "backbone": model.name,
        "embedding_dim": model.embedding_dim,
        "opset": OPSET,
        "input": {
            "name": INPUT_NAME, "shape": ["batch", 3, geometry.size, geometry.size], "layout": "NCHW", "color": "RGB",
            "dtype": "float32", "normalization": f"(pixel - {PIXEL_MEAN}) / {PIXEL_STD}", "mean": PIXEL_MEAN, "std": PIXEL_STD,
            "alignment": f"{geometry.describe()}, template in `geometry` ({aligner_version(geometry)})",
        },
        "geometry": geometry_manifest(geometry),
        "output": {"name": OUTPUT_NAME, "shape": ["batch", model.embedding_dim], "normalized": False},
        "files": {kind: {"path": p.name, "sha256": sha256(p), "bytes": p.stat().st_size} for kind, p in files.items()},
        "torch_state_dict": {"path": torch_file.name, "sha256": sha256(torch_file), "source": model_source(spec)},
        "parity": metrics,
    }
    (out_dir / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return ExportResult(out_dir, manifest, metrics)
