"""What a phone's owner gets: each device identity enrolls from its own photos and is verified on
its held-out ones, against every other device identity's held-out photos, at the threshold the
model publishes.

Invariants:
- Per identity, a seeded permutation holds out `holdout_fraction` of the photos (at least one, and
  at least one left to enroll); the rest enroll. `holdout_split` is the one place that decides,
  so a run that trains on device photos can leave the same held-out photos out.
- The template is the normalised mean embedding of the enrollment photos, as the SDK enrolls.
- Genuine: each held-out photo against its own template. Impostor: each held-out photo against
  every other identity's template. Accept rates are read at the model's published threshold,
  never at one chosen on these photos.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from facecore.errors import FaceCoreError


@dataclass(frozen=True)
class OwnerFaces:
    identity: str
    enroll: np.ndarray  # (n, S, S, 3) uint8 aligned faces
    held_out: np.ndarray


@dataclass(frozen=True)
class OwnerReport:
    threshold: float
    identities: int
    genuine_pairs: int
    impostor_pairs: int
    genuine_accept: float  # of all held-out owner photos
    impostor_accept: float  # of all (held-out photo, other identity's template) pairs
    owners_all_accepted: float  # share of identities whose every held-out photo is accepted
    worst_owner_accept: float
    impostor_accept_worst_template: float  # the template that lets the most other photos in

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def holdout_split(faces: np.ndarray, holdout_fraction: float, seed: int, index: int) -> tuple[np.ndarray, np.ndarray]:
    """(enroll, held out) for one identity; the same photos for the same (seed, index)."""
    if len(faces) < 2:
        raise FaceCoreError(f"an owner needs at least 2 photos (one to enroll, one to verify), got {len(faces)}")
    order = np.random.default_rng([seed, index]).permutation(len(faces))
    n_held = min(len(faces) - 1, max(1, round(holdout_fraction * len(faces))))
    return faces[np.sort(order[n_held:])], faces[np.sort(order[:n_held])]


def owner_verification(embed: Any, owners: Sequence[OwnerFaces], threshold: float) -> OwnerReport:
    """Score every owner's held-out photos against every template (module docstring).
    `embed`: (N, S, S, 3) uint8 faces -> (N, D) embeddings."""
    return owner_verifications(embed, owners, (threshold,))[0]


def owner_verifications(embed: Any, owners: Sequence[OwnerFaces], thresholds: Sequence[float]) -> list[OwnerReport]:
    """`owner_verification` at each of `thresholds`, embedding every photo once."""
    scores = owner_scores([embed(owner.enroll) for owner in owners], [embed(owner.held_out) for owner in owners])
    return [scores.report(threshold) for threshold in thresholds]


@dataclass(frozen=True)
class OwnerScores:
    """Every held-out photo's cosine to every owner's template."""

    scores: np.ndarray  # (held-out photos, owners)
    held_identity: np.ndarray  # the owner each row's photo belongs to

    @property
    def own(self) -> np.ndarray:
        return self.held_identity[:, None] == np.arange(self.scores.shape[1])[None, :]

    def genuine_and_impostor(self) -> tuple[np.ndarray, np.ndarray]:
        own = self.own
        return self.scores[own], self.scores[~own]

    def report(self, threshold: float) -> OwnerReport:
        return _report(self.scores >= threshold, self.own, self.held_identity, threshold)


def owner_scores(enrolled: Sequence[np.ndarray], held_out: Sequence[np.ndarray]) -> OwnerScores:
    """The scores of the module docstring from each owner's embeddings: `enrolled[i]` and `held_out[i]`
    are owner i's (n, D) embeddings of its enrolment and held-out photos."""
    if len(enrolled) < 2:
        raise FaceCoreError(f"owner verification needs at least 2 identities, got {len(enrolled)}")
    if len(enrolled) != len(held_out):
        raise FaceCoreError(f"{len(enrolled)} owners enrolled but {len(held_out)} have held-out photos")
    templates = []
    for embeddings in enrolled:
        mean = np.asarray(embeddings, np.float64).mean(axis=0)
        templates.append(mean / np.linalg.norm(mean))
    held = [np.asarray(embeddings, np.float64) for embeddings in held_out]
    held_identity = np.concatenate([np.full(len(h), i) for i, h in enumerate(held)])
    held_all = np.concatenate(held)
    held_all /= np.linalg.norm(held_all, axis=1, keepdims=True)
    return OwnerScores(held_all @ np.stack(templates).T, held_identity)


def _report(accepted: np.ndarray, own: np.ndarray, held_identity: np.ndarray, threshold: float) -> OwnerReport:
    per_owner = np.array([accepted[held_identity == i, i].mean() for i in range(own.shape[1])])
    per_template_impostor = (accepted & ~own).sum(axis=0) / (~own).sum(axis=0)
    return OwnerReport(
        threshold=float(threshold), identities=own.shape[1], genuine_pairs=int(own.sum()), impostor_pairs=int((~own).sum()),
        genuine_accept=float(accepted[own].mean()), impostor_accept=float(accepted[~own].mean()),
        owners_all_accepted=float((per_owner == 1.0).mean()), worst_owner_accept=float(per_owner.min()),
        impostor_accept_worst_template=float(per_template_impostor.max()),
    )
