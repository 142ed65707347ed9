"""The LFW verification protocol on identity-disjoint folds.

Accuracy: the View-2 pairs of the chosen folds, threshold picked on the other folds (10-fold
protocol restricted to the chosen folds), mean ± std over folds.
TAR@FAR: LFW's 300 mismatched pairs per fold cannot measure FAR 1e-4, so every image of
every person in the chosen people folds is scored against every other: same-person pairs
are genuine, the rest impostors (about 25M for folds 6-10). The same folds' people only,
so these pairs stay disjoint from anything trained outside them.
A smaller evaluation (`max_photos`): a seeded subset of the chosen folds' View-2 pairs, balanced over
folds and matched/mismatched, whose photos number at most `max_photos`; TAR@FAR then compares every
photo of that subset with every other. Its report says it is a subset (`extra["subset"]`).
"""
from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from facecore.align.pipeline import AlignedSet, FaceAligner
from facecore.data.lfw import LFW, LFWPair
from facecore.errors import FaceCoreError
from facecore.eval.metrics import (
    VerificationReport,
    all_pairs_scores,
    cosine_scores,
    kfold_accuracy,
    roc_auc,
    roc_curve,
    tar_at_far,
)

EmbedFn = Callable[[np.ndarray], np.ndarray]
FARS = (1e-3, 1e-4)
# LFW people folds 6-10 are the test set: nothing that shapes a model or its settings may see them.
TEST_FOLDS = frozenset(range(6, 11))
# The seed of the smaller evaluation's pairs: fixed, so that every run (any --seed) scores the same subset.
SUBSET_SEED = 0
MIN_SUBSET_PHOTOS_PER_FOLD = 4  # a matched and a mismatched pair in every fold: accuracy needs both


def refuse_test_folds(folds: tuple[int, ...] | list[int], choice: str) -> None:
    """Raise when a choice (a crop, a threshold, a checkpoint) would be made on test folds."""
    if TEST_FOLDS & set(folds):
        raise FaceCoreError(f"folds {sorted(TEST_FOLDS & set(folds))} are the test set: choose {choice} on folds 1-5")


@dataclass(frozen=True)
class LFWFaces:
    """Aligned faces of one fold selection, ready to embed."""

    folds: tuple[int, ...]
    faces: np.ndarray  # unique usable images
    identities: np.ndarray  # one per row of faces
    pair_index: np.ndarray  # (P, 2) rows into faces
    pair_same: np.ndarray  # (P,)
    pair_fold: np.ndarray  # (P,)
    alignment: AlignedSet
    skipped_pairs: tuple[str, ...]
    face_fold: np.ndarray | None = None  # the people fold of each face's person (all_people or a subset)
    # A smaller evaluation: {"photos", "of_photos", "pairs", "of_pairs", "seed"}; None: the whole folds.
    subset: dict[str, int] | None = None

    def without(self, identities: Collection[str]) -> LFWFaces:
        """These folds less the given people's faces and every pair that shows one of them: how a
        model is scored on folds 1-5 when some of their people trained it."""
        keep = ~np.isin(self.identities, list(identities))
        if keep.all():
            return self
        new_row = np.cumsum(keep) - 1
        pairs = keep[self.pair_index].all(axis=1)
        return replace(
            self, faces=self.faces[keep], identities=self.identities[keep], pair_index=new_row[self.pair_index[pairs]],
            pair_same=self.pair_same[pairs], pair_fold=self.pair_fold[pairs],
            face_fold=None if self.face_fold is None else self.face_fold[keep],
            subset=None if self.subset is None else {**self.subset, "photos": int(keep.sum()), "pairs": int(pairs.sum())},
        )

    def alignment_summary(self) -> dict[str, object]:
        return {
            "images": len(self.alignment.paths),
            "fallback_images": len(self.alignment.with_status("fallback")),
            "unusable_images": [str(p) for s in ("noface", "unreadable") for p in self.alignment.with_status(s)],
            "skipped_pairs": list(self.skipped_pairs),
        }


