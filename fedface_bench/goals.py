"""Goals as every `fedface bench` JSON reports them: each with its target, what this run measured, and
whether it was met.

Invariants:
- A bench's JSON object carries `goals_met`, {goal name: {"target", "compare", "measured", "met"}}, and
  `all_goals_met`; `fedface bench sim` prints a list (one object per device count), and each object carries them.
- `compare` is "<=" or ">=": `met` is `measured compare target`. `met` is None where this run says nothing
  about the goal (the server's goals are stated for 1,000 devices; a smaller run is not judged), and
  `all_goals_met` is None when no goal was judged (a bench without goals: export, secagg).
- The keys each bench printed before (`goals`, `ingest_goal_met`, the commands' `met`, ...) stay as they were;
  `goals_met` is added beside them.
"""
from __future__ import annotations

from collections.abc import Mapping
from typing import Any

Goal = dict[str, Any]


def at_most(target: float, measured: float | None, judged: bool = True) -> Goal:
    """A goal met when `measured` <= `target` (seconds, megabytes)."""
    return _goal(target, "<=", measured, judged)


def at_least(target: float, measured: float | None, judged: bool = True) -> Goal:
    """A goal met when `measured` >= `target` (photos/s, ratios)."""
    return _goal(target, ">=", measured, judged)


def _goal(target: float, compare: str, measured: float | None, judged: bool) -> Goal:
    if not judged:
        met = None
    elif measured is None:  # the run measured nothing (a round that never completed): missed
        met = False
    else:
        met = measured <= target if compare == "<=" else measured >= target
    return {"target": target, "compare": compare, "measured": measured, "met": met}


def with_goals(result: dict[str, Any], goals: Mapping[str, Goal]) -> dict[str, Any]:
    """`result` with `goals_met` (merged into any already there) and `all_goals_met` set."""
    merged = {**result.get("goals_met", {}), **goals}
    judged = [goal["met"] for goal in merged.values() if goal["met"] is not None]
    result["goals_met"] = merged
    result["all_goals_met"] = all(judged) if judged else None
    return result


def verdict(goal: Goal) -> str:
    """The word a report prints for a goal: met, NOT met, or n/a."""
    return "n/a" if goal["met"] is None else ("met" if goal["met"] else "NOT met")
