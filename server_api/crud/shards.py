"""The shards of a round whose replicas share its sum (services.aggregation_shards): queries only; the caller owns
the transaction. A claim is one conditional UPDATE per candidate, so two processes never both hold a shard's lease
on either backend (PostgreSQL re-reads the condition after a concurrent writer commits; SQLite has one writer)."""
from __future__ import annotations

from datetime import datetime
from typing import Any, NamedTuple, cast

from sqlalchemy import ColumnElement, CursorResult, delete, or_, select, update
from sqlalchemy.orm import Session

from server_api.tables import AggregationShard, table_of


class ShardState(NamedTuple):
    shard: int
    shard_updates: int
    holder: str | None
    lease_until: datetime | None
    partial_sha256: str | None


def shard_states(session: Session, round_id: int) -> list[ShardState]:
    """The round's shards in shard order ([] when its sum is not shared)."""
    rows = session.execute(
        select(AggregationShard.shard, AggregationShard.shard_updates, AggregationShard.holder, AggregationShard.lease_until,
               AggregationShard.partial_sha256)
        .where(AggregationShard.round_id == round_id).order_by(AggregationShard.shard)
    )
    return [ShardState(*row) for row in rows]


def add_shards(session: Session, round_id: int, count: int, shard_updates: int) -> None:
    session.execute(
        table_of(AggregationShard).insert(),
        [{"round_id": round_id, "shard": shard, "shard_updates": shard_updates} for shard in range(count)],
    )


def _claimable(round_id: int, now: datetime) -> list[ColumnElement[bool]]:
    return [
        AggregationShard.round_id == round_id, AggregationShard.partial_sha256.is_(None),
        or_(AggregationShard.lease_until.is_(None), AggregationShard.lease_until <= now),
    ]


def claim_shard(session: Session, round_id: int, holder: str, now: datetime, until: datetime) -> int | None:
    """Take the first shard that is not summed and whose lease is free or ran out; None when there is none."""
    candidates = session.execute(
        select(AggregationShard.shard).where(*_claimable(round_id, now)).order_by(AggregationShard.shard)
    ).scalars().all()
    for shard in candidates:
        taken = session.execute(
            update(table_of(AggregationShard)).where(AggregationShard.shard == shard, *_claimable(round_id, now))
            .values(holder=holder, lease_until=until)
        )
        if cast(CursorResult[Any], taken).rowcount == 1:
            return shard
    return None


def record_partial(session: Session, round_id: int, shard: int, holder: str, digest: str) -> bool:
    """Name the shard's partial sum; a shard summed twice (its lease ran out mid-sum) keeps the first digest, which
    is the same bytes. False when the shard's row is gone (its round ended)."""
    session.execute(
        update(table_of(AggregationShard))
        .where(AggregationShard.round_id == round_id, AggregationShard.shard == shard, AggregationShard.partial_sha256.is_(None))
        .values(partial_sha256=digest, holder=holder, lease_until=None)
    )
    return session.execute(
        select(AggregationShard.shard).where(AggregationShard.round_id == round_id, AggregationShard.shard == shard)
    ).first() is not None


def free_shard_size(session: Session, round_id: int, now: datetime) -> int | None:
    """The round's shard size when one of its shards is free to claim, else None."""
    return session.execute(
        select(AggregationShard.shard_updates).where(*_claimable(round_id, now)).limit(1)
    ).scalar_one_or_none()


def drop_shards(session: Session, round_id: int) -> list[str]:
    """Delete the round's shard rows; returns the digests of their partial sums."""
    digests = [state.partial_sha256 for state in shard_states(session, round_id) if state.partial_sha256]
    session.execute(delete(AggregationShard).where(AggregationShard.round_id == round_id))
    return digests
