"""Partitions exactly as specified: disjoint, covering their pool, 2 classes / all classes / random."""
import itertools

import numpy as np
import pytest

from simulator.fusion.config import FusionInputError
from simulator.fusion.partition import Partition, apportion, partition

CLASSES = 10


def _labels(seed: int = 0, per_class: int = 700) -> np.ndarray:
    # Uneven class sizes, as in MNIST, so shards cannot line up with class boundaries by luck
    sizes = per_class + np.random.default_rng(seed).integers(-150, 150, CLASSES)
    return np.random.default_rng(seed + 1).permutation(np.repeat(np.arange(CLASSES), sizes))


def _assert_disjoint_and_covering(split: Partition, nodes: int) -> None:
    assert len(split.nodes) == nodes
    for a, b in itertools.combinations(split.nodes, 2):
        assert np.intersect1d(a, b).size == 0
    assert len(np.unique(split.pool)) == sum(len(n) for n in split.nodes)


@pytest.mark.parametrize("nodes", [10, 7, 3, 1])
def test_pathological_gives_every_node_exactly_two_classes(nodes: int) -> None:
    # Prepare
    labels = _labels()
    # Execute
    split = partition(labels, "pathological", nodes, 60, np.random.default_rng(4))
    # Assert
    counts = split.class_counts(labels, CLASSES)
    assert ((counts > 0).sum(axis=1) == 2).all()
    _assert_disjoint_and_covering(split, nodes)
    assert len(split.pool) == nodes * 60
    assert abs(min(map(len, split.nodes)) - 60) < 30  # shards of one class are near-equal halves


def test_pathological_uses_two_shards_per_node_of_single_classes() -> None:
    # Prepare: 10 nodes → 20 shards over 10 classes → every class cut into exactly 2 shards
    labels = _labels(3)
    # Execute
    split = partition(labels, "pathological", 10, 60, np.random.default_rng(8))
    # Assert: every class is held by exactly two nodes, and no two nodes pair the same classes twice everywhere
    counts = split.class_counts(labels, CLASSES)
    assert ((counts > 0).sum(axis=0) == 2).all()
    assert len({tuple(np.flatnonzero(row)) for row in counts}) > 1


def test_user_specific_gives_every_node_every_class_in_different_proportions() -> None:
    # Prepare
    labels = _labels(5)
    # Execute
    split = partition(labels, "user-specific", 10, 200, np.random.default_rng(6), alpha=0.5)
    iid = partition(labels, "iid", 10, 200, np.random.default_rng(6))
    # Assert
    counts = split.class_counts(labels, CLASSES)
    assert (counts >= 1).all()
    assert (counts.sum(axis=1) == 200).all()
    _assert_disjoint_and_covering(split, 10)
    share = counts / counts.sum(axis=1, keepdims=True)
    iid_share = iid.class_counts(labels, CLASSES) / 200

    def mean_tv(s: np.ndarray) -> float:  # mean total-variation distance between pairs of nodes
        return float(np.mean([0.5 * np.abs(s[a] - s[b]).sum() for a, b in itertools.combinations(range(len(s)), 2)]))

    assert len({tuple(row) for row in counts}) == 10
    assert mean_tv(share) > 0.4 > 0.15 > mean_tv(iid_share)


def test_iid_splits_a_random_pool_evenly() -> None:
    # Prepare
    labels = _labels(7)
    # Execute
    split = partition(labels, "iid", 6, 100, np.random.default_rng(1))
    # Assert
    _assert_disjoint_and_covering(split, 6)
    assert [len(n) for n in split.nodes] == [100] * 6
    assert (split.class_counts(labels, CLASSES).sum(axis=0) > 0).all()


@pytest.mark.parametrize("scheme", ["iid", "pathological", "user-specific"])
def test_a_late_node_is_drawn_only_from_images_no_other_node_holds(scheme: str) -> None:
    # Prepare
    labels = _labels(9)
    first = partition(labels, scheme, 5, 100, np.random.default_rng(2))
    # Execute
    late = partition(labels, scheme, 1, 100, np.random.default_rng(3), exclude=first.pool)
    # Assert
    assert np.intersect1d(late.pool, first.pool).size == 0
    assert len(late.pool) == 100


def test_too_many_images_is_one_clear_error() -> None:
    with pytest.raises(FusionInputError, match="only"):
        partition(_labels(), "iid", 100, 100, np.random.default_rng(0))


def test_apportion_sums_exactly() -> None:
    assert apportion(np.array([1.0, 1.0, 1.0]), 10).tolist() == [4, 3, 3]
    assert apportion(np.array([0.7, 0.2, 0.1]), 7).sum() == 7
