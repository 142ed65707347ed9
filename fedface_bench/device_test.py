"""`fedface bench device`'s report of the cold commands: one readable line per command, with its goal's verdict."""
from __future__ import annotations

from typing import Any

from fedface_bench.device import COMMAND_GOALS, command_goals, describe_commands


def _row(wall_s: float, rss_mb: float, goal: dict[str, float] | None = None) -> dict[str, Any]:
    row: dict[str, Any] = {"wall_s": wall_s, "cpu_s": wall_s / 2, "peak_rss_mb": rss_mb}
    if goal is not None:
        row |= {"goal": goal, "met": wall_s <= goal["wall_s"] and rss_mb <= goal["peak_rss_mb"]}
    return row


def test_each_goal_gets_a_line_saying_whether_it_is_met() -> None:
    # Prepare: register within its goals, enroll over its memory goal, verify over its time goal
    result = {
        "photos": 10, "repeats": 3, "cpus": 2, "load_average": (0.5, 0.4, 0.3), "met": False,
        "register": _row(0.5, 70, COMMAND_GOALS["register"]), "enroll": _row(1.5, 320, COMMAND_GOALS["enroll"]),
        "verify": _row(0.45, 160, COMMAND_GOALS["verify"]), "unenroll": _row(0.5, 70),
    }
    # Execute
    lines = describe_commands(result).splitlines()
    goals = command_goals(result)
    # Assert
    assert len(lines) == 5 and "medians of 3 fresh processes" in lines[0]
    assert lines[1].startswith("  fedface device register:") and lines[1].endswith("(goals 1 s, 200 MB): met")
    assert "enroll, 10 new photos:" in lines[2] and "320 MB" in lines[2] and lines[2].endswith("NOT met")
    assert "verify, 1 photo:" in lines[3] and "0.45 s (0.23)" in lines[3] and lines[3].endswith("(goals 0.4 s, 200 MB): NOT met")
    assert "unenroll:" in lines[4] and "goals" not in lines[4]
    # the JSON's goals_met judges time and memory apart: what each missed
    assert {name: goal["met"] for name, goal in goals.items()} == {
        "register_wall_s": True, "register_peak_rss_mb": True, "enroll_wall_s": True, "enroll_peak_rss_mb": False,
        "verify_wall_s": False, "verify_peak_rss_mb": True,
    }
    assert goals["enroll_peak_rss_mb"] == {"target": 300, "compare": "<=", "measured": 320, "met": False}
