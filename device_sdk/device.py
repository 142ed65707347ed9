"""`FaceDevice`: what a phone app embeds to enroll its owner, join rounds and verify faces.

Only `register()` creates local state; every other call needs a registered state folder. Anything the
server names (model versions, URLs, device ids) is validated before it touches a path or a request, and
server refusals are explained by what was asked and the HTTP status or the body's `code`, not by the
wording of the server's message.

Torch is imported only by the calls that train: `train_round`, `personalize` (and `_load_backbone`, which
both use), through device_sdk.round_files, device_sdk.training and device_sdk.personal, inside those
methods. Importing this module, and register, enroll, verify (also with `personal`), status, unenroll and
reset, need numpy, PIL, onnxruntime, httpx and cryptography only (tests/device/test_device_torch_free.py
checks `sys.modules` in a subprocess): a command that trains nothing must not pay torch's ~2 s and ~0.7 GB.
Pydantic's round messages are imported where a round reads or writes them, for the same reason.

A hostile server cannot make the device exhaust itself (device_sdk/README.md, "What the device refuses"):
the model description is read capped (MAX_DESCRIPTION_BYTES) and checked (`DeviceState.remember_model`),
model downloads are capped as they stream (MAX_MODEL_BYTES), and a backbone file is compared with its
registry entry, finite floats only, before a model is built from it (`check_backbone_payload`).
"""
from __future__ import annotations

import base64
import re
import secrets
import time
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from device_sdk.errors import (
    AuthError,
    BadServerResponse,
    DeviceError,
    NoFaceFound,
    NotAnImage,
    NotEnoughPhotos,
    NotEnrolled,
    NotRegistered,
    RegistrationRefused,
    RoundClosed,
    ServerRefused,
    ServerUnavailable,
    StateError,
)
from device_sdk.inference import OnnxEmbedder
from device_sdk.state import (
    MAX_DESCRIPTION_BYTES,
    MAX_MODEL_BYTES,
    DeviceState,
    check_device_id,
    check_model_description,
    check_version,
)
from device_sdk.transport import Transport
from facecore.align.geometry import FaceGeometry, geometry_of
from facecore.align.pipeline import FaceAligner, load_rgb
from facecore.data.folders import list_photos
from facecore.federation.protocol import CONTENT_SHA256_HEADER
from facecore.federation.status import CHOSEN_STATUSES, ParticipationStatus
from facecore.federation.template_noise import noisy_template, sigma_for_cosine
from facecore.templates import mean_feature_embedding

if TYPE_CHECKING:  # the types only: importing these modules imports torch or pydantic's models
    from pydantic import BaseModel
    from torch import nn

    from device_sdk.personal import PersonalConfig
    from device_sdk.personal_file import PersonalFile
    from facecore.federation.messages import CheckinPublic
    from facecore.federation.wire import Precision

# Faces a device trains on, enrolment and camera photos together: one local epoch stays a few seconds.
MAX_FACES = 500
# How long after a round's deadline `wait_for_round_end` still expects its model: the server aggregates as soon as
# the deadline passes, and retakes a stuck aggregation after its lease (60 s by default); a round still without a
# model after twice that has most likely failed.
ROUND_END_GRACE_S = 120.0
# A path on the round server: "/v1/" then segments that cannot be "." or "..", no scheme, no host, no query.
SERVER_PATH = re.compile(r"/v1(/[A-Za-z0-9_~-][A-Za-z0-9._~-]*)+")


def server_path(url: object) -> str:
    """A URL the server sent, accepted only as a path on that same server."""
    if not isinstance(url, str) or not SERVER_PATH.fullmatch(url):
        raise BadServerResponse(f"the server sent a URL that is not a path on it: {str(url)[:80]!r}; "
                                "refusing to follow it")
    return url


Body = TypeVar("Body", bound="BaseModel")


def server_body(model: type[Body], body: object) -> Body:
    """A response body read as the protocol defines it (facecore.federation.messages), or a one-line error."""
    from pydantic import ValidationError  # loaded with `model`'s module anyway

    try:
        return model.model_validate(body)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "the body"
        raise BadServerResponse(f"the server's {model.__name__} is malformed at {where}: {first['msg']}") from None


