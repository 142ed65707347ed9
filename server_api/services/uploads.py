"""Accepting one device update in two steps, so nothing unauthenticated is ever spooled.

:func:`begin_upload` runs before the body is read: the signature (over the body hash the
device declared in ``X-Content-SHA256``), the nonce, the device's rate limit, idempotency, and
whether this device was selected for this round. Only then does the route read the body,
checking it against the declared hash, and :func:`finish_upload` validates and records it.

Order matters for crash safety: the blob is written (content-addressed, fsynced) before the
row that names it is committed, and the 201 is only sent after that commit. A retry with the
same Idempotency-Key after any crash either finds the committed record (same response) or
starts over cleanly.

The service returns plain values, never a response: :class:`AcceptedUpdate` holds what the 201
says (the update's id, its sample count, ...), and the route builds the body from it. The same
values are stored with the Idempotency-Key, in the recording transaction, and a replay rebuilds
the body from them, so it answers the same bytes as the first response.

Transactions: :func:`begin_upload` is one (committed before the body is read, since on SQLite
every transaction holds the write lock) and :func:`record_update` is another, with the round
row locked: it re-checks everything the first one checked, so nothing that changed while the
body arrived can slip in.
"""
from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, fields
from datetime import datetime
from pathlib import Path
from typing import Any, NamedTuple

from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from facecore.federation.status import CHOSEN_STATUSES, ParticipationStatus, RoundStatus
from server_api.core.db import transaction
from server_api.core.logging import get_logger
from server_api.crud import audit
from server_api.crud import rounds as round_crud
from server_api.crud import updates as update_crud
from server_api.errors import Conflict, DeviceNotEnrolled, Forbidden, InvalidInput, NotFound, ServerError, StaleRound
from server_api.services import secure_aggregation
from server_api.services.auth import SignedRequest, authenticate_device
from server_api.services.context import ServerContext
from server_api.services.validation_pool import UpdateSpec
from server_api.tables import Device, Round, utcnow

IDEMPOTENCY_KEY = re.compile(r"^[A-Za-z0-9_.:-]{8,128}$")
log = get_logger("uploads")


@dataclass(frozen=True)
class AcceptedUpdate:
    """An accepted update, as plain values: what its 201 says, and what an Idempotency-Key replays."""

    update_id: int
    round_id: int
    device_id: str
    n_samples: int
    size_bytes: int
    accepted_at: datetime

    def to_record(self) -> dict[str, Any]:
        """The JSON stored with the Idempotency-Key."""
        return asdict(self) | {"accepted_at": self.accepted_at.isoformat()}

    @classmethod
    def from_record(cls, record: Mapping[str, Any]) -> AcceptedUpdate:
        """The values `to_record` stored; also reads the records stored before it, which held the 201's body
        (the same keys, its time written with a trailing Z)."""
        values = {f.name: record[f.name] for f in fields(cls)}
        return cls(**values | {"accepted_at": datetime.fromisoformat(record["accepted_at"])})


class Recorded(NamedTuple):
    """record_update's outcome: the status and the accepted update to answer with, whether this request
    created the update, and whether it reached the round's target (the caller then starts aggregation)."""

    status_code: int
    accepted: AcceptedUpdate
    created: bool
    due: bool


@dataclass(frozen=True)
class UploadTicket:
    """An authenticated, selected device's go-ahead to send its body, or the replayed answer
    of an Idempotency-Key it already used (``replay``; then no body is needed)."""

    device_id: str
    round_id: int
    body_sha256: str  # declared by the device and covered by its signature
    idempotency_key: str
    expected: UpdateSpec | None  # what the body is checked against; None for a replay
    target: int | None  # a secure-aggregation round's number of uploads, else None (the round's own)
    arrived_at: datetime
    replay: Recorded | None = None


