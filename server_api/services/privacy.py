"""A DP-FedAvg round's privacy record: its parameters and ε over every completed DP round so far,
composed by RDP (facecore.federation.strategies.dp_fedavg.epsilon_of_history)."""
from __future__ import annotations

import math
from typing import Any

from facecore.federation.config import AggregationSettings
from facecore.federation.strategies.dp_fedavg import epsilon_of_history
from server_api.core.db import session_scope
from server_api.crud import rounds as round_crud
from server_api.services.context import ServerContext


def round_privacy(
    ctx: ServerContext, round_id: int, settings: AggregationSettings, sample_rate: float, population: int | None, expected: int,
) -> dict[str, Any]:
    """This round's DP-FedAvg parameters and ε over every completed DP round so far, this one
    included, composed by RDP at this round's δ. The sample rate is the one the round's Poisson
    selection used (target / enrolled devices at selection), and the mean's denominator is the
    fixed expected count (the target), so the accountant's assumptions are what the round did."""
    this = (settings.dp_noise_multiplier, sample_rate, 1)
    with session_scope(ctx.sessions) as session:
        history = [
            (r.summary["privacy"]["noise_multiplier"], r.summary["privacy"]["sample_rate"], 1)
            for r in round_crud.completed_rounds(session) if r.id != round_id and r.summary and "privacy" in r.summary
        ]
    delta = settings.dp_delta
    return {
        "noise_multiplier": this[0], "clip_norm": settings.max_update_norm, "sample_rate": sample_rate,
        "population": population, "expected_clients": expected, "selection": "poisson",
        "delta": delta, "dp_rounds": len(history) + 1, "epsilon": _finite(epsilon_of_history([*history, this], delta)),
    }


def _finite(epsilon: float) -> float | None:
    """JSON (and PostgreSQL's json) has no infinity: no noise means no guarantee, stored as null."""
    return None if math.isinf(epsilon) else round(epsilon, 4)
