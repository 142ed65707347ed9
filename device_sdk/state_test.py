"""DeviceState on a real folder: names the server picks, the key file, corrupt files, sealed uploads."""
from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import re
import stat
import zipfile
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

import device_sdk.server_limits
from device_sdk.errors import BadServerResponse, NotRegistered, StateError
from device_sdk.server_limits import MAX_BACKBONE_PICKLE_BYTES, MAX_BACKBONE_TENSORS, check_torch_archive
from device_sdk.state import KEY_ENV, DeviceState
from facecore.align.geometry import ARCFACE_112

VERSION = "ab" * 32


@pytest.fixture(autouse=True)
def _no_key_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)


def registered(folder: Path) -> DeviceState:
    state = DeviceState(folder)
    state.signing_key(create=True)
    state.update_info(device_id="0" * 32)
    return state


@pytest.mark.parametrize("version", ["../../x/y", "AB" * 32, "ab" * 31, "ab" * 32 + "/..", "", None])
def test_a_model_version_that_is_not_64_lowercase_hex_digits_never_reaches_a_path(
    tmp_path: Path, version: object,
) -> None:
    # Prepare
    state = registered(tmp_path / "device")
    # Execute / Assert
    with pytest.raises(BadServerResponse, match="64 lowercase hex digits"):
        state.model_path(version, "onnx")  # type: ignore[arg-type]
    with pytest.raises(BadServerResponse, match="64 lowercase hex digits"):
        state.store_model(version, "onnx", b"model", None)  # type: ignore[arg-type]
    assert not (tmp_path / "x").exists() and not list((tmp_path / "device").glob("models/*"))


def test_a_models_folder_linked_outside_the_state_is_refused(tmp_path: Path) -> None:
    # Prepare: models/ is a link to a folder outside the state
    state = registered(tmp_path / "device")
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "device" / "models").symlink_to(tmp_path / "elsewhere")
    # Execute / Assert
    with pytest.raises(StateError, match="resolves outside"):
        state.store_model(VERSION, "onnx", b"model", None)
    assert not list((tmp_path / "elsewhere").iterdir())


def test_the_key_file_is_created_once_with_mode_0600_and_32_bytes(tmp_path: Path) -> None:
    # Execute
    state = registered(tmp_path / "device")
    key = tmp_path / "device" / "device.key"
    # Assert
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and len(key.read_bytes()) == 32
    before = key.read_bytes()
    state.create()  # registering again must not re-key
    assert key.read_bytes() == before


@pytest.mark.parametrize("damage, message", [
    (lambda key: key.write_bytes(key.read_bytes()[:20]), "holds 20 bytes, not a 32-byte key"),
    (lambda key: key.unlink(), "device.key is missing, so identity.enc cannot be decrypted"),
    (lambda key: key.write_bytes(os.urandom(32)), "identity.enc cannot be decrypted with"),
])
def test_a_damaged_key_is_one_line_naming_the_file_and_the_fix_and_writes_nothing(
    tmp_path: Path, damage: Callable[[Path], object], message: str,
) -> None:
    # Prepare
    registered(tmp_path / "device")
    key = tmp_path / "device" / "device.key"
    damage(key)
    listing = sorted(p.name for p in (tmp_path / "device").iterdir())
    # Execute
    with pytest.raises(StateError, match=re.escape(message)) as caught:
        DeviceState(tmp_path / "device").require_registered()
    # Assert: named file, the reset fix, one line, and no fresh key written behind the user's back
    text = str(caught.value)
    assert message in text and "fedface device reset" in text and "\n" not in text
    assert sorted(p.name for p in (tmp_path / "device").iterdir()) == listing


def test_a_corrupt_device_json_is_one_line_naming_the_file(tmp_path: Path) -> None:
    # Prepare
    registered(tmp_path / "device")
    (tmp_path / "device" / "device.json").write_text('{"device_id": "0000')
    # Execute / Assert
    with pytest.raises(StateError, match=r"device\.json cannot be read \(not valid JSON\): run `fedface device reset"):
        DeviceState(tmp_path / "device").require_registered()


def test_a_missing_folder_or_a_file_is_not_a_device_and_nothing_is_created(tmp_path: Path) -> None:
    # Prepare
    (tmp_path / "notes.txt").write_text("hello")
    # Execute / Assert
    with pytest.raises(NotRegistered, match="no device state at .*typo: run `fedface device register"):
        DeviceState(tmp_path / "typo").require_registered()
    with pytest.raises(StateError, match="is a file, not a device state folder"):
        DeviceState(tmp_path / "notes.txt")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]


