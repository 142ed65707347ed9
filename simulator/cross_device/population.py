"""Simulated devices: one real identity each, its aligned photos.

With an owner holdout, each device trains and enrolls on `faces` only; `held_out` are the photos
its owner is verified on afterwards (facecore.eval.owners.holdout_split decides which, so the
training runs and `fedface eval owners` hold out the same photos)."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from facecore.align.geometry import ARCFACE_112, FaceGeometry
from facecore.align.pipeline import FaceAligner
from facecore.data.faces import load_labelled_faces
from facecore.data.split import SplitManifest
from facecore.eval.owners import holdout_split


@dataclass(frozen=True)
class SimDevice:
    index: int
    identity: str
    faces: np.ndarray  # (n,size,size,3) uint8, in the crop of the model being trained
    held_out: np.ndarray | None = None  # never trained on: the owner-verification photos


@dataclass(frozen=True)
class Population:
    devices: tuple[SimDevice, ...]
    requested: int
    excluded_photos: int

    def notice(self) -> str | None:
        if len(self.devices) < self.requested:
            return (
                f"asked for {self.requested} devices but the split has {len(self.devices)} real device identities "
                f"with a detected face: simulating {len(self.devices)} (synthetic identities never enter accuracy claims)"
            )
        return None


def load_population(
    manifest: SplitManifest, root: Path, requested: int, seed: int = 0, min_faces: int = 2, geometry: FaceGeometry = ARCFACE_112,
    holdout: float | None = None,
) -> Population:
    devices, _, excluded = device_people(manifest, root, requested, seed, min_faces, geometry)
    if holdout is None:
        chosen = tuple(SimDevice(i, identity, faces) for i, (identity, faces) in enumerate(devices))
    else:
        chosen = tuple(SimDevice(i, identity, *holdout_split(faces, holdout, seed, i)) for i, (identity, faces) in enumerate(devices))
    return Population(chosen, requested, excluded)


def device_people(
    manifest: SplitManifest, root: Path, requested: int, seed: int = 0, min_faces: int = 2, geometry: FaceGeometry = ARCFACE_112,
) -> tuple[list[tuple[str, np.ndarray]], list[tuple[str, np.ndarray]], int]:
    """(simulated, left out, photos with no detected face): the split's device identities with at least
    `min_faces` faces, `requested` of them chosen by `seed`; the rest are on no device of the run."""
    data = load_labelled_faces(manifest.images("devices", root), FaceAligner(geometry=geometry), desc="aligning device faces")
    people = [(identity, data.faces[data.labels == label]) for label, identity in enumerate(data.classes)]
    people = [(identity, faces) for identity, faces in people if len(faces) >= min_faces]
    keep = set(range(len(people)))
    if len(people) > requested:
        keep = set(np.random.default_rng(seed).choice(len(people), requested, replace=False).tolist())
    return [p for i, p in enumerate(people) if i in keep], [p for i, p in enumerate(people) if i not in keep], len(data.excluded)
