"""Fuzzing what a hostile server can hand a device as a model: mutated `/v1/models/current` bodies and
mutated backbone files, each through the device's own checks in the order a download takes them
(`check_model_description`; `DeviceState.store_model`, then `load_backbone_file`).

Invariant under test: every input ends in exactly one of two ways. Either it is refused with one
BadServerResponse line that names what was refused, or it is accepted and what was accepted is sane (a
description whose geometry builds and whose numbers lie in range; a model of the registry's shapes with
finite weights). Nothing else escapes: no other exception type, no NaN model, no crash.
"""
from __future__ import annotations

import copy
import io
import math
from pathlib import Path
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from device_sdk.errors import BadServerResponse
from device_sdk.round_files import load_backbone_file
from device_sdk.server_limits import MAX_EMBEDDING_DIM, MIN_EMBEDDING_DIM, check_model_description
from device_sdk.state import DeviceState
from facecore.align.geometry import ARCFACE_112, MAX_CROP_SIZE, FaceGeometry
from facecore.models.registry import expected_state, get_backbone

BACKBONE = "mobilefacenet_s"
VERSION = "ab" * 32
FUZZ = settings(max_examples=150, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def _payload() -> dict[str, Any]:
    torch.manual_seed(0)
    model = get_backbone(BACKBONE)
    state = {k: v.half() if v.is_floating_point() else v for k, v in model.state_dict().items()}
    return {"format": "fedface-backbone/1", "backbone": BACKBONE, "embedding_dim": model.embedding_dim,
            "state_dict": state, "meta": {}}


PAYLOAD = _payload()


def _saved(payload: dict[str, Any]) -> bytes:
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    return buffer.getvalue()


VALID_FILE = _saved(PAYLOAD)
DESCRIPTION: dict[str, Any] = {
    "version": VERSION, "backbone": BACKBONE, "embedding_dim": 128, "face_geometry": ARCFACE_112.to_json(),
    "round_id": None, "created_at": "2026-01-01T00:00:00Z", "backbone_url": f"/v1/models/{VERSION}/backbone",
    "onnx_url": f"/v1/models/{VERSION}/onnx", "verify_threshold": 0.5, "verify_far": 0.001}

JSON_VALUES = st.recursive(
    st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.text(max_size=20)
    | st.floats(allow_nan=True, allow_infinity=True) | st.sampled_from([0, 1, -1, 10**6, 10**9, 1e308, -0.0]),
    lambda inner: st.lists(inner, max_size=6) | st.dictionaries(st.text(max_size=12), inner, max_size=6),
    max_leaves=12)


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every path to a value inside a JSON document: the places a mutation can land."""
    found = [prefix] if prefix else []
    if isinstance(value, dict):
        for key, inner in value.items():
            found += _paths(inner, (*prefix, key))
    elif isinstance(value, list):
        for index, inner in enumerate(value):
            found += _paths(inner, (*prefix, index))
    return found


DESCRIPTION_PATHS = _paths(DESCRIPTION)


@st.composite
def hostile_descriptions(draw: st.DrawFn) -> object:
    """The published description with 1-3 values anywhere in it (the geometry's included) replaced or
    deleted, or now and then a body that is not an object at all."""
    if draw(st.integers(0, 19)) == 0:
        return draw(JSON_VALUES)
    body = copy.deepcopy(DESCRIPTION)
    for path in draw(st.lists(st.sampled_from(DESCRIPTION_PATHS), min_size=1, max_size=3)):
        parent: Any = body
        try:
            for step in path[:-1]:
                parent = parent[step]
            if isinstance(parent, dict) and draw(st.booleans()) and draw(st.booleans()):
                parent.pop(path[-1], None)
            else:
                parent[path[-1]] = draw(JSON_VALUES)
        except (KeyError, IndexError, TypeError):
            continue  # an earlier mutation replaced this path's parent
    return body


def _in_range(value: object, low: float, high: float) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and low <= value <= high


@FUZZ
@given(body=hostile_descriptions())
def test_a_hostile_model_description_is_refused_in_one_line_or_is_sane(body: object) -> None:
    # Execute
    try:
        accepted = check_model_description(body)
    except BadServerResponse as refused:
        # Assert: refused, in one line that says what
        assert "\n" not in str(refused) and str(refused).startswith(("the server", "the ")), str(refused)
        return
    # Assert: what was accepted is sane
    if "embedding_dim" in accepted:
        assert _in_range(accepted["embedding_dim"], MIN_EMBEDDING_DIM, MAX_EMBEDDING_DIM)
    if accepted.get("verify_threshold") is not None:
        assert _in_range(accepted["verify_threshold"], -1.0, 1.0)
    if "face_geometry" in accepted:
        geometry = FaceGeometry.from_json(accepted["face_geometry"])
        assert geometry.size <= MAX_CROP_SIZE


def _through_the_device(data: bytes, state: DeviceState) -> torch.nn.Module:
    """What a device does with a downloaded backbone file: store it (size and archive checks), load it."""
    path = state.store_model(VERSION, "fp32.pt", data, expected_sha256=None)
    try:
        return load_backbone_file(path, f"backbone of model {VERSION[:12]}")
    finally:
        state.drop_model(VERSION, "fp32.pt")


def _assert_refused_or_sane(data: bytes, state: DeviceState) -> None:
    try:
        model = _through_the_device(data, state)
    except BadServerResponse as refused:
        assert "\n" not in str(refused) and str(refused).startswith(("the server", "the ")), str(refused)
        return
    expected = expected_state(BACKBONE, model.embedding_dim)
    loaded = model.state_dict()
    assert {k: tuple(v.shape) for k, v in loaded.items()} == {k: shape for k, (shape, _) in expected.items()}
    assert all(bool(torch.isfinite(v).all()) for v in loaded.values() if v.is_floating_point())


@pytest.fixture()
def device_state(tmp_path: Path) -> DeviceState:
    state = DeviceState(tmp_path / "device")
    state.create()
    return state


def _pickle_span(data: bytes) -> tuple[int, int]:
    start = data.find(b"data.pkl")
    return (start, min(len(data), start + 4096)) if start >= 0 else (0, 4096)


REGIONS = {"head": (0, 4096), "pickle": _pickle_span(VALID_FILE), "directory": (len(VALID_FILE) - 8192, len(VALID_FILE)),
           "anywhere": (0, len(VALID_FILE))}


Edit = tuple[str, int, bytes | int]  # (overwrite | truncate | repeat, offset, new bytes | repeated length)


@st.composite
def byte_edits(draw: st.DrawFn) -> list[Edit]:
    """Edits of the valid file: bytes overwritten, the file cut short, or a slice repeated, mostly where
    torch and the zip reader parse (headers, the pickle, the central directory) rather than tensor data."""
    edits: list[Edit] = []
    for _ in range(draw(st.integers(1, 4))):
        low, high = REGIONS[draw(st.sampled_from(sorted(REGIONS)))]
        at = draw(st.integers(low, high - 1))
        kind = draw(st.sampled_from(["overwrite", "truncate", "repeat"]))
        edits.append((kind, at, draw(st.binary(min_size=1, max_size=8)) if kind == "overwrite" else draw(st.integers(1, 4096))))
        if kind == "truncate":
            break
    return edits


def _edited(edits: list[Edit]) -> bytes:
    data = bytearray(VALID_FILE)
    for kind, at, change in edits:
        if kind == "overwrite":
            assert isinstance(change, bytes)
            data[at:at + len(change)] = change
        elif kind == "truncate":
            del data[at:]
        else:
            assert isinstance(change, int)
            data[at:at] = data[at:at + change]
    return bytes(data)


@FUZZ
@given(edits=byte_edits())
def test_a_byte_mutated_backbone_file_is_refused_in_one_line_or_loads_a_finite_model(
        edits: list[Edit], device_state: DeviceState) -> None:
    # Prepare
    data = _edited(edits)
    # Execute / Assert
    _assert_refused_or_sane(data, device_state)


TENSOR_NAMES = sorted(PAYLOAD["state_dict"])
ODD_DTYPES = [torch.int8, torch.uint8, torch.bool, torch.float64, torch.bfloat16, torch.complex64, torch.int64]


Lie = tuple[str, str, Any]  # (what changes, the tensor or header field, the value drawn for it)


@st.composite
def content_lies(draw: st.DrawFn) -> Lie:
    """A change to a well-formed torch file's content: a header field, or one tensor's dtype, shape or
    values, or the tensor set itself."""
    kind = draw(st.sampled_from(["header", "dtype", "shape", "values", "drop", "extra", "sparse"]))
    if kind == "header":
        return kind, draw(st.sampled_from(["backbone", "embedding_dim", "state_dict", "format"])), draw(JSON_VALUES)
    name = draw(st.sampled_from(TENSOR_NAMES))
    if kind == "dtype":
        return kind, name, draw(st.sampled_from(ODD_DTYPES))
    if kind == "shape":
        return kind, name, draw(st.lists(st.integers(0, 64), min_size=0, max_size=4))
    if kind == "values":
        poison = draw(st.sampled_from([math.nan, math.inf, -math.inf, 65504.0]))
        return kind, name, (draw(st.integers(0, PAYLOAD["state_dict"][name].numel() - 1)), poison)
    return kind, name, None


def _lying_file(lie: Lie) -> bytes:
    kind, name, value = lie
    payload = dict(PAYLOAD, state_dict=dict(PAYLOAD["state_dict"]))
    state = payload["state_dict"]
    if kind == "header":
        payload[name] = value
    elif kind == "dtype":
        state[name] = state[name].to(value)
    elif kind == "shape":
        state[name] = torch.zeros(value, dtype=state[name].dtype)
    elif kind == "values" and state[name].is_floating_point():
        poisoned = state[name].clone().flatten()
        poisoned[value[0]] = value[1]
        state[name] = poisoned.view_as(state[name])
    elif kind == "drop":
        del state[name]
    elif kind == "extra":
        state[f"{name}.extra"] = torch.zeros(3)
    elif kind == "sparse" and state[name].dim() == 2:
        state[name] = state[name].float().to_sparse()
    return _saved(payload)


@FUZZ
@given(lie=content_lies())
def test_a_backbone_file_whose_content_lies_is_refused_in_one_line_or_loads_a_finite_model(
        lie: Lie, device_state: DeviceState) -> None:
    # Prepare
    data = _lying_file(lie)
    # Execute / Assert
    _assert_refused_or_sane(data, device_state)


def test_the_unmutated_file_loads(device_state: DeviceState) -> None:
    """The fuzzers' starting point is a file the device accepts: their refusals come from the mutations."""
    # Prepare: the valid file (module level) and a device's state folder
    # Execute
    model = _through_the_device(VALID_FILE, device_state)
    # Assert
    assert model.embedding_dim == PAYLOAD["embedding_dim"]
