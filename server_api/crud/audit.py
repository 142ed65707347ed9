"""Audit trail rows, added to the caller's transaction (committed with the change they describe)."""
from __future__ import annotations

from typing import Any

from sqlalchemy import insert
from sqlalchemy.orm import Session

from server_api.tables import AuditEvent, table_of


def record(session: Session, actor: str, action: str, round_id: int | None = None, device_id: str | None = None, **details: Any) -> None:
    # details carry ids, counts and reasons only: never embeddings or keys.
    session.add(AuditEvent(actor=actor, action=action, round_id=round_id, device_id=device_id, details=details))


def record_now(session: Session, actor: str, action: str, round_id: int | None = None, device_id: str | None = None, **details: Any) -> None:
    """:func:`record` as one INSERT executed now: for hot paths that write no ORM objects, so
    committing needs no unit-of-work flush."""
    session.execute(insert(table_of(AuditEvent)).values(actor=actor, action=action, round_id=round_id, device_id=device_id, details=details))
