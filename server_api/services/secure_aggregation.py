"""The server's part in secure aggregation (facecore.federation.secagg): route messages, never hold a secret.

Steps of a round with ``secure_aggregation.enabled`` (times from the end of selection):

- ``advertise`` until ``key_phase_s`` or until every selected device has sent its two public keys;
  those devices are the members, numbered 1..n in arrival order.
- ``share_keys`` until ``2 x key_phase_s`` or until every member has sent one ciphertext for each
  other member. The devices that did are the key sharers; only they may upload.
- ``masked_input`` until the round's deadline or until every key sharer has uploaded.
- ``unmask`` (round status ``unmasking``): each device that uploaded sends its shares of the
  dropped sharers' s keys and of the uploaders' self-mask seeds. Aggregation starts when all have
  answered, or at ``unmask_phase_s`` with at least t answers; with fewer the round fails.

t = max(2, floor(fraction x members) + 1) and is never lowered to fit the members: a round with
fewer than t members, or fewer than max(min_participants, t) masked uploads, fails and publishes
nothing, so no published model is one device's update in disguise. Public keys that are not
usable X25519 points (low order, all zero) are refused at the advert, so one member cannot make
every honest device's key agreement fail, and so is a key another member of the round already
advertised (409), so no device can pose as another or cancel its masks.

A step is closed by time or by everyone having acted; either is final, so no request can see a
step reopen. Every device write is one transaction that takes the round lock first
(:func:`view` with ``locked=True``), so counts cannot race; then the device's new state is read,
as a :class:`DeviceStep` of plain values (the route encodes it for the wire).
"""
from __future__ import annotations

import base64
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from typing import Literal

from sqlalchemy.orm import Session

from facecore.federation.config import SecureAggregationSettings
from facecore.federation.messages import SecAggAdvertCreate, SecAggSharesCreate, SecAggUnmaskCreate
from facecore.federation.secagg import SHARE_CIPHERTEXT_BYTES, Advert, is_valid_public_key, mask_bound, threshold_for
from facecore.federation.status import CHOSEN_STATUSES, RoundStatus
from server_api.core.db import lock_round, transaction
from server_api.crud import audit
from server_api.crud import rounds as round_crud
from server_api.crud import secagg as secagg_crud
from server_api.crud import updates as update_crud
from server_api.errors import Conflict, Forbidden, InvalidInput, NotFound
from server_api.tables import Device, Round, SecAggMember, utcnow

STATUS_PHASE: dict[str, str] = {RoundStatus.UNMASKING: "unmask", RoundStatus.AGGREGATING: "aggregating", RoundStatus.COMPLETED: "completed",
                RoundStatus.FAILED: "failed"}


def settings_of(round_: Round) -> SecureAggregationSettings | None:
    settings = round_.settings.secure_aggregation
    return settings if settings.enabled else None


@dataclass(frozen=True)
class RoundView:
    """Everything a step decision needs, read under one lock."""

    round_: Round
    settings: SecureAggregationSettings
    members: list[SecAggMember]
    n_selected: int
    now: datetime

    @property
    def keys_until(self) -> datetime:
        return self.round_.selection_at + timedelta(seconds=self.settings.key_phase_s)

    @property
    def shares_until(self) -> datetime:
        return self.round_.selection_at + timedelta(seconds=2 * self.settings.key_phase_s)

    @property
    def adverts_closed(self) -> bool:
        everyone = self.round_.selection_done and self.n_selected > 0 and len(self.members) >= self.n_selected
        return self.now >= self.keys_until or everyone

    @property
    def shares_closed(self) -> bool:
        return self.adverts_closed and (self.now >= self.shares_until or (bool(self.members) and all(m.shared_at for m in self.members)))

    @property
    def phase(self) -> str:
        if self.round_.status != RoundStatus.OPEN:
            return STATUS_PHASE[self.round_.status]
        if not self.adverts_closed:
            return "advertise"
        return "masked_input" if self.shares_closed else "share_keys"

    @property
    def key_sharers(self) -> list[SecAggMember]:
        return [m for m in self.members if m.shared_at is not None]

    @property
    def threshold(self) -> int:
        return threshold_for(len(self.members), self.settings.threshold_fraction)

    @property
    def scale(self) -> float:
        return float(2**self.settings.scale_bits)


