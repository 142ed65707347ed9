"""Checks on untrusted payloads: uploaded update files and enrolled embeddings.

An update file (tensor file, see facecore.tensorfile) holds ``backbone.<name>``, the delta
trained - base, for each of the round's trained entries (facecore.federation.wire.trained_entries:
every entry of the model's state_dict, or with a frozen prefix only the suffix's; a file with every
entry is accepted too, and aggregation reads only the trained ones), each as F16/F32 or quantised
(I8 or packed U8 codes with ``scale.<name>`` beside them: facecore.federation.quantize), plus
``class_embedding`` (D,), and ``__metadata__["fedface"]``: a JSON
:class:`~facecore.federation.messages.UpdateMeta` (the key names: facecore.federation.protocol).
Tensors are read one at a time.
"""
from __future__ import annotations

import io
import math
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, BinaryIO, cast

import numpy as np
from pydantic import ValidationError

from facecore.federation.messages import UpdateMeta
from facecore.federation.protocol import BACKBONE_PREFIX, EMBEDDING_KEY, MASKED_KEY, METADATA_KEY, SCALE_PREFIX
from facecore.federation.quantize import coded_shape, codes_of, rows_of
from facecore.federation.wire import trained_entries, widened
from facecore.tensorfile import DTYPES, TensorFileError, TensorFileHeader, TensorInfo, read_header, read_tensor
from server_api.errors import Conflict, InvalidInput

UNIT_NORM_TOLERANCE = 1e-3
# Uploaded embeddings come back un-normalised from spreadout; only absurd scales are refused.
EMBEDDING_NORM_RANGE = (1e-3, 1e3)
_FLOAT_WIRE = {"F16", "F32"}
_INT_WIRE = {"I32", "I64"}
_F16_EXPONENT = 0x7C00
_EXACT_FLOAT32_WIDTH = 2**18


@dataclass(frozen=True)
class ParsedUpdate:
    meta: UpdateMeta
    embedding: np.ndarray
    delta_norm: float


def check_enrollment_embedding(values: list[float], embedding_dim: int) -> np.ndarray:
    vector = np.asarray(values, dtype=np.float32)
    if vector.shape != (embedding_dim,):
        raise InvalidInput(f"embedding must have {embedding_dim} values, got {vector.size}")
    if not np.isfinite(vector).all():
        raise InvalidInput("embedding contains NaN or Inf")
    norm = float(np.linalg.norm(vector.astype(np.float64)))
    if abs(norm - 1.0) > UNIT_NORM_TOLERANCE:
        raise InvalidInput(f"embedding must be L2-normalised (norm {norm:.4f})")
    return vector


def _header_and_meta(handle: BinaryIO, size: int, base_version: str) -> tuple[TensorFileHeader, UpdateMeta]:
    try:
        header = read_header(handle, size)
    except TensorFileError as error:
        raise InvalidInput(f"update is not a valid tensor file: {error}") from None
    meta = _parse_meta(header)
    if meta.base_version != base_version:
        raise Conflict(f"update was trained from model {meta.base_version[:12]}, but this round's base is {base_version[:12]}")
    return header, meta


def parse_update(
    handle: BinaryIO, size: int, spec: dict[str, Any], embedding_dim: int, base_version: str, max_delta_norm: float, trainable_blocks: int | None = None,
) -> ParsedUpdate:
    header, meta = _header_and_meta(handle, size, base_version)
    _check_names_and_shapes(header, spec, embedding_dim, trainable_blocks)
    delta_norm = math.sqrt(_backbone_squared_norm(handle, header) + _quantized_squared_norm(handle, header, spec))
    if delta_norm > max_delta_norm:
        raise InvalidInput(f"backbone delta L2 norm {delta_norm:.3g} exceeds the bound {max_delta_norm:.3g}")
    return ParsedUpdate(meta=meta, embedding=_embedding(handle, header), delta_norm=delta_norm)


def parse_masked_update(handle: BinaryIO, size: int, spec: dict[str, Any], embedding_dim: int, base_version: str) -> ParsedUpdate:
    """A secure-aggregation upload: ``secagg.masked`` (I32 bits of the uint32 masked vector over the
    model's float tensors in spec order, facecore.federation.secagg.weighted_update) and ``class_embedding``. The server
    cannot bound the norm of a masked update; devices clip each coordinate before masking."""
    header, meta = _header_and_meta(handle, size, base_version)
    if set(header.tensors) != {MASKED_KEY, EMBEDDING_KEY}:
        raise InvalidInput(f"a secure-aggregation update holds exactly {MASKED_KEY!r} and {EMBEDDING_KEY!r}, got {sorted(header.tensors)[:4]}")
    length = sum(math.prod(shape) for dtype, shape in spec.values() if dtype.startswith("float"))
    info = header.tensors[MASKED_KEY]
    if info.dtype != "I32" or info.shape != (length,):
        raise InvalidInput(f"{MASKED_KEY} must be I32 of shape [{length}], got {info.dtype} {list(info.shape)}")
    _check_embedding_spec(header, embedding_dim)
    return ParsedUpdate(meta=meta, embedding=_embedding(handle, header), delta_norm=float("nan"))