def begin_upload(
    ctx: ServerContext, session: Session, signed: SignedRequest, round_id: int, idempotency_key: str | None,
    admit: Callable[[str], None],
) -> UploadTicket:
    """Everything that can refuse an upload before its body is read. ``admit(device_id)`` is the
    device's rate limit, charged once the signature has proved who is asking."""
    # The signature, the nonce and the cheap refusals share one transaction: on SQLite each
    # transaction holds the only connection, and a busy round queues on it.
    with transaction(session):
        device = authenticate_device(session, signed, ctx.settings.signature_window_s)
        try:
            admit(device.id)
            return _early_checks(ctx, session, device, round_id, signed.body_sha256, idempotency_key)
        except ServerError as error:
            refusal = error  # committed all the same: the nonce stays used, so a refused request cannot be replayed either
    raise refusal


def finish_upload(ctx: ServerContext, session: Session, ticket: UploadTicket, spool: Path, size: int) -> Recorded:
    """Validate the received body (already checked against the ticket's hash) and record it."""
    assert ticket.expected is not None, "a replay has nothing to finish"
    device_id, round_id, now = ticket.device_id, ticket.round_id, ticket.arrived_at
    parsed = ctx.validation.check(spool, size, ticket.expected)
    blob = ctx.store.adopt(spool, ticket.body_sha256)  # the route hashed the body as it arrived
    ciphertext = ctx.cipher.encrypt(parsed.embedding.astype("<f4").tobytes(), device_id, "update")
    recorded = record_update(
        session, round_id=round_id, device_id=device_id, blob_sha256=blob, size_bytes=size,
        n_samples=parsed.meta.n_samples, metrics=dict(parsed.meta.metrics), embedding_ciphertext=ciphertext,
        idempotency_key=ticket.idempotency_key, request_sha256=ticket.body_sha256, now=now, target=ticket.target,
    )
    if recorded.created:
        ctx.metrics.updates.inc()
        ctx.metrics.upload_bytes.inc(size)
        fields = {"round_id": round_id, "device_id": device_id, "n_samples": parsed.meta.n_samples, "bytes": size}
        log.info("update accepted", extra={"fields": fields})
    return recorded


def _early_checks(
    ctx: ServerContext, session: Session, device: Device, round_id: int, body_sha256: str, idempotency_key: str | None,
) -> UploadTicket:
    """The replayed response of a known Idempotency-Key, or the ticket for a new upload. Refuses
    stale rounds and unselected devices before the body is read; record_update repeats that
    under the lock."""
    if not idempotency_key or not IDEMPOTENCY_KEY.match(idempotency_key):
        raise InvalidInput("Idempotency-Key header is required (8-128 characters of [A-Za-z0-9_.:-])")
    now = utcnow()
    previous = update_crud.get_idempotency(session, device.id, idempotency_key)
    if previous is not None:
        if previous.request_sha256 != body_sha256:
            raise InvalidInput("Idempotency-Key was already used for a different request body")
        replay = _replayed(previous)
        return UploadTicket(device.id, round_id, body_sha256, idempotency_key, None, None, now, replay)
    round_ = round_crud.get_round(session, round_id)
    if round_ is None:
        raise NotFound(f"round {round_id} does not exist")
    spec, dim, base_hash = ctx.version_spec(session, round_.base_version_id)
    target = _secure_target(session, round_, device, now) if secure_aggregation.settings_of(round_) else None
    _refuse_closed(session, round_.id, (round_.status, round_.deadline_at), now)
    problem = _participation_problem(session, round_.id, device.id)
    if problem is not None:
        raise problem
    expected = UpdateSpec(spec, dim, base_hash, ctx.settings.max_delta_norm if target is None else None, round_.settings.local.trainable_blocks)
    return UploadTicket(device.id, round_id, body_sha256, idempotency_key, expected, target, now)