def view(session: Session, round_id: int, now: datetime, locked: bool = False) -> RoundView:
    round_ = lock_round(session, round_id) if locked else round_crud.get_round(session, round_id)
    if round_ is None:
        raise NotFound(f"round {round_id} does not exist")
    settings = settings_of(round_)
    if settings is None:
        raise Conflict(f"round {round_id} does not use secure aggregation")
    return RoundView(round_, settings, secagg_crud.members(session, round_id), secagg_crud.selected_count(session, round_id), now)


def _selected(session: Session, round_id: int, device: Device) -> None:
    if round_crud.participation_status(session, round_id, device.id) not in CHOSEN_STATUSES:
        raise Forbidden(f"device {device.id} was not selected for round {round_id}")


def _find_member(v: RoundView, device: Device) -> SecAggMember | None:
    return next((m for m in v.members if m.device_id == device.id), None)


def _member_of(v: RoundView, device: Device) -> SecAggMember:
    member = _find_member(v, device)
    if member is None:
        raise Forbidden(f"device {device.id} did not advertise keys in round {v.round_.id}")
    return member


def _decode(value: str, what: str) -> bytes:
    try:
        return base64.b64decode(value, validate=True)
    except ValueError:
        raise InvalidInput(f"{what} is not valid base64") from None


# ---- device requests -------------------------------------------------------------------------
@dataclass(frozen=True)
class MemberKeys:
    index: int
    c_public: bytes
    s_public: bytes


@dataclass(frozen=True)
class DeviceStep:
    """What one device needs for the current step; the parts of a step appear once it is closed.
    Plain values: they outlive the read transaction, which ends before the answer is sent."""

    round_id: int
    phase: str
    scale: float
    index: int | None  # this device's, once it advertised
    retry_after_s: float | None = None
    threshold: int | None = None
    bound: float | None = None
    max_update_norm: float | None = None
    members: list[MemberKeys] | None = None
    selected: int | None = None  # the round's selected devices, published beside its members
    key_sharers: list[int] | None = None
    shares: dict[int, bytes] | None = None  # sender index -> ciphertext addressed to this device
    survived: list[int] | None = None
    dropped: list[int] | None = None
    answered: bool = False


def state_for(session: Session, round_id: int, device: Device) -> DeviceStep:
    v = view(session, round_id, utcnow())
    _selected(session, round_id, device)
    me = _find_member(v, device)
    phase = v.phase
    step = DeviceStep(round_id=round_id, phase=phase, scale=v.scale, index=me.index if me else None)
    if phase == "advertise":
        step = replace(step, retry_after_s=max(0.5, min(2.0, (v.keys_until - v.now).total_seconds())))
    if phase in ("share_keys", "masked_input") and me is not None:
        step = replace(
            step, threshold=v.threshold, bound=mask_bound(len(v.members), v.scale), max_update_norm=v.settings.max_update_norm,
            members=[MemberKeys(m.index, m.c_public, m.s_public) for m in v.members], selected=v.n_selected,
        )
    if phase == "share_keys":
        step = replace(step, retry_after_s=max(0.5, min(2.0, (v.shares_until - v.now).total_seconds())))
    if phase == "masked_input" and me is not None and me.shared_at is not None:
        sharers = [m.index for m in v.key_sharers]
        step = replace(step, key_sharers=sharers, shares=secagg_crud.shares_for(session, round_id, me.index, sharers))
    if phase == "unmask" and me is not None:
        survived, dropped = _survivors(session, v)
        step = replace(step, threshold=v.threshold, survived=survived, dropped=dropped, answered=me.unmask_answer is not None)
    session.rollback()  # read only: ended now, so SQLite's write lock is not held while the answer is sent
    return step


