"""Model versions as blobs: the fp32 backbone file (its sha256 is the version hash and
the ETag), an fp16 and an int8 copy for downloads (a round's `local.download_bits` picks int8), and the
ONNX fp32 export for inference.

Backbone files are FedFace backbone files (facecore.models.checkpoint), so whatever
loads ``--model PATH`` also loads a downloaded version. A version's verification threshold is written
into its files as the one it shipped with (facecore.models.verification.SHIPPED_KEY) and into
:class:`VersionBlobs` for its row, which is the truth from then on: a recalibration changes the row only,
since the file's bytes name the version.
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import torch

from facecore.errors import CheckpointError
from facecore.models import get_backbone
from facecore.models.checkpoint import FORMAT, save_backbone
from facecore.models.registry import embedding_dim_of
from facecore.models.verification import Verification, shipping
from server_api.core.logging import expected_warnings
from server_api.storage.blobs import BlobStore


@dataclass(frozen=True)
class VersionBlobs:
    version_hash: str
    fp16_blob: str
    onnx_blob: str | None
    backbone: str
    embedding_dim: int
    spec: dict[str, Any]
    verification: Verification | None = None  # the row's published threshold, to start with the one the files ship with
    feature_center: list[float] | None = None  # the unit mean feature of public faces rounds centre on
    int8_blob: str | None = None


def spec_of(model: torch.nn.Module) -> dict[str, Any]:
    """{name: [dtype, shape]} of every state_dict entry: what uploads must match."""
    return {k: [str(v.dtype).removeprefix("torch."), list(v.shape)] for k, v in model.state_dict().items()}


def store_model(
    store: BlobStore, model: torch.nn.Module, export_onnx: bool, meta: dict[str, Any], verification: Verification | None,
) -> VersionBlobs:
    """Write all blobs of a version, `meta` in its backbone files with `verification` as the threshold it
    ships with; the caller commits a row naming them (and publishing `verification`) afterwards."""
    model = model.float().eval()
    meta = shipping(meta, verification)
    version_hash = _put_backbone(store, model, meta)
    fp16_blob = _put_backbone(store, model, meta, half=True)
    int8_blob = _put_backbone(store, model, meta, int8=True)
    onnx_blob = None
    if export_onnx:
        from export.onnx_model import export_fp32

        # Tracing warns of shape arithmetic it records as constants and of Slice steps it cannot fold: expected
        # for a fixed crop size (export.onnx_model.fold_shape_arithmetic folds them after), so DEBUG, not WARNING.
        with store.temp_file() as temp, expected_warnings("torch.onnx export of a fixed-size backbone"):
            export_fp32(model, temp)
            onnx_blob = store.put_file(temp)
    name = cast(str, model.name)  # every backbone names itself (facecore.models.registry)
    return VersionBlobs(version_hash, fp16_blob, onnx_blob, name, int(embedding_dim_of(model)), spec_of(model), verification,
                        meta.get("feature_center"), int8_blob)


def int8_copy(store: BlobStore, version_hash: str) -> str:
    """The int8 file of a stored fp32 backbone, written from it with its own meta, as `store_model` writes one; its
    digest. For a version published before int8 downloads."""
    header, weights = load_weights(store, version_hash)
    return _put_backbone(store, build_model(header["backbone"], header["embedding_dim"], weights), header.get("meta"), int8=True)


def _put_backbone(store: BlobStore, model: torch.nn.Module, meta: dict[str, Any] | None, half: bool = False, int8: bool = False) -> str:
    """`model`'s backbone file at that precision, stored; its digest."""
    with store.temp_file() as temp:
        save_backbone(model, temp, meta=meta, half=half, int8=int8)
        return store.put_file(temp)


def load_weights(store: BlobStore, version_hash: str) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """(payload header without state_dict, weights as numpy) of a stored fp32 backbone file."""
    with store.open(version_hash) as handle:
        payload = torch.load(handle, map_location="cpu", weights_only=True)
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise CheckpointError(f"blob {version_hash} is not a FedFace backbone file")
    state = payload.pop("state_dict")
    return payload, {k: v.numpy() for k, v in state.items()}


def build_model(backbone: str, embedding_dim: int, weights: Mapping[str, np.ndarray]) -> torch.nn.Module:
    model = get_backbone(backbone, embedding_dim=embedding_dim)
    model.load_state_dict({k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in weights.items()})
    return model.eval()
