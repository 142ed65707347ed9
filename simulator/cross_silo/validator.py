"""Validators: private verification pairs, scored as FV needs (Alg. 2 line 8), and the report set.

A validator receives backbone weights only and answers one number: the accuracy on its
own pairs with each fold's threshold chosen on its other folds (the LFW protocol, run
on the validator's folds). It never sees training data; trainers never see its pairs.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from facecore.eval.metrics import cosine_scores, kfold_accuracy, roc_auc
from facecore.models.preprocess import faces_to_tensor
from simulator.cross_silo.models import backbone_autocast


@dataclass(frozen=True)
class PairSet:
    """Faces plus labelled pairs over them, split into folds for threshold selection."""

    name: str
    faces: np.ndarray  # (N, S, S, 3) uint8
    pair_index: np.ndarray  # (P, 2) rows into faces
    same: np.ndarray  # (P,) bool
    folds: np.ndarray  # (P,) fold id of each pair

    def __post_init__(self) -> None:
        P = len(self.same)
        if self.pair_index.shape != (P, 2) or self.folds.shape != (P,) or P == 0:
            raise ValueError(f"{self.name}: need (P, 2) pairs with one label and fold each, got {self.pair_index.shape}, {self.same.shape}, {self.folds.shape}")
        if self.pair_index.min() < 0 or self.pair_index.max() >= len(self.faces):
            raise ValueError(f"{self.name}: a pair points outside the {len(self.faces)} faces")
        if len(np.unique(self.folds)) < 2:
            raise ValueError(f"{self.name}: cross-validated thresholds need at least 2 folds")

    def sizes(self) -> dict[str, int]:
        return {"faces": int(len(self.faces)), "pairs": int(len(self.same)), "folds": int(len(np.unique(self.folds)))}


@torch.no_grad()
def embed(backbone: nn.Module, faces: np.ndarray, device: str = "cpu", batch: int = 256) -> np.ndarray:
    backbone.eval()
    out = []
    for start in range(0, len(faces), batch):
        with backbone_autocast(device):
            features = backbone(faces_to_tensor(faces[start : start + batch], device))
        out.append(features.float().cpu().numpy())
    return np.concatenate(out)


def verify(backbone: nn.Module, pairs: PairSet, device: str = "cpu") -> dict[str, float]:
    """Cross-validated accuracy (mean over folds) and AUC of cosine scores on ``pairs``."""
    emb = embed(backbone, pairs.faces, device)
    scores = cosine_scores(emb[pairs.pair_index[:, 0]], emb[pairs.pair_index[:, 1]])
    folds = kfold_accuracy(scores, pairs.same, pairs.folds)
    return {"accuracy": folds.mean, "accuracy_std": folds.std, "auc": roc_auc(scores, pairs.same)}


class Validator:
    """One validator party: its own backbone copy and its private pairs."""

    def __init__(self, pairs: PairSet, backbone: nn.Module, device: str = "cpu") -> None:
        self.pairs, self.backbone, self.device = pairs, backbone, device

    @property
    def name(self) -> str:
        return self.pairs.name

    def score(self, weights: Mapping[str, np.ndarray]) -> float:
        own = self.backbone.state_dict()
        self.backbone.load_state_dict({k: torch.as_tensor(np.asarray(weights[k])).to(own[k]) for k in own})
        return verify(self.backbone, self.pairs, self.device)["accuracy"]
