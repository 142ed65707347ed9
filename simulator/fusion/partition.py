"""The paper's three ways of spreading a training subsample over nodes.

Every scheme returns disjoint index sets whose union is the subsample it drew (``pool``), so a
node's data never leaks into another node's, and a later node can be drawn from what is left.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simulator.fusion.config import PARTITIONS, FusionInputError


@dataclass(frozen=True)
class Partition:
    scheme: str
    nodes: tuple[np.ndarray, ...]  # indices into the label array given to `partition`

    @property
    def pool(self) -> np.ndarray:
        return np.sort(np.concatenate(self.nodes))

    def class_counts(self, labels: np.ndarray, classes: int) -> np.ndarray:
        """(nodes, classes) matrix of image counts."""
        return np.stack([np.bincount(labels[idx], minlength=classes) for idx in self.nodes])


def partition(
    labels: np.ndarray, scheme: str, nodes: int, per_node: int, rng: np.random.Generator,
    alpha: float = 0.5, exclude: np.ndarray | None = None,
) -> Partition:
    """Draw about ``nodes × per_node`` images from ``labels`` (never ``exclude``) and split them per ``scheme``."""
    if scheme not in PARTITIONS:
        raise FusionInputError(f"partition must be one of {', '.join(PARTITIONS)}")
    available = np.setdiff1d(np.arange(len(labels)), exclude if exclude is not None else np.empty(0, np.int64))
    if scheme == "user-specific":
        return Partition(scheme, _dirichlet(labels, available, nodes, per_node, rng, alpha))
    if scheme == "pathological":
        return Partition(scheme, _pathological(labels, available, nodes, per_node, rng))
    pool = _draw(available, nodes * per_node, rng)
    return Partition(scheme, tuple(np.sort(part) for part in np.array_split(rng.permutation(pool), nodes)))


def _draw(available: np.ndarray, size: int, rng: np.random.Generator) -> np.ndarray:
    if size > len(available):
        raise FusionInputError(f"asked for {size} training images but only {len(available)} are left; lower --nodes or per-node")
    return rng.choice(available, size, replace=False)


def apportion(weights: np.ndarray, total: int) -> np.ndarray:
    """Integers proportional to ``weights`` summing exactly to ``total`` (largest remainder)."""
    quota = np.asarray(weights, dtype=np.float64) / np.sum(weights) * total
    counts = np.floor(quota).astype(np.int64)
    order = np.argsort(-(quota - counts), kind="stable")
    counts[order[: total - counts.sum()]] += 1
    return counts


def _pathological(labels: np.ndarray, available: np.ndarray, nodes: int, per_node: int, rng: np.random.Generator) -> tuple[np.ndarray, ...]:
    """McMahan's shards: 2N single-class shards, two of distinct classes per node.

    Shards are cut inside each class rather than from one label-sorted list, because a shard that
    straddles a class boundary would give its node a third class.
    """
    present = np.unique(labels[available])
    if len(present) < 2:
        raise FusionInputError("the pathological partition needs at least two classes")
    shards_total = 2 * nodes
    # Fewer shards than classes: each shard gets its own class and the other classes stay out of the pool.
    chosen = rng.choice(present, shards_total, replace=False) if shards_total < len(present) else present
    pool = _draw(available[np.isin(labels[available], chosen)], nodes * per_node, rng)
    per_class = [pool[labels[pool] == c] for c in chosen]
    counts = np.array([len(p) for p in per_class])
    shards = _shard_counts(counts, shards_total, cap=nodes)
    pieces: list[tuple[int, np.ndarray]] = []
    for c, members, n in zip(chosen, per_class, shards):
        pieces += [(int(c), part) for part in np.array_split(rng.permutation(members), n)]
    pairs = _pair_distinct([c for c, _ in pieces], rng)
    return tuple(np.sort(np.concatenate([pieces[a][1], pieces[b][1]])) for a, b in pairs)


def _shard_counts(counts: np.ndarray, total: int, cap: int) -> np.ndarray:
    """Shards per class ∝ its images, each class 1..cap shards (cap = nodes keeps pairs distinct)."""
    if total > cap * len(counts) or np.any(counts < 1):
        raise FusionInputError("too few classes for two distinct classes per node")
    shards = np.minimum(np.maximum(apportion(counts, total), 1), np.minimum(cap, counts))
    while shards.sum() < total:  # capped classes hand their shards to the largest uncapped ones
        room = np.where(shards < np.minimum(cap, counts), counts / shards, -1.0)
        if room.max() < 0:
            raise FusionInputError("too few images per class to cut two shards per node; raise per-node")
        shards[int(np.argmax(room))] += 1
    while shards.sum() > total:
        shards[int(np.argmax(np.where(shards > 1, shards, 0)))] -= 1
    return shards


def _pair_distinct(shard_classes: list[int], rng: np.random.Generator) -> list[tuple[int, int]]:
    """Random pairs of shards of different classes (no class holds more than half the shards)."""
    n = len(shard_classes) // 2
    for _ in range(200):
        order = rng.permutation(len(shard_classes))
        pairs = [(int(order[2 * i]), int(order[2 * i + 1])) for i in range(n)]
        if all(shard_classes[a] != shard_classes[b] for a, b in pairs):
            return pairs
    # Sorted by class, shard i and shard i+n can only share a class if that class held n+1 shards.
    by_class = sorted(range(len(shard_classes)), key=lambda i: shard_classes[i])
    return [(by_class[i], by_class[i + n]) for i in rng.permutation(n)]


DIRICHLET_TRIES = 1000


def _dirichlet(
    labels: np.ndarray, available: np.ndarray, nodes: int, per_node: int, rng: np.random.Generator, alpha: float
) -> tuple[np.ndarray, ...]:
    """Per node: class proportions ~ Dirichlet(alpha), one image of every class first; proportions
    that ask a class for more images than it has are redrawn (up to DIRICHLET_TRIES times).

    The guaranteed image per class is what makes the scheme "user-specific" (all classes, different
    mix) rather than a milder pathological split; it is skipped only when per_node < classes.
    """
    present = np.unique(labels[available])
    floor = 1 if per_node >= len(present) else 0
    sizes = np.array([int((labels[available] == c).sum()) for c in present])
    # Redraw the proportions while some class cannot supply what the nodes want together: the split
    # is then conditioned on fitting the data (a first draw that fits is kept, as before this loop).
    for _ in range(DIRICHLET_TRIES):
        wanted = np.stack([
            floor + apportion(rng.dirichlet(np.full(len(present), alpha)), per_node - floor * len(present)) for _ in range(nodes)
        ])
        if np.all(wanted.sum(0) <= sizes):
            break
    parts: list[list[np.ndarray]] = [[] for _ in range(nodes)]
    for k, c in enumerate(present):
        members = rng.permutation(available[labels[available] == c])
        if wanted[:, k].sum() > len(members):
            raise FusionInputError(f"class {c} has {len(members)} images, the user-specific split asks for {wanted[:, k].sum()}; lower per-node")
        edges = np.cumsum(wanted[:, k])
        for node, part in enumerate(np.split(members[: edges[-1]], edges[:-1])):
            parts[node].append(part)
    return tuple(np.sort(np.concatenate(p)) for p in parts)
