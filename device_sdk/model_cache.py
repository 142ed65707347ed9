"""The server's current model as a device reads it, and the model files it keeps.

Invariants:
- A model description is read capped (MAX_DESCRIPTION_BYTES) and checked (`check_model_description`) before
  anything uses it; it is remembered (`DeviceState.remember_model`) only by a caller that also has, or will
  cache, its ONNX file, because an offline verify falls back to the model remembered and needs that file.
- A version-pinned file never changes: a cached copy that still has its recorded sha256 is used as is;
  anything else is downloaded, at most MAX_MODEL_BYTES of it, and checked against the sha256 the server names
  (and, for a backbone, its archive: `DeviceState.store_model`) before it is kept.
- A backbone file is compared with its registry entry, finite floats only, before a model is built from it
  (device_sdk.round_files); one that fails is not kept, so the next round downloads it afresh.
- Torch is imported only by `load_backbone`, inside it: the training calls use it, nothing else does.
"""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from device_sdk.errors import BadServerResponse, DeviceError, ServerRefused
from device_sdk.inference import OnnxEmbedder
from device_sdk.link import ServerLink, server_path
from device_sdk.server_limits import MAX_DESCRIPTION_BYTES, MAX_MODEL_BYTES, check_model_description, check_version
from device_sdk.state import DeviceState
from facecore.align.geometry import FaceGeometry
from facecore.federation.protocol import CONTENT_SHA256_HEADER

if TYPE_CHECKING:  # the type only: importing torch costs ~2 s
    from torch import nn


def current_model(link: ServerLink, remember: bool = True) -> dict[str, Any]:
    """The server's current model description, checked and, with `remember`, remembered."""
    try:
        response = link.request("GET", "/v1/models/current", max_bytes=MAX_DESCRIPTION_BYTES)
    except ServerRefused as refused:
        if refused.status == 404:
            raise DeviceError("the server has no model yet: ask its operator to start it with a model") from None
        raise
    try:
        model = response.json()
    except ValueError:
        raise BadServerResponse("the server's model description is not JSON") from None
    if remember:
        link.state.remember_model(model)  # refuses a bad version, embedding_dim or face_geometry
    else:
        check_model_description(model)
    return model


def model_geometry(model: dict[str, Any]) -> FaceGeometry:
    """The crop a model description declares, or a BadServerResponse naming why not."""
    try:
        return FaceGeometry.from_json(model["face_geometry"])
    except (KeyError, ValueError) as error:
        why = "it has none" if isinstance(error, KeyError) else str(error)
        raise BadServerResponse(f"the server's face_geometry of model {str(model.get('version'))[:12]} is refused: "
                                f"{why}") from None


def fetch_model_file(link: ServerLink, url: str, version: str, kind: str) -> Path:
    """The `kind` file of model `version`: the cached copy while it keeps its sha256, else downloaded from `url`."""
    cached = link.state.cached_model(version, kind)
    if cached is not None:
        return cached
    response = link.request("GET", url, max_bytes=MAX_MODEL_BYTES)
    published = response.headers.get(CONTENT_SHA256_HEADER)
    expected = published.lower() if published else (version if kind == "fp32.pt" else None)
    return link.state.store_model(version, kind, response.content, expected)


def fetch_onnx(link: ServerLink, model: dict[str, Any]) -> Path:
    """The ONNX file of a (checked) model description, downloaded once."""
    version = check_version(model["version"])
    if not model.get("onnx_url"):
        raise DeviceError(f"the server publishes no ONNX file for model {version[:12]} (it runs with ONNX export "
                          "off): ask its operator")
    return fetch_model_file(link, model["onnx_url"], version, "onnx")


class Embedders:
    """ONNX sessions by model version, the latest one kept: a session takes ~0.1 s to build."""

    def __init__(self) -> None:
        self._held: dict[str, OnnxEmbedder] = {}

    def holds(self, version: str) -> bool:
        return version in self._held

    def open(self, state: DeviceState, version: str, onnx: Path) -> OnnxEmbedder:
        """The session of model `version`, built from its cached file `onnx` unless one is held."""
        if version not in self._held:
            self._held = {version: OnnxEmbedder(onnx, sha256=state.model_sha256(version, "onnx"))}
        return self._held[version]

    def embedder(self, link: ServerLink, model: dict[str, Any]) -> OnnxEmbedder:
        """The session of a (checked) model description, its ONNX file downloaded once."""
        version = check_version(model["version"])
        if version in self._held:
            return self._held[version]
        return self.open(link.state, version, fetch_onnx(link, model))

    def clear(self) -> None:
        self._held = {}


DownloadPrecision = Literal["fp32", "fp16", "int8"]


def download_precision(fp16: bool, local: Mapping[str, Any] | None = None) -> DownloadPrecision:
    """The backbone file a device downloads: int8 where its round's `local.download_bits` is 8, else fp16
    or fp32 (the device's choice, as it uploads)."""
    bits = (local or {}).get("download_bits")
    if bits is None:
        return "fp16" if fp16 else "fp32"
    if isinstance(bits, bool) or bits != 8:
        raise BadServerResponse(f"the round asks for a download of {str(bits)[:20]} bits; this device downloads 8 or fp16")
    return "int8"


def load_backbone(link: ServerLink, url: str, version: str, dtype: DownloadPrecision) -> nn.Module:
    """The round's torch backbone (for training: it imports torch), downloaded once per version and
    precision, and checked against its registry entry before a model is built from it."""
    from device_sdk.round_files import load_backbone_file

    kind = f"{dtype}.pt"
    path = fetch_model_file(link, f"{server_path(url)}?dtype={dtype}", check_version(version), kind)
    try:
        return load_backbone_file(path, f"{kind} file of model {version[:12]}")
    except BadServerResponse:
        link.state.drop_model(version, kind)  # not kept: the next round downloads it afresh
        raise


__all__ = ["DownloadPrecision", "Embedders", "current_model", "download_precision", "fetch_model_file", "fetch_onnx", "load_backbone",
           "model_geometry"]
