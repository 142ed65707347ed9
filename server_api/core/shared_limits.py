"""Rate buckets and upload slots that every server process on one PostgreSQL shares.

Several `fedface server` processes behind one address must enforce one device's rate and one cap
on upload bodies in flight, whichever process a request lands on. Both live in the database:

- :class:`SharedRateLimiter`: one row per (scope, key); a request refills and spends its bucket in
  one ``INSERT ... ON CONFLICT DO UPDATE`` (the row lock serialises concurrent requests for one key),
  and the row records whether that request got its token.
- :class:`SharedUploadSlots`: ``capacity`` rows; a holder takes a free (or expired) row with
  ``FOR UPDATE SKIP LOCKED`` and frees it when its body is checked. A process killed mid-upload
  cannot free its slot; the slot's lease (the body timeout plus the time to validate) frees it.

Times are the database clock's (``clock_timestamp()``), so processes on several hosts agree.
Invariants are those of :mod:`server_api.core.limits`: a refusal is a domain error with its retry
time, never a silent drop. Buckets that have refilled are deleted (:meth:`SharedRateLimiter.prune`), which
bounds the table by the keys active in the last ``burst / rate`` seconds.
"""
from __future__ import annotations

import math
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from sqlalchemy import Engine, text
from starlette.concurrency import run_in_threadpool

from server_api.errors import RateLimited, Unavailable

_NOW = "EXTRACT(EPOCH FROM clock_timestamp())"
_REFILLED = f"LEAST(:burst, rate_buckets.tokens + ({_NOW} - rate_buckets.at) * :rate)"
_SPEND = text(f"""
    INSERT INTO rate_buckets (scope, key, tokens, at, taken) VALUES (:scope, :key, :burst - 1, {_NOW}, true)
    ON CONFLICT (scope, key) DO UPDATE SET
        tokens = {_REFILLED} - CASE WHEN {_REFILLED} >= 1 THEN 1 ELSE 0 END,
        at = {_NOW},
        taken = {_REFILLED} >= 1
    RETURNING tokens, taken
""")
_PEEK = text(f"SELECT {_REFILLED} FROM rate_buckets WHERE scope = :scope AND key = :key")
_PRUNE = text(f"DELETE FROM rate_buckets WHERE scope = :scope AND {_REFILLED} >= :burst")
_CREATE_SLOTS = text("INSERT INTO upload_slots (slot) SELECT generate_series(0, :capacity - 1) ON CONFLICT DO NOTHING")
_TAKE_SLOT = text(f"""
    UPDATE upload_slots SET holder = :holder, until = {_NOW} + :lease_s
    WHERE slot = (
        SELECT slot FROM upload_slots WHERE slot < :capacity AND (holder IS NULL OR until < {_NOW})
        ORDER BY slot LIMIT 1 FOR UPDATE SKIP LOCKED
    )
    RETURNING slot
""")
_FREE_SLOT = text("UPDATE upload_slots SET holder = NULL, until = NULL WHERE slot = :slot AND holder = :holder")


def rate_refusal(what: str, tokens: float, rate_per_s: float) -> RateLimited:
    """The 429 for a bucket holding ``tokens`` (< 1): its retry time is when the next whole token is back."""
    retry_after = max(1, math.ceil((1.0 - tokens) / rate_per_s))
    return RateLimited(f"too many requests from this {what}; retry in {retry_after} s", retry_after)


class SharedRateLimiter:
    """:class:`server_api.core.limits.KeyedRateLimiter`'s contract, kept in the database. Blocking:
    call it off the event loop."""

    blocking = True

    def __init__(self, engine: Engine, rate_per_s: float, burst: int, what: str) -> None:
        self.engine, self.rate_per_s, self.burst, self.what = engine, rate_per_s, burst, what

    def _params(self, key: str) -> dict[str, object]:
        return {"scope": self.what, "key": key[:128], "burst": float(self.burst), "rate": self.rate_per_s}

    def check(self, key: str) -> None:
        if not self.rate_per_s:
            return
        with self.engine.connect() as connection:
            tokens = connection.scalar(_PEEK, self._params(key))
        if tokens is not None and tokens < 1.0:
            raise rate_refusal(self.what, float(tokens), self.rate_per_s)

    def _spend(self, key: str) -> tuple[float, bool]:
        with self.engine.begin() as connection:
            tokens, taken = connection.execute(_SPEND, self._params(key)).one()
        return float(tokens), bool(taken)

    def take(self, key: str) -> bool:
        return True if not self.rate_per_s else self._spend(key)[1]

    def charge(self, key: str) -> None:
        if not self.rate_per_s:
            return
        tokens, taken = self._spend(key)
        if not taken:
            raise rate_refusal(self.what, tokens, self.rate_per_s)

    def prune(self) -> int:
        """Delete the buckets that have refilled (a fresh bucket is the same); how many."""
        if not self.rate_per_s:
            return 0
        with self.engine.begin() as connection:
            return connection.execute(_PRUNE, self._params("")).rowcount


class SharedUploadSlots:
    """At most ``capacity`` upload bodies in flight across every process; the next is refused (503)."""

    def __init__(self, engine: Engine, capacity: int, lease_s: float) -> None:
        self.engine, self.capacity, self.lease_s = engine, capacity, lease_s
        with engine.begin() as connection:
            connection.execute(_CREATE_SLOTS, {"capacity": capacity})

    def _take(self, holder: str) -> int | None:
        with self.engine.begin() as connection:
            return connection.scalar(_TAKE_SLOT, {"holder": holder, "lease_s": self.lease_s, "capacity": self.capacity})

    def _free(self, slot: int, holder: str) -> None:
        with self.engine.begin() as connection:
            connection.execute(_FREE_SLOT, {"slot": slot, "holder": holder})

    def in_use(self) -> int:
        with self.engine.connect() as connection:
            query = text(f"SELECT count(*) FROM upload_slots WHERE slot < :capacity AND holder IS NOT NULL AND until >= {_NOW}")
            return int(connection.scalar(query, {"capacity": self.capacity}) or 0)

    @asynccontextmanager
    async def hold(self) -> AsyncIterator[None]:
        holder = str(uuid.uuid4())
        slot = await run_in_threadpool(self._take, holder)
        if slot is None:
            raise Unavailable(f"{self.capacity} uploads are already in progress; retry")
        try:
            yield
        finally:
            await run_in_threadpool(self._free, slot, holder)