def test_registering_into_a_non_empty_foreign_folder_is_refused(tmp_path: Path) -> None:
    # Prepare: a folder with the user's own files, e.g. a mistyped --state
    (tmp_path / "photos.txt").write_text("mine")
    # Execute / Assert
    with pytest.raises(StateError, match="not empty and holds no device state"):
        DeviceState(tmp_path).create()
    assert not (tmp_path / "device.key").exists()


def test_the_pending_upload_is_sealed_and_an_old_plain_one_is_sealed_on_read(tmp_path: Path) -> None:
    # Prepare
    state = registered(tmp_path / "device")
    body = b"delta and template " * 100
    meta = {"round_id": 3, "key": "k", "url": "/v1/rounds/3/updates"}
    # Execute
    state.save_pending(meta, body)
    # Assert
    assert body[:19] not in (tmp_path / "device" / "pending_upload.enc").read_bytes()
    assert state.pending() == (meta, body)
    # Prepare: a plain body left by an earlier version
    (tmp_path / "device" / "pending_upload.enc").unlink()
    (tmp_path / "device" / "pending_upload.bin").write_bytes(body)
    # Execute / Assert
    assert state.pending() == (meta, body)
    assert not (tmp_path / "device" / "pending_upload.bin").exists()
    state.clear_pending()
    assert state.pending() is None


def test_a_cached_model_whose_bytes_changed_is_dropped_and_a_wrong_download_refused(tmp_path: Path) -> None:
    # Prepare
    state = registered(tmp_path / "device")
    data = b"onnx bytes" * 1000
    path = state.store_model(VERSION, "onnx", data, hashlib.sha256(data).hexdigest())
    assert state.cached_model(VERSION, "onnx") == path
    # Execute: a bit flips on disk
    path.write_bytes(b"X" + data[1:])
    # Assert: not used, and gone so the next use downloads it again
    assert state.cached_model(VERSION, "onnx") is None and not path.exists()
    with pytest.raises(BadServerResponse, match="not the .* the server published"):
        state.store_model(VERSION, "onnx", data, "0" * 64)


def test_the_key_from_the_environment_must_be_32_bytes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Prepare
    monkeypatch.setenv(KEY_ENV, base64.b64encode(b"short").decode())
    # Execute / Assert
    with pytest.raises(StateError, match=f"{KEY_ENV} must be base64 of 32 bytes"):
        DeviceState(tmp_path).signing_key(create=True)