def _embedding(handle: BinaryIO, header: TensorFileHeader) -> np.ndarray:
    embedding = read_tensor(handle, header, EMBEDDING_KEY).astype(np.float32)
    if not np.isfinite(embedding).all():
        raise InvalidInput("class_embedding contains NaN or Inf")
    norm = float(np.linalg.norm(embedding.astype(np.float64)))
    if not EMBEDDING_NORM_RANGE[0] <= norm <= EMBEDDING_NORM_RANGE[1]:
        raise InvalidInput(f"class_embedding norm {norm:.3g} is outside {EMBEDDING_NORM_RANGE}")
    return embedding


def _float_spans(header: TensorFileHeader, prefix: str) -> Iterator[tuple[str, int, int, list[str]]]:
    """Maximal runs of adjacent float tensors of one wire dtype: (dtype, begin, end, names).
    Tensors are packed without holes in header order, so a run is one contiguous read."""
    run: list[str] = []
    for name, info in header.tensors.items():
        if name.startswith(prefix) and info.dtype in _FLOAT_WIRE and run and header.tensors[run[-1]].dtype == info.dtype \
                and header.tensors[run[-1]].end == info.begin:
            run.append(name)
            continue
        if run:
            yield header.tensors[run[0]].dtype, header.tensors[run[0]].begin, header.tensors[run[-1]].end, run
        run = [name] if name.startswith(prefix) and info.dtype in _FLOAT_WIRE else []
    if run:
        yield header.tensors[run[0]].dtype, header.tensors[run[0]].begin, header.tensors[run[-1]].end, run


def _non_finite(values: np.ndarray) -> np.ndarray:
    if values.dtype == np.float16:
        # numpy has no vectorised half-precision isfinite; an all-ones exponent is Inf or NaN.
        return (values.view(np.uint16) & _F16_EXPONENT) == _F16_EXPONENT
    return ~np.isfinite(values)


