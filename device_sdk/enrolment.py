"""The owner's enrolment: photos to aligned faces and a template, sent once; camera photos added; unenrolment.

Invariants:
- Photos are aligned in memory only, to the crop the server's model declares: the owner's faces never enter a
  shared, unencrypted cache (`PhotoAligner`).
- An enrolment is refused before any photo is read when the device is not registered or is already enrolled,
  here or on the server. Its model is remembered only once its ONNX file is cached (device_sdk.model_cache).
- The template the server may see is blurred when the owner asked for template noise (`shared_template`); the
  device keeps the clean one, with the faces, sealed in its state folder.
- A device trains on at most MAX_FACES faces, enrolment and camera photos together.
- Imports numpy, PIL, onnxruntime, httpx and cryptography, never torch.
"""
from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from device_sdk.errors import DeviceError, NotEnoughPhotos, NotEnrolled, ServerRefused
from device_sdk.link import ServerLink
from device_sdk.model_cache import Embedders, current_model, model_geometry
from device_sdk.server_limits import MAX_DESCRIPTION_BYTES
from device_sdk.state import DeviceState
from facecore.align.detectors import FaceDetector
from facecore.align.geometry import FaceGeometry
from facecore.align.photos import load_rgb
from facecore.align.pipeline import FaceAligner
from facecore.data.folders import list_photos
from facecore.federation.template_noise import noisy_template
from facecore.templates import mean_feature_embedding, mean_feature_length

# Faces a device trains on, enrolment and camera photos together: one local epoch stays a few seconds.
MAX_FACES = 500

Progress = Callable[[str], None]


@dataclass(frozen=True)
class EnrollResult:
    faces: int
    skipped: tuple[str, ...]  # photos that gave no face
    model_version: str
    reasons: tuple[str, ...] = ()  # why, one per skipped photo: "not an image" or "no face found"


class PhotoAligner:
    """One detector, loaded once (or the caller's `aligner`'s), aligning to whichever crop a model declares."""

    def __init__(self, aligner: FaceAligner | None = None) -> None:
        self._aligner = aligner

    def detector(self) -> FaceDetector:
        if self._aligner is None:
            self._aligner = FaceAligner()
        return self._aligner.detector

    def align(self, photos: Sequence[str | Path], geometry: FaceGeometry) -> tuple[np.ndarray, dict[str, str]]:
        """The faces found, and, per unusable photo, why ("not an image" or "no face found")."""
        if self._aligner is None:
            self._aligner = FaceAligner(geometry=geometry)
        self._aligner = aligner = self._aligner.with_geometry(geometry)
        faces, rejected = [], {}
        for path in list_photos(list(photos)):
            image = load_rgb(path)
            found = aligner.align_image(image) if image is not None else None
            if found is None:
                rejected[str(path)] = "not an image" if image is None else "no face found"
            else:
                faces.append(found[0])
        return (np.stack(faces) if faces else np.zeros((0, *geometry.row_shape), np.uint8)), rejected


def shared_template(embedding: np.ndarray, noise_cos: float | None) -> np.ndarray:
    """The template as the server may see it: blurred to about cosine `noise_cos` with the true one, if set."""
    if noise_cos is None:
        return np.asarray(embedding, np.float32)
    return noisy_template(embedding, noise_cos, np.random.default_rng(secrets.randbits(128)))


def enroll(link: ServerLink, aligner: PhotoAligner, embedders: Embedders, photos: Sequence[str | Path], min_photos: int,
           noise_cos: float | None, progress: Progress | None = None) -> EnrollResult:
    """Detect and align the owner's faces, embed them and upload the template (`FaceDevice.enroll`)."""
    say = progress or (lambda _: None)
    # Remembered only once the embedder cached its ONNX file: a refusal before that leaves the model last seen as it was.
    model = current_model(link, remember=False)
    _require_not_enrolled(link)
    say("detecting and aligning faces")
    faces, rejected = aligner.align(photos, model_geometry(model))
    if len(faces) < min_photos:
        raise NotEnoughPhotos(len(faces), min_photos, rejected)
    features = embedders.embedder(link, model).embed(faces)
    embedding = mean_feature_embedding(features)
    try:
        link.request("PUT", f"/v1/devices/{link.identity()[0]}/embedding",
                     body={"embedding": shared_template(embedding, noise_cos).tolist()}, expect=(200, 201))
    except ServerRefused as refused:
        if refused.status == 409:
            raise DeviceError("the server already holds an enrollment for this device: run unenroll first to "
                              "enroll again") from None
        raise
    state = link.state
    state.remember_model(model)
    state.save_faces(faces)
    state.save_template(embedding)
    # Not the template itself, only how tightly the enrolment photos agree: a round's centred loss needs it.
    state.update_info(enrolled=True, model_version=model["version"], template_length=mean_feature_length(features))
    return EnrollResult(len(faces), tuple(rejected), model["version"], tuple(rejected.values()))