def _deadline(value: object) -> datetime | None:
    try:
        parsed = datetime.fromisoformat(str(value))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


@dataclass(frozen=True)
class EnrollResult:
    faces: int
    skipped: tuple[str, ...]  # photos that gave no face
    model_version: str
    reasons: tuple[str, ...] = ()  # why, one per skipped photo: "not an image" or "no face found"


@dataclass(frozen=True)
class RoundSummary:
    round_id: int
    loss_before: float
    loss_after: float
    seconds: float
    bytes_up: int
    bytes_down: int
    steps: int
    resent: bool = False  # the update saved by an earlier train (server down or a crash) was sent now
    notices: tuple[str, ...] = ()  # what else happened on the way, e.g. a saved update discarded as late
    deadline_at: datetime | None = None  # the round's upload deadline, when known
    base_version: str | None = None  # the model the round trained from, when known


@dataclass(frozen=True)
class RoundEnd:
    """What `wait_for_round_end` saw: the server's current model, and the round that made it."""

    round_id: int  # the round this device's update went to
    model_version: str  # the server's current model when the wait ended
    made_by_round: int | None  # the round that made it, once >= round_id; None: no new model by `gave_up_at`
    gave_up_at: datetime

    @property
    def ended(self) -> bool:
        return self.made_by_round is not None


@dataclass(frozen=True)
class ResetResult:
    device_id: str | None
    server: str  # what happened on the server, one sentence
    removed: tuple[str, ...] = field(default_factory=tuple)


@dataclass(frozen=True)
class VerifyResult:
    score: float
    match: bool
    threshold: float
    personal: bool = False


@dataclass(frozen=True)
class PersonalizeResult:
    fusion: str
    faces: int
    loss_before: float
    loss_after: float
    seconds: float
    model_version: str
    fusion_summary: dict[str, float]
    threshold: float | None = None  # the verifier's own, calibrated on public impostors at `far`
    far: float | None = None


