"""Quantised update deltas (a round's `local.upload_bits`): 8 or 4 bits a weight, a scale a row, and the
device's error feedback.

Invariants:
- A float entry ``name`` of shape S crosses as ``backbone.<name>``, I8 of shape S (8 bits) or U8 of shape
  (ceil(n / 2),) holding two 4-bit codes a byte, the low nibble first, in C order (4 bits); beside it
  ``scale.<name>``, F32 of shape (rows,): rows = S[0] for an entry of two or more dimensions, else 1.
  A weight is its code times its row's scale. Codes are symmetric, -127..127 or -7..7 (a 4-bit code is
  stored plus 8), so zero is exact and a row's largest magnitude is its scale times the top code.
- Integer entries cross as they are.
- Codes round to nearest: what the server reads is within half a step of what the device meant to send.
  The device keeps the difference (its residual) and adds it to its next delta, so quantisation delays
  part of a delta and loses none of it (error feedback; Seide et al. 2014, Karimireddy et al. 2019).
- numpy only: the server's validation workers import no torch.
"""
from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from facecore.federation.protocol import BACKBONE_PREFIX, SCALE_PREFIX

BITS = (8, 4)  # a round's local.upload_bits
_TOP_CODE = {8: 127, 4: 7}


def rows_of(shape: tuple[int, ...]) -> int:
    """How many scales an entry of `shape` carries."""
    return shape[0] if len(shape) >= 2 else 1


def coded_shape(shape: tuple[int, ...], bits: int) -> tuple[int, ...]:
    """The shape of an entry's codes on the wire."""
    return shape if bits == 8 else ((int(np.prod(shape)) + 1) // 2,)


def quantize(values: np.ndarray, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """(codes as sent, float32 scale per row) of one float entry."""
    if bits not in _TOP_CODE:
        raise ValueError(f"upload bits must be one of {BITS}, got {bits}")
    top = _TOP_CODE[bits]
    rows = np.asarray(values, np.float32).reshape(rows_of(values.shape), -1)
    scale = (np.abs(rows).max(axis=1) / top).astype(np.float32)
    codes = np.rint(rows / np.where(scale > 0, scale, 1)[:, None]).clip(-top, top).astype(np.int8)
    if bits == 8:
        return codes.reshape(values.shape), scale
    nibbles = (codes.ravel() + 8).astype(np.uint8)
    if nibbles.size % 2:
        nibbles = np.append(nibbles, np.uint8(8))
    return nibbles[0::2] | (nibbles[1::2] << 4), scale


def codes_of(sent: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """The signed codes of an entry as sent (I8 as is, U8 unpacked), in `shape`."""
    if sent.dtype == np.int8:
        return sent.reshape(shape)
    unpacked = np.empty(sent.size * 2, np.int8)
    unpacked[0::2], unpacked[1::2] = sent & 15, sent >> 4
    return (unpacked[: int(np.prod(shape))] - 8).reshape(shape)


def dequantize(sent: np.ndarray, scale: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """The float32 entry the server reads."""
    rows = codes_of(sent, shape).reshape(rows_of(shape), -1).astype(np.float32) * scale[:, None]
    return rows.reshape(shape)


def quantized_update(
    deltas: Mapping[str, np.ndarray], bits: int, residual: Mapping[str, np.ndarray] | None = None,
) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], dict[str, np.ndarray]]:
    """(an update file's backbone tensors, the deltas the server will read, the residual to keep) for
    float32 `deltas` plus the device's `residual` from its last update (ignored unless it holds exactly
    these entries, in these shapes: a round that trains other blocks starts afresh)."""
    floats = {k: v for k, v in deltas.items() if np.issubdtype(v.dtype, np.floating)}
    carry = residual is not None and residual.keys() == floats.keys() and all(residual[k].shape == v.shape for k, v in floats.items())
    tensors: dict[str, np.ndarray] = {}
    received: dict[str, np.ndarray] = {}
    kept: dict[str, np.ndarray] = {}
    for name, value in deltas.items():
        if name not in floats:
            tensors[BACKBONE_PREFIX + name] = received[name] = value
            continue
        meant = value.astype(np.float32) + (residual[name] if carry and residual is not None else 0)
        codes, scale = quantize(meant, bits)
        tensors[BACKBONE_PREFIX + name], tensors[SCALE_PREFIX + name] = codes, scale
        received[name] = dequantize(codes, scale, value.shape)
        kept[name] = meant - received[name]
    return tensors, received, kept


def received_deltas(tensors: Mapping[str, np.ndarray], shapes: Mapping[str, tuple[int, ...]]) -> dict[str, np.ndarray]:
    """The backbone deltas of an update file's tensors, as aggregation reads them: a quantised entry
    (one with a scale) dequantised to float32, any other as sent. `shapes`: the entries to read (a file may
    send more: an older device's frozen prefix), and their shapes."""
    out = {}
    for key, value in tensors.items():
        name = key[len(BACKBONE_PREFIX):]
        if not key.startswith(BACKBONE_PREFIX) or name not in shapes:
            continue
        scale = tensors.get(SCALE_PREFIX + name)
        out[name] = value if scale is None else dequantize(value, scale, tuple(shapes[name]))
    return out