def subset_pairs(pairs: Sequence[LFWPair], folds: tuple[int, ...], max_photos: int, seed: int = SUBSET_SEED) -> list[LFWPair]:
    """A seeded subset of `pairs` showing at most `max_photos` photos: the pairs of each (fold,
    matched or mismatched) in a seeded order, taken one from each in turn, so that every fold and
    both kinds keep about equal shares, until the next pair's photos would not fit."""
    if max_photos < MIN_SUBSET_PHOTOS_PER_FOLD * len(folds):
        raise FaceCoreError(f"a subset of {max_photos} photos cannot hold a matched and a mismatched pair in each of "
                            f"{len(folds)} folds: take at least {MIN_SUBSET_PHOTOS_PER_FOLD * len(folds)}")
    rng = np.random.default_rng(seed)
    queues = []
    for fold in folds:
        for same in (True, False):
            group = [p for p in pairs if p.fold == fold and p.same == same]
            queues.append([group[i] for i in rng.permutation(len(group))])
    chosen: list[LFWPair] = []
    photos: set[Path] = set()
    for turn in range(max(map(len, queues), default=0)):
        for queue in queues:
            if turn >= len(queue):
                continue
            pair = queue[turn]
            new = {pair.a.path, pair.b.path} - photos
            if len(photos) + len(new) > max_photos:
                return chosen
            photos |= new
            chosen.append(pair)
    return chosen


def folds_text(folds: Sequence[int]) -> str:
    """6-10 for a run of folds, else 6,8: how reports name a fold selection."""
    ordered = sorted(folds)
    if len(ordered) > 1 and ordered == list(range(ordered[0], ordered[-1] + 1)):
        return f"{ordered[0]}-{ordered[-1]}"
    return ",".join(map(str, ordered))


def fold_photo_count(root: str | Path, folds: tuple[int, ...]) -> int:
    """How many photos the people of `folds` have: what the whole evaluation aligns and embeds."""
    people = LFW(root).people_folds()
    return sum(sum(people[fold - 1].values()) for fold in folds)


