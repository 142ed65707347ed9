"""Checks on untrusted payloads: uploaded update files and enrolled embeddings.

An update file (tensor file, see storage.tensorfile) holds ``backbone.<name>`` for
every entry of the model's state_dict, as the delta trained - base, plus
``class_embedding`` (D,), and ``__metadata__["fedface"]``: a JSON
:class:`~server_api.schemas.UpdateMeta`. Tensors are read one at a time.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, BinaryIO

import numpy as np
from pydantic import ValidationError

from server_api.errors import Conflict, InvalidInput
from server_api.schemas import UpdateMeta
from facecore.tensorfile import TensorFileError, TensorFileHeader, iter_tensors, read_header, read_tensor

EMBEDDING_KEY = "class_embedding"
BACKBONE_PREFIX = "backbone."
UNIT_NORM_TOLERANCE = 1e-3
# Uploaded embeddings come back un-normalised from spreadout; only absurd scales are refused.
EMBEDDING_NORM_RANGE = (1e-3, 1e3)
_FLOAT_WIRE = {"F16", "F32"}
_INT_WIRE = {"I32", "I64"}


@dataclass(frozen=True)
class ParsedUpdate:
    meta: UpdateMeta
    header: TensorFileHeader
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


def parse_update(handle: BinaryIO, size: int, spec: dict[str, Any], embedding_dim: int, base_version: str, max_delta_norm: float) -> ParsedUpdate:
    try:
        header = read_header(handle, size)
    except TensorFileError as error:
        raise InvalidInput(f"update is not a valid tensor file: {error}") from None
    meta = _parse_meta(header)
    if meta.base_version != base_version:
        raise Conflict(f"update was trained from model {meta.base_version[:12]}, but this round's base is {base_version[:12]}")
    _check_names_and_shapes(header, spec, embedding_dim)
    squared = 0.0
    for name, tensor in iter_tensors(handle, header, prefix=BACKBONE_PREFIX):
        if tensor.dtype.kind == "f":
            if not np.isfinite(tensor).all():
                raise InvalidInput(f"backbone.{name} contains NaN or Inf")
            flat = tensor.astype(np.float64).ravel()
            squared += float(flat @ flat)
    delta_norm = math.sqrt(squared)
    if delta_norm > max_delta_norm:
        raise InvalidInput(f"backbone delta L2 norm {delta_norm:.3g} exceeds the bound {max_delta_norm:.3g}")
    embedding = read_tensor(handle, header, EMBEDDING_KEY).astype(np.float32)
    if not np.isfinite(embedding).all():
        raise InvalidInput("class_embedding contains NaN or Inf")
    norm = float(np.linalg.norm(embedding.astype(np.float64)))
    if not EMBEDDING_NORM_RANGE[0] <= norm <= EMBEDDING_NORM_RANGE[1]:
        raise InvalidInput(f"class_embedding norm {norm:.3g} is outside {EMBEDDING_NORM_RANGE}")
    return ParsedUpdate(meta=meta, header=header, embedding=embedding, delta_norm=delta_norm)


def _parse_meta(header: TensorFileHeader) -> UpdateMeta:
    if set(header.metadata) != {"fedface"}:
        raise InvalidInput('update __metadata__ must hold exactly one entry, "fedface"')
    try:
        return UpdateMeta.model_validate_json(header.metadata["fedface"])
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "metadata"
        raise InvalidInput(f"update metadata invalid at {where}: {first['msg']}") from None


def _check_names_and_shapes(header: TensorFileHeader, spec: dict[str, Any], embedding_dim: int) -> None:
    expected = {BACKBONE_PREFIX + k for k in spec} | {EMBEDDING_KEY}
    names = set(header.tensors)
    if names != expected:
        missing, extra = sorted(expected - names), sorted(names - expected)
        raise InvalidInput(f"update tensors do not match the model: missing {missing[:3]}, unexpected {extra[:3]}")
    for key, (dtype, shape) in spec.items():
        info = header.tensors[BACKBONE_PREFIX + key]
        if list(info.shape) != list(shape):
            raise InvalidInput(f"backbone.{key} has shape {list(info.shape)}, expected {shape}")
        allowed = _FLOAT_WIRE if dtype.startswith("float") else _INT_WIRE
        if info.dtype not in allowed:
            raise InvalidInput(f"backbone.{key} has dtype {info.dtype}, expected one of {sorted(allowed)}")
    info = header.tensors[EMBEDDING_KEY]
    if info.shape != (embedding_dim,) or info.dtype not in _FLOAT_WIRE:
        raise InvalidInput(f"class_embedding must be F32/F16 of shape [{embedding_dim}], got {info.dtype} {list(info.shape)}")
