"""A backbone file the server sends, checked against the registry before a model is built from it:
the registered backbone's tensors exactly (names, count, shapes, dtypes), finite floats, an embedding
size in range; and the caps on model files fit every registered backbone."""
from __future__ import annotations

import re
import resource
import time
from typing import Any

import pytest
import torch

from device_sdk.backbone_check import check_backbone_payload
from device_sdk.errors import BadServerResponse
from device_sdk.round_files import load_backbone_file
from device_sdk.server_limits import MAX_BACKBONE_TENSORS, MAX_EMBEDDING_DIM, MAX_MODEL_BYTES
from facecore.models.checkpoint import dequantized_state, int8_state
from facecore.models.registry import backbone_names, expected_state, get_backbone

WHAT = "fp16.pt file of model abababababab"


def _payload(backbone: str = "mobilefacenet_s", half: bool = True, **changes: Any) -> dict[str, Any]:
    """A backbone file's dict as the server writes it (facecore.models.checkpoint.save_backbone)."""
    torch.manual_seed(0)
    model = get_backbone(backbone)
    state = {k: (v.half() if half and v.is_floating_point() else v).clone() for k, v in model.state_dict().items()}
    return {"format": "fedface-backbone/1", "backbone": backbone, "embedding_dim": model.embedding_dim,
            "state_dict": state, "meta": {}} | changes


def _first_weight(payload: dict[str, Any]) -> str:
    return next(k for k, v in payload["state_dict"].items() if v.is_floating_point() and k.endswith("weight"))


@pytest.mark.parametrize(("backbone", "half"), [("mobilefacenet_s", True), ("mobilefacenet_s", False), ("dlib-resnet", True)])
def test_a_backbone_file_as_the_server_writes_it_passes(backbone: str, half: bool) -> None:
    # Prepare
    payload = _payload(backbone, half)
    # Execute / Assert: no refusal
    check_backbone_payload(payload, WHAT)


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
def test_a_weight_that_is_not_finite_is_refused(value: float) -> None:
    # Prepare: one value of one weight
    payload = _payload()
    name = _first_weight(payload)
    payload["state_dict"][name].view(-1)[3] = value
    # Execute / Assert
    with pytest.raises(BadServerResponse, match=rf"^the server's {WHAT} is refused: state_dict\['{name}'\] holds NaN or "
                                                "infinite values; weights must be finite$"):
        check_backbone_payload(payload, WHAT)


@pytest.mark.parametrize("dtype", [torch.int8, torch.uint8, torch.int32, torch.float64, torch.bfloat16])
def test_a_weight_of_another_dtype_than_float16_or_float32_is_refused(dtype: torch.dtype) -> None:
    # Prepare: a quantised (or widened) copy of one weight
    payload = _payload()
    name = _first_weight(payload)
    payload["state_dict"][name] = payload["state_dict"][name].to(dtype)
    # Execute / Assert
    with pytest.raises(BadServerResponse, match=rf"state_dict\['{name}'\] is {str(dtype).removeprefix('torch.')}; backbone "
                                                r"'mobilefacenet_s' has floats there \(float16 or float32\)$"):
        check_backbone_payload(payload, WHAT)


def _int8_payload() -> dict[str, Any]:
    """A backbone file's dict as the server writes its int8 copy (save_backbone(..., int8=True))."""
    torch.manual_seed(0)
    model = get_backbone("mobilefacenet_s")
    codes, scales = int8_state(model.state_dict())
    return {"format": "fedface-backbone/1", "backbone": "mobilefacenet_s", "embedding_dim": model.embedding_dim,
            "state_dict": codes, "meta": {}, "int8_scales": scales}


def test_an_int8_file_as_the_server_writes_it_passes_and_loads_as_its_weights(tmp_path: Any) -> None:
    # Prepare
    payload = _int8_payload()
    torch.save(payload, tmp_path / "int8.pt")
    # Execute
    check_backbone_payload(payload, WHAT)
    model = load_backbone_file(tmp_path / "int8.pt", WHAT)
    # Assert
    for key, value in dequantized_state(payload).items():
        assert torch.equal(model.state_dict()[key], value), key