def _secure_target(session: Session, round_: Round, device: Device, now: datetime) -> int:
    """A masked update is only accepted from a key sharer once key sharing has closed; the round
    is complete when every key sharer has uploaded."""
    v = secure_aggregation.view(session, round_.id, now)
    if v.phase != "masked_input":
        raise Conflict(f"round {round_.id} is at the {v.phase} step of secure aggregation, not accepting masked updates")
    if not any(m.device_id == device.id for m in v.key_sharers):
        raise Forbidden(f"device {device.id} did not share its keys in round {round_.id}, so its update could not be unmasked")
    return len(v.key_sharers)


def record_update(
    session: Session, *, round_id: int, device_id: str, blob_sha256: str, size_bytes: int, n_samples: int,
    metrics: dict[str, float], embedding_ciphertext: bytes, idempotency_key: str, request_sha256: str,
    now: datetime, target: int | None = None,
) -> Recorded:
    """Insert the update, mark the participation and store the accepted update's values under the
    Idempotency-Key, in one transaction with the round row locked.

    `target` overrides the round's (secure aggregation: the number of devices that shared keys).
    A concurrent duplicate with the same Idempotency-Key gets the first request's values, created=False."""
    try:
        with transaction(session):
            state = update_crud.locked_round_state(session, round_id)
            _refuse_closed(session, round_id, None if state is None else (state.status, state.deadline_at), now)
            assert state is not None  # _refuse_closed raised for a round that is not there
            # One conditional UPDATE instead of reading the participation and the enrollment first.
            if not update_crud.mark_uploaded(session, round_id, device_id):
                replay = update_crud.get_idempotency(session, device_id, idempotency_key)  # the same request, sent twice at once
                if replay is not None and replay.request_sha256 == request_sha256:
                    return _replayed(replay)
                raise _participation_problem(session, round_id, device_id) or Conflict(f"device {device_id} cannot upload to round {round_id}")
            update_id = update_crud.insert_update(
                session, round_id=round_id, device_id=device_id, blob_sha256=blob_sha256, size_bytes=size_bytes,
                n_samples=n_samples, metrics=metrics, embedding_ciphertext=embedding_ciphertext, created_at=now,
            )
            accepted = AcceptedUpdate(update_id, round_id, device_id, n_samples, size_bytes, now)
            update_crud.insert_idempotency(session, device_id, idempotency_key, request_sha256, 201, accepted.to_record(), now)
            due = update_crud.count_upload(session, round_id) >= (target if target is not None else state.target_participants)
            audit.record_now(session, f"device:{device_id}", "update.accepted", round_id=round_id, device_id=device_id,
                             n_samples=n_samples, bytes=size_bytes)
    except IntegrityError:  # a concurrent duplicate got in first: answer what it was answered
        existing = update_crud.get_idempotency(session, device_id, idempotency_key)
        if existing is None:
            raise Conflict(f"device {device_id} already uploaded an update for round {round_id}") from None
        return _replayed(existing)
    return Recorded(201, accepted, created=True, due=due)


def _replayed(replay: update_crud.Replay) -> Recorded:
    return Recorded(replay.status_code, AcceptedUpdate.from_record(replay.response), created=False, due=False)


def _refuse_closed(session: Session, round_id: int, state: tuple[str, datetime] | None, now: datetime) -> None:
    """StaleRound unless the round (status, deadline) is open and before its deadline."""
    if state is None or state[0] != RoundStatus.OPEN or now >= state[1]:
        active = round_crud.active_round(session)
        raise StaleRound(round_id, active.id if active else None, active.status if active else None)


def _participation_problem(session: Session, round_id: int, device_id: str) -> Exception | None:
    """Why this device may not upload to this round, or None."""
    status, enrolled = update_crud.upload_standing(session, round_id, device_id)
    if status not in CHOSEN_STATUSES:
        return Forbidden(f"device {device_id} was not selected for round {round_id}")
    if status == ParticipationStatus.UPLOADED:
        return Conflict(f"device {device_id} already uploaded an update for round {round_id}")
    if not enrolled:
        # An unenrolled device's new embedding would be a template we promised to delete.
        return DeviceNotEnrolled(f"device {device_id} is not enrolled")
    return None
