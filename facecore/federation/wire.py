"""What crosses the wire in a round, as arrays: the global model as a device receives it, a device's
delta, and the update file's tensors as a device sends them. The device SDK, the simulator and the
simulator's worker processes all take their deltas (`delta`) and their wire cast (`wire_arrays`,
`update_tensors`) from here, so every simulated update sees the precision a live round has.

Invariants:
- Importing this module loads numpy only, never torch: the server's validation processes and the
  strategies read `widened` from here. The functions that take torch tensors use the tensors' own
  methods, and `delta` imports torch when called.
- Only floating arrays change precision; integer entries (batch-norm counters) cross as they are.
- A delta is the trained value minus the base one, where the base is the model as the device received
  it, so a delta never carries the download's rounding error back to the server. An update carries one
  for each of the round's trained entries (`trained_entries`) and nothing for the frozen rest, in an
  update file as in the simulator; the server reads only those entries.
- The class embedding always crosses in float32.

Speed: numpy converts the tiny values a delta holds (fp16 subnormals) about 100x slower than normal
ones, in both directions. Tensors are cast with torch (`wire_arrays`: the same bits, already at the
wire's precision, so `as_sent` leaves them alone), and every half-precision array is widened by
`widened`'s table lookup.
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Literal

import numpy as np

from facecore.federation.packed import PackedArrays
from facecore.federation.protocol import BACKBONE_PREFIX, EMBEDDING_KEY

if TYPE_CHECKING:
    from torch import Tensor

Precision = Literal["fp16", "fp32"]
PRECISIONS: tuple[Precision, ...] = ("fp16", "fp32")
_DTYPES: dict[str, type[np.floating]] = {"fp16": np.float16, "fp32": np.float32}


def as_sent(weights: Mapping[str, np.ndarray], precision: Precision) -> dict[str, np.ndarray]:
    """Each floating array at the wire's precision; every other array unchanged."""
    wire = _wire_dtype(precision)
    return {k: v.astype(wire, copy=False) if np.issubdtype(v.dtype, np.floating) else v for k, v in weights.items()}


# Every half-precision value, widened exactly: a table lookup instead of numpy's slow fp16 cast.
_HALF_TO_SINGLE = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)


def widened_table() -> np.ndarray:
    """Every half-precision value as float32, indexed by its bits (read-only)."""
    view = _HALF_TO_SINGLE.view()
    view.flags.writeable = False
    return view


def widened(values: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """`values` as float32, exactly; float16 through the lookup table, anything else by numpy."""
    if values.dtype == np.float16:
        # "wrap" never wraps (every uint16 indexes the table) and spares the bounds check, the slow part of a take into `out`
        return _HALF_TO_SINGLE.take(values.view(np.uint16), out=out, mode="wrap")
    if out is None:
        return np.asarray(values, dtype=np.float32)
    out[...] = values
    return out


def trained_entries(names: Sequence[str], trainable_blocks: int | None) -> list[str]:
    """The state_dict entries a round's local training changes, in `names`' order: every entry, or with
    `trainable_blocks` k those of the last k `blocks.<i>` and of the `head` (the backbone contract,
    facecore.models.registry). The device trains, and sends, exactly these; the server reads exactly these."""
    if trainable_blocks is None:
        return list(names)
    count = 1 + max((int(n.split(".")[1]) for n in names if n.startswith("blocks.")), default=-1)
    cut = count - min(trainable_blocks, count)
    prefixes = ("head.", *(f"blocks.{i}." for i in range(cut, count)))
    return [n for n in names if n.startswith(prefixes)]


def delta(trained: Mapping[str, Tensor], base: Mapping[str, Tensor], every_entry: bool = False) -> dict[str, Tensor]:
    """The trained value minus the base one for each entry of `trained` (the entries local training
    changed); with `every_entry`, one for each entry of `base`, in its order, zero for an entry training
    left out: what an update file carries."""
    import torch

    keys = list(trained)
    # No graph: `base` may hold a model's live parameters. One call for every entry: a backbone's state_dict has hundreds of small tensors.
    with torch.no_grad():
        moved = dict(zip(keys, torch._foreach_sub([trained[k] for k in keys], [base[k] for k in keys]), strict=True)) if keys else {}
        if not every_entry:
            return moved
        return {name: moved[name] if name in moved else torch.zeros_like(value) for name, value in base.items()}


def wire_arrays(tensors: Mapping[str, Tensor], precision: Precision) -> dict[str, np.ndarray]:
    """`tensors` as numpy at the wire's precision, cast by torch: numpy casts the tiny values of a
    delta to fp16 about 100x slower, to the same bits."""
    _wire_dtype(precision)
    return {k: _on_wire(v, precision) for k, v in tensors.items()}


def packed_delta(trained: Tensor, base: Tensor, precision: Precision) -> np.ndarray:
    """`delta` then `wire_arrays` for floating entries packed in one flat buffer each, in the same layout
    (facecore.federation.packed): one subtraction and one cast for every entry, to the same bits."""
    import torch

    _wire_dtype(precision)
    with torch.no_grad():
        return _on_wire(trained - base, precision)


def packed_on_wire(moved: PackedArrays, precision: Precision) -> PackedArrays:
    """A packed delta (a device worker's, in float32) at the wire's precision: one cast for its floating
    entries, the others as they are, to the bits `wire_arrays` gives entry by entry."""
    import torch

    _wire_dtype(precision)
    flat = torch.from_numpy(np.require(moved.flat, requirements="W"))  # Ray hands read-only arrays, which torch will not wrap quietly
    return PackedArrays(moved.layout, _on_wire(flat, precision), moved.rest)


def _wire_dtype(precision: Precision) -> type[np.floating]:
    if precision not in _DTYPES:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    return _DTYPES[precision]


def _on_wire(tensor: Tensor, precision: Precision) -> np.ndarray:
    return (tensor.half() if precision == "fp16" and tensor.is_floating_point() else tensor).numpy()


def as_received(weights: Mapping[str, np.ndarray], precision: Precision) -> dict[str, np.ndarray]:
    """The weights a device computes with after a download at `precision`: sent, then widened to float32."""
    return {k: widened(v) if np.issubdtype(v.dtype, np.floating) else v for k, v in as_sent(weights, precision).items()}


def update_tensors(deltas: Mapping[str, np.ndarray], template: np.ndarray, precision: Precision) -> dict[str, np.ndarray]:
    """An update file's tensors: every backbone delta at the wire's precision, then the class embedding."""
    tensors = {BACKBONE_PREFIX + k: v for k, v in as_sent(deltas, precision).items()}
    tensors[EMBEDDING_KEY] = np.asarray(template, np.float32)
    return tensors

