"""The periodic job every worker runs: selection windows, deadlines, stuck aggregations, the shared shards of
another replica's aggregation, nonce pruning. All of it is safe to run concurrently (decisions are made under locks).

Each step is its own transaction: the nonce pruning, the selection, and aggregation's (services.aggregation)."""
from __future__ import annotations

import asyncio
import time

import anyio

from facecore.federation.status import RoundStatus
from server_api.core.db import session_scope, transaction
from server_api.core.logging import get_logger
from server_api.crud import devices as device_crud
from server_api.crud import rounds as round_crud
from server_api.services import rounds
from server_api.services.aggregation import help_aggregate, try_aggregate
from server_api.services.auth import nonce_cutoff
from server_api.services.context import ServerContext
from server_api.tables import utcnow

log = get_logger("scheduler")
NONCE_PRUNE_INTERVAL_S = 60.0


def tick(ctx: ServerContext) -> str | None:
    """One pass; returns the aggregation outcome when an active round was looked at."""
    now = utcnow()
    if time.monotonic() - ctx.last_nonce_prune > NONCE_PRUNE_INTERVAL_S:
        with session_scope(ctx.sessions) as session, transaction(session):
            device_crud.prune_nonces(session, nonce_cutoff(ctx.settings.signature_window_s))
        ctx.limits.prune()
        ctx.last_nonce_prune = time.monotonic()
    with session_scope(ctx.sessions) as session:
        active = round_crud.active_round(session)
        if active is None:
            return None
        round_id, needs_selection = active.id, active.status == RoundStatus.OPEN and not active.selection_done and now >= active.selection_at
    if needs_selection:
        with session_scope(ctx.sessions) as session, transaction(session):
            rounds.run_selection_if_due(session, round_id, now)
    outcome = try_aggregate(ctx, round_id)
    if outcome == "busy" and ctx.settings.aggregation_shared_shards:
        help_aggregate(ctx, round_id)  # another replica aggregates: sum the shards it shares
    return outcome


async def run_forever(ctx: ServerContext) -> None:
    while True:
        try:
            await anyio.to_thread.run_sync(tick, ctx)
        except Exception:  # keep the loop alive; the next tick retries
            log.exception("scheduler tick failed")
        await asyncio.sleep(ctx.settings.scheduler_interval_s)
