"""The personal verifier's file (what `personal.enc` seals), readable without torch.

Invariants:
- A zip archive (stored, not compressed) of three members: `verifier.json` (format, the global
  model's version and crop geometry, config, the owner's fused template and the calibrated
  threshold, or null), `verifier.onnx`
  (aligned faces (N, 3, S, S) in [-1, 1] -> fused embeddings (N, D), not normalised) and
  `trained.pt` (the torch state of the trained parts, for `device_sdk.personal.load_verifier`).
- Reading the JSON and the ONNX member needs only the standard library, so `fedface device verify
  --personal` scores with onnxruntime and never imports torch.
- A file written before this format (a bare `torch.save` of the trained parts) is recognised and
  refused by `read_personal` with the fix: personalize again.
"""
from __future__ import annotations

import io
import json
import zipfile
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from device_sdk.errors import NotEnrolled
from facecore.align.geometry import FaceGeometry

FORMAT = "fedface-personal/2"
MEMBERS = ("verifier.json", "verifier.onnx", "trained.pt")


@dataclass(frozen=True)
class PersonalThreshold:
    """The personal verifier's own operating point. `threshold`: the smallest cosine at which at
    most `far` of the impostor faces score above it; `impostor_far` is what it lets through there.
    `genuine_accept` is measured on the owner's enrollment faces, which the verifier trained on,
    so it is an upper bound of what held-out photos of the owner reach."""

    threshold: float
    far: float
    impostor_far: float
    impostors: int
    genuine_accept: float
    genuine: int
    impostor_source: str

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> PersonalThreshold:
        return cls(**{name: data[name] for name in cls.__dataclass_fields__})

    def describe(self) -> str:
        return (f"{self.threshold:.3f}, FAR {self.impostor_far:.2g} on {self.impostors:,} public impostor faces "
                f"(target {self.far:g}); accepts {100 * self.genuine_accept:.0f}% of the {self.genuine} "
                "enrollment faces")


@dataclass(frozen=True)
class PersonalFile:
    model_version: str  # the global model it was trained on
    geometry: FaceGeometry  # that model's crop
    config: dict[str, Any]
    template: np.ndarray  # (D,) unit float32
    threshold: PersonalThreshold | None
    onnx: bytes
    trained_state: bytes


def write_personal(file: PersonalFile) -> bytes:
    meta = {
        "format": FORMAT, "model_version": file.model_version, "geometry": file.geometry.to_json(),
        "config": file.config,
        "template": [float(v) for v in np.asarray(file.template, np.float32)],
        "threshold": None if file.threshold is None else file.threshold.to_json(),
    }
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr("verifier.json", json.dumps(meta))
        archive.writestr("verifier.onnx", file.onnx)
        archive.writestr("trained.pt", file.trained_state)
    return buffer.getvalue()


def is_current_format(payload: bytes) -> bool:
    try:
        with zipfile.ZipFile(io.BytesIO(payload)) as archive:
            return set(MEMBERS) <= set(archive.namelist())
    except zipfile.BadZipFile:
        return False


def read_personal(payload: bytes) -> PersonalFile:
    if not is_current_format(payload):
        raise NotEnrolled("this device's personal verifier was saved by an earlier version: run personalize again")
    with zipfile.ZipFile(io.BytesIO(payload)) as archive:
        meta = json.loads(archive.read("verifier.json"))
        onnx, trained = archive.read("verifier.onnx"), archive.read("trained.pt")
    threshold = meta.get("threshold")
    return PersonalFile(
        str(meta["model_version"]), FaceGeometry.from_json(meta["geometry"]), dict(meta["config"]),
        np.asarray(meta["template"], np.float32),
        None if threshold is None else PersonalThreshold.from_json(threshold), onnx, trained,
    )


__all__ = ["FORMAT", "PersonalFile", "PersonalThreshold", "is_current_format", "read_personal", "write_personal"]
