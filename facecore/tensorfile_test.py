"""The tensor-file parser answers every malformed header with TensorFileError, never another exception."""
from __future__ import annotations

import io
import json
import struct
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from facecore import tensorfile
from facecore.tensorfile import TensorFileError, read_header

# JSON values of any shape, nested, with integers far past 64 bits: what a hostile header may hold.
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(10**40), max_value=10**40) | st.floats(allow_nan=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
_ENTRY_KEYS = st.sampled_from(["dtype", "shape", "data_offsets", "x"])


def _file(header: bytes, data: bytes = b"") -> bytes:
    return struct.pack("<Q", len(header)) + header + data


def _read(body: bytes) -> tensorfile.TensorFileHeader:
    return read_header(io.BytesIO(body), len(body))


@pytest.mark.parametrize(
    ("header", "message"),
    [
        (b"[" * 100_000, "nested too deeply"),
        (b'{"x": {"dtype": "F32", "shape": [' + b"9" * 5000 + b'], "data_offsets": [0, 4]}}', "not valid JSON"),
        (b'{"x": {"dtype": ["F32"], "shape": [1], "data_offsets": [0, 4]}}', "unsupported dtype"),
        (b'{"x": {"dtype": {"a": 1}, "shape": [1], "data_offsets": [0, 4]}}', "unsupported dtype"),
        (b"\xff\xfe{}", "not valid JSON"),
    ],
    ids=["100k nested brackets", "5000-digit integer", "list dtype", "object dtype", "not utf-8"],
)
def test_hostile_headers_are_tensor_file_errors(header: bytes, message: str) -> None:
    # Prepare
    body = _file(header, b"\0" * 4)
    # Execute / Assert
    with pytest.raises(TensorFileError, match=message):
        _read(body)


def test_a_long_tensor_name_is_cut_short_in_the_error() -> None:
    # Prepare: a megabyte-long name on an entry that fails
    entry = {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}
    body = _file(json.dumps({"n" * 1_000_000: entry}).encode(), b"\0" * 4)
    # Execute
    with pytest.raises(TensorFileError, match=r"^tensor 'n{1,100}': its data_offsets do not fit shape \[2\] of F32$") as caught:
        _read(body)
    # Assert
    assert len(str(caught.value)) < 200


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)
@given(header=st.dictionaries(st.text(max_size=6), st.dictionaries(_ENTRY_KEYS, _JSON, max_size=4) | _JSON, max_size=4),
       data=st.binary(max_size=64))
def test_any_json_header_parses_or_is_a_tensor_file_error(header: dict[str, Any], data: bytes) -> None:
    # Prepare
    body = _file(json.dumps(header).encode(), data)
    # Execute / Assert: a parsed header always describes the bytes that follow it
    try:
        parsed = _read(body)
    except TensorFileError:
        return
    assert sum(info.end - info.begin for info in parsed.tensors.values()) == len(data)


@settings(max_examples=300, deadline=None, database=None)
@given(position=st.integers(min_value=0), flip=st.integers(min_value=1, max_value=255))
def test_a_corrupted_byte_anywhere_parses_or_is_a_tensor_file_error(position: int, flip: int) -> None:
    # Prepare: a valid file with one byte changed
    good = bytearray(tensorfile.dumps({"a": np.ones((2, 3), "<f4"), "b": np.arange(4, dtype="<i8")}, {"k": "v"}))
    good[position % len(good)] ^= flip
    # Execute / Assert
    try:
        _read(bytes(good))
    except TensorFileError:
        pass


def test_tensorfile_roundtrip_and_rejects_malformed_headers() -> None:
    # Prepare
    tensors: dict[str, np.ndarray] = {
        "a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.array(7, dtype=np.int64), "c": np.ones(3, np.float16)}
    data = tensorfile.dumps(tensors, {"k": "v"})

    def header_file(header: dict[str, Any], payload: bytes = b"") -> bytes:
        encoded = json.dumps(header).encode()
        return struct.pack("<Q", len(encoded)) + encoded + payload

    bad = {  # each malformed file and what the error names
        "overlaps or leaves a hole": header_file(
            {"x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}, "y": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 8),
        "do not fit shape": header_file({"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 4]}}, b"\0" * 4),
        "covers 4 bytes but the file holds 9": header_file({"x": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, b"\0" * 9),
        "shape must be a list": header_file({"x": {"dtype": "F32", "shape": [-1], "data_offsets": [0, 0]}}),
        "needs exactly dtype, shape and data_offsets": header_file({"x": {"dtype": "F32", "shape": [0], "data_offsets": [0, 0], "code": "x"}}),
        "__metadata__ must map strings": header_file({"__metadata__": {"n": 1}}),
        "not valid JSON": struct.pack("<Q", 3) + b"\xff\xfe{",
    }
    # Execute
    header = tensorfile.read_header(io.BytesIO(data), len(data))
    loaded = dict(tensorfile.iter_tensors(io.BytesIO(data), header))
    # Assert
    assert header.metadata == {"k": "v"} and header.data_start % 8 == 0
    for name, value in tensors.items():
        assert loaded[name].dtype == value.dtype and loaded[name].shape == value.shape
        np.testing.assert_array_equal(loaded[name], value)
    for message, blob in bad.items():
        with pytest.raises(tensorfile.TensorFileError, match=message):
            tensorfile.read_header(io.BytesIO(blob), len(blob))
