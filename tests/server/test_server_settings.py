"""Pure parts: the tensor wire format, settings and secrets. (The aggregation strategies' unit tests live
next to them, in facecore/federation/strategies.)"""
from __future__ import annotations

import base64
import io
import json
import stat
import struct
from pathlib import Path

import numpy as np
import pytest

from facecore import tensorfile
from server_api.core.config import Settings, resolve_secrets
from server_api.errors import ConfigError


def test_tensorfile_roundtrip_and_rejects_malformed_headers() -> None:
    # Prepare
    tensors = {"a": np.arange(6, dtype=np.float32).reshape(2, 3), "b": np.array(7, dtype=np.int64), "c": np.ones(3, np.float16)}
    data = tensorfile.dumps(tensors, {"k": "v"})

    def header_file(header: dict, payload: bytes = b"") -> bytes:
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


def test_production_secrets_are_required_and_checked(tmp_path: Path) -> None:
    key = base64.b64encode(bytes(range(32))).decode()
    strong = "Zt4kQw9-Lp2mXc7vB1nR5sT8yU3oP6aD"
    with pytest.raises(ConfigError, match="FEDFACE_ADMIN_TOKEN is not set"):
        resolve_secrets(Settings(data_dir=tmp_path, template_key=key))
    with pytest.raises(ConfigError, match="weak"):
        resolve_secrets(Settings(data_dir=tmp_path, admin_token="changeme", template_key=key))
    with pytest.raises(ConfigError, match="at least 32"):
        resolve_secrets(Settings(data_dir=tmp_path, admin_token="Zt4kQw9#Lp2", template_key=key))
    with pytest.raises(ConfigError, match="no template key"):
        resolve_secrets(Settings(data_dir=tmp_path, admin_token=strong))
    with pytest.raises(ConfigError, match="weak key"):
        resolve_secrets(Settings(data_dir=tmp_path, admin_token=strong, template_key=base64.b64encode(b"\0" * 32).decode()))
    with pytest.raises(ConfigError, match="32 bytes"):
        resolve_secrets(Settings(data_dir=tmp_path, admin_token=strong, template_key=base64.b64encode(b"short").decode()))
    (tmp_path / "key").write_text(key)
    secrets = resolve_secrets(Settings(data_dir=tmp_path, admin_token=strong, template_key_file=tmp_path / "key"))
    assert secrets.template_key == bytes(range(32)) and "Zt4k" not in repr(secrets)


def test_dev_mode_generates_private_secrets_once(tmp_path: Path) -> None:
    # Execute
    first = resolve_secrets(Settings(data_dir=tmp_path / "d", dev=True))
    second = resolve_secrets(Settings(data_dir=tmp_path / "d", dev=True))
    # Assert
    assert first == second and len(first.admin_token) >= 32 and len(first.template_key) == 32
    for name in ("admin_token", "template.key"):
        assert stat.S_IMODE((tmp_path / "d" / name).stat().st_mode) == 0o600


def test_database_urls_are_normalised(tmp_path: Path) -> None:
    assert Settings(database_url="postgresql://u:p@h/db").resolved_database_url() == "postgresql+psycopg://u:p@h/db"
    assert Settings(database_url="postgres://u@h/db").resolved_database_url() == "postgresql+psycopg://u@h/db"
    assert Settings(data_dir=tmp_path).resolved_database_url() == f"sqlite:///{tmp_path.resolve()}/fedface.db"
    with pytest.raises(ConfigError, match="unsupported"):
        Settings(database_url="mysql://x").resolved_database_url()