def _survivors(session: Session, v: RoundView) -> tuple[list[int], list[int]]:
    """(key sharers that uploaded, key sharers that did not), by index."""
    uploaded = set(update_crud.round_uploaders(session, v.round_.id))
    sharers = v.key_sharers
    return [m.index for m in sharers if m.device_id in uploaded], [m.index for m in sharers if m.device_id not in uploaded]


def advertise(session: Session, round_id: int, device: Device, body: SecAggAdvertCreate) -> DeviceStep:
    c_public, s_public = _decode(body.c_public, "c_public"), _decode(body.s_public, "s_public")
    if c_public == s_public or not is_valid_public_key(c_public) or not is_valid_public_key(s_public):
        raise InvalidInput("c_public and s_public must be two different 32-byte X25519 public keys of full order")
    with transaction(session):
        v = view(session, round_id, utcnow(), locked=True)
        _selected(session, round_id, device)
        if _find_member(v, device) is not None:
            raise Conflict(f"device {device.id} already advertised keys for round {round_id}")
        if v.phase != "advertise":
            raise Conflict(f"round {round_id} is past the advertise step ({v.phase})")
        taken = {key for m in v.members for key in (m.c_public, m.s_public)}
        if c_public in taken or s_public in taken:
            # A copied key would let its holder read the shares meant for the key's owner, or make two members' masks cancel.
            raise Conflict(f"round {round_id}: a member already advertised one of these public keys; each member's keys must be its own")
        row = secagg_crud.add_member(session, round_id, device.id, c_public, s_public)
        audit.record(session, f"device:{device.id}", "secagg.advertised", round_id=round_id, device_id=device.id, index=row.index)
    return state_for(session, round_id, device)


def share_keys(session: Session, round_id: int, device: Device, body: SecAggSharesCreate) -> DeviceStep:
    with transaction(session):
        v = view(session, round_id, utcnow(), locked=True)
        me = _member_of(v, device)
        if v.phase != "share_keys":
            raise Conflict(f"round {round_id} is not at the share-keys step ({v.phase})")
        if me.shared_at is not None:
            raise Conflict(f"device {device.id} already shared its keys for round {round_id}")
        expected = {m.index for m in v.members if m.index != me.index}
        given = {int(k) for k in body.shares}
        if given != expected:
            raise InvalidInput(f"shares must go to exactly the other {len(expected)} member(s); "
                               f"missing {sorted(expected - given)[:5]}, unknown {sorted(given - expected)[:5]}")
        ciphertexts = {int(k): _decode(value, f"share for {k}") for k, value in body.shares.items()}
        if any(len(blob) != SHARE_CIPHERTEXT_BYTES for blob in ciphertexts.values()):
            raise InvalidInput(f"each share ciphertext must be {SHARE_CIPHERTEXT_BYTES} bytes")
        secagg_crud.store_shares(session, round_id, me, ciphertexts, v.now)
        audit.record(session, f"device:{device.id}", "secagg.shared", round_id=round_id, device_id=device.id, recipients=len(ciphertexts))
    return state_for(session, round_id, device)


def answer_unmask(session: Session, round_id: int, device: Device, body: SecAggUnmaskCreate) -> tuple[DeviceStep, bool]:
    """Store one survivor's shares; True when every survivor has now answered (aggregate now)."""
    with transaction(session):
        v = view(session, round_id, utcnow(), locked=True)
        me = _member_of(v, device)
        if v.phase != "unmask":
            raise Conflict(f"round {round_id} is not at the unmasking step ({v.phase})")
        survived, dropped = _survivors(session, v)
        if me.index not in survived:
            raise Forbidden(f"device {device.id} sent no masked update in round {round_id}, so it does not unmask")
        if me.unmask_answer is not None:
            raise Conflict(f"device {device.id} already answered the unmasking step of round {round_id}")
        s_keys, b_keys = {int(k) for k in body.s}, {int(k) for k in body.b}
        if s_keys != set(dropped) or b_keys != set(survived):
            raise InvalidInput("unmask answer must hold an s share for exactly each dropped device and a b share for exactly each survivor")
        secagg_crud.record_answer(me, {"s": dict(body.s), "b": dict(body.b)})
        answered = sum(1 for m in v.members if m.unmask_answer is not None)
        audit.record(session, f"device:{device.id}", "secagg.answered", round_id=round_id, device_id=device.id)
    return state_for(session, round_id, device), answered >= len(survived)


