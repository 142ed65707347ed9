"""The figures a named model ships with (`facecore/weights/<name>.json`), measured in one place.

Order matters for the evaluation discipline: the verification threshold is calibrated on LFW
folds 1-5 first; folds 6-10 and the CelebA owners are only measured, never used to choose.
"""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

from facecore.align.detectors import detector_version
from facecore.align.geometry import geometry_of
from facecore.align.pipeline import FaceAligner
from facecore.data.split import SplitConfig, build_split
from facecore.eval.calibration import calibrate_threshold, trained_on_public
from facecore.eval.cross_source import celeba_owner_check
from facecore.eval.feature_center import feature_center_figures
from facecore.eval.lfw import TEST_FOLDS, evaluate, load_lfw_faces
from facecore.models.checkpoint import FIGURES, backbone_file_bytes, load_backbone, model_source, set_shipped_verification
from facecore.models.preprocess import embed_faces
from facecore.models.registry import embedding_dim_of


def measure(spec: str, root: Path, progress: bool = True) -> dict[str, Any]:
    """Threshold (folds 1-5), LFW folds 6-10, CelebA owners at that threshold, the feature centre of
    public photos, size, crop and the detector every photo was aligned with ($FEDFACE_DETECTOR or the default)."""
    model = load_backbone(spec)
    split = build_split(root, SplitConfig(seed=0))
    seen = split.sets["public"] if trained_on_public(model) else ()
    verification = calibrate_threshold(model, root / "lfw", exclude=list(seen))
    verification = dataclasses.replace(verification, far_10_point=calibrate_threshold(model, root / "lfw", far=0.1, exclude=list(seen)).threshold)
    set_shipped_verification(model, verification)
    folds = tuple(sorted(TEST_FOLDS))
    data = load_lfw_faces(root / "lfw", folds, aligner=FaceAligner(geometry=geometry_of(model)))
    lfw = evaluate(data, lambda faces: embed_faces(model, faces)).report.to_json_dict()
    owners = celeba_owner_check(model, root, split, progress=progress).to_json_dict()
    owners = {k: v for k, v in owners.items() if k not in ("skipped", "single_photo_persons", "empty_persons", "folder")}
    center = feature_center_figures(split, root, model, geometry_of(model))
    return {
        "name": spec, "backbone": model.name, "embedding_dim": int(embedding_dim_of(model)), "weights": model_source(spec),
        "parameters": sum(p.numel() for p in model.parameters()), "fp16_bytes": backbone_file_bytes(model, half=True),
        "geometry": geometry_of(model).to_json(), "detector": detector_version(),
        "verification": verification.to_json(), "lfw": lfw, "celeba_owners": owners, "feature_center": center,
    }


def write_figures(spec: str, figures: dict[str, Any]) -> Path:
    """Merge into the model's JSON (training history a bundle wrote stays)."""
    path = FIGURES[spec]
    stored = json.loads(path.read_text()) if path.is_file() else {}
    path.write_text(json.dumps({**stored, **figures}, indent=1) + "\n")
    return path
