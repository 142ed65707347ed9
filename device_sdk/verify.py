"""The one place a device decides "is this my owner": which model, which template, which threshold.

`FaceDevice.verify` (one photo, `verify_photo`) and `fedface device verify` (many, `owner_verifier`) both open
their verifier here; device_sdk.scoring does the detecting, embedding and comparing.

Invariants:
- The owner must be enrolled (a template held here) before the server is asked anything.
- The model: the server's current one (one signed GET, read capped and checked; its ONNX file downloaded once,
  and only then remembered). When the server cannot be reached (ServerUnavailable), the model last remembered,
  if its ONNX file is still cached or its session held (`DeviceModel.offline`); else the ServerUnavailable
  stands. With `personal` the server is not asked: the personal file carries its own graph, template and crop,
  those of the global model it was trained on, which a newer server model does not change.
- The threshold is the caller's, else, with `personal`, the one calibrated with the personal verifier, else
  the model's published one; the verifier says which, with its FAR when known. None at all is NoThreshold.
- Every refusal is a DeviceError (device_sdk.errors), so the SDK's caller and the CLI catch the same types.
- Imports numpy, PIL, onnxruntime, httpx and cryptography, never torch (tests/device/test_device_torch_free.py
  and test_device_verify.py check `sys.modules`): a one-photo verify must not pay torch's import (~2 s, ~0.7 GB).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from device_sdk.errors import BadServerResponse, NoFaceFound, NotAnImage, NotEnrolled, NoThreshold, ServerUnavailable
from device_sdk.inference import OnnxEmbedder
from device_sdk.link import ServerLink
from device_sdk.model_cache import Embedders, current_model, fetch_onnx, model_geometry
from device_sdk.scoring import NOT_AN_IMAGE, PhotoVerifier, Threshold
from device_sdk.server_limits import check_version
from device_sdk.state import DeviceState
from facecore.align.detectors import FaceDetector, load_detector
from facecore.align.geometry import FaceGeometry
from facecore.data.folders import list_photos

if TYPE_CHECKING:
    from device_sdk.personal_file import PersonalFile, PersonalThreshold


@dataclass(frozen=True)
class VerifyResult:
    score: float
    match: bool
    threshold: float
    personal: bool = False
    model_version: str | None = None  # the model that scored: the server's, or the personal verifier's base
    offline: bool = False  # the server was unreachable: the model last seen scored


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
        return model_geometry(self.description)


def usable_model(link: ServerLink, embedders: Embedders | None = None) -> DeviceModel:
    """The server's current model, its ONNX file cached; offline, the one last seen whose file is at hand.
    `embedders`: sessions already open, whose files need not be checked again."""
    state = link.state
    try:
        described = current_model(link, remember=False)
    except ServerUnavailable:
        last = _last_model(state, embedders)
        if last is None:
            raise
        return last
    version = check_version(described["version"])
    held = embedders is not None and embedders.holds(version)
    onnx = state.model_path(version, "onnx") if held else fetch_onnx(link, described)
    state.remember_model(described)  # with its file cached: what an offline verify falls back to
    return DeviceModel(described, onnx, offline=False)


def _last_model(state: DeviceState, embedders: Embedders | None) -> DeviceModel | None:
    last = state.current_model()
    if last is None:
        return None
    try:
        version = check_version(last.get("version"))
    except BadServerResponse:
        return None
    held = embedders is not None and embedders.holds(version)
    onnx = state.model_path(version, "onnx") if held else state.cached_model(version, "onnx")
    return None if onnx is None else DeviceModel(last, onnx, offline=True)


def open_verifier(state: DeviceState, model: DeviceModel | None, personal: bool = False, threshold: float | None = None,
                  detector: FaceDetector | None = None, embedders: Embedders | None = None,
                  load: Callable[[], FaceDetector] = load_detector) -> PhotoVerifier:
    """A verifier for the enrolled owner: the global `model` with the enrollment template, or, with
    `personal`, the personal verifier's own graph, template, crop and threshold (`model` unused).
    `detector`: one loaded already, else `load` loads one at the first photo."""
    if personal:
        saved = personal_file(state)
        chosen = _personal_threshold(saved.threshold, threshold)
        return PhotoVerifier(OnnxEmbedder(saved.onnx), saved.template, saved.geometry, chosen, saved.model_version,
                             detector, load=load)
    if model is None:
        raise ValueError("open_verifier needs the global model unless `personal`")
    template = state.template()
    if template is None:
        raise NotEnrolled()
    embedder = (embedders or Embedders()).open(state, model.version, model.onnx)
    geometry = model.geometry
    if embedder.size != geometry.size:
        raise BadServerResponse(f"model {model.version[:12]} takes {embedder.size}px faces but declares a "
                                f"{geometry.size}px crop ({geometry.key})")
    chosen = _server_threshold(model, threshold)
    return PhotoVerifier(embedder, template, geometry, chosen, model.version, detector, offline=model.offline, load=load)


def owner_verifier(link: ServerLink, personal: bool = False, threshold: float | None = None,
                   load: Callable[[], FaceDetector] = load_detector, embedders: Embedders | None = None) -> PhotoVerifier:
    """The verifier this device judges its owner with: registered and enrolled first, then the model
    (`usable_model`, not asked with `personal`), then the threshold (`open_verifier`). `load`: the
    detector, loaded at the first photo; `embedders`: ONNX sessions kept between calls."""
    link.identity()
    if link.state.template() is None:
        raise NotEnrolled()
    model = None if personal else usable_model(link, embedders)
    return open_verifier(link.state, model, personal, threshold, embedders=embedders, load=load)


def verify_photo(link: ServerLink, photo: str | Path, personal: bool = False, threshold: float | None = None,
                 load: Callable[[], FaceDetector] = load_detector, embedders: Embedders | None = None) -> VerifyResult:
    """One photo against the owner (`owner_verifier`): NotAnImage or NoFaceFound when it has no score."""
    verifier = owner_verifier(link, personal, threshold, load, embedders)
    results = verifier.verify(list_photos([photo]))
    scored = next((r for r in results if r.score is not None), None)
    if scored is None or scored.match is None or scored.score is None:
        if any(r.problem == NOT_AN_IMAGE for r in results):
            raise NotAnImage(str(photo))
        raise NoFaceFound([r.photo for r in results])
    return VerifyResult(scored.score, scored.match, verifier.threshold.value, personal, verifier.model_version,
                        verifier.offline)


def personal_file(state: DeviceState) -> PersonalFile:
    """The personal verifier personalize() saved; NotEnrolled when there is none, or one of an earlier format."""
    from device_sdk.personal_file import read_personal  # zipfile and the personal format: only when asked

    payload = state.personal()
    if payload is None:
        raise NotEnrolled("this device has no personal verifier: run personalize first")
    saved = read_personal(payload)
    check_version(saved.model_version)
    return saved


def _server_threshold(model: DeviceModel, given: float | None) -> Threshold:
    if given is not None:
        return Threshold(float(given), "given")
    value = model.description.get("verify_threshold")
    if value is None:
        raise NoThreshold(f"model {model.version[:12]} publishes no verification threshold: pass one (--threshold)")
    far = model.description.get("verify_far")
    return Threshold(float(value), "server", None if far is None else float(far))


def _personal_threshold(calibrated: PersonalThreshold | None, given: float | None) -> Threshold:
    if given is not None:
        return Threshold(float(given), "given")
    if calibrated is None:
        raise NoThreshold("this personal verifier has no calibrated threshold (no public impostor faces were at hand "
                          "when it was trained): personalize again with FEDFACE_DATA set, or pass one (--threshold)")
    return Threshold(calibrated.threshold, "personal", calibrated.impostor_far, calibrated.describe())


__all__ = ["DeviceModel", "VerifyResult", "open_verifier", "owner_verifier", "personal_file",
           "usable_model", "verify_photo"]