def test_delete_removes_the_state_files_only(tmp_path: Path) -> None:
    # Prepare
    state = registered(tmp_path)
    state.save_template(np.ones(4, np.float32))
    state.store_model(VERSION, "onnx", b"m", None)
    (tmp_path / "keep.txt").write_text("the user's own file")
    # Execute
    removed = state.delete()
    # Assert
    assert {p.name for p in removed} == {"device.key", "device.json", "identity.enc", "template.enc", "models"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keep.txt"]


GEOMETRY = ARCFACE_112.to_json()


@pytest.mark.parametrize(("change", "refusal"), [
    ({"embedding_dim": 10**9}, "embedding_dim 1000000000 is not an integer in 16..4096"),
    ({"embedding_dim": 0}, "embedding_dim 0 is not an integer in 16..4096"),
    ({"embedding_dim": "128"}, "embedding_dim '128' is not an integer in 16..4096"),
    ({"face_geometry": GEOMETRY | {"size": 10**6}}, "face_geometry size 1000000 is not an integer in 16..256 pixels"),
    ({"face_geometry": GEOMETRY | {"size": 112.5}}, "face_geometry size 112.5 is not an integer in 16..256 pixels"),
    ({"face_geometry": GEOMETRY | {"template": [[float("nan"), 50.0]] + GEOMETRY["template"][1:]}},
     r"face_geometry template point 0 \(nan, 50\) is not inside the 112px crop"),
    ({"face_geometry": GEOMETRY | {"template": [[50.0, 50.0]] * 5}}, "face_geometry template's eyes are 0px apart, under 0.1 of"),
    ({"face_geometry": GEOMETRY | {"template": GEOMETRY["template"][:4]}}, "face_geometry template is not a list of 5"),
    ({"face_geometry": GEOMETRY | {"key": "../../cache"}}, "face_geometry key '../../cache' is not 1-64 letters"),
    ({"face_geometry": "arcface112"}, "face_geometry a face geometry is an object with key, size and template"),
    ({"verify_threshold": -1.5}, "verify_threshold '-1.5' is not a number in"),
    ({"verify_threshold": "0.3"}, "verify_threshold '0.3' is not a number in"),
])
def test_a_model_description_out_of_range_is_refused_in_one_line_and_not_remembered(
    tmp_path: Path, change: dict[str, object], refusal: str,
) -> None:
    # Prepare: what /v1/models/current sends, with one field out of its range
    state = registered(tmp_path / "device")
    description = {"version": VERSION, "embedding_dim": 128, "face_geometry": GEOMETRY} | change
    # Execute / Assert
    with pytest.raises(BadServerResponse, match=f"^the server's model {VERSION[:12]} is refused: {refusal}") as refused:
        state.remember_model(json.loads(json.dumps(description)))
    assert "\n" not in str(refused.value)
    assert state.current_model() is None
    # Execute / Assert: the same description in range is remembered
    state.remember_model(in_range := {"version": VERSION, "embedding_dim": 128, "face_geometry": GEOMETRY})
    assert state.current_model() == in_range


def test_a_model_file_over_the_cap_is_refused_and_not_cached(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Prepare: a 1 KiB cap stands for MAX_MODEL_BYTES
    state = registered(tmp_path / "device")
    monkeypatch.setattr(device_sdk.server_limits, "MAX_MODEL_BYTES", 1024)
    # Execute / Assert
    with pytest.raises(BadServerResponse, match="onnx file of model abababababab is refused: 1025 bytes is over MAX_MODEL_BYTES"):
        state.store_model(VERSION, "onnx", b"x" * 1025, None)
    assert not list(state.models_dir().iterdir())
    state.store_model(VERSION, "onnx", b"x" * 1024, None)


def _archive(entries: dict[str, bytes], compression: int = zipfile.ZIP_STORED) -> bytes:
    """A zip laid out as torch.save lays out its files."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", compression) as archive:
        for name, data in entries.items():
            archive.writestr(name, data)
    return buffer.getvalue()


TORCH_ENTRIES = {"archive/data.pkl": b"pickle", "archive/byteorder": b"little", "archive/version": b"3",
                 **{f"archive/data/{n}": b"\0" * 64 for n in range(10)}}


@pytest.mark.parametrize(("entries", "refusal"), [
    ({**TORCH_ENTRIES, **{f"archive/data/{n}": b"" for n in range(MAX_BACKBONE_TENSORS + 20)}},
     f"declares {MAX_BACKBONE_TENSORS + 23} entries .* over MAX_BACKBONE_TENSORS \\({MAX_BACKBONE_TENSORS}\\) tensors"),
    ({**TORCH_ENTRIES, "archive/data.pkl": b"(" * (MAX_BACKBONE_PICKLE_BYTES + 1)},
     f"pickle 'archive/data.pkl' is {MAX_BACKBONE_PICKLE_BYTES + 1} bytes, over MAX_BACKBONE_PICKLE_BYTES"),
    (None, "it is not a zip archive"),
])
def test_a_backbone_archive_past_its_caps_is_refused_before_torch_reads_it(
    tmp_path: Path, entries: dict[str, bytes] | None, refusal: str,
) -> None:
    # Prepare
    state = registered(tmp_path / "device")
    data = _archive(entries) if entries is not None else b"not a zip" * 100
    # Execute / Assert
    with pytest.raises(BadServerResponse, match=f"^the server's fp16.pt file of model abababababab is refused: .*{refusal}"):
        state.store_model(VERSION, "fp16.pt", data, None)
    assert not list(state.models_dir().iterdir())
    # Execute / Assert: an archive within the caps is kept
    assert state.store_model(VERSION, "fp16.pt", _archive(TORCH_ENTRIES), None).exists()


def test_a_compressed_backbone_archive_is_capped_at_its_unpacked_size(monkeypatch: pytest.MonkeyPatch) -> None:
    # Prepare: 64 KiB of zeros that deflate to a few hundred bytes, under a 16 KiB cap
    monkeypatch.setattr(device_sdk.server_limits, "MAX_MODEL_BYTES", 16 * 1024)
    data = _archive({**TORCH_ENTRIES, "archive/data/0": b"\0" * 65536}, zipfile.ZIP_DEFLATED)
    assert len(data) < 16 * 1024
    # Execute / Assert
    with pytest.raises(BadServerResponse, match=r"\(unpacked\) is refused: 6\d{4} bytes is over MAX_MODEL_BYTES"):
        check_torch_archive(data, "fp16.pt file")
