"""An update's floating arrays packed in one flat buffer, so that the per-update arithmetic a simulated round
repeats for every device (the delta, its wire cast, its length, its share of the weighted sum) is one pass over
one buffer instead of one call per entry: a backbone's trainable suffix has dozens of small entries, and one
numpy or torch call per entry costs more than the arithmetic itself.

Invariants:
- :class:`PackedArrays` is a ``Mapping[str, np.ndarray]`` like any update's arrays: every consumer that reads it
  entry by entry gets the same values, as views of the flat buffer. Code that knows the layout may read ``flat``.
- The packed entries are the floating ones, in the layout's order; any other entry (an integer BatchNorm step
  count) is kept aside in ``rest``, unpacked. A layout is fixed by its keys and shapes, so two packs with equal
  layouts hold the same entries at the same offsets.
- Importing this module loads numpy only: the server's strategies read it.
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from math import prod

import numpy as np


@dataclass(frozen=True)
class Layout:
    """Where each packed entry lies in the flat buffer: ``keys[i]`` has ``shapes[i]`` and starts at ``offsets[i]``."""

    keys: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    sizes: tuple[int, ...] = field(init=False, compare=False)
    offsets: tuple[int, ...] = field(init=False, compare=False)
    size: int = field(init=False, compare=False)

    def __post_init__(self) -> None:
        if len(self.keys) != len(self.shapes):
            raise ValueError(f"{len(self.keys)} keys but {len(self.shapes)} shapes")
        sizes = tuple(prod(shape) for shape in self.shapes)
        offsets = [0]
        for size in sizes:
            offsets.append(offsets[-1] + size)
        object.__setattr__(self, "sizes", sizes)
        object.__setattr__(self, "offsets", tuple(offsets[:-1]))
        object.__setattr__(self, "size", offsets[-1])

    @classmethod
    def of(cls, shapes: Mapping[str, tuple[int, ...]]) -> Layout:
        return cls(tuple(shapes), tuple(tuple(s) for s in shapes.values()))

    def views(self, flat: np.ndarray) -> dict[str, np.ndarray]:
        """Each entry as a view of ``flat`` (a 1-D buffer of ``size`` values)."""
        if flat.shape != (self.size,):
            raise ValueError(f"a flat buffer of this layout holds {self.size} values, got shape {flat.shape}")
        return {key: flat[offset : offset + size].reshape(shape)
                for key, shape, size, offset in zip(self.keys, self.shapes, self.sizes, self.offsets, strict=True)}


class PackedArrays(Mapping[str, np.ndarray]):
    """The packed entries as views of ``flat`` in ``layout``'s order, then the ``rest``. The views are made on the
    first lookup by key, which the packed fast paths never do."""

    def __init__(self, layout: Layout, flat: np.ndarray, rest: Mapping[str, np.ndarray] | None = None) -> None:
        if flat.shape != (layout.size,) or flat.dtype.kind != "f":
            raise ValueError(f"packed entries need a 1-D floating buffer of {layout.size} values, got {flat.dtype} {flat.shape}")
        rest = dict(rest or {})
        if not rest.keys().isdisjoint(layout.keys):
            raise ValueError(f"{sorted(rest.keys() & set(layout.keys))[:3]} are both packed and kept aside")
        self.layout = layout
        self.flat = flat
        self.rest = rest
        self._entries: dict[str, np.ndarray] | None = None

    def __reduce__(self) -> tuple[type[PackedArrays], tuple[Layout, np.ndarray, dict[str, np.ndarray]]]:
        # The buffer once, not again as the views made by a lookup (pickle copies a view's values).
        return PackedArrays, (self.layout, self.flat, self.rest)

    def _all(self) -> dict[str, np.ndarray]:
        if self._entries is None:
            self._entries = {**self.layout.views(self.flat), **self.rest}
        return self._entries

    def __getitem__(self, key: str) -> np.ndarray:
        return self._all()[key]

    def __iter__(self) -> Iterator[str]:
        yield from self.layout.keys
        yield from self.rest

    def __len__(self) -> int:
        return len(self.layout.keys) + len(self.rest)

    def __contains__(self, key: object) -> bool:
        return key in self.rest or key in self.layout.keys
