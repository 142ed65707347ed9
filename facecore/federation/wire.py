"""What crosses the wire in a round, as arrays: the global model as a device receives it and the update
file's tensors as a device sends them. The device SDK writes its update file from `update_tensors`, and
the simulator runs every simulated update through the same two functions, so both see the precision
a live round has.

Invariants: numpy only. Only floating arrays change precision; integer entries (batch-norm counters)
cross as they are. Deltas are taken against the model as received, so a device's delta never carries
the download's rounding error back to the server. The class embedding always crosses in float32.

Speed: numpy converts the tiny values a delta holds (fp16 subnormals) about 100x slower than normal
ones, in both directions. Callers that hold torch tensors cast them with torch before calling here
(`device_sdk.training.wire_arrays`: the same bits, already at the wire's precision, so `as_sent`
leaves them alone), and every half-precision array is widened by `widened`'s table lookup.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

import numpy as np

from facecore.federation.protocol import BACKBONE_PREFIX, EMBEDDING_KEY

Precision = Literal["fp16", "fp32"]
PRECISIONS: tuple[Precision, ...] = ("fp16", "fp32")
_DTYPES = {"fp16": np.float16, "fp32": np.float32}


def as_sent(weights: Mapping[str, np.ndarray], precision: Precision) -> dict[str, np.ndarray]:
    """Each floating array at the wire's precision; every other array unchanged."""
    if precision not in _DTYPES:
        raise ValueError(f"precision must be one of {PRECISIONS}, got {precision!r}")
    wire = _DTYPES[precision]
    return {k: v.astype(wire, copy=False) if np.issubdtype(v.dtype, np.floating) else v for k, v in weights.items()}


# Every half-precision value, widened exactly: a table lookup instead of numpy's slow fp16 cast.
_HALF_TO_SINGLE = np.arange(1 << 16, dtype=np.uint16).view(np.float16).astype(np.float32)


def widened(values: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """`values` as float32, exactly; float16 through the lookup table, anything else by numpy."""
    if values.dtype == np.float16:
        return _HALF_TO_SINGLE.take(values.view(np.uint16), out=out)
    if out is None:
        return np.asarray(values, dtype=np.float32)
    out[...] = values
    return out


def as_received(weights: Mapping[str, np.ndarray], precision: Precision) -> dict[str, np.ndarray]:
    """The weights a device computes with after a download at `precision`: sent, then widened to float32."""
    return {k: widened(v) if np.issubdtype(v.dtype, np.floating) else v for k, v in as_sent(weights, precision).items()}


def update_tensors(deltas: Mapping[str, np.ndarray], template: np.ndarray, precision: Precision) -> dict[str, np.ndarray]:
    """An update file's tensors: every backbone delta at the wire's precision, then the class embedding."""
    tensors = {BACKBONE_PREFIX + k: v for k, v in as_sent(deltas, precision).items()}
    tensors[EMBEDDING_KEY] = np.asarray(template, np.float32)
    return tensors


def backbone_deltas(tensors: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The backbone deltas of an update file's tensors, as the server's aggregation reads them."""
    return {k[len(BACKBONE_PREFIX):]: v for k, v in tensors.items() if k.startswith(BACKBONE_PREFIX)}
