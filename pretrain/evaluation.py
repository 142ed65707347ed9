"""What pretraining needs from evaluation: a disjointness guard and a cheap LFW monitor."""
from __future__ import annotations

from pathlib import Path

import torch

from facecore.align.geometry import ARCFACE_112, FaceGeometry
from facecore.align.pipeline import FaceAligner
from facecore.data.lfw import LFW
from facecore.data.split import SplitManifest
from facecore.errors import SplitOverlap
from facecore.eval.lfw import evaluate, load_lfw_faces
from facecore.models.preprocess import embed_faces


def check_disjoint_from_evaluation(manifest: SplitManifest, root: Path, role: str) -> None:
    """Refuse to train on anyone in the evaluation folds, whatever the manifest claims."""
    folds = LFW(root / "lfw").people_folds()
    evaluated = {f"lfw:{name}" for k in manifest.config.eval_folds for name in folds[k - 1]}
    overlap = evaluated & set(manifest.sets[role])
    if overlap:
        raise SplitOverlap(
            f"the manifest's {role} identities include {len(overlap)} people of the evaluation folds "
            f"{list(manifest.config.eval_folds)} (e.g. {', '.join(sorted(overlap)[:3])}): rebuild it with `fedface data split`"
        )


def lfw_monitor(root: Path, folds: tuple[int, ...], geometry: FaceGeometry = ARCFACE_112):  # type: ignore[no-untyped-def]
    """Accuracy on the evaluation folds' pairs, for the training plot only: checkpoints are never
    chosen by it, so it cannot leak the test set into the product."""
    data = load_lfw_faces(root / "lfw", folds, aligner=FaceAligner(geometry=geometry), all_people=False)

    def monitor(model: torch.nn.Module) -> dict[str, float]:
        result = evaluate(data, lambda faces: embed_faces(model, faces))
        return {"lfw_accuracy": result.report.accuracy, "lfw_auc": result.report.auc}

    return monitor



