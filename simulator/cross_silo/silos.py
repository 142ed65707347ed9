"""Who holds what: heterogeneous trainer silos and validators with disjoint identities.

Everything comes from the split manifest's non-evaluation identities (``public`` +
``devices``: LFW people folds 1-5 and the CelebA subset); LFW folds 6-10 are only ever
used to report accuracy. With the default seed-0 split:

* validator ``lfw-pairs``: LFW View-2 pairs of folds 1 and 2 (1,200 pairs), threshold by
  2-fold cross-validation (fold 1 <-> fold 2). Every person in those pairs leaves the trainers.
* validator ``celeba-pairs``: a seeded fifth of the CelebA identities; pairs are built in
  5 identity-disjoint folds (up to 60 matched + 60 mismatched each).
* trainer ``lfw-many``: remaining LFW people with >= 5 photos (press photos, many per person);
* trainer ``lfw-few``: remaining LFW people with 1-4 photos (many classes, few samples each);
* trainer ``celeba``: remaining CelebA identities (in-the-wild photos, ~21 per person).

``parties = 4 * trainers`` splits each silo into 4 identity-disjoint parts (the paper's 12-party setting).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from facecore.data.lfw import LFWPair
from facecore.data.split import SplitManifest

SILOS = ("lfw-many", "lfw-few", "celeba")
VALIDATORS = ("lfw-pairs", "celeba-pairs")
LFW_VALIDATION_FOLDS = (1, 2)
MANY_PHOTOS = 5
CELEBA_VALIDATION_SHARE = 0.2


@dataclass(frozen=True)
class PartyPlan:
    name: str
    identities: tuple[str, ...]


@dataclass(frozen=True)
class SiloPlan:
    trainers: tuple[PartyPlan, ...]
    validators: tuple[PartyPlan, ...]
    evaluation: frozenset[str]

    def __post_init__(self) -> None:
        self.check_disjoint()

    def check_disjoint(self) -> None:
        """Every trainer, every validator and the evaluation identities are pairwise disjoint."""
        groups = [(p.name, set(p.identities)) for p in self.trainers + self.validators] + [("evaluation", set(self.evaluation))]
        for i, (first, a) in enumerate(groups):
            for second, b in groups[i + 1 :]:
                shared = a & b
                if shared:
                    raise ValueError(f"{first} and {second} share {len(shared)} identities, e.g. {sorted(shared)[:3]}")
        for party in self.trainers + self.validators:
            if not party.identities:
                raise ValueError(f"{party.name} holds no identity")

    def describe(self) -> list[dict[str, object]]:
        return [{"role": role, "name": p.name, "identities": len(p.identities)}
                for role, group in (("trainer", self.trainers), ("validator", self.validators)) for p in group]


def plan_silos(
    manifest: SplitManifest, lfw_pairs: Sequence[LFWPair], trainers: int = 3, parties: int | None = None, validators: int = 2, seed: int = 0,
) -> SiloPlan:
    """Assign identities (see the module docstring); photo counts are the manifest's."""
    parties = parties or trainers
    if not 1 <= trainers <= len(SILOS) or parties % trainers or not 0 <= validators <= len(VALIDATORS):
        raise ValueError(f"need 1-3 trainers, parties a multiple of trainers and 0-2 validators, got {trainers}, {parties}, {validators}")
    clash = set(LFW_VALIDATION_FOLDS) & set(manifest.config.eval_folds)
    if clash:
        raise ValueError(f"the lfw-pairs validator uses LFW folds {LFW_VALIDATION_FOLDS}, but the manifest evaluates on {sorted(clash)}")
    pool = {**manifest.sets["public"], **manifest.sets["devices"]}
    rng = np.random.default_rng(seed)
    held: list[PartyPlan] = []
    if validators >= 1:
        ids = sorted({img.identity for p in lfw_pairs if p.fold in LFW_VALIDATION_FOLDS for img in (p.a, p.b)})
        held.append(PartyPlan("lfw-pairs", tuple(ids)))
    celeba = sorted(i for i in pool if i.startswith("celeba:") and len(pool[i]) >= 2)
    if validators >= 2:
        chosen = rng.choice(len(celeba), max(2, round(CELEBA_VALIDATION_SHARE * len(celeba))), replace=False)
        held.append(PartyPlan("celeba-pairs", tuple(sorted(celeba[i] for i in chosen))))
    taken = {i for v in held for i in v.identities}
    free = sorted(i for i in pool if i not in taken)
    silos = {
        "lfw-many": [i for i in free if i.startswith("lfw:") and len(pool[i]) >= MANY_PHOTOS],
        "lfw-few": [i for i in free if i.startswith("lfw:") and len(pool[i]) < MANY_PHOTOS],
        "celeba": [i for i in free if i.startswith("celeba:")],
    }
    split = parties // trainers
    chosen_trainers: list[PartyPlan] = []
    for name in SILOS[:trainers]:
        ids = silos[name]
        if split == 1:
            chosen_trainers.append(PartyPlan(name, tuple(ids)))
            continue
        order = rng.permutation(len(ids))
        for part, index in enumerate(np.array_split(order, split), start=1):
            chosen_trainers.append(PartyPlan(f"{name}/{part}", tuple(sorted(ids[i] for i in index))))
    return SiloPlan(tuple(chosen_trainers), tuple(held), frozenset(manifest.sets["evaluation"]))


def pairs_in_folds(labels: np.ndarray, folds: int, per_fold: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Verification pairs over row ``labels`` in identity-disjoint folds, like LFW's View 2.

    Returns ``(pair_index (P, 2), same (P,), fold (P,))``; each fold holds up to ``per_fold``
    matched and as many mismatched pairs, all between identities of that fold.
    """
    rng = np.random.default_rng(seed)
    identities = rng.permutation(np.unique(labels))
    index: list[tuple[int, int]] = []
    same: list[bool] = []
    fold_of: list[int] = []
    for fold, members in enumerate(np.array_split(identities, folds), start=1):
        rows = {int(m): np.flatnonzero(labels == m) for m in members}
        draws = -(-2 * per_fold // max(1, len(rows)))  # enough candidates to fill the fold after de-duplication
        matched = [tuple(rng.choice(r, 2, replace=False)) for m, r in rows.items() if len(r) >= 2 for _ in range(draws)]
        matched = list(dict.fromkeys(tuple(sorted(p)) for p in matched))
        rng.shuffle(matched)
        matched = matched[:per_fold]
        keys = [m for m in rows if len(rows[m])]
        mismatched: list[tuple[int, int]] = []
        while len(keys) >= 2 and len(mismatched) < len(matched):
            a, b = rng.choice(keys, 2, replace=False)
            mismatched.append((int(rng.choice(rows[int(a)])), int(rng.choice(rows[int(b)]))))
        for pairs, flag in ((matched, True), (mismatched, False)):
            index.extend(pairs)
            same.extend([flag] * len(pairs))
            fold_of.extend([fold] * len(pairs))
    return np.array(index, np.int64).reshape(-1, 2), np.array(same, bool), np.array(fold_of, np.int64)