def _require_not_enrolled(link: ServerLink) -> None:
    """Refuse an enrollment the server would refuse only after the photos were detected (seconds each)."""
    device_id, _ = link.identity()
    again = "run unenroll first to enroll again"
    info = link.state.info()
    if info.get("enrolled"):
        model = f" (with model {str(info['model_version'])[:12]})" if info.get("model_version") else ""
        raise DeviceError(f"this device is already enrolled{model}: {again}")
    try:
        held = link.request("GET", f"/v1/devices/{device_id}", max_bytes=MAX_DESCRIPTION_BYTES).json()
    except (ValueError, ServerRefused):
        return  # a server that does not say: its 409 to the upload below still refuses a second enrollment
    if isinstance(held, dict) and held.get("enrolled") is True:
        raise DeviceError(f"the server already holds an enrollment for this device: {again}")


def add_photos(link: ServerLink, aligner: PhotoAligner, photos: Sequence[str | Path],
               progress: Progress | None = None) -> EnrollResult:
    """Camera photos of the enrolled owner, aligned to the current model's crop, added to what it trains on."""
    link.identity()
    enrolled_faces(link.state)
    # Not remembered: its ONNX file is not cached here, and an offline verify falls back to the model remembered.
    model = current_model(link, remember=False)
    (progress or (lambda _: None))("detecting and aligning faces")
    faces, rejected = aligner.align(photos, model_geometry(model))
    if not len(faces):
        raise NotEnoughPhotos(0, 1, rejected)
    add_faces(link.state, faces)
    return EnrollResult(len(faces), tuple(rejected), model["version"], tuple(rejected.values()))


def add_faces(state: DeviceState, faces: np.ndarray) -> int:
    """Faces already aligned to the enrolled crop, added; returns how many the device now trains on."""
    held = enrolled_faces(state)
    faces = np.asarray(faces)
    if faces.dtype != np.uint8 or faces.shape[1:] != held.shape[1:] or not len(faces):
        raise DeviceError(f"faces to add must be uint8 crops of shape (n, {', '.join(map(str, held.shape[1:]))}) like the "
                          f"enrolled ones, got {faces.dtype} {faces.shape}")
    if len(held) + len(faces) > MAX_FACES:
        raise DeviceError(f"this device holds {len(held)} faces and may hold at most {MAX_FACES}: {len(faces)} more do not fit")
    state.save_faces(np.concatenate([held, faces]))
    return len(held) + len(faces)


def enrolled_faces(state: DeviceState) -> np.ndarray:
    """The owner's aligned faces; NotEnrolled when there is no enrolled owner."""
    faces = state.faces()
    if faces is None or not state.info().get("enrolled"):
        raise NotEnrolled()
    return faces


def unenroll(link: ServerLink) -> None:
    """Delete the owner's enrolment on the server (already gone there is fine), then here."""
    device_id, _ = link.identity()
    try:
        link.request("DELETE", f"/v1/devices/{device_id}", expect=(204,))
    except ServerRefused as refused:
        if refused.status != 404:  # 404: the server holds nothing of this device any more
            raise
    link.state.forget_owner()
    link.state.update_info(enrolled=False)


__all__ = ["MAX_FACES", "EnrollResult", "PhotoAligner", "add_faces", "add_photos", "enroll", "enrolled_faces",
           "shared_template", "unenroll"]
