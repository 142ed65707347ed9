"""Secure-aggregation rows: members (public keys, who shared, answers) and routed share ciphertexts.

Queries only; the caller owns the transaction. Its writes happen with the round row locked
(services.secure_aggregation), like every other round transition, so a step's membership
cannot change while another request decides that the step is closed.
"""
from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import delete, func, select, update
from sqlalchemy.orm import Session

from facecore.federation.status import CHOSEN_STATUSES
from server_api.tables import Participation, SecAggMember, SecAggShare


def members(session: Session, round_id: int) -> list[SecAggMember]:
    return list(session.execute(select(SecAggMember).where(SecAggMember.round_id == round_id).order_by(SecAggMember.index)).scalars())


def member(session: Session, round_id: int, device_id: str) -> SecAggMember | None:
    return session.execute(
        select(SecAggMember).where(SecAggMember.round_id == round_id, SecAggMember.device_id == device_id)
    ).scalar_one_or_none()


def selected_count(session: Session, round_id: int) -> int:
    return session.scalar(
        select(func.count()).select_from(Participation)
        .where(Participation.round_id == round_id, Participation.status.in_(CHOSEN_STATUSES))
    ) or 0


def add_member(session: Session, round_id: int, device_id: str, c_public: bytes, s_public: bytes) -> SecAggMember:
    """The next index in arrival order (the caller holds the round lock)."""
    last = session.scalar(select(func.max(SecAggMember.index)).where(SecAggMember.round_id == round_id)) or 0
    row = SecAggMember(round_id=round_id, device_id=device_id, index=last + 1, c_public=c_public, s_public=s_public)
    session.add(row)
    session.flush()
    return row


def store_shares(session: Session, round_id: int, sender: SecAggMember, ciphertexts: dict[int, bytes], now: datetime) -> None:
    session.add_all(SecAggShare(round_id=round_id, recipient=v, sender=sender.index, ciphertext=blob) for v, blob in ciphertexts.items())
    sender.shared_at = now


def shares_for(session: Session, round_id: int, recipient: int, senders: list[int]) -> dict[int, bytes]:
    rows = session.execute(
        select(SecAggShare.sender, SecAggShare.ciphertext).where(SecAggShare.round_id == round_id, SecAggShare.recipient == recipient)
    ).all()
    wanted = set(senders)
    return {sender: blob for sender, blob in rows if sender in wanted}


def record_answer(row: SecAggMember, answer: dict[str, Any]) -> None:
    row.unmask_answer = answer


def forget_round(session: Session, round_id: int) -> None:
    """An ended round's routed ciphertexts and unmasking answers (shares of secrets) go."""
    session.execute(delete(SecAggShare).where(SecAggShare.round_id == round_id))
    session.execute(update(SecAggMember).where(SecAggMember.round_id == round_id).values(unmask_answer=None))