class FaceDevice:
    def __init__(
        self, server_url: str, state_dir: str | Path, min_photos: int = 3, timeout: float = 30.0, retries: int = 4,
        aligner: FaceAligner | None = None, verify_tls: bool | str = True, upload_fp16: bool = True,
        template_noise_cos: float | None = None, training_slot: AbstractContextManager[Any] | None = None,
        min_secure_members: int = 2,
    ) -> None:
        """`min_secure_members`: the fewest members a secure-aggregation round may have for this device to
        take part (2, the protocol's least); each puppet a server would enrol beside it costs it one.
        `template_noise_cos`: blur every template sent to the server so that it keeps about this
        cosine with the true one (facecore.federation.template_noise); the device keeps the clean one.
        `training_slot`: entered around local training. Only for many devices in one process (a
        simulation), e.g. a shared Semaphore, so their trainings do not all hold memory at once.
        Nothing is created on disk until register()."""
        self.state = DeviceState(state_dir)
        self.transport = Transport(server_url, timeout=timeout, retries=retries, verify=verify_tls)
        self.min_photos = min_photos
        if min_secure_members < 2:
            raise DeviceError(f"min_secure_members must be at least 2 (the sum of one update is that update), got {min_secure_members}")
        self.min_secure_members = min_secure_members
        self.upload_fp16 = upload_fp16
        if template_noise_cos is not None:
            sigma_for_cosine(template_noise_cos, 1)  # refuse a bad setting now, not at the first upload
        self.template_noise_cos = template_noise_cos
        self._aligner = aligner
        self._training_slot = training_slot if training_slot is not None else nullcontext()
        self._embedders: dict[str, OnnxEmbedder] = {}  # by model version: a session takes ~0.1 s to build
        self._signer: tuple[str, Ed25519PrivateKey] | None = None
        # The round of the last update the server accepted from this object: with the pending upload on disk, it
        # tells a caller whose train was interrupted what is left to send.
        self.accepted_round: int | None = None

    # ---- plumbing --------------------------------------------------------------------------
    @property
    def device_id(self) -> str | None:
        return self.state.info().get("device_id")

    def _identity(self) -> tuple[str, Ed25519PrivateKey]:
        if self._signer is None:
            device_id = self.state.require_registered()
            key = self.state.signing_key()
            assert key is not None  # require_registered checked that identity.enc opens
            self._signer = (device_id, key)
        return self._signer

    def _request(self, method: str, path: str, **kwargs: Any):  # type: ignore[no-untyped-def]
        device_id, key = self._identity()
        return self.transport.request(method, server_path(path.split("?")[0]) + _query(path), key, device_id, **kwargs)

    def _align(self, photos: Sequence[str | Path], geometry: FaceGeometry) -> tuple[np.ndarray, dict[str, str]]:
        """Align in memory only, to the crop the server's model declares: the owner's faces never
        enter a shared, unencrypted cache. Returns the faces and, per unusable photo, why."""
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

    def _model(self, remember: bool = True) -> dict[str, Any]:
        """The server's current model description, checked (`check_model_description`) and, with `remember`,
        remembered (`DeviceState.remember_model`). A caller that will not also cache the model's ONNX file
        leaves `remember` off: an offline verify falls back to the model remembered, and needs its file."""
        try:
            response = self._request("GET", "/v1/models/current", max_bytes=MAX_DESCRIPTION_BYTES)
        except ServerRefused as refused:
            if refused.status == 404:
                raise DeviceError("the server has no model yet: ask its operator to start it with a model") from None
            raise
        try:
            model = response.json()
        except ValueError:
            raise BadServerResponse("the server's model description is not JSON") from None
        if remember:
            self.state.remember_model(model)  # refuses a bad version, embedding_dim or face_geometry
        else:
            check_model_description(model)
        return model

    @staticmethod
    def _geometry(model: dict[str, Any]) -> FaceGeometry:
        try:
            return FaceGeometry.from_json(model["face_geometry"])
        except (KeyError, ValueError) as error:
            why = "it has none" if isinstance(error, KeyError) else str(error)
            raise BadServerResponse(f"the server's face_geometry of model {str(model.get('version'))[:12]} is refused: "
                                    f"{why}") from None

    def _fetch_model(self, url: str, version: str, kind: str) -> Path:
        """A version-pinned file never changes: a cached copy that still has its recorded sha256 is
        used as is; anything else is downloaded, at most MAX_MODEL_BYTES of it, and checked against the
        sha256 the server names (and, for a backbone, its archive: `DeviceState.store_model`)."""
        cached = self.state.cached_model(version, kind)
        if cached is not None:
            return cached
        response = self._request("GET", url, max_bytes=MAX_MODEL_BYTES)
        published = response.headers.get(CONTENT_SHA256_HEADER)
        expected = published.lower() if published else (version if kind == "fp32.pt" else None)
        return self.state.store_model(version, kind, response.content, expected)

    def _embedder(self, model: dict[str, Any]) -> OnnxEmbedder:
        version = check_version(model["version"])
        if not model.get("onnx_url"):
            raise DeviceError(f"the server publishes no ONNX file for model {version[:12]} (it runs with ONNX export "
                              "off): ask its operator")
        if version not in self._embedders:
            onnx = self._fetch_model(model["onnx_url"], version, "onnx")
            self._embedders = {version: OnnxEmbedder(onnx, sha256=self.state.model_sha256(version, "onnx"))}
        return self._embedders[version]

    # ---- API -----------------------------------------------------------------------------
    def register(self, enrollment_token: str | None = None) -> str:
        """Create this device's key pair and register it; on a registered folder, return its id unchanged.
        `enrollment_token`: the one-time token a production server's operator issued for this device (without
        one, such a server refuses: RegistrationRefused). The key pair is made in memory and the state folder
        written only once the server accepted it: a refusal, an unreachable server or Ctrl-C leaves no state."""
        existing = self.state.registration()
        if existing is not None:
            return existing
        # An identity sealed here by an earlier version's interrupted registration is offered again: the server
        # may have registered it (a lost answer), and a known key registers without spending a token.
        key = self.state.signing_key()
        fresh = key is None
        if key is None:
            self.state.check_creatable()
            key = Ed25519PrivateKey.generate()
        public = base64.b64encode(key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)).decode()
        body = {"public_key": public} | ({"enrollment_token": enrollment_token} if enrollment_token else {})
        try:
            response = self.transport.request("POST", "/v1/devices", key, None, body=body, expect=(200, 201))
        except AuthError as refused:
            raise RegistrationRefused(refused.status, refused.detail or str(refused), bool(enrollment_token),
                                      str(self.state.dir)) from None
        except ServerRefused as refused:
            if refused.status != 422 or not enrollment_token:
                raise
            raise RegistrationRefused(422, refused.detail, True, str(self.state.dir)) from None
        except ServerUnavailable as down:
            raise ServerUnavailable(f"{down}; nothing was saved in {self.state.dir}" if fresh else str(down)) from None
        device_id = check_device_id(response.json().get("device_id"))
        self.state.save_registration(device_id, key if fresh else None)
        return device_id

    def enroll(self, photos: Sequence[str | Path], progress: Callable[[str], None] | None = None) -> EnrollResult:
        """Detect and align the owner's faces, embed them and upload the template. A device that is not
        registered, or already enrolled (here or on the server), is refused before any photo is read.
        `progress` hears each step as it starts."""
        say = progress or (lambda _: None)
        # Remembered only once `_embedder` cached its ONNX file: a refusal before that leaves the model last seen as it was.
        model = self._model(remember=False)
        self._require_not_enrolled()
        say("detecting and aligning faces")
        faces, rejected = self._align(photos, self._geometry(model))
        if len(faces) < self.min_photos:
            raise NotEnoughPhotos(len(faces), self.min_photos, rejected)
        embedding = mean_feature_embedding(self._embedder(model).embed(faces))
        try:
            self._request("PUT", f"/v1/devices/{self._identity()[0]}/embedding",
                          body={"embedding": self._shared_template(embedding).tolist()}, expect=(200, 201))
        except ServerRefused as refused:
            if refused.status == 409:
                raise DeviceError("the server already holds an enrollment for this device: run unenroll first to "
                                  "enroll again") from None
            raise
        self.state.remember_model(model)
        self.state.save_faces(faces)
        self.state.save_template(embedding)
        self.state.update_info(enrolled=True, model_version=model["version"])
        return EnrollResult(len(faces), tuple(rejected), model["version"], tuple(rejected.values()))

    def _require_not_enrolled(self) -> None:
        """Refuse an enrollment the server would refuse only after the photos were detected (seconds each)."""
        device_id, _ = self._identity()
        again = "run unenroll first to enroll again"
        info = self.state.info()
        if info.get("enrolled"):
            model = f" (with model {str(info['model_version'])[:12]})" if info.get("model_version") else ""
            raise DeviceError(f"this device is already enrolled{model}: {again}")
        try:
            held = self._request("GET", f"/v1/devices/{device_id}", max_bytes=MAX_DESCRIPTION_BYTES).json()
        except (ValueError, ServerRefused):
            return  # a server that does not say: its 409 to the upload below still refuses a second enrollment
        if isinstance(held, dict) and held.get("enrolled") is True:
            raise DeviceError(f"the server already holds an enrollment for this device: {again}")

    def add_photos(self, photos: Sequence[str | Path], progress: Callable[[str], None] | None = None) -> EnrollResult:
        """Add photos this device's own camera took of its owner (at an unlock, say) to the faces it
        trains on from the next round; the template stays the enrolment's. Rounds that keep the
        templates then teach the shared model to map this camera's view of the owner onto it.
        `progress` hears each step as it starts, once the device is known to be enrolled."""
        self._identity()
        self._enrolled_faces()
        model = self._model()
        (progress or (lambda _: None))("detecting and aligning faces")
        faces, rejected = self._align(photos, self._geometry(model))
        if not len(faces):
            raise NotEnoughPhotos(0, 1, rejected)
        self.add_faces(faces)
        return EnrollResult(len(faces), tuple(rejected), model["version"], tuple(rejected.values()))

    def add_faces(self, faces: np.ndarray) -> int:
        """`add_photos` for faces already aligned to the enrolled crop (a camera pipeline that crops
        itself); returns how many faces the device now trains on."""
        held = self._enrolled_faces()
        faces = np.asarray(faces)
        if faces.dtype != np.uint8 or faces.shape[1:] != held.shape[1:] or not len(faces):
            raise DeviceError(f"faces to add must be uint8 crops of shape (n, {', '.join(map(str, held.shape[1:]))}) like the "
                              f"enrolled ones, got {faces.dtype} {faces.shape}")
        if len(held) + len(faces) > MAX_FACES:
            raise DeviceError(f"this device holds {len(held)} faces and may hold at most {MAX_FACES}: {len(faces)} more do not fit")
        self.state.save_faces(np.concatenate([held, faces]))
        return len(held) + len(faces)

    def _enrolled_faces(self) -> np.ndarray:
        faces = self.state.faces()
        if faces is None or not self.state.info().get("enrolled"):
            raise NotEnrolled()
        return faces

    def train_round(
        self, wait: float | None = 0.0, poll: float = 2.0, progress: Callable[[str], None] | None = None,
    ) -> RoundSummary:
        """Send an update an earlier call saved, else check in (waiting up to `wait` seconds for a
        round and a slot; None: until the round this device joins ends), train, upload once.
        `progress` hears each step as it starts. One train at a time per state folder: another one
        running (in this process or another) raises TrainingInProgress before anything is done."""
        self._identity()
        with self.state.train_lock():  # before torch's import: a refused second train costs nothing
            return self._train_round(wait, poll, progress)

    def _train_round(self, wait: float | None, poll: float, progress: Callable[[str], None] | None) -> RoundSummary:
        # Training's modules, here and not at the top: they import torch (see the module's docstring).
        from device_sdk.round_files import update_file
        from device_sdk.secure_round import SecureRound
        from device_sdk.training import LocalTrainingConfig, train_local
        from facecore.federation.config import training_seed
        from facecore.federation.messages import EmbeddingPublic

        say = progress or (lambda _: None)
        self._identity()
        faces = self._enrolled_faces()
        up0, down0 = self.transport.bytes_up, self.transport.bytes_down
        notices: list[str] = []
        resent = self._resend_pending(notices)
        if resent is not None:
            return resent
        say("checking in" + (" (waiting for the round to select this device)" if wait is None or wait > 0 else ""))
        checkin = self._checkin_until_selected(wait, poll)
        round_id = checkin.round_id
        if checkin.status == ParticipationStatus.UPLOADED:
            raise RoundClosed(f"this device already sent its update for round {round_id}: run train again for the "
                              "next round")
        started = time.perf_counter()
        secure = None
        if checkin.secagg_url:
            say("joining secure aggregation")
            secure = SecureRound(self._request, server_path(checkin.secagg_url), poll=min(poll, 1.0),
                                 min_members=self.min_secure_members)
            secure.join()  # before training: the key steps have short deadlines
            # What the device agreed to, for its user to see: a server that filled the round with puppets shows here.
            notices.append(f"secure aggregation: {secure.members} members, threshold {secure.client.threshold}")
        say("downloading the model")
        backbone = self._load_backbone(checkin.backbone_url, check_version(checkin.base_version))
        if faces.shape[1:] != geometry_of(backbone).row_shape:
            raise NotEnrolled(f"the server's model crops faces as {geometry_of(backbone).key}, this device's faces "
                              "were cropped for another model: enroll again")
        held = server_body(EmbeddingPublic, self._request("GET", server_path(checkin.embedding_url)).json())
        embedding = np.asarray(held.embedding, np.float32)
        config = LocalTrainingConfig.from_round(checkin.local)
        say(f"training locally for round {round_id}")
        with self._training_slot:
            update = train_local(backbone, embedding, faces, config, seed=training_seed(round_id))
        precision: Precision = "fp16" if self.upload_fp16 else "fp32"
        template = self._shared_template(update.embedding.numpy())
        body = update_file(backbone, update, checkin.base_version, template, precision, secure)
        meta = {"round_id": round_id, "key": f"{self._identity()[0]}-{round_id}-{secrets.token_hex(8)}",
                "url": server_path(checkin.upload_url), "deadline_at": checkin.deadline_at.isoformat(),
                "base_version": checkin.base_version,
                "loss_before": update.loss_before, "loss_after": update.loss_after, "steps": update.steps}
        # Persist before sending: a crash or an outage after this point resends the same bytes under the same key.
        self.state.save_pending(meta, body)
        say("uploading the update")
        try:
            self._post_update(meta, body)
        except ServerUnavailable:
            raise ServerUnavailable(f"the server became unreachable after training: the update for round {round_id} is "
                                    f"saved in {self.state.dir} and will be resent by the next train") from None
        self.state.save_template(update.embedding.numpy())
        if secure is not None:
            secure.unmask()
        return RoundSummary(round_id, update.loss_before, update.loss_after, time.perf_counter() - started,
                            self.transport.bytes_up - up0, self.transport.bytes_down - down0, update.steps,
                            notices=tuple(notices), deadline_at=checkin.deadline_at,
                            base_version=checkin.base_version)

    def wait_for_round_end(self, summary: RoundSummary, poll: float = 2.0, grace: float = ROUND_END_GRACE_S) -> RoundEnd:
        """After `summary`'s update was accepted: wait for the model its round makes and return it. A device
        cannot ask a round's status, and a check-in would join the next round, so this reads only the
        server's current model (whose `round_id` names the round that made it), every `poll` seconds. A
        round that fails makes none: `grace` seconds after the round's deadline this gives up and returns
        a RoundEnd without a new model, naming the server's current one."""
        round_id = summary.round_id
        give_up = (summary.deadline_at or datetime.now(UTC)) + timedelta(seconds=grace)
        while True:
            try:
                model = self._model(remember=False)
            except ServerUnavailable as down:
                raise ServerUnavailable(f"this device's update for round {round_id} was accepted, but the server became "
                                        f"unreachable while waiting for the round to end: {down}") from None
            made = model.get("round_id")
            if isinstance(made, int) and not isinstance(made, bool) and made >= round_id:
                return RoundEnd(round_id, model["version"], made, give_up)
            if datetime.now(UTC) >= give_up:
                return RoundEnd(round_id, model["version"], None, give_up)
            time.sleep(poll)

    def personalize(self, config: PersonalConfig | None = None, cohort: np.ndarray | None = None) -> PersonalizeResult:
        """Opt-in: train the fused personal verifier (FedFusion) on the owner's faces, on the
        current global model. `cohort`: aligned public impostor faces to train against. Nothing
        is sent to the server; the result is stored encrypted and used by verify(personal=True)."""
        from device_sdk.personal import save_verifier, train_personal_verifier  # torch: it trains

        self._identity()
        faces = self.state.faces()
        if faces is None or not self.state.info().get("enrolled"):
            raise NotEnrolled()
        model = self._model()
        backbone = self._load_backbone(model["backbone_url"], model["version"])
        verifier, report = train_personal_verifier(backbone, faces, config, cohort=cohort)
        self.state.save_personal(save_verifier(verifier, model["version"]))
        calibrated = verifier.threshold  # set while saving, when public impostor faces are available
        return PersonalizeResult(report.fusion, report.faces, report.loss_before, report.loss_after, report.seconds,
                                 model["version"], report.fusion_summary, calibrated.threshold if calibrated else None,
                                 calibrated.far if calibrated else None)

    def verify(self, photo: str | Path, personal: bool = False, threshold: float | None = None) -> VerifyResult:
        """Score a photo against the owner. `personal`: with the fused verifier of personalize().
        `threshold` defaults to the server's for the global model, and to the personal verifier's
        own (calibrated at personalize on public impostors) with `personal`: fused scores of owners
        and of impostors both run higher, so the global threshold would let impostors through."""
        self._identity()
        template = self.state.template()
        if template is None:
            raise NotEnrolled()
        if personal:
            # The personal file's own ONNX graph, template and crop (device_sdk.personal_file): no torch, and the
            # crop of the global model it was trained on, which a newer server model does not change.
            saved = self._personal_file()
            embedder, geometry, template = OnnxEmbedder(saved.onnx), saved.geometry, saved.template
            calibrated: float | None = saved.threshold.threshold if saved.threshold is not None else None
            missing = "the personal verifier has no calibrated threshold: run personalize again or pass --threshold"
        else:
            model = self._model()
            embedder, geometry = self._embedder(model), self._geometry(model)
            calibrated = model.get("verify_threshold")
            missing = "the server publishes no verification threshold for the current model: pass --threshold"
        faces, rejected = self._align([photo], geometry)
        if len(faces) == 0:
            if "not an image" in rejected.values():
                raise NotAnImage(str(photo))
            raise NoFaceFound(list(rejected))
        score = float(embedder.embed(faces)[0] @ (template / np.linalg.norm(template)))
        threshold = calibrated if threshold is None else threshold
        if threshold is None:
            raise DeviceError(missing)
        return VerifyResult(score, score >= threshold, float(threshold), personal)

    def _personal_file(self) -> PersonalFile:
        from device_sdk.personal_file import read_personal  # zipfile and the personal format: only when asked

        payload = self.state.personal()
        if payload is None:
            raise NotEnrolled("this device has no personalised verifier: run personalize first")
        saved = read_personal(payload)  # a file of an earlier version: NotEnrolled, "run personalize again"
        check_version(saved.model_version)
        return saved

    def unenroll(self) -> None:
        device_id, _ = self._identity()
        try:
            self._request("DELETE", f"/v1/devices/{device_id}", expect=(204,))
        except ServerRefused as refused:
            if refused.status != 404:  # 404: the server holds nothing of this device any more
                raise
        self.state.forget_owner()
        self.state.update_info(enrolled=False)

    def status(self) -> dict[str, Any]:
        """What this state folder holds, read locally (no server call): DeviceState.summary()."""
        return self.state.summary()

    def reset(self) -> ResetResult:
        """Delete this device's local state; first, if this state can still sign, unenroll on the server."""
        if not self.state.present():
            raise NotRegistered(f"no device state at {self.state.dir}: nothing to reset (check --state)")
        try:
            device_id = self.state.info().get("device_id")
        except StateError:
            device_id = None
        if device_id is None:
            server = "not registered on a server: nothing to delete there"
        else:
            try:
                self._request("DELETE", f"/v1/devices/{self._identity()[0]}", expect=(204,))
                server = f"unenrolled device {device_id} on the server (its template there is deleted)"
            except (StateError, BadServerResponse) as error:
                server = (f"could not sign a request to unenroll on the server ({error}); "
                          f"it keeps device {device_id}'s template")
            except (ServerUnavailable, AuthError, ServerRefused) as error:
                server = f"could not unenroll on the server ({error}); it keeps device {device_id}'s template"
        removed = tuple(path.name for path in self.state.delete())
        self._signer, self._embedders = None, {}
        return ResetResult(device_id, server, removed)

    # ---- rounds ----------------------------------------------------------------------------
    def _checkin_until_selected(self, wait: float | None, poll: float) -> CheckinPublic:
        """`wait` None: until the round this device sees ends; else up to `wait` seconds."""
        from facecore.federation.messages import CheckinPublic  # pydantic's models: only when a round is asked for

        deadline = time.monotonic() + (wait or 0.0)
        seen_round: int | None = None
        enrollment_checked = False
        while True:
            try:
                checkin = server_body(CheckinPublic, self._request("POST", "/v1/rounds/current/checkin").json())
            except ServerRefused as refused:
                if refused.status != 409:
                    raise
                if not enrollment_checked:
                    self._raise_if_not_enrolled_on_server(refused)
                    enrollment_checked = True
                if wait is None and seen_round is not None:
                    raise RoundClosed(f"round {seen_round} ended before it selected this device: run train again "
                                      "for the next round") from None
                if wait is not None and time.monotonic() >= deadline:
                    raise RoundClosed("no round is open for check-in right now: wait for the operator to open one, "
                                      "or pass --wait to keep checking in") from None
                time.sleep(poll)
                continue
            seen_round = checkin.round_id
            if checkin.status in CHOSEN_STATUSES:
                return checkin
            status = str(checkin.status).replace("_", " ")
            if wait is None and checkin.status == ParticipationStatus.NOT_SELECTED:
                raise RoundClosed(f"round {seen_round} selected other devices: run train again for the next round")
            if wait is not None and time.monotonic() >= deadline:
                raise RoundClosed(f"round {seen_round}: this device is {status} (pass a longer --wait, or --wait alone "
                                  "to wait until the round ends)")
            time.sleep(min(poll, max(checkin.retry_after_s or poll, 0.1)))

    def _raise_if_not_enrolled_on_server(self, refused: ServerRefused) -> None:
        """A check-in 409 means no open round or no enrollment on the server: the body's `code` says
        which (the transport typed the refusal by it)."""
        if refused.code is not None and not isinstance(refused, NotEnrolled):
            return
        if refused.code is None:
            # A server older than error codes: asking for this device's own template tells them apart.
            try:
                self._request("GET", f"/v1/devices/{self._identity()[0]}/embedding")
                return
            except ServerRefused as missing:
                if missing.status != 404:
                    raise
        raise NotEnrolled("the server holds no enrollment for this device (it was unenrolled there, or the server's "
                          "data was reset): run unenroll, then enroll again") from None

    def _resend_pending(self, notices: list[str]) -> RoundSummary | None:
        """Send the update an earlier train saved (an outage or a crash after training); one the
        server no longer accepts is discarded and reported in `notices`."""
        pending = self.state.pending()
        if pending is None:
            return None
        meta, body = pending
        try:
            self._post_update(meta, body)
        except RoundClosed as late:
            notices.append(str(late))
            return None
        except ServerUnavailable:
            raise ServerUnavailable(f"the server is still unreachable: the update saved for round {meta['round_id']} "
                                    "stays saved and will be resent by the next train") from None
        return RoundSummary(meta["round_id"], float(meta["loss_before"]), float(meta["loss_after"]), 0.0, len(body), 0,
                            int(meta["steps"]), resent=True, deadline_at=_deadline(meta.get("deadline_at")),
                            base_version=meta.get("base_version"))

    def _post_update(self, meta: dict[str, Any], body: bytes) -> None:
        """Upload a saved update; clear it once the server took it or refused it for good."""
        headers = {"Idempotency-Key": meta["key"], "Content-Type": "application/octet-stream"}
        round_id = meta["round_id"]
        try:
            self._request("POST", meta["url"], body=body, headers=headers, expect=(200, 201))
        except ServerRefused as refused:
            self.state.clear_pending()  # a refusal does not change on a resend
            deadline = _deadline(meta.get("deadline_at"))
            if isinstance(refused, RoundClosed) or (refused.status == 409 and deadline and datetime.now(UTC) >= deadline):
                when = f" ({deadline:%H:%M:%S} UTC)" if deadline else ""
                raise RoundClosed(f"round {round_id}'s upload deadline{when} passed before this device's update "
                                  "arrived: the update is discarded; run train again to join the next round") from None
            if refused.status in (404, 409):
                raise RoundClosed(f"round {round_id} no longer accepts this device's update ({refused.detail}): the "
                                  "update is discarded; run train again to join the next round") from None
            raise ServerRefused(refused.status, f"the update for round {round_id} was refused and discarded: "
                                f"{refused.detail}", refused.code) from None
        self.accepted_round = round_id
        self.state.clear_pending()

    def _load_backbone(self, url: str, version: str) -> nn.Module:
        """The round's torch backbone (for training: it imports torch), downloaded once per version and
        checked against its registry entry before a model is built from it (`load_backbone_file`)."""
        from device_sdk.round_files import load_backbone_file

        dtype = "fp16" if self.upload_fp16 else "fp32"
        kind = f"{dtype}.pt"
        path = self._fetch_model(f"{server_path(url)}?dtype={dtype}", check_version(version), kind)
        try:
            return load_backbone_file(path, f"{kind} file of model {version[:12]}")
        except BadServerResponse:
            self.state.drop_model(version, kind)  # not kept: the next round downloads it afresh
            raise

    def _shared_template(self, embedding: np.ndarray) -> np.ndarray:
        """The template as the server may see it: blurred when the owner asked for template noise."""
        if self.template_noise_cos is None:
            return np.asarray(embedding, np.float32)
        return noisy_template(embedding, self.template_noise_cos, np.random.default_rng(secrets.randbits(128)))


def _query(path: str) -> str:
    """The query string of a path this device built (only `?dtype=`), kept as it is."""
    return "?" + path.split("?", 1)[1] if "?" in path else ""


__all__ = ["EnrollResult", "FaceDevice", "PersonalizeResult", "ResetResult", "RoundEnd", "RoundSummary", "VerifyResult"]
