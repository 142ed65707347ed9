"""The verification threshold a model ships with: a target FAR over impostor pairs of unseen people.

Calibrated on LFW people folds 1-5 (every impostor pair among their photos, about 19M), which no
model here trains on and no reported figure is measured on: folds 6-10 are the test set, and a
threshold chosen there would make the FAR reported on them a measurement of the calibration.
People the model trained on would set it too low (their impostor scores are lower).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from facecore.align.geometry import geometry_of
from facecore.align.pipeline import FaceAligner
from facecore.eval.lfw import load_lfw_faces, refuse_test_folds
from facecore.eval.metrics import all_pairs_scores, threshold_at_far
from facecore.models.preprocess import embed_faces

CALIBRATION_FOLDS = (1, 2, 3, 4, 5)


def calibrate_threshold(
    model: torch.nn.Module, lfw_root: Path, folds: tuple[int, ...] = CALIBRATION_FOLDS, far: float = 1e-3,
) -> dict[str, Any]:
    """{"threshold", "far", "calibration"}: the cosine at which `far` of the impostor pairs score above."""
    refuse_test_folds(folds, "a verification threshold")
    data = load_lfw_faces(lfw_root, folds, aligner=FaceAligner(geometry=geometry_of(model)))
    _, impostor = all_pairs_scores(embed_faces(model, data.faces), data.identities)
    return {
        "threshold": float(threshold_at_far(impostor, far)), "far": far,
        "calibration": f"all {impostor.size:,} impostor pairs of LFW people folds {folds[0]}-{folds[-1]}",
    }