# ---- the round's transitions (called by aggregation_claim.claim_for_aggregation and rounds.check_in, lock held)
def next_transition(session: Session, round_: Round, n_uploaded: int, now: datetime) -> tuple[RoundStatus | Literal["not_due"], str | None]:
    """(the status the round moves to, or "not_due"; failure reason)."""
    v = view(session, round_.id, now)  # the caller holds the round's lock; this is the same row
    t = v.threshold
    need = max(round_.min_participants, t)
    if round_.status == RoundStatus.OPEN:
        sharers = len(v.key_sharers)
        if v.adverts_closed and len(v.members) < t:
            return RoundStatus.FAILED, f"only {len(v.members)} device(s) advertised keys, threshold {t}: the round cannot hide one update"
        if v.shares_closed and sharers < need:
            return RoundStatus.FAILED, f"only {sharers} device(s) shared keys, {need} required (threshold {t}, minimum {round_.min_participants})"
        if v.shares_closed and n_uploaded >= sharers:
            return RoundStatus.UNMASKING, None
        if now >= round_.deadline_at:
            if n_uploaded >= need:
                return RoundStatus.UNMASKING, None
            return RoundStatus.FAILED, (f"deadline passed with {n_uploaded} masked update(s), {need} required "
                              f"({len(v.members)} advertised keys, {sharers} shared them, threshold {t})")
        return "not_due", None
    answered = sum(1 for m in v.members if m.unmask_answer is not None)
    if n_uploaded < need:  # only reachable through a bug: never unmask fewer than t updates
        return RoundStatus.FAILED, f"{n_uploaded} masked update(s) to unmask, {need} required"
    if answered >= n_uploaded or (round_.unmask_deadline_at is not None and now >= round_.unmask_deadline_at and answered >= t):
        return RoundStatus.AGGREGATING, None
    if round_.unmask_deadline_at is not None and now >= round_.unmask_deadline_at:
        return RoundStatus.FAILED, f"secure aggregation aborted: {answered} unmasking answer(s), threshold {t}"
    return "not_due", None


def members_fixed(session: Session, round_: Round, now: datetime) -> bool:
    """Whether a secure round's members are fixed (its adverts are closed: keys are being agreed
    among them), so a late candidate is not selected. False for a round without secure aggregation."""
    return settings_of(round_) is not None and view(session, round_.id, now).adverts_closed


def unmask_deadline(round_: Round, now: datetime) -> datetime:
    settings = settings_of(round_)
    assert settings is not None
    return now + timedelta(seconds=settings.unmask_phase_s)


# ---- what aggregation needs ------------------------------------------------------------------
@dataclass(frozen=True)
class UnmaskInputs:
    adverts: dict[int, Advert]
    key_sharers: list[int]
    answers: list[dict[str, dict[int, tuple[int, int]]]]
    threshold: int
    scale: float
    max_update_norm: float
    index_of: dict[str, int]


def unmask_inputs(session: Session, round_: Round) -> UnmaskInputs:
    settings = settings_of(round_)
    assert settings is not None
    rows = secagg_crud.members(session, round_.id)
    answers = [
        {part: {int(k): (m.index, int(y)) for k, y in m.unmask_answer[part].items()} for part in ("s", "b")}
        for m in rows if m.unmask_answer is not None
    ]
    return UnmaskInputs(
        adverts={m.index: Advert(m.index, m.c_public, m.s_public) for m in rows},
        key_sharers=[m.index for m in rows if m.shared_at is not None], answers=answers,
        threshold=threshold_for(len(rows), settings.threshold_fraction), scale=float(2**settings.scale_bits),
        max_update_norm=settings.max_update_norm, index_of={m.device_id: m.index for m in rows},
    )
