"""Silo plans: heterogeneous, identity-disjoint trainers and validators, evaluation untouched."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from facecore.data.lfw import LFWPair
from facecore.data.records import FaceImage
from facecore.data.split import SplitConfig, SplitManifest
from simulator.cross_silo.silos import pairs_in_folds, plan_silos


def photos(identity: str, n: int) -> tuple[str, ...]:
    return tuple(f"{identity}/{k}.jpg" for k in range(n))


def fake_split() -> tuple[SplitManifest, list[LFWPair]]:
    public = {f"lfw:many{i}": photos(f"many{i}", 6 + i) for i in range(8)}
    public |= {f"lfw:few{i}": photos(f"few{i}", 1 + i % 4) for i in range(12)}
    public |= {f"lfw:val{i}": photos(f"val{i}", 3) for i in range(4)}
    devices = {f"celeba:{i}": photos(f"c{i}", 20) for i in range(20)}
    evaluation = {f"lfw:eval{i}": photos(f"eval{i}", 2) for i in range(3)}
    manifest = SplitManifest(SplitConfig(), {"public": public, "devices": devices, "evaluation": evaluation})
    img = lambda name: FaceImage(f"lfw:{name}", Path(name))  # noqa: E731
    pairs = [LFWPair(img(f"val{i}"), img(f"val{i}"), True, fold) for i, fold in ((0, 1), (1, 2))]
    pairs += [LFWPair(img("val2"), img("val3"), False, 2), LFWPair(img("eval0"), img("eval1"), False, 6)]
    return manifest, pairs


def test_three_party_plan_is_heterogeneous_and_disjoint() -> None:
    manifest, pairs = fake_split()
    plan = plan_silos(manifest, pairs, trainers=3, validators=2, seed=0)
    names = {p.name: set(p.identities) for p in plan.trainers + plan.validators}
    assert list(names) == ["lfw-many", "lfw-few", "celeba", "lfw-pairs", "celeba-pairs"]
    assert names["lfw-pairs"] == {f"lfw:val{i}" for i in range(4)}  # everyone in folds 1-2 pairs, nobody of fold 6
    assert names["lfw-many"] == {f"lfw:many{i}" for i in range(8)} and names["lfw-few"] == {f"lfw:few{i}" for i in range(12)}
    assert len(names["celeba-pairs"]) == 4 and len(names["celeba"]) == 16
    assert not any(i.startswith("lfw:eval") for ids in names.values() for i in ids)


def test_twelve_parties_split_each_silo_into_four_disjoint_parts() -> None:
    manifest, pairs = fake_split()
    plan = plan_silos(manifest, pairs, trainers=3, parties=12, validators=1, seed=0)
    assert [p.name for p in plan.trainers][:4] == ["lfw-many/1", "lfw-many/2", "lfw-many/3", "lfw-many/4"]
    assert sum(len(p.identities) for p in plan.trainers if p.name.startswith("celeba")) == 20  # no celeba validator
    assert len(plan.trainers) == 12  # __post_init__ already checked that they are disjoint


def test_a_manifest_that_evaluates_on_validation_folds_is_refused() -> None:
    manifest, pairs = fake_split()
    clash = SplitManifest(SplitConfig(eval_folds=(1, 6)), manifest.sets)
    with pytest.raises(ValueError, match="evaluates"):
        plan_silos(clash, pairs)


def test_built_pairs_are_balanced_within_identity_disjoint_folds() -> None:
    labels = np.repeat(np.arange(10), 4)
    index, same, folds = pairs_in_folds(labels, folds=5, per_fold=3, seed=0)
    for fold in np.unique(folds):
        rows = index[folds == fold]
        assert (same[folds == fold]).sum() == (~same[folds == fold]).sum() == 3
        others = index[folds != fold]
        assert not set(labels[rows].ravel()) & set(labels[others].ravel())
    assert np.all((labels[index[:, 0]] == labels[index[:, 1]]) == same)
