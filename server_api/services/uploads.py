"""Accepting one device update in two steps, so nothing unauthenticated is ever spooled.

:func:`begin_upload` runs before the body is read: the signature (over the body hash the
device declared in ``X-Content-SHA256``), the nonce, the device's rate limit, idempotency, and
whether this device was selected for this round. Only then does the route read the body,
checking it against the declared hash, and :func:`finish_upload` validates and records it.

Order matters for crash safety: the blob is written (content-addressed, fsynced) before the
row that names it is committed, and the 201 is only sent after that commit. A retry with the
same Idempotency-Key after any crash either finds the committed record (same response) or
starts over cleanly.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from sqlalchemy.orm import Session

from server_api.core.logging import get_logger
from server_api.crud import rounds as round_crud
from server_api.crud import updates as update_crud
from server_api.crud.updates import Recorded
from server_api.errors import Conflict, Forbidden, InvalidInput, NotFound, ServerError
from server_api.models import Device, Round, utcnow
from server_api.schemas import UpdatePublic
from server_api.services import secure_aggregation
from server_api.services.auth import SignedRequest, authenticate_device
from server_api.services.context import ServerContext
from server_api.services.validation_pool import UpdateSpec

IDEMPOTENCY_KEY = re.compile(r"^[A-Za-z0-9_.:-]{8,128}$")
log = get_logger("uploads")


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
    device = authenticate_device(session, signed, ctx.settings.signature_window_s, commit=False)
    try:
        admit(device.id)
        ticket = _early_checks(ctx, session, device, round_id, signed.body_sha256, idempotency_key)
    except ServerError:
        session.commit()  # the nonce stays used: a refused request cannot be replayed either
        raise
    # Commits before the body is read: on SQLite every transaction holds the write lock.
    session.commit()
    return ticket


def finish_upload(ctx: ServerContext, session: Session, ticket: UploadTicket, spool: Path, size: int) -> Recorded:
    """Validate the received body (already checked against the ticket's hash) and record it."""
    assert ticket.expected is not None, "a replay has nothing to finish"
    device_id, round_id, now = ticket.device_id, ticket.round_id, ticket.arrived_at
    parsed = ctx.validation.check(spool, size, ticket.expected)
    blob = ctx.store.adopt(spool, ticket.body_sha256)  # the route hashed the body as it arrived
    ciphertext = ctx.cipher.encrypt(parsed.embedding.astype("<f4").tobytes(), device_id, "update")

    def response(update_id: int) -> dict[str, Any]:
        public = UpdatePublic(
            update_id=update_id, round_id=round_id, device_id=device_id, n_samples=parsed.meta.n_samples,
            size_bytes=size, accepted_at=now,
        )
        return public.model_dump(mode="json")

    recorded = update_crud.record_update(
        session, round_id=round_id, device_id=device_id, blob_sha256=blob, size_bytes=size,
        n_samples=parsed.meta.n_samples, metrics=dict(parsed.meta.metrics), embedding_ciphertext=ciphertext,
        idempotency_key=ticket.idempotency_key, request_sha256=ticket.body_sha256, response=response, now=now,
        target=ticket.target,
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
        replay = Recorded(previous.status_code, previous.response, created=False, due=False)
        return UploadTicket(device.id, round_id, body_sha256, idempotency_key, None, None, now, replay)
    round_ = round_crud.get_round(session, round_id)
    if round_ is None:
        raise NotFound(f"round {round_id} does not exist")
    spec, dim, base_hash = ctx.version_spec(session, round_.base_version_id)
    target = _secure_target(session, round_, device, now) if secure_aggregation.settings_of(round_) else None
    update_crud.check_can_upload(session, round_, device.id, now)
    expected = UpdateSpec(spec, dim, base_hash, ctx.settings.max_delta_norm if target is None else None)
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
