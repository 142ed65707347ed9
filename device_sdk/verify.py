"""Verify photos against the enrolled owner without torch: many photos, one process.

Invariants:
- Imports numpy, PIL, onnxruntime, httpx and cryptography, never torch (a test checks
  `sys.modules` in a subprocess): a one-photo verify must not pay torch's import (~3 s, ~0.9 GB).
- A photo is cropped as enrollment crops it: the five landmarks of the detector enrollment's `FaceAligner`
  loads (`facecore.align.detectors.load_detector()`: the default, or $FEDFACE_DETECTOR; never a name fixed
  here) warped by `warp_to_template` onto the model's `FaceGeometry`, the warp `FaceAligner.warp` uses.
- The threshold is the caller's, else, with `personal`, the one calibrated with the personal
  verifier, else the model's published one; the result says which, with its FAR when known.
- Every photo gets a result, in input order: a score, or why it has none (not an image, no face).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import numpy as np

from device_sdk.errors import BadServerResponse, NotEnrolled, ServerUnavailable
from device_sdk.inference import OnnxEmbedder
from device_sdk.state import DeviceState, check_version
from device_sdk.transport import Transport
from facecore.align.detectors import FaceDetector, load_detector
from facecore.align.geometry import FaceGeometry
from facecore.align.pipeline import load_rgb
from facecore.align.template import warp_to_template
from facecore.errors import FaceCoreError
from facecore.federation.protocol import CONTENT_SHA256_HEADER

if TYPE_CHECKING:
    from device_sdk.personal_file import PersonalThreshold

NOT_AN_IMAGE = "not an image"
NO_FACE = "no face found"


class Embedder(Protocol):
    def embed(self, faces: np.ndarray) -> np.ndarray:
        """(N, S, S, 3) uint8 aligned faces -> (N, D) embeddings."""


@dataclass(frozen=True)
class Threshold:
    value: float
    source: str  # "server", "personal" or "given"
    # Its false-accept rate: for the server's, the one it was calibrated for; for the personal
    # verifier's, the one measured on its calibration impostors; None for a given threshold.
    far: float | None = None
    detail: str | None = None  # how it was calibrated


@dataclass(frozen=True)
class PhotoResult:
    photo: str
    score: float | None
    match: bool | None
    problem: str | None = None  # NOT_AN_IMAGE or NO_FACE when there is no score

    def to_json(self) -> dict[str, Any]:
        return {"photo": self.photo, "score": self.score, "match": self.match, "problem": self.problem}


class PhotoVerifier:
    """Detect, align, embed (in batches) and compare with the owner's template."""

    def __init__(self, embedder: Embedder, template: np.ndarray, geometry: FaceGeometry, threshold: Threshold,
                 model_version: str, detector: FaceDetector | None = None, batch: int = 16) -> None:
        template = np.asarray(template, np.float32)
        self.embedder, self.geometry, self.threshold, self.batch = embedder, geometry, threshold, batch
        self.model_version = model_version
        self.template = template / np.linalg.norm(template)
        self.detector = detector or load_detector()

    def align(self, image: np.ndarray) -> np.ndarray | None:
        (found,) = self.detector.detect([image])
        if found is None:
            return None
        return warp_to_template(image, found.landmarks, self.geometry.size, self.geometry.points)[0]

    def scores(self, faces: np.ndarray) -> np.ndarray:
        features = self.embedder.embed(faces)
        return (features / np.linalg.norm(features, axis=1, keepdims=True)) @ self.template

    def verify(self, photos: Sequence[str | Path]) -> list[PhotoResult]:
        results: list[PhotoResult | None] = [None] * len(photos)
        pending: list[tuple[int, np.ndarray]] = []
        for index, photo in enumerate(photos):
            image = load_rgb(Path(photo))
            face = self.align(image) if image is not None else None
            if face is None:
                results[index] = PhotoResult(str(photo), None, None, NOT_AN_IMAGE if image is None else NO_FACE)
            else:
                pending.append((index, face))
            if len(pending) == self.batch or (index == len(photos) - 1 and pending):
                for (at, _), score in zip(pending, self.scores(np.stack([f for _, f in pending]))):
                    results[at] = PhotoResult(str(photos[at]), float(score), bool(score >= self.threshold.value))
                pending = []
        return [r for r in results if r is not None]


