"""Backbone files: what the product ships, what `--model` accepts, and the named models.

Named models: `default` (and its architecture name `dlib-resnet`) is the dlib ResNet with the
weights the setup fetched from the npm registry (`facecore.models.published`); `mobile` is the
compact cut of it bundled in int8 in `facecore/weights/mobile.pt`, and the other names of
`facecore.models.cards.BUNDLED_MODELS` (`mobilefacenet`) are bundled beside it; `random` is an untrained backbone.
Anything else is a path to a backbone or training file.

A backbone file is a torch pickle of a plain dict (loaded with weights_only=True):
{"format": "fedface-backbone/1", "backbone": name, "embedding_dim": d, "state_dict": {...}, "meta": {...}}.
An int8 file (the compact shipped form) also holds "int8_scales": {key: one fp32 scale per output channel}
for each weight stored as int8; loading multiplies them back, so every reader gets fp32 weights.
Training checkpoints embed the same keys, so both load here. A loaded model keeps its file's meta as
`model.meta`; the verification threshold in it is only the one the model shipped with, read and set through
`shipped_verification` and `set_shipped_verification` (facecore.models.verification says where the truth is).
"""
from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from facecore.errors import CheckpointError

# The named models' paths and figures live in the torch-free cards module; re-exported for the callers that import them from here.
from facecore.models.cards import BUNDLED_MODELS as BUNDLED_MODELS
from facecore.models.cards import FIGURES as FIGURES
from facecore.models.cards import MOBILE_MODEL as MOBILE_MODEL
from facecore.models.cards import MODEL_NAMES as MODEL_NAMES
from facecore.models.cards import PUBLISHED_MODELS as PUBLISHED_MODELS
from facecore.models.cards import WEIGHTS_DIR as WEIGHTS_DIR
from facecore.models.cards import model_source as model_source
from facecore.models.registry import get_backbone
from facecore.models.verification import Verification, shipped_in, shipping

FORMAT = "fedface-backbone/1"


def save_backbone(
    model: torch.nn.Module, path: str | Path, meta: dict[str, Any] | None = None, half: bool = False, int8: bool = False,
) -> Path:
    """Atomically write a backbone file. `half` stores floating tensors as fp16 (the shipped form); `int8`
    stores every weight of two or more dimensions as int8 with a scale per output channel, the rest as fp16."""
    if half and int8:
        raise ValueError("a backbone file is fp16 or int8, not both")
    if int8:
        state, scales = int8_state(model.state_dict())
    else:
        state, scales = {k: (v.detach().cpu().half() if half and v.is_floating_point() else v.detach().cpu()).clone()
                         for k, v in model.state_dict().items()}, {}
    payload = {"format": FORMAT, "backbone": model.name, "embedding_dim": model.embedding_dim, "state_dict": state, "meta": meta or {}}
    if scales:
        payload["int8_scales"] = scales
    return atomic_torch_save(payload, path)


def backbone_file_bytes(model: torch.nn.Module, half: bool = False, int8: bool = False) -> int:
    """The size of the file `save_backbone` writes for `model` at that precision."""
    with tempfile.TemporaryDirectory() as scratch:
        return save_backbone(model, Path(scratch) / "model.pt", half=half, int8=int8).stat().st_size


