"""A downloaded backbone file checked against its registry entry before a model is built from it.

A hostile server could send a file that names a billion outputs, holds NaN weights, int8 weights
without their scales, or tensors of other shapes. Torch: only the training calls import this module
(device_sdk.device).
"""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from device_sdk.errors import BadServerResponse
from device_sdk.server_limits import check_embedding_dim

# The floating dtypes a backbone file may carry where its registry model has floats: the wire's fp16 and fp32.
BACKBONE_FLOAT_DTYPES = ("float16", "float32")


def check_backbone_payload(payload: object, what: str) -> None:
    """A downloaded backbone file (torch.load'ed with weights_only), refused (BadServerResponse, one line
    naming the field and the limit) unless it names a registered backbone, an `embedding_dim` in range,
    and exactly the tensors a freshly built model of that backbone has: same names, count and shapes,
    the same dtype where that is not floating, float16/float32 where it is, and finite values only.
    An int8 file (facecore.models.checkpoint.int8_state) may hold int8 codes for a floating weight of two
    or more dimensions that `int8_scales` gives a finite, positive float32 scale per output channel.
    The reference is built on torch's meta device (`expected_state`): checking allocates no weights."""
    import torch

    from facecore.models.registry import backbone_names, expected_state

    def refused(why: str) -> BadServerResponse:
        return BadServerResponse(f"the server's {what} is refused: {why}")

    if not isinstance(payload, dict):
        raise refused(f"it holds a {type(payload).__name__}, not a backbone file's dict")
    name, state = payload.get("backbone"), payload.get("state_dict")
    if not isinstance(name, str) or name not in backbone_names():
        raise refused(f"backbone {str(name)[:40]!r} is not one of {', '.join(backbone_names())}")
    dim = check_embedding_dim(payload.get("embedding_dim"), what)
    if not isinstance(state, dict):
        raise refused("state_dict is not a dict of tensors")
    expected = expected_state(name, dim)
    scales = _checked_scales(payload.get("int8_scales", {}), expected, refused)
    if len(state) != len(expected):
        raise refused(f"state_dict holds {len(state)} tensors; backbone {name!r} (embedding_dim {dim}) has {len(expected)}")
    for key, (shape, dtype) in expected.items():
        tensor = state.get(key)
        field = f"state_dict[{key[:60]!r}]"
        if not isinstance(tensor, torch.Tensor) or tensor.layout != torch.strided:
            raise refused(f"{field} is missing or not a dense tensor; backbone {name!r} has one")
        if tuple(tensor.shape) != shape:
            raise refused(f"{field} has shape {tuple(tensor.shape)}; backbone {name!r} (embedding_dim {dim}) has {shape}")
        floating = str(tensor.dtype).removeprefix("torch.")
        if key in scales:
            if tensor.dtype != torch.int8:
                raise refused(f"{field} is {floating}, yet int8_scales gives it a scale: a scaled weight is int8")
            continue
        if dtype.is_floating_point and floating not in BACKBONE_FLOAT_DTYPES:
            raise refused(f"{field} is {floating}; backbone {name!r} has floats there ({' or '.join(BACKBONE_FLOAT_DTYPES)})")
        if not dtype.is_floating_point and tensor.dtype != dtype:
            raise refused(f"{field} is {floating}; backbone {name!r} has {str(dtype).removeprefix('torch.')} there")
        if dtype.is_floating_point and not bool(torch.isfinite(tensor).all()):
            raise refused(f"{field} holds NaN or infinite values; weights must be finite")


def _checked_scales(scales: object, expected: dict[str, Any], refused: Callable[[str], BadServerResponse]) -> dict[str, Any]:
    """`int8_scales`: for floating weights of two or more dimensions only, each a finite, positive float32 vector
    of one scale per output channel."""
    import torch

    if not isinstance(scales, dict):
        raise refused("int8_scales is not a dict of tensors")
    for key, scale in scales.items():
        field = f"int8_scales[{str(key)[:60]!r}]"
        if key not in expected or not expected[key][1].is_floating_point or len(expected[key][0]) < 2:
            raise refused(f"{field} names no floating weight of two or more dimensions")
        if not isinstance(scale, torch.Tensor) or scale.layout != torch.strided or scale.dtype != torch.float32:
            raise refused(f"{field} is not a dense float32 tensor")
        if tuple(scale.shape) != expected[key][0][:1]:
            raise refused(f"{field} has shape {tuple(scale.shape)}; the weight has {expected[key][0][0]} output channels")
        if not bool((torch.isfinite(scale) & (scale > 0)).all()):
            raise refused(f"{field} holds a scale that is not finite and positive")
    return scales


__all__ = ["BACKBONE_FLOAT_DTYPES", "check_backbone_payload"]