@dataclass(frozen=True)
class DeviceModel:
    """The server's current model as this device holds it: its description and cached ONNX file."""

    description: dict[str, Any]
    onnx: Path
    offline: bool  # the server was unreachable: the model last seen is used

    @property
    def version(self) -> str:
        return str(self.description["version"])

    @property
    def geometry(self) -> FaceGeometry:
        return FaceGeometry.from_json(self.description["face_geometry"])


def device_model(state: DeviceState, transport: Transport) -> DeviceModel:
    """Ask the server for its current model (one signed GET) and download its ONNX file once; when
    the server cannot be reached, fall back to the model last seen if its file is cached."""
    device_id = state.require_registered()
    key = state.signing_key()
    assert key is not None  # require_registered checked the identity
    try:
        description = transport.request("GET", "/v1/models/current", key, device_id).json()
        state.remember_model(description)
    except ServerUnavailable:
        last = state.current_model()
        cached = last and state.cached_model(check_version(last.get("version")), "onnx")
        if not cached or last is None:
            raise
        return DeviceModel(last, cached, offline=True)
    version = check_version(description.get("version"))
    cached = state.cached_model(version, "onnx")
    if cached is None:
        url = description.get("onnx_url")
        if not isinstance(url, str) or not url.startswith(f"/v1/models/{version}/"):
            raise BadServerResponse(f"the server publishes no usable ONNX file for model {version[:12]} "
                                    f"(onnx_url {url!r})")
        response = transport.request("GET", url, key, device_id)
        cached = state.store_model(version, "onnx", response.content, response.headers.get(CONTENT_SHA256_HEADER))
    return DeviceModel(description, cached, offline=False)


def open_verifier(state: DeviceState, model: DeviceModel, personal: bool = False, threshold: float | None = None,
                  detector: FaceDetector | None = None) -> PhotoVerifier:
    """A verifier for the enrolled owner: the global model with the enrollment template, or, with
    `personal`, the personal verifier's own graph, template, crop and threshold (it carries the
    global model it was trained on, so it does not follow a newer one)."""
    if personal:
        from device_sdk.personal_file import read_personal  # zipfile and the personal format: only when asked

        payload = state.personal()
        if payload is None:
            raise NotEnrolled("this device has no personal verifier: run personalize first")
        saved = read_personal(payload)
        chosen = _personal_threshold(saved.threshold, threshold)
        embedder = OnnxEmbedder(saved.onnx)
        return PhotoVerifier(embedder, saved.template, saved.geometry, chosen, saved.model_version, detector)
    template = state.template()
    if template is None:
        raise NotEnrolled()
    embedder = OnnxEmbedder(model.onnx, sha256=state.model_sha256(model.version, "onnx"))
    if embedder.size != model.geometry.size:
        raise BadServerResponse(f"model {model.version[:12]} takes {embedder.size}px faces but declares a "
                                f"{model.geometry.size}px crop ({model.geometry.key})")
    chosen = _server_threshold(model, threshold)
    return PhotoVerifier(embedder, template, model.geometry, chosen, model.version, detector)


def _server_threshold(model: DeviceModel, given: float | None) -> Threshold:
    if given is not None:
        return Threshold(given, "given")
    value = model.description.get("verify_threshold")
    if value is None:
        raise FaceCoreError(f"model {model.version[:12]} publishes no verification threshold: pass --threshold")
    far = model.description.get("verify_far")
    return Threshold(float(value), "server", None if far is None else float(far))


def _personal_threshold(calibrated: PersonalThreshold | None, given: float | None) -> Threshold:
    if given is not None:
        return Threshold(given, "given")
    if calibrated is None:
        raise FaceCoreError("this personal verifier has no calibrated threshold (no public impostor faces were at hand "
                            "when it was trained): personalize again with FEDFACE_DATA set, or pass --threshold")
    return Threshold(calibrated.threshold, "personal", calibrated.impostor_far, calibrated.describe())


__all__ = ["DeviceModel", "PhotoResult", "PhotoVerifier", "Threshold", "device_model", "open_verifier"]
