"""Which candidates a round takes: the round server's rule, which the simulator runs too.

Least recently selected first (never-selected devices before all others), ties in random order, so
over many rounds every available device trains about equally often and no device is starved by bad
luck. DP-FedAvg rounds do not use this: their accountant assumes an independent (Poisson) draw of
each device (facecore.federation.strategies.dp_fedavg.poisson_selected).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence


def least_recently_selected(last_selected: Sequence[int | None], slots: int, tie_break: Callable[[], float]) -> list[int]:
    """Indices of the `slots` candidates chosen, in choice order. `last_selected[i]` is the round that
    last selected candidate i (None: never); `tie_break` draws one uniform number per candidate."""
    keys = [(-1 if last is None else last, tie_break()) for last in last_selected]
    return sorted(range(len(keys)), key=keys.__getitem__)[:max(slots, 0)]
