"""Typed records shared by every reader."""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

IMAGE_SUFFIXES = frozenset({".jpg", ".jpeg", ".png", ".bmp", ".webp"})


@dataclass(frozen=True, order=True)
class FaceImage:
    """One photo of one person. `identity` is namespaced by source ("lfw:Name", "celeba:123")
    so identities from different datasets never collide."""

    identity: str
    path: Path


def group_by_identity(images: Iterable[FaceImage]) -> dict[str, list[FaceImage]]:
    groups: dict[str, list[FaceImage]] = defaultdict(list)
    for image in images:
        groups[image.identity].append(image)
    return {identity: sorted(group) for identity, group in sorted(groups.items())}