def quantized_per_channel(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 codes of `weight` and one fp32 scale per output channel (its first dimension)."""
    peak = weight.float().abs().flatten(1).amax(1).clamp_min(1e-12)
    scale = peak / 127.0
    codes = torch.round(weight.float() / scale.view(-1, *[1] * (weight.dim() - 1))).clamp_(-127, 127).to(torch.int8)
    return codes, scale


def int8_state(state: Mapping[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """An int8 file's (state dict, scales): every floating weight of two or more dimensions as int8 codes with
    a scale per output channel, the other floating tensors in fp16, the rest as they are."""
    codes, scales = {}, {}
    for key, value in state.items():
        value = value.detach().cpu()
        if value.is_floating_point() and value.dim() >= 2:
            codes[key], scales[key] = quantized_per_channel(value)
        else:
            codes[key] = (value.half() if value.is_floating_point() else value).clone()
    return codes, scales


def int8_received(state: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The fp32 weights a reader of `state`'s int8 file computes with: what a device trains from after an
    int8 download (a round's `local.download_bits` 8), the simulator's devices included."""
    codes, scales = int8_state(state)
    return dequantized_state({"state_dict": codes, "int8_scales": scales})


def dequantized_state(payload: dict[str, Any]) -> dict[str, torch.Tensor]:
    """A backbone file's state dict with fp32 floating tensors, int8 weights multiplied back by their scales."""
    scales = payload.get("int8_scales") or {}
    state = {}
    for key, value in payload["state_dict"].items():
        if key in scales:
            value = value.float() * scales[key].float().view(-1, *[1] * (value.dim() - 1))
        state[key] = value.float() if value.is_floating_point() else value
    return state


def atomic_torch_save(payload: Any, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.NamedTemporaryFile(dir=path.parent, suffix=".tmp", delete=False) as handle:
        torch.save(payload, handle)
        handle.flush()
        os.fsync(handle.fileno())
    os.chmod(handle.name, 0o644)
    os.replace(handle.name, path)
    return path


def read_backbone_file(path: str | Path) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"model file {path} does not exist")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises many types for a corrupt pickle
        raise CheckpointError(f"{path} is not a readable torch file ({type(error).__name__}: {error})") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a FedFace backbone file (expected format {FORMAT!r})")
    return payload


def load_backbone(spec: str | Path, backbone: str = "mobilefacenet", seed: int = 0) -> torch.nn.Module:
    """A named model (`default`, `dlib-resnet`, `mobile`, `mobilefacenet`, `random`: untrained, seeded, of
    architecture `backbone`) or a path to a backbone/training file."""
    if str(spec) == "random":
        torch.manual_seed(seed)
        return get_backbone(backbone).eval()
    if str(spec) in PUBLISHED_MODELS:
        from facecore.models.published import load_dlib_resnet

        return _with_figures(load_dlib_resnet(), str(spec))
    if str(spec) in BUNDLED_MODELS:
        return _with_figures(_load_file(BUNDLED_MODELS[str(spec)]), str(spec))
    return _load_file(Path(spec))


def meta_of(model: torch.nn.Module) -> dict[str, Any]:
    """The meta of the file `model` was loaded from (or that was given it), or {}."""
    return dict(getattr(model, "meta", None) or {})


def _set_meta(model: torch.nn.Module, meta: dict[str, Any]) -> None:
    model.meta = meta  # type: ignore[assignment]  # Module types unknown attributes as Tensor | Module; meta is a dict


def shipped_verification(model: torch.nn.Module) -> Verification | None:
    """The verification threshold the model's file (or a named model's card) shipped with, or None. For a
    version the server published, its row is the truth: an operator may have recalibrated it since."""
    return shipped_in(meta_of(model))


def set_shipped_verification(model: torch.nn.Module, verification: Verification | None) -> torch.nn.Module:
    """Record `verification` as what `model` ships with: `save_backbone(model, path, meta_of(model))` writes it."""
    _set_meta(model, shipping(meta_of(model), verification))
    return model


def feature_center_of(model: torch.nn.Module) -> list[float] | None:
    """The model's published feature centre (facecore.eval.feature_center), or None."""
    center = meta_of(model).get("feature_center")
    return None if center is None else [float(x) for x in center]


def _with_figures(model: torch.nn.Module, name: str) -> torch.nn.Module:
    figures = json.loads(FIGURES[name].read_text()) if FIGURES[name].is_file() else {}
    center = (figures.get("feature_center") or {}).get("vector")
    _set_meta(model, meta_of(model) | {"feature_center": center})
    return set_shipped_verification(model, Verification.from_json(figures.get("verification")))


def _load_file(path: Path) -> torch.nn.Module:
    payload = read_backbone_file(path)
    model = get_backbone(payload["backbone"], embedding_dim=payload["embedding_dim"])
    state = dequantized_state(payload)
    try:
        model.load_state_dict(state)
    except RuntimeError as error:
        raise CheckpointError(f"{path}: weights do not fit backbone {payload['backbone']!r}: {str(error).splitlines()[0]}") from None
    _set_meta(model, payload.get("meta", {}))
    return model.eval()
