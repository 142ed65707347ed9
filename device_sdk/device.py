"""`FaceDevice`: what a phone app embeds to enroll its owner, join rounds and verify faces.

A facade: each call is one function of the module that owns it, on this device's state folder, signed link and
settings. Module map:
- device_sdk.link: the signed link (identity, paths on the server only, bodies read as the protocol says);
- device_sdk.registration: register, reset;
- device_sdk.enrolment: enroll, add_photos, add_faces, unenroll (photos aligned in memory, template noise);
- device_sdk.rounds and device_sdk.uploads: check-in, train, upload, resend, wait_for_round_end;
- device_sdk.model_cache: the server's model description, model files, ONNX sessions, the torch backbone;
- device_sdk.personalize: the opt-in personal verifier;
- device_sdk.verify: "is this my owner", the one decision the CLI's `fedface device verify` shares.

Invariants:
- Only `register()` creates local state; every other call needs a registered state folder. Anything the server
  names (model versions, URLs, device ids) is validated before it touches a path or a request, and server
  refusals are explained by what was asked and the HTTP status or the body's `code`, not by the wording of the
  server's message.
- Torch is imported only by the calls that train: `train_round`, `personalize` (and `_load_backbone`, which both
  use), inside the functions they call. Importing this module, and register, enroll, verify (also with
  `personal`), status, unenroll and reset, need numpy, PIL, onnxruntime, httpx and cryptography only
  (tests/device/test_device_torch_free.py checks `sys.modules` in a subprocess): a command that trains nothing
  must not pay torch's ~2 s and ~0.7 GB. Pydantic's round messages are imported where a round reads or writes them.
- A hostile server cannot make the device exhaust itself (device_sdk/README.md, "What the device refuses"):
  descriptions and downloads are read capped, and a backbone is checked before a model is built from it
  (device_sdk.model_cache).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from device_sdk import enrolment, registration, rounds
from device_sdk.enrolment import MAX_FACES, EnrollResult, PhotoAligner
from device_sdk.errors import DeviceError
from device_sdk.link import ServerLink, server_body, server_path
from device_sdk.model_cache import Embedders, current_model, download_precision, load_backbone
from device_sdk.personalize import PersonalizeResult
from device_sdk.personalize import personalize as train_personal
from device_sdk.registration import ResetResult
from device_sdk.rounds import ROUND_END_GRACE_S, RoundEnd, RoundOptions, RoundSummary
from device_sdk.state import DeviceState
from device_sdk.transport import Transport
from device_sdk.verify import VerifyResult, verify_photo
from facecore.align.pipeline import FaceAligner
from facecore.federation.template_noise import sigma_for_cosine

if TYPE_CHECKING:  # the types only: importing these modules imports torch or pydantic's models
    import httpx
    from torch import nn

    from device_sdk.personal import PersonalConfig


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
        self._training_slot = training_slot if training_slot is not None else nullcontext()
        self._link = ServerLink(self.state, self.transport)
        self._photos = PhotoAligner(aligner)
        self._embedders = Embedders()
        # The round of the last update the server accepted from this object: with the pending upload on disk, it
        # tells a caller whose train was interrupted what is left to send.
        self.accepted_round: int | None = None

    @property
    def device_id(self) -> str | None:
        return self.state.info().get("device_id")

    # ---- registration and enrolment ----------------------------------------------------------
    def register(self, enrollment_token: str | None = None) -> str:
        """Create this device's key pair and register it; on a registered folder, return its id unchanged.
        `enrollment_token`: the one-time token a production server's operator issued for this device (without
        one, such a server refuses: RegistrationRefused). The key pair is made in memory and the state folder
        written only once the server accepted it: a refusal, an unreachable server or Ctrl-C leaves no state."""
        return registration.register(self._link, enrollment_token)

    def enroll(self, photos: Sequence[str | Path], progress: Callable[[str], None] | None = None) -> EnrollResult:
        """Detect and align the owner's faces, embed them and upload the template. A device that is not
        registered, or already enrolled (here or on the server), is refused before any photo is read.
        `progress` hears each step as it starts."""
        return enrolment.enroll(self._link, self._photos, self._embedders, photos, self.min_photos,
                                self.template_noise_cos, progress)

    def add_photos(self, photos: Sequence[str | Path], progress: Callable[[str], None] | None = None) -> EnrollResult:
        """Add photos this device's own camera took of its owner (at an unlock, say) to the faces it
        trains on from the next round; the template stays the enrolment's. Rounds that keep the
        templates then teach the shared model to map this camera's view of the owner onto it.
        `progress` hears each step as it starts, once the device is known to be enrolled."""
        return enrolment.add_photos(self._link, self._photos, photos, progress)

    def add_faces(self, faces: np.ndarray) -> int:
        """`add_photos` for faces already aligned to the enrolled crop (a camera pipeline that crops
        itself); returns how many faces the device now trains on."""
        return enrolment.add_faces(self.state, faces)

    def unenroll(self) -> None:
        """Delete the owner's enrolment on the server and here (template, faces, personal verifier)."""
        enrolment.unenroll(self._link)

    # ---- rounds ----------------------------------------------------------------------------
    def train_round(
        self, wait: float | None = 0.0, poll: float = 2.0, progress: Callable[[str], None] | None = None,
    ) -> RoundSummary:
        """Send an update an earlier call saved, else check in (waiting up to `wait` seconds for a
        round and a slot; None: until the round this device joins ends), train, upload once.
        `progress` hears each step as it starts. One train at a time per state folder: another one
        running (in this process or another) raises TrainingInProgress before anything is done."""
        options = RoundOptions(self.upload_fp16, self.template_noise_cos, self.min_secure_members, self._training_slot)
        return rounds.train_round(self._link, options, self._accepted, wait, poll, progress)

    def wait_for_round_end(self, summary: RoundSummary, poll: float = 2.0, grace: float = ROUND_END_GRACE_S) -> RoundEnd:
        """After `summary`'s update was accepted: wait for the model its round makes and return it. A round
        that fails makes none: `grace` seconds after the round's deadline this gives up and returns a
        RoundEnd without a new model, naming the server's current one."""
        return rounds.wait_for_round_end(self._link, summary, poll, grace)

    def _accepted(self, round_id: int) -> None:
        self.accepted_round = round_id

    # ---- personalisation and verification ----------------------------------------------------
    def personalize(self, config: PersonalConfig | None = None, cohort: np.ndarray | None = None) -> PersonalizeResult:
        """Opt-in: train the fused personal verifier (FedFusion) on the owner's faces, on the
        current global model. `cohort`: aligned public impostor faces to train against. Nothing
        is sent to the server; the result is stored encrypted and used by verify(personal=True)."""
        return train_personal(self._link, config, cohort, self.upload_fp16)

    def verify(self, photo: str | Path, personal: bool = False, threshold: float | None = None) -> VerifyResult:
        """Score a photo against the owner (device_sdk.verify). `personal`: with the fused verifier of
        personalize(). `threshold` defaults to the server's for the global model, and to the personal
        verifier's own (calibrated at personalize on public impostors) with `personal`: fused scores of
        owners and of impostors both run higher, so the global threshold would let impostors through.
        When the server cannot be reached, the model last seen scores, if its ONNX file is cached
        (`VerifyResult.offline`)."""
        return verify_photo(self._link, photo, personal, threshold, self._photos.detector, self._embedders)

    # ---- local state -------------------------------------------------------------------------
    def status(self) -> dict[str, Any]:
        """What this state folder holds, read locally (no server call): DeviceState.summary()."""
        return self.state.summary()

    def reset(self) -> ResetResult:
        """Delete this device's local state; first, if this state can still sign, unenroll on the server."""
        done = registration.reset(self._link)
        self._embedders.clear()
        return done

    # ---- for the simulator's demo (simulator/demo.py) and tests, which read the server directly --------
    def _request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        return self._link.request(method, path, **kwargs)

    def _model(self, remember: bool = True) -> dict[str, Any]:
        return current_model(self._link, remember)

    def _load_backbone(self, url: str, version: str) -> nn.Module:
        return load_backbone(self._link, url, version, download_precision(self.upload_fp16))


__all__ = ["MAX_FACES", "ROUND_END_GRACE_S", "EnrollResult", "FaceDevice", "PersonalizeResult", "ResetResult", "RoundEnd",
           "RoundSummary", "VerifyResult", "server_body", "server_path"]