@pytest.mark.parametrize(("change", "refusal"), [
    (lambda p, name: p["int8_scales"].pop(name), r"state_dict\['{name}'\] is int8; backbone 'mobilefacenet_s' has floats there"),
    (lambda p, name: p["int8_scales"].__setitem__(name, p["int8_scales"][name].double()), r"int8_scales\['{name}'\] is not a dense float32 tensor"),
    (lambda p, name: p["int8_scales"].__setitem__(name, p["int8_scales"][name][:1]), r"int8_scales\['{name}'\] has shape \(1,\); the weight has \d+ output"),
    (lambda p, name: p["int8_scales"][name].__setitem__(0, float("inf")), r"int8_scales\['{name}'\] holds a scale that is not finite and positive"),
    (lambda p, name: p["int8_scales"][name].__setitem__(0, -1.0), r"int8_scales\['{name}'\] holds a scale that is not finite and positive"),
    (lambda p, name: p["state_dict"].__setitem__(name, p["state_dict"][name].half()), r"state_dict\['{name}'\] is float16, yet int8_scales gives it a scale"),
    (lambda p, name: p["int8_scales"].__setitem__("nowhere", torch.ones(3)), r"int8_scales\['nowhere'\] names no floating weight of two or more"),
    (lambda p, name: p.__setitem__("int8_scales", [1.0]), r"int8_scales is not a dict of tensors"),
])
def test_an_int8_file_whose_scales_do_not_fit_its_codes_is_refused(change: Any, refusal: str) -> None:
    # Prepare
    payload = _int8_payload()
    name = next(iter(payload["int8_scales"]))
    change(payload, name)
    # Execute / Assert
    with pytest.raises(BadServerResponse, match=rf"^the server's {WHAT} is refused: " + refusal.format(name=re.escape(name))):
        check_backbone_payload(payload, WHAT)


def test_an_integer_buffer_sent_as_floats_is_refused() -> None:
    # Prepare: a BatchNorm counter, int64 in the registry model
    payload = _payload()
    name = next(k for k, v in payload["state_dict"].items() if not v.is_floating_point())
    payload["state_dict"][name] = payload["state_dict"][name].float()
    # Execute / Assert
    with pytest.raises(BadServerResponse, match=rf"state_dict\['{name}'\] is float32; backbone 'mobilefacenet_s' has int64 there$"):
        check_backbone_payload(payload, WHAT)


def test_an_embedding_dim_out_of_range_is_refused_before_anything_is_allocated() -> None:
    # Prepare: the file claims 10^9 outputs (its tensors are the 128-output model's)
    payload = _payload(embedding_dim=10**9)
    peak_before, started = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, time.perf_counter()
    # Execute / Assert
    with pytest.raises(BadServerResponse, match=f"^the server's {WHAT} is refused: embedding_dim 1000000000 is not an "
                                                f"integer in 16..{MAX_EMBEDDING_DIM}$"):
        check_backbone_payload(payload, WHAT)
    assert time.perf_counter() - started < 5.0
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak_before < 256 * 1024  # KiB: not the ~2 TB of a model


def test_an_embedding_dim_in_range_that_the_tensors_do_not_match_is_refused_by_shape() -> None:
    # Prepare
    payload = _payload(embedding_dim=256)
    # Execute / Assert
    with pytest.raises(BadServerResponse, match=r"state_dict\['head.linear.weight'\] has shape \(128, 256\); backbone 'mobilefacenet_s' \(embedding_dim 256\) "
                                                r"has \(256, 256\)$"):
        check_backbone_payload(payload, WHAT)


@pytest.mark.parametrize(("change", "refusal"), [
    (lambda p: p["state_dict"].update({f"extra.{n}": torch.zeros(1) for n in range(10**4)}),
     "state_dict holds 10333 tensors; backbone 'mobilefacenet_s' (embedding_dim 128) has 333"),
    (lambda p: p["state_dict"].pop(next(iter(p["state_dict"]))), "state_dict holds 332 tensors"),
    (lambda p: p["state_dict"].update({"renamed": p["state_dict"].pop(_first_weight(p))}), "is missing or not a dense tensor"),
    (lambda p: p["state_dict"].update({_first_weight(p): torch.zeros(2, 2)}), "has shape (2, 2); backbone 'mobilefacenet_s'"),
    (lambda p: p["state_dict"].update({_first_weight(p): [1.0, 2.0]}), "is missing or not a dense tensor"),
    (lambda p: p.update(backbone="resnet1000"), "backbone 'resnet1000' is not one of dlib-resnet, "),
    (lambda p: p.update(embedding_dim=True), "embedding_dim True is not an integer"),
    (lambda p: p.update(state_dict=None), "state_dict is not a dict of tensors"),
])
def test_a_file_whose_tensors_are_not_the_registry_models_is_refused(change: Any, refusal: str) -> None:
    # Prepare
    payload = _payload()
    change(payload)
    # Execute / Assert
    with pytest.raises(BadServerResponse, match=f"^the server's {WHAT} is refused: .*{re.escape(refusal)}") as refused:
        check_backbone_payload(payload, WHAT)
    assert "\n" not in str(refused.value)


def test_the_caps_on_model_files_fit_every_registered_backbone() -> None:
    # Prepare / Execute: each backbone's fp32 state_dict, described on the meta device
    sizes = {name: expected_state(name) for name in backbone_names()}
    # Assert: room for the largest (fp32 file, or its ONNX graph, a little larger) and its tensors
    for name, state in sizes.items():
        fp32 = sum(torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size() for shape, dtype in state.values())
        assert 1.5 * fp32 < MAX_MODEL_BYTES, name
        assert 2 * len(state) < MAX_BACKBONE_TENSORS, name
