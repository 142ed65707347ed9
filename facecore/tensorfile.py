"""Tensor files in the safetensors layout, parsed here without pickle or the library.

This is the wire format of device uploads (see server_api/README.md). It was chosen
because untrusted bytes only ever go through ``json.loads`` and ``np.frombuffer``:
no code runs, every size is checked before anything is allocated, and tensors can
be read one at a time, which the streaming FedAvg relies on. Files written by the
``safetensors`` library (numpy or torch) are accepted as long as they use the dtypes
below.

Every malformed input raises :class:`TensorFileError` (a ValueError), never anything else:
the server turns it into a 422, and fuzzing checks the promise.

Layout: an unsigned 64-bit little-endian header length ``N``; ``N`` bytes of UTF-8
JSON ``{"__metadata__": {str: str}, name: {"dtype", "shape", "data_offsets": [b, e]}}``;
then the little-endian data, offsets relative to its start, packed without holes.
"""
from __future__ import annotations

import io
import json
import math
import struct
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import BinaryIO

import numpy as np

DTYPES: dict[str, np.dtype] = {
    "F16": np.dtype("<f2"),
    "F32": np.dtype("<f4"),
    "F64": np.dtype("<f8"),
    "I32": np.dtype("<i4"),
    "I64": np.dtype("<i8"),
    "I8": np.dtype("i1"),  # quantised update deltas (facecore.federation.quantize)
    "U8": np.dtype("u1"),
}
_NAMES = {v: k for k, v in DTYPES.items()}
MAX_DIMS = 8


class TensorFileError(ValueError):
    """Malformed or inconsistent tensor file."""


@dataclass(frozen=True)
class TensorInfo:
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int


@dataclass(frozen=True)
class TensorFileHeader:
    tensors: dict[str, TensorInfo]
    metadata: dict[str, str]
    data_start: int


def read_header(handle: BinaryIO, file_size: int, max_header_bytes: int = 1 << 20) -> TensorFileHeader:
    handle.seek(0)
    prefix = handle.read(8)
    if len(prefix) != 8:
        raise TensorFileError("file shorter than its 8-byte header length")
    (length,) = struct.unpack("<Q", prefix)
    if length > max_header_bytes or length > file_size - 8:
        raise TensorFileError(f"header length {length} exceeds the limit or the file")
    try:
        header = json.loads(handle.read(length).decode("utf-8"))
    except RecursionError:
        # Deep nesting ("[[[[..." a megabyte long) exhausts the decoder's stack: malformed input, not a fault.
        raise TensorFileError("header JSON is nested too deeply") from None
    except ValueError as error:  # bad UTF-8 or JSON, or an integer past Python's 4,300-digit conversion limit
        raise TensorFileError(f"header is not valid JSON: {str(error)[:200]}") from None
    if not isinstance(header, dict):
        raise TensorFileError("header must be a JSON object")
    metadata = header.pop("__metadata__", {})
    if not isinstance(metadata, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
        raise TensorFileError("__metadata__ must map strings to strings")
    tensors = {name: _tensor_info(name, entry) for name, entry in header.items()}
    _check_layout(tensors, file_size - 8 - length)
    return TensorFileHeader(tensors=tensors, metadata=metadata, data_start=8 + length)


def _tensor_info(name: str, entry: object) -> TensorInfo:
    label = repr(name[:64])  # names are untrusted and may be a megabyte long: errors stay one short line
    # Plain loops, not set()/all(genexpr): a header has hundreds of entries and sits on the upload path.
    if type(entry) is not dict or len(entry) != 3 or "dtype" not in entry or "shape" not in entry or "data_offsets" not in entry:
        raise TensorFileError(f"tensor {label}: entry needs exactly dtype, shape and data_offsets")
    dtype, shape, offsets = entry["dtype"], entry["shape"], entry["data_offsets"]
    if type(dtype) is not str or dtype not in DTYPES:  # a list or object here is unhashable
        raise TensorFileError(f"tensor {label}: unsupported dtype {str(dtype)[:32]!r} (supported: {', '.join(DTYPES)})")
    if type(shape) is not list or len(shape) > MAX_DIMS or not _non_negative_ints(shape):
        raise TensorFileError(f"tensor {label}: shape must be a list of at most {MAX_DIMS} non-negative integers")
    if type(offsets) is not list or len(offsets) != 2 or not _non_negative_ints(offsets):
        raise TensorFileError(f"tensor {label}: data_offsets must be two non-negative integers")
    begin, end = offsets
    if end - begin != math.prod(shape) * DTYPES[dtype].itemsize:
        raise TensorFileError(f"tensor {label}: its data_offsets do not fit shape {str(shape)[:80]} of {dtype}")
    return TensorInfo(dtype=dtype, shape=tuple(shape), begin=begin, end=end)


def _non_negative_ints(values: list[object]) -> bool:
    for value in values:
        if type(value) is not int or value < 0:  # type(), not isinstance: JSON true must not pass as 1
            return False
    return True


def _check_layout(tensors: Mapping[str, TensorInfo], data_bytes: int) -> None:
    position = 0
    for info in sorted(tensors.values(), key=lambda t: (t.begin, t.end)):
        if info.begin != position:
            raise TensorFileError("tensor data overlaps or leaves a hole")
        position = info.end
    if position != data_bytes:
        raise TensorFileError(f"tensor data covers {position} bytes but the file holds {data_bytes}")


def read_tensor(handle: BinaryIO, header: TensorFileHeader, name: str) -> np.ndarray:
    info = header.tensors[name]
    handle.seek(header.data_start + info.begin)
    raw = handle.read(info.end - info.begin)
    if len(raw) != info.end - info.begin:
        raise TensorFileError(f"tensor {name!r} is truncated")
    # Native byte order copy: the result outlives the buffer and is safe to write to.
    return np.frombuffer(raw, dtype=DTYPES[info.dtype]).astype(DTYPES[info.dtype].newbyteorder("="), copy=True).reshape(info.shape)


def iter_tensors(handle: BinaryIO, header: TensorFileHeader, prefix: str = "") -> Iterator[tuple[str, np.ndarray]]:
    for name in header.tensors:
        if name.startswith(prefix):
            yield name[len(prefix):], read_tensor(handle, header, name)


def dumps(tensors: Mapping[str, np.ndarray], metadata: Mapping[str, str] | None = None) -> bytes:
    out = io.BytesIO()
    write(out, tensors, metadata)
    return out.getvalue()


def write(handle: BinaryIO, tensors: Mapping[str, np.ndarray], metadata: Mapping[str, str] | None = None) -> None:
    header: dict[str, object] = {"__metadata__": dict(metadata or {})}
    arrays: list[np.ndarray] = []
    position = 0
    for name, value in tensors.items():
        array = np.asarray(value, order="C")  # not ascontiguousarray: it turns 0-d into 1-d
        dtype = array.dtype.newbyteorder("<") if array.dtype.byteorder == "=" else array.dtype
        if dtype not in _NAMES:
            raise TensorFileError(f"tensor {name!r}: unsupported dtype {array.dtype}")
        array = array.astype(dtype, copy=False)
        header[name] = {"dtype": _NAMES[dtype], "shape": list(array.shape), "data_offsets": [position, position + array.nbytes]}
        position += array.nbytes
        arrays.append(array)
    encoded = json.dumps(header, separators=(",", ":")).encode()
    encoded += b" " * (-len(encoded) % 8)  # keep the data 8-byte aligned, as safetensors does
    handle.write(struct.pack("<Q", len(encoded)))
    handle.write(encoded)
    for array in arrays:
        handle.write(array.tobytes())
