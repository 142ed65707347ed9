"""Simulated devices: one real identity each, its aligned photos.

With an owner holdout, each device trains and enrolls on `faces` only; `held_out` are the photos
its owner is verified on afterwards (facecore.eval.owners.holdout_split decides which, so the
training runs and `fedface eval owners` hold out the same photos).

With a capture model (facecore.capture) every device photo, trained on or held out, is the one the
fleet's camera takes; the draws follow the run's seed and the device, so every arm of one seed
sees the same photos."""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from facecore.align.geometry import ARCFACE_112, FaceGeometry
from facecore.align.pipeline import FaceAligner
from facecore.capture import get_capture
from facecore.data.faces import load_labelled_faces
from facecore.data.split import SplitManifest
from facecore.eval.owners import holdout_split


@dataclass(frozen=True)
class SimDevice:
    index: int
    identity: str
    faces: np.ndarray  # (n,size,size,3) uint8, in the crop of the model being trained
    held_out: np.ndarray | None = None  # never trained on: the owner-verification photos
    clean: np.ndarray | None = None  # under a capture: `faces` before the fleet camera took them


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
    holdout: float | None = None, capture: str | None = None,
) -> Population:
    devices, _, excluded = device_people(manifest, root, requested, seed, min_faces, geometry)
    if holdout is None:
        chosen = tuple(SimDevice(i, identity, faces) for i, (identity, faces) in enumerate(devices))
    else:
        chosen = tuple(SimDevice(i, identity, *holdout_split(faces, holdout, seed, i)) for i, (identity, faces) in enumerate(devices))
    population = Population(chosen, requested, excluded)
    return population if capture is None else captured(population, capture, geometry, seed)


# Capture streams: device i's photos draw from stream DEVICE_STREAM + 2i, its held-out ones from the next,
# so no two sets of photos share draws however many devices run (the LFW evaluation's stream lies below).
DEVICE_STREAM = 1000


def captured(population: Population, capture: str, geometry: FaceGeometry, seed: int) -> Population:
    """`population` with every device photo taken by the capture model `capture`. The holdout split
    comes first, so a device holds out the same photos with and without a capture."""
    model = get_capture(capture)

    def device(d: SimDevice) -> SimDevice:
        stream = DEVICE_STREAM + 2 * d.index
        held_out = None if d.held_out is None else model.capture(d.held_out, geometry, seed, stream + 1)
        return replace(d, faces=model.capture(d.faces, geometry, seed, stream), held_out=held_out, clean=d.faces)

    return replace(population, devices=tuple(device(d) for d in population.devices))


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
