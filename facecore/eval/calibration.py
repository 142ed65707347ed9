"""The verification threshold a model ships with: a target FAR over impostor pairs of unseen people.

Calibrated on LFW people folds 1-5 (every impostor pair among their photos, about 19M), on which
no reported figure is measured: folds 6-10 are the test set, and a threshold chosen there would
make the FAR reported on them a measurement of the calibration. Most folds 1-5 people are public
split identities, which a model pretrained here has seen; their impostor scores are lower and
would set its threshold too low, so such a model calibrates on the folds' people it never saw
(`exclude`: the identities it trained on).
"""
from __future__ import annotations

import math
from collections.abc import Collection
from pathlib import Path

import numpy as np
import torch

from facecore.align.geometry import geometry_of
from facecore.align.pipeline import FaceAligner
from facecore.data.split import SplitConfig, build_split
from facecore.errors import FaceCoreError
from facecore.eval.lfw import load_lfw_faces, refuse_test_folds
from facecore.eval.metrics import all_pairs_scores, threshold_at_far
from facecore.models.preprocess import embed_faces
from facecore.models.verification import Verification

CALIBRATION_FOLDS = (1, 2, 3, 4, 5)
CALIBRATION_FAR = 1e-3  # a version's threshold, unless the operator names another FAR
# The published dlib ResNet learned from faces outside this project's data; every backbone trained
# here (`fedface pretrain`, `fedface distill`, federated rounds) learned from the split's public people.
TRAINED_ELSEWHERE = frozenset({"dlib-resnet"})


def trained_on_public(model: torch.nn.Module) -> bool:
    """Whether `calibrate_threshold` must leave out the split's public people for `model`."""
    return getattr(model, "name", None) not in TRAINED_ELSEWHERE


def public_people(data_root: Path) -> list[str]:
    """The split's public identities ("lfw:Name", "celeba:N"): what every backbone trained here saw."""
    return sorted(build_split(data_root, SplitConfig(seed=0)).sets["public"])


def calibrate_threshold(
    model: torch.nn.Module, lfw_root: Path, folds: tuple[int, ...] = CALIBRATION_FOLDS, far: float = CALIBRATION_FAR,
    exclude: Collection[str] = (),
) -> Verification:
    """The cosine at which `far` of the impostor pairs score above, among the folds' people not in
    `exclude` (identities such as "lfw:Name"), with `far` and how it was calibrated."""
    refuse_test_folds(folds, "a verification threshold")
    data = load_lfw_faces(lfw_root, folds, aligner=FaceAligner(geometry=geometry_of(model)))
    unseen = ~np.isin(data.identities, list(exclude))
    people = len(np.unique(data.identities[unseen]))
    if people < 2:
        raise FaceCoreError(f"LFW folds {folds[0]}-{folds[-1]} have fewer than 2 people the model did not train on")
    _, impostor = all_pairs_scores(embed_faces(model, data.faces[unseen]), data.identities[unseen])
    threshold = threshold_at_far(impostor, far)
    if np.isnan(threshold):
        raise FaceCoreError(
            f"a FAR of {far:g} needs at least {math.ceil(1 / far - 1e-9):,} impostor pairs; LFW folds "
            f"{folds[0]}-{folds[-1]} give {impostor.size:,}: calibrate on more folds or at a larger FAR")
    calibration = (f"all {impostor.size:,} impostor pairs of the {people:,} people of LFW folds {folds[0]}-{folds[-1]}"
                   + (" the model never trained on" if exclude else ""))
    return Verification(float(threshold), far, calibration)
