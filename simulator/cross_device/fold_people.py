"""Who carries a fold's TAR: each person's share of a people fold's genuine pairs, and of its change.

A fold's TAR@FAR is the fraction of its genuine pairs (all same-person pairs of its people) above the
threshold its impostors set. A person with n photos brings n(n-1)/2 of those pairs, so a few people
decide a fold: George_W_Bush alone holds 95% of fold 10's. Comparing two models fold by fold, this
says which people a gain or a loss comes from, and whether the threshold moved or their scores did.

Invariants:
- Each fold gets its own threshold, from its own impostor pairs, as `facecore.eval.lfw.per_fold_tar`
  sets it; a pair counts when its score is above it.
- A person's contribution is the change in their accepted pairs over the fold's genuine pairs, in
  points, so a fold's contributions add up to its TAR change exactly.

`python -m simulator.cross_device.fold_people mobile runs/a/model.pt --folds 6-10` prints a table per
fold. It reads scores; it chooses nothing, so it may look at the test folds.
"""
from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from facecore.align.pipeline import FaceAligner
from facecore.data.lfw import parse_folds
from facecore.errors import FaceCoreError
from facecore.eval.folder import embed_with_progress
from facecore.eval.lfw import load_lfw_faces
from facecore.eval.metrics import all_pairs_scores, threshold_at_far
from facecore.paths import data_root
from simulator.cross_device.left_out import models_of_one_crop


@dataclass(frozen=True)
class PersonChange:
    name: str
    pairs: int
    accepted: tuple[int, int]  # genuine pairs above the fold's threshold, before and after
    mean_cosine: tuple[float, float]  # of those pairs
    contribution: float  # points of the fold's TAR change


@dataclass(frozen=True)
class FoldChange:
    fold: int
    threshold: tuple[float, float]
    tar: tuple[float, float]  # percent
    impostor_mean: tuple[float, float]
    people: tuple[PersonChange, ...]  # most pairs first


def _person_scores(embeddings: np.ndarray, identities: np.ndarray) -> dict[str, np.ndarray]:
    scores = {}
    for name in np.unique(identities):
        rows = embeddings[identities == name]
        if len(rows) > 1:
            scores[str(name)] = (rows @ rows.T)[np.triu_indices(len(rows), 1)]
    return scores


def fold_changes(before: np.ndarray, after: np.ndarray, identities: np.ndarray, face_fold: np.ndarray, far: float = 1e-3) -> list[FoldChange]:
    """Each fold of `face_fold`: its threshold, TAR and people, `before` against `after` (L2-normalised rows)."""
    if before.shape != after.shape or len(before) != len(identities) or len(identities) != len(face_fold):
        raise FaceCoreError("before, after, identities and face_fold must describe the same faces")
    changes = []
    for fold in np.unique(face_fold):
        rows = face_fold == fold
        ids = identities[rows]
        thresholds, impostor_means, per_model = [], [], []
        for embeddings in (before[rows], after[rows]):
            _, impostor = all_pairs_scores(embeddings, ids)
            thresholds.append(threshold_at_far(impostor, far))
            impostor_means.append(float(impostor.mean()))
            per_model.append(_person_scores(embeddings, ids))
        total = sum(s.size for s in per_model[0].values())
        if total == 0:
            raise FaceCoreError(f"fold {fold} has no genuine pairs")
        people = []
        for name, first in per_model[0].items():
            second = per_model[1][name]
            accepted = (int((first > thresholds[0]).sum()), int((second > thresholds[1]).sum()))
            people.append(PersonChange(name, int(first.size), accepted, (float(first.mean()), float(second.mean())),
                                       100 * (accepted[1] - accepted[0]) / total))
        people.sort(key=lambda p: -p.pairs)
        tar = tuple(100 * sum(p.accepted[i] for p in people) / total for i in (0, 1))
        changes.append(FoldChange(int(fold), (thresholds[0], thresholds[1]), (tar[0], tar[1]), (impostor_means[0], impostor_means[1]), tuple(people)))
    return changes


def markdown(changes: Sequence[FoldChange], top: int = 8) -> str:
    lines = []
    for change in changes:
        (t0, t1), (a0, a1), (i0, i1) = change.threshold, change.tar, change.impostor_mean
        lines += [f"### Fold {change.fold}: TAR {a0:.2f} → {a1:.2f} ({a1 - a0:+.2f}); threshold {t0:.3f} → {t1:.3f}; "
                  f"impostor mean cosine {i0:.3f} → {i1:.3f}", "",
                  "| person | genuine pairs | share % | accepted % | genuine mean cosine | points of the change |",
                  "|---|---:|---:|---:|---:|---:|"]
        total = sum(p.pairs for p in change.people)
        for p in change.people[:top]:
            lines.append(f"| {p.name} | {p.pairs:,} | {100 * p.pairs / total:.1f} | {100 * p.accepted[0] / p.pairs:.1f} → "
                         f"{100 * p.accepted[1] / p.pairs:.1f} | {p.mean_cosine[0]:.3f} → {p.mean_cosine[1]:.3f} | {p.contribution:+.2f} |")
        rest = sum(p.contribution for p in change.people[top:])
        lines += [f"| the other {len(change.people) - top} people | {sum(p.pairs for p in change.people[top:]):,} | | | | {rest:+.2f} |", ""]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m simulator.cross_device.fold_people", description=__doc__.split("\n\n")[0])
    parser.add_argument("before", help="'mobile', 'default' or a checkpoint path")
    parser.add_argument("after", help="a checkpoint with the same crop")
    parser.add_argument("--folds", default="6-10", help="LFW people folds (default: 6-10)")
    parser.add_argument("--far", type=float, default=1e-3)
    parser.add_argument("--top", type=int, default=8, help="people shown per fold, most pairs first")
    parser.add_argument("--data", type=Path, default=None)
    parser.add_argument("--json", type=Path, default=None, help="also write every person's figures here")
    args = parser.parse_args(argv)
    try:
        models, geometry = models_of_one_crop([args.before, args.after])
    except FaceCoreError as error:
        parser.error(str(error))
    data = load_lfw_faces((args.data or data_root()) / "lfw", parse_folds(args.folds), aligner=FaceAligner(geometry=geometry))
    assert data.face_fold is not None  # all_people loads every person's fold
    before, after = (embed_with_progress(m, data.faces, desc=f"embedding for {spec}") for m, spec in zip(models, (args.before, args.after)))
    changes = fold_changes(before, after, data.identities, data.face_fold, args.far)
    print(markdown(changes, args.top))
    if args.json:
        args.json.write_text(json.dumps([asdict(c) for c in changes], indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