def load_lfw_faces(
    root: str | Path, folds: tuple[int, ...], aligner: FaceAligner | None = None, max_pairs_per_fold: int | None = None,
    all_people: bool = True, max_photos: int | None = None,
) -> LFWFaces:
    """Align every image the chosen folds need (cached after the first run). `max_photos`: the
    smaller evaluation (`subset_pairs`), unless the folds' people have no more photos than that."""
    lfw = LFW(root)
    pairs = [p for p in lfw.pairs() if p.fold in folds]
    if max_pairs_per_fold is not None:  # a quick look, e.g. in tests: keep matched and mismatched balanced
        pairs = [p for fold in folds for same in (True, False) for p in [q for q in pairs if q.fold == fold and q.same == same][: max_pairs_per_fold // 2]]
    subset: dict[str, int] | None = None
    fold_of: dict[str, int] = {}
    if max_photos is not None and all_people and max_photos < (everyone := fold_photo_count(root, folds)):
        every_pair = len(pairs)
        pairs = subset_pairs(pairs, folds, max_photos)
        fold_of = {img.identity: p.fold for p in pairs for img in (p.a, p.b)}  # a pair's fold is its people's (LFW View 2)
        all_people = False
        subset = {"photos": len({img.path for p in pairs for img in (p.a, p.b)}), "of_photos": everyone, "pairs": len(pairs),
                  "of_pairs": every_pair, "seed": SUBSET_SEED}
    images = {img.path: img for p in pairs for img in (p.a, p.b)}
    if all_people:
        people = lfw.people_folds()
        for fold in folds:
            for name, count in people[fold - 1].items():
                images.update({img.path: img for img in lfw.images_of(name, count)})
                fold_of[f"lfw:{name}"] = fold
    paths = sorted(images)
    aligned = (aligner or FaceAligner()).align_paths(paths, allow_fallback=True, desc=f"aligning LFW folds {folds[0]}-{folds[-1]}")
    row_of = {aligned.paths[k]: row for row, k in enumerate(aligned.kept)}
    index, same, fold_ids, skipped = [], [], [], []
    for pair in pairs:
        if pair.a.path in row_of and pair.b.path in row_of:
            index.append((row_of[pair.a.path], row_of[pair.b.path]))
            same.append(pair.same)
            fold_ids.append(pair.fold)
        else:
            skipped.append(f"{pair.a.path.name} / {pair.b.path.name}")
    identities = np.array([images[aligned.paths[k]].identity for k in aligned.kept])
    face_fold = np.array([fold_of.get(str(name), 0) for name in identities]) if fold_of else None
    return LFWFaces(
        folds, aligned.faces, identities, np.array(index, dtype=np.int64).reshape(-1, 2), np.array(same, bool),
        np.array(fold_ids), aligned, tuple(skipped), face_fold, subset,
    )


@dataclass(frozen=True)
class LFWResult:
    report: VerificationReport
    genuine: np.ndarray = field(repr=False)  # every all-pairs score, for the ROC
    impostor: np.ndarray = field(repr=False)

    @property
    def roc(self) -> tuple[np.ndarray, np.ndarray]:
        """All-pairs FAR, TAR, for plots; worked out when asked for: sorting 25M impostor scores takes
        seconds, and the demo and the simulator score every round without plotting a ROC."""
        return _all_pairs_roc(self.genuine, self.impostor)


def evaluate(data: LFWFaces, embed: EmbedFn, fars: tuple[float, ...] = FARS) -> LFWResult:
    if len(data.pair_index) == 0:
        raise FaceCoreError("no LFW pair could be scored: every pair has an image without a face")
    if len(set(data.pair_fold.tolist())) < 2:
        raise FaceCoreError("accuracy needs at least 2 folds to choose thresholds on held-out folds")
    embeddings = embed(data.faces)
    scores = cosine_scores(embeddings[data.pair_index[:, 0]], embeddings[data.pair_index[:, 1]])
    accuracy = kfold_accuracy(scores, data.pair_same, data.pair_fold)
    genuine, impostor = all_pairs_scores(embeddings, data.identities)
    report = VerificationReport(
        accuracy=accuracy.mean,
        accuracy_std=accuracy.std,
        auc=roc_auc(scores, data.pair_same),
        tar_at_far=tar_at_far(genuine, impostor, fars),
        folds=data.folds,
        pairs=int(len(scores)),
        extra={
            "per_fold_accuracy": [round(a, 6) for a in accuracy.per_fold],
            **({"per_fold_tar_at_far": per_fold_tar(data, embeddings, fars)} if data.face_fold is not None else {}),
            "all_pairs": {"genuine": int(genuine.size), "impostor": int(impostor.size)},
            **({"subset": dict(data.subset)} if data.subset is not None else {}),
            **data.alignment_summary(),
        },
    )
    return LFWResult(report, genuine, impostor)


def per_fold_tar(data: LFWFaces, embeddings: np.ndarray, fars: tuple[float, ...] = FARS) -> dict[str, list[float]]:
    """TAR@FAR over each people fold's own all pairs: the fold-to-fold spread a TAR gain must beat.
    A fold of about 1,400 faces holds about 1M impostor pairs, enough for FAR 1e-4."""
    if data.face_fold is None:
        raise FaceCoreError("per-fold TAR needs every person's fold: load the faces with all_people=True")
    per_fold: dict[str, list[float]] = {}
    for fold in data.folds:
        rows = data.face_fold == fold
        genuine, impostor = all_pairs_scores(embeddings[rows], data.identities[rows])
        for key, tar in tar_at_far(genuine, impostor, fars).items():
            per_fold.setdefault(key, []).append(round(tar, 6))
    return per_fold


def _all_pairs_roc(genuine: np.ndarray, impostor: np.ndarray, points: int = 400) -> tuple[np.ndarray, np.ndarray]:
    """A ROC curve sampled at log-spaced FARs: 25M impostors are too many to plot one by one."""
    fars = np.logspace(np.log10(max(1.0 / max(impostor.size, 1), 1e-6)), 0, points)
    ordered = np.sort(impostor)[::-1]
    thresholds = ordered[np.minimum((fars * impostor.size).astype(np.int64), impostor.size - 1)]
    genuine_sorted = np.sort(genuine)
    tars = 1.0 - np.searchsorted(genuine_sorted, thresholds, side="right") / max(genuine.size, 1)
    return fars, tars


__all__ = [
    "MIN_SUBSET_PHOTOS_PER_FOLD", "SUBSET_SEED", "TEST_FOLDS", "LFWFaces", "LFWResult", "evaluate", "fold_photo_count", "folds_text", "load_lfw_faces",
    "per_fold_tar", "refuse_test_folds", "roc_curve", "subset_pairs",
]
