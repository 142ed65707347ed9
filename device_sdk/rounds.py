"""A device's part in a round: check in until selected, train on the owner's faces, upload once, wait for the end.

Invariants:
- One train at a time per state folder (`DeviceState.train_lock`), taken before torch is imported: a refused
  second train costs nothing. An update an earlier train saved is sent first (device_sdk.uploads).
- Torch is imported only inside `_train` (device_sdk.round_files, device_sdk.training and the backbone through
  device_sdk.model_cache), and pydantic's round messages only where a round reads them: importing this module,
  as FaceDevice's does, costs a command that trains nothing neither.
- Secure aggregation is joined before training (its key steps have short deadlines) and only with at least
  `min_secure_members` members; the device says how many it agreed to.
- A device cannot ask a round's status, and a check-in would join the next round, so the end of a round is read
  from the server's current model (`wait_for_round_end`), which names the round that made it.
"""
from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import numpy as np

from device_sdk.enrolment import enrolled_faces, shared_template
from device_sdk.errors import BadServerResponse, NotEnrolled, RoundClosed, ServerRefused, ServerUnavailable
from device_sdk.link import ServerLink, read_deadline, server_body, server_path
from device_sdk.model_cache import current_model, download_precision, load_backbone
from device_sdk.server_limits import check_version
from device_sdk.uploads import Accepted, post_update, resend_pending
from facecore.align.geometry import geometry_of
from facecore.federation.status import CHOSEN_STATUSES, ParticipationStatus

if TYPE_CHECKING:  # the types only: importing these modules imports torch or pydantic's models
    from facecore.federation.messages import CheckinPublic
    from facecore.federation.wire import Precision

# How long after a round's deadline `wait_for_round_end` still expects its model: the server aggregates as soon as
# the deadline passes, and retakes a stuck aggregation after its lease (60 s by default); a round still without a
# model after twice that has most likely failed.
ROUND_END_GRACE_S = 120.0

Progress = Callable[[str], None]


@dataclass(frozen=True)
class RoundOptions:
    """What the owner set for rounds (FaceDevice's arguments of the same names)."""

    upload_fp16: bool = True
    template_noise_cos: float | None = None
    min_secure_members: int = 2
    training_slot: AbstractContextManager[Any] = field(default_factory=nullcontext)  # entered around local training


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


def train_round(link: ServerLink, options: RoundOptions, accepted: Accepted, wait: float | None = 0.0, poll: float = 2.0,
                progress: Progress | None = None) -> RoundSummary:
    """`FaceDevice.train_round`: resend a saved update, else check in, train and upload once."""
    link.identity()
    with link.state.train_lock():  # before torch's import: a refused second train costs nothing
        return _train(link, options, accepted, wait, poll, progress or (lambda _: None))


def _train(link: ServerLink, options: RoundOptions, accepted: Accepted, wait: float | None, poll: float,
           say: Progress) -> RoundSummary:
    # Training's modules, here and not at the top: they import torch (see the module's docstring).
    from device_sdk.round_files import update_file
    from device_sdk.secure_round import SecureRound
    from device_sdk.training import LocalTrainingConfig, train_local
    from facecore.federation.config import training_seed
    from facecore.federation.messages import EmbeddingPublic

    state, transport = link.state, link.transport
    faces = enrolled_faces(state)
    up0, down0 = transport.bytes_up, transport.bytes_down
    notices: list[str] = []
    resent = resend_pending(link, notices, accepted)
    if resent is not None:
        meta, size = resent
        return RoundSummary(meta["round_id"], float(meta["loss_before"]), float(meta["loss_after"]), 0.0, size, 0,
                            int(meta["steps"]), resent=True, deadline_at=read_deadline(meta.get("deadline_at")),
                            base_version=meta.get("base_version"))
    say("checking in" + (" (waiting for the round to select this device)" if wait is None or wait > 0 else ""))
    checkin = _checkin_until_selected(link, wait, poll)
    round_id = checkin.round_id
    if checkin.status == ParticipationStatus.UPLOADED:
        raise RoundClosed(f"this device already sent its update for round {round_id}: run train again for the "
                          "next round")
    started = time.perf_counter()
    secure = None
    if checkin.secagg_url:
        say("joining secure aggregation")
        secure = SecureRound(link.request, server_path(checkin.secagg_url), poll=min(poll, 1.0),
                             min_members=options.min_secure_members)
        secure.join()  # before training: the key steps have short deadlines
        # What the device agreed to, for its user to see: a server that filled the round with puppets shows here.
        notices.append(f"secure aggregation: {secure.members} members, threshold {secure.client.threshold}")
    say("downloading the model")
    backbone = load_backbone(link, checkin.backbone_url, check_version(checkin.base_version),
                             download_precision(options.upload_fp16, checkin.local))
    if faces.shape[1:] != geometry_of(backbone).row_shape:
        raise NotEnrolled(f"the server's model crops faces as {geometry_of(backbone).key}, this device's faces "
                          "were cropped for another model: enroll again")
    held = server_body(EmbeddingPublic, link.request("GET", server_path(checkin.embedding_url)).json())
    embedding = np.asarray(held.embedding, np.float32)
    config = LocalTrainingConfig.from_round(checkin.local)
    say(f"training locally for round {round_id}")
    with options.training_slot:
        # A device enrolled before the length was kept trains towards its unit template, as it did then.
        update = train_local(backbone, embedding, faces, config, seed=training_seed(round_id),
                             template_length=float(state.info().get("template_length", 1.0)))
    precision: Precision = "fp16" if options.upload_fp16 else "fp32"
    template = shared_template(update.embedding.numpy(), options.template_noise_cos)
    bits = upload_bits(checkin.local)
    body, residual = update_file(backbone, update, checkin.base_version, template, precision, secure,
                                 bits, state.residual() if bits is not None else None)
    meta = {"round_id": round_id, "key": f"{link.identity()[0]}-{round_id}-{secrets.token_hex(8)}",
            "url": server_path(checkin.upload_url), "deadline_at": checkin.deadline_at.isoformat(),
            "base_version": checkin.base_version,
            "loss_before": update.loss_before, "loss_after": update.loss_after, "steps": update.steps}
    # Persist before sending: a crash or an outage after this point resends the same bytes under the same key,
    # and the residual is what those bytes leave undelivered.
    state.save_pending(meta, body)
    if residual is not None:
        state.save_residual(residual)
    say("uploading the update")
    try:
        post_update(link, meta, body, accepted)
    except ServerUnavailable:
        raise ServerUnavailable(f"the server became unreachable after training: the update for round {round_id} is "
                                f"saved in {state.dir} and will be resent by the next train") from None
    state.save_template(update.embedding.numpy())
    if secure is not None:
        secure.unmask()
    return RoundSummary(round_id, update.loss_before, update.loss_after, time.perf_counter() - started,
                        transport.bytes_up - up0, transport.bytes_down - down0, update.steps,
                        notices=tuple(notices), deadline_at=checkin.deadline_at, base_version=checkin.base_version)


