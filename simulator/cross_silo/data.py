"""Faces for a :class:`SiloPlan`: every party loads only what it holds, from the aligned-face cache."""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import torch
import torch.nn.functional as F

from facecore.data.faces import load_labelled_faces
from facecore.data.lfw import LFW
from facecore.data.records import FaceImage
from facecore.data.split import SplitConfig, SplitManifest, build_split
from facecore.data.synthetic import synthetic_faces
from facecore.eval.lfw import load_lfw_faces
from simulator.cross_silo.silos import LFW_VALIDATION_FOLDS, PartyPlan, SiloPlan, pairs_in_folds, plan_silos
from simulator.cross_silo.trainer import SiloData
from simulator.cross_silo.validator import PairSet

CELEBA_FOLDS = 5
CELEBA_PAIRS_PER_FOLD = 60


def resize_faces(faces: np.ndarray, size: int, chunk: int = 1024) -> np.ndarray:
    """(N, 112, 112, 3) uint8 -> (N, size, size, 3) uint8, antialiased; a no-op at the same size."""
    if faces.shape[1] == size:
        return faces
    out = np.empty((len(faces), size, size, 3), np.uint8)
    for start in range(0, len(faces), chunk):
        x = torch.from_numpy(faces[start : start + chunk]).permute(0, 3, 1, 2).float()
        y = F.interpolate(x, size=(size, size), mode="bilinear", antialias=True, align_corners=False)
        out[start : start + chunk] = y.round().clamp(0, 255).to(torch.uint8).permute(0, 2, 3, 1).numpy()
    return out


def _images(party: PartyPlan, manifest: SplitManifest, root: Path) -> list[FaceImage]:
    pool = {**manifest.sets["public"], **manifest.sets["devices"]}
    return [FaceImage(identity, root / path) for identity in party.identities for path in pool[identity]]


def load_trainer(party: PartyPlan, manifest: SplitManifest, root: Path, size: int) -> SiloData:
    data = load_labelled_faces(_images(party, manifest, root), desc=f"faces of {party.name}")
    return SiloData(party.name, resize_faces(data.faces, size), data.labels, len(data.classes))


def load_validator(party: PartyPlan, manifest: SplitManifest, root: Path, size: int, seed: int) -> PairSet:
    if party.name == "lfw-pairs":
        return lfw_pairs(root, LFW_VALIDATION_FOLDS, size, party.name)
    data = load_labelled_faces(_images(party, manifest, root), desc=f"faces of {party.name}")
    index, same, folds = pairs_in_folds(data.labels, CELEBA_FOLDS, CELEBA_PAIRS_PER_FOLD, seed)
    used = np.unique(index)  # keep only faces some pair needs
    remap = np.full(len(data.labels), -1, np.int64)
    remap[used] = np.arange(len(used))
    return PairSet(party.name, resize_faces(data.faces[used], size), remap[index], same, folds)


def lfw_pairs(root: Path, folds: tuple[int, ...], size: int, name: str) -> PairSet:
    """LFW View-2 pairs of ``folds`` (pairs' images only), as a :class:`PairSet`."""
    lfw = load_lfw_faces(root / "lfw", folds, all_people=False)
    return PairSet(name, resize_faces(lfw.faces, size), lfw.pair_index, lfw.pair_same, lfw.pair_fold)


def load_plan(plan: SiloPlan, manifest: SplitManifest, root: Path, size: int, seed: int) -> tuple[list[SiloData], list[PairSet]]:
    trainers = [load_trainer(p, manifest, root, size) for p in plan.trainers]
    validators = [load_validator(p, manifest, root, size, seed) for p in plan.validators]
    return trainers, validators


@dataclass(frozen=True)
class RealData:
    """Picklable recipe for the real silos: each process (trainer, validator, server) calls only its own loader."""

    root: str
    split: str | None = None  # a split manifest; None = the seed-0 split
    trainers: int = 3
    parties: int = 3
    validators: int = 2
    seed: int = 0
    size: int = 112
    eval_folds: tuple[int, ...] = (6, 7, 8, 9, 10)

    @cached_property
    def manifest(self) -> SplitManifest:
        if self.split:
            return SplitManifest.load(self.split)
        return build_split(Path(self.root), SplitConfig(seed=0, eval_folds=self.eval_folds))

    @cached_property
    def plan(self) -> SiloPlan:
        return plan_silos(self.manifest, LFW(Path(self.root) / "lfw").pairs(), self.trainers, self.parties, self.validators, self.seed)

    def settings(self) -> dict[str, Any]:
        """What decides who holds what; a face pack records it (see :mod:`simulator.cross_silo.packed`)."""
        return {"trainers": self.trainers, "parties": self.parties, "validators": self.validators, "seed": self.seed,
                "size": self.size, "eval_folds": list(self.eval_folds), "split": Path(self.split).name if self.split else None}

    def describe_plan(self) -> list[dict[str, object]]:
        return self.plan.describe()

    def trainer_name(self, index: int) -> str:
        return self.plan.trainers[index].name

    def trainer(self, index: int) -> SiloData:
        return load_trainer(self.plan.trainers[index], self.manifest, Path(self.root), self.size)

    def validator(self, index: int) -> PairSet:
        return load_validator(self.plan.validators[index], self.manifest, Path(self.root), self.size, self.seed)

    def evaluation(self) -> PairSet | None:
        return lfw_pairs(Path(self.root), self.eval_folds, self.size, "lfw-eval")


@dataclass(frozen=True)
class SyntheticData:
    """Synthetic faces for tests and wiring checks only; never for accuracy claims."""

    trainer_identities: tuple[int, ...] = (5, 7, 5)
    validators: int = 2
    size: int = 32
    with_evaluation: bool = False

    def trainer_name(self, index: int) -> str:
        return "abc"[index] if index < 3 else f"t{index}"

    def trainer(self, index: int) -> SiloData:
        n = self.trainer_identities[index]
        faces, labels = synthetic_faces(n, 4, seed=1 + index, size=self.size)
        return SiloData(self.trainer_name(index), faces, labels, n)

    def _pairs(self, name: str, seed: int) -> PairSet:
        faces, labels = synthetic_faces(8, 3, seed=seed, size=self.size)
        index, same, folds = pairs_in_folds(labels, folds=2, per_fold=4, seed=seed)
        return PairSet(name, faces, index, same, folds)

    def validator(self, index: int) -> PairSet:
        return self._pairs(f"v{index + 1}", 10 + index)

    def evaluation(self) -> PairSet | None:
        return self._pairs("eval", 20) if self.with_evaluation else None


class DataSpec(Protocol):
    """Where a run's parties get their faces: :class:`RealData`, :class:`SyntheticData` or a face pack."""

    def trainer_name(self, index: int) -> str: ...

    def trainer(self, index: int) -> SiloData: ...

    def validator(self, index: int) -> PairSet: ...

    def evaluation(self) -> PairSet | None: ...