class _Scratch(threading.local):
    """Per-thread buffers reused across uploads: a fresh 2-4 MB array per upload is fresh memory
    from the kernel, and its page faults cost more than the arithmetic (4.5 vs 0.9 ms measured)."""

    def __init__(self) -> None:
        self.raw = bytearray()
        self.buffers: dict[type, np.ndarray] = {}  # one per dtype, its contents whatever its last user left
        self.ones: dict[type, np.ndarray] = {}

    def read(self, handle: BinaryIO, size: int) -> memoryview:
        if len(self.raw) < size:
            self.raw = bytearray(size)
        view = memoryview(self.raw)[:size]
        # typing.BinaryIO declares no readinto; the handles are files opened "rb" (and BytesIO in tests): BufferedIOBase
        if cast(io.BufferedIOBase, handle).readinto(view) != size:
            raise InvalidInput("update is truncated")
        return view

    def widened(self, runs: list[np.ndarray]) -> np.ndarray:
        """The runs (all float16 or all float32) concatenated as one float32 array, exactly."""
        total = sum(r.size for r in runs)
        wide = self._buffer(np.float32, total)
        if runs[0].dtype == np.float16:
            half = np.concatenate(runs, out=self._buffer(np.float16, total))
            widened(half, out=wide)
        else:
            np.concatenate(runs, out=wide, casting="same_kind")
        return wide

    def row_squared_codes(self, sent: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
        """Each row's sum of squared codes (float64, exact) of one quantised entry as sent: squared in
        reused buffers: 8-bit codes in int16, summed in int64; 4-bit codes in float32, summed by a product with
        ones, whose integer partial sums stay exact (at most 64 a code: within 2**24 for rows up to 2**18)."""
        rows = rows_of(shape)
        width = math.prod(shape) // rows
        if sent.dtype == np.int8:
            codes = sent.reshape(rows, width)
            squares = self._buffer(np.int16, sent.size).reshape(rows, width)  # 128² fits
            return np.multiply(codes, codes, out=squares, dtype=np.int16).sum(axis=1, dtype=np.int64).astype(np.float64)
        if width % 2 or width > _EXACT_FLOAT32_WIDTH:  # a byte holds the end of one row and the start of the next
            codes = codes_of(sent, shape).reshape(rows, width).astype(np.int64)
            return np.square(codes).sum(axis=1).astype(np.float64)
        nibbles, values = self._buffer(np.uint8, sent.size), self._buffer(np.float32, sent.size)
        sums = np.zeros(rows)
        for shift in (0, 4):  # the low nibbles, then the high ones: a code is its nibble minus 8
            np.bitwise_and(np.right_shift(sent, shift, out=nibbles), 15, out=nibbles)
            np.subtract(nibbles, 8, out=values, dtype=np.float32)
            np.multiply(values, values, out=values)
            sums += values.reshape(rows, width // 2) @ self._ones(np.float32, width // 2)
        return sums

    def _buffer(self, dtype: type, size: int) -> np.ndarray:
        return _grown(self.buffers, dtype, size, ones=False)

    def _ones(self, dtype: type, size: int) -> np.ndarray:
        return _grown(self.ones, dtype, size, ones=True)


def _grown(store: dict[type, np.ndarray], dtype: type, size: int, ones: bool) -> np.ndarray:
    """The first `size` elements of `store`'s array of `dtype`, made anew (of ones, or left as memory gives it)
    only when it is too small."""
    if store.get(dtype, np.empty(0)).size < size:
        store[dtype] = np.ones(size, dtype) if ones else np.empty(size, dtype)
    return store[dtype][:size]


_scratch = _Scratch()
# Half-precision runs are widened by facecore.federation.wire's table lookup, faster than numpy's float16
# cast, and validation needs no torch (whose import is ~480 MB of a worker's memory).


def _backbone_squared_norm(handle: BinaryIO, header: TensorFileHeader) -> float:
    """Sum of squares of every float backbone tensor, refusing NaN/Inf.

    One read of the backbone's bytes; the runs of each wire dtype (~50 runs in mobilefacenet,
    split by BatchNorm's integer step counts) are gathered into one float32 array and squared
    with one dot product, which NaN or Inf anywhere makes non-finite; only then is each run
    checked on its own, to name the culprit or to redo in float64 the finite values whose
    squares overflow float32. ~1.5 ms for a 2 MB update, in a validation worker (validation_pool)."""
    spans = list(_float_spans(header, BACKBONE_PREFIX))
    if not spans:
        return 0.0
    first = min(begin for _, begin, _, _ in spans)
    handle.seek(header.data_start + first)
    buffer = _scratch.read(handle, max(end for _, _, end, _ in spans) - first)
    runs = [(np.frombuffer(buffer, dtype=DTYPES[dtype], count=(end - begin) // DTYPES[dtype].itemsize, offset=begin - first), begin, names)
            for dtype, begin, end, names in spans]
    squared = 0.0
    for wire in {values.dtype for values, _, _ in runs}:
        total = _float32_dot(_scratch.widened([values for values, _, _ in runs if values.dtype == wire]))
        squared += total if math.isfinite(total) else sum(_run_squared_norm(v, b, n, header) for v, b, n in runs if v.dtype == wire)
    return squared


def _float32_dot(wide: np.ndarray) -> float:
    with np.errstate(all="ignore"):  # NaN/Inf/overflow are answered by the caller, not warned about
        return float(np.dot(wide, wide))


def _run_squared_norm(values: np.ndarray, begin: int, names: list[str], header: TensorFileHeader) -> float:
    """One run's sum of squares once the fast sum came out non-finite: refuse NaN/Inf, else float64."""
    run = _float32_dot(_scratch.widened([values]))
    if math.isfinite(run):
        return run
    _refuse_non_finite(values, begin, names, header)
    return float(np.square(values.astype(np.float64)).sum())  # finite values whose squares overflow float32


def _refuse_non_finite(values: np.ndarray, begin: int, names: list[str], header: TensorFileHeader) -> None:
    bad = _non_finite(values)
    if bad.any():
        at = begin + int(np.argmax(bad)) * values.itemsize
        name = next(n for n in names if header.tensors[n].begin <= at < header.tensors[n].end)
        raise InvalidInput(f"{name} contains NaN or Inf")


def _parse_meta(header: TensorFileHeader) -> UpdateMeta:
    if set(header.metadata) != {METADATA_KEY}:
        raise InvalidInput(f'update __metadata__ must hold exactly one entry, "{METADATA_KEY}"')
    try:
        return UpdateMeta.model_validate_json(header.metadata[METADATA_KEY])
    except ValidationError as error:
        first = error.errors()[0]
        # A metric's name is the client's, of any length: the error quotes at most 80 characters of it.
        where = ".".join(str(p) for p in first["loc"])[:80] or "metadata"
        raise InvalidInput(f"update metadata invalid at {where}: {first['msg'][:200]}") from None


def _quantized_squared_norm(handle: BinaryIO, header: TensorFileHeader, spec: dict[str, Any]) -> float:
    """Sum of squares of the quantised entries as aggregation reads them (code x its row's scale), refusing
    a scale that is negative, NaN or Inf; codes are integers, so they are finite. One read of the entries'
    bytes into the reused buffer; each row's squared codes are summed exactly (_Scratch.row_squared_codes)."""
    names = [key[len(SCALE_PREFIX):] for key in header.tensors if key.startswith(SCALE_PREFIX)]
    if not names:
        return 0.0
    infos = [header.tensors[prefix + name] for name in names for prefix in (SCALE_PREFIX, BACKBONE_PREFIX)]
    first = min(info.begin for info in infos)
    handle.seek(header.data_start + first)
    buffer = _scratch.read(handle, max(info.end for info in infos) - first)

    def view(key: str) -> np.ndarray:
        info = header.tensors[key]
        dtype = DTYPES[info.dtype]
        return np.frombuffer(buffer, dtype, count=(info.end - info.begin) // dtype.itemsize, offset=info.begin - first)

    squared = 0.0
    for name in names:
        scale = view(SCALE_PREFIX + name).astype(np.float64)
        if not (np.isfinite(scale).all() and (scale >= 0).all()):
            raise InvalidInput(f"{SCALE_PREFIX}{name} holds a negative, NaN or Inf scale")
        squared += float(np.dot(_scratch.row_squared_codes(view(BACKBONE_PREFIX + name), tuple(spec[name][1])), np.square(scale)))
    return squared


def _check_names_and_shapes(header: TensorFileHeader, spec: dict[str, Any], embedding_dim: int, trainable_blocks: int | None) -> None:
    scales = {k for k in header.tensors if k.startswith(SCALE_PREFIX)}
    names = set(header.tensors) - scales
    every = {BACKBONE_PREFIX + k for k in spec} | {EMBEDDING_KEY}
    trained = {BACKBONE_PREFIX + k for k in trained_entries(list(spec), trainable_blocks)} | {EMBEDDING_KEY}
    if names not in (trained, every):
        missing, extra = sorted(trained - names), sorted(names - every)
        raise InvalidInput(f"update tensors do not match the round's trained entries: missing {missing[:3]}, unexpected {extra[:3]}")
    for key, (dtype, shape) in spec.items():
        if BACKBONE_PREFIX + key not in names:
            continue
        info = header.tensors[BACKBONE_PREFIX + key]
        scale = header.tensors.get(SCALE_PREFIX + key)
        if scale is not None:
            _check_quantized(key, dtype, tuple(shape), info, scale)
            continue
        if list(info.shape) != list(shape):
            raise InvalidInput(f"backbone.{key} has shape {list(info.shape)}, expected {shape}")
        allowed = _FLOAT_WIRE if dtype.startswith("float") else _INT_WIRE
        if info.dtype not in allowed:
            raise InvalidInput(f"backbone.{key} has dtype {info.dtype}, expected one of {sorted(allowed)}")
    stray = sorted(k for k in scales if k[len(SCALE_PREFIX):] not in spec or BACKBONE_PREFIX + k[len(SCALE_PREFIX):] not in names)
    if stray:
        raise InvalidInput(f"update holds scales of no sent entry: {stray[:3]}")
    _check_embedding_spec(header, embedding_dim)


def _check_quantized(key: str, dtype: str, shape: tuple[int, ...], info: TensorInfo, scale: TensorInfo) -> None:
    """A quantised float entry: I8 codes in the entry's shape or U8 packed 4-bit codes, and F32 scales, one a row."""
    bits = {"I8": 8, "U8": 4}.get(info.dtype)
    if not dtype.startswith("float") or bits is None:
        raise InvalidInput(f"backbone.{key} has a scale, so it must be a float entry sent as I8 or U8, got {info.dtype} for {dtype}")
    if info.shape != coded_shape(shape, bits):
        raise InvalidInput(f"backbone.{key} has shape {list(info.shape)}, expected {list(coded_shape(shape, bits))} at {bits} bits")
    if scale.dtype != "F32" or scale.shape != (rows_of(shape),):
        raise InvalidInput(f"{SCALE_PREFIX}{key} must be F32 of shape [{rows_of(shape)}], got {scale.dtype} {list(scale.shape)}")


def _check_embedding_spec(header: TensorFileHeader, embedding_dim: int) -> None:
    info = header.tensors[EMBEDDING_KEY]
    if info.shape != (embedding_dim,) or info.dtype not in _FLOAT_WIRE:
        raise InvalidInput(f"class_embedding must be F32/F16 of shape [{embedding_dim}], got {info.dtype} {list(info.shape)}")