def wait_for_round_end(link: ServerLink, summary: RoundSummary, poll: float = 2.0,
                       grace: float = ROUND_END_GRACE_S) -> RoundEnd:
    """After `summary`'s update was accepted: the model its round makes, read every `poll` seconds from the
    server's current model; `grace` seconds after the round's deadline without one, a RoundEnd without it."""
    round_id = summary.round_id
    give_up = (summary.deadline_at or datetime.now(UTC)) + timedelta(seconds=grace)
    while True:
        try:
            model = current_model(link, remember=False)
        except ServerUnavailable as down:
            raise ServerUnavailable(f"this device's update for round {round_id} was accepted, but the server became "
                                    f"unreachable while waiting for the round to end: {down}") from None
        made = model.get("round_id")
        if isinstance(made, int) and not isinstance(made, bool) and made >= round_id:
            return RoundEnd(round_id, model["version"], made, give_up)
        if datetime.now(UTC) >= give_up:
            return RoundEnd(round_id, model["version"], None, give_up)
        time.sleep(poll)


def upload_bits(local: Mapping[str, Any]) -> int | None:
    """The round's `local.upload_bits`: None (fp16 or fp32, the device's choice), 8 or 4."""
    from facecore.federation.quantize import BITS

    bits = local.get("upload_bits")
    if bits is not None and (isinstance(bits, bool) or bits not in BITS):
        raise BadServerResponse(f"the round asks for uploads of {str(bits)[:20]} bits; this device sends {' or '.join(map(str, BITS))}")
    return bits


def _checkin_until_selected(link: ServerLink, wait: float | None, poll: float) -> CheckinPublic:
    """`wait` None: until the round this device sees ends; else up to `wait` seconds."""
    from facecore.federation.messages import CheckinPublic  # pydantic's models: only when a round is asked for

    deadline = time.monotonic() + (wait or 0.0)
    seen_round: int | None = None
    enrollment_checked = False
    while True:
        try:
            checkin = server_body(CheckinPublic, link.request("POST", "/v1/rounds/current/checkin").json())
        except ServerRefused as refused:
            if refused.status != 409:
                raise
            if not enrollment_checked:
                _raise_if_not_enrolled_on_server(link, refused)
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


def _raise_if_not_enrolled_on_server(link: ServerLink, refused: ServerRefused) -> None:
    """A check-in 409 means no open round or no enrollment on the server: the body's `code` says
    which (the transport typed the refusal by it)."""
    if refused.code is not None and not isinstance(refused, NotEnrolled):
        return
    if refused.code is None:
        # A server older than error codes: asking for this device's own template tells them apart.
        try:
            link.request("GET", f"/v1/devices/{link.identity()[0]}/embedding")
            return
        except ServerRefused as missing:
            if missing.status != 404:
                raise
    raise NotEnrolled("the server holds no enrollment for this device (it was unenrolled there, or the server's "
                      "data was reset): run unenroll, then enroll again") from None


__all__ = ["ROUND_END_GRACE_S", "RoundEnd", "RoundOptions", "RoundSummary", "train_round", "wait_for_round_end"]
