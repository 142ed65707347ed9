"""`fedface bench device --commands-only` end to end at toy scale: its own real server, cold `fedface device`
processes. Asserts the JSON contract and that each goal's verdict follows from its figures, never the timings
themselves: those depend on the machine and are the benchmark's output."""
from __future__ import annotations

import argparse
import json

import pytest

from fedface.commands import bench
from fedface_bench.device import COMMAND_GOALS


@pytest.mark.slow
def test_bench_device_measures_each_cold_command_against_its_goal(capsys: pytest.CaptureFixture[str]) -> None:
    # Prepare
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    # Execute: one measured run of each command (after the unmeasured one)
    code = bench.run(parser.parse_args(["device", "--commands-only", "--commands-repeats", "1", "--json"]))
    result = json.loads(capsys.readouterr().out)  # stdout is exactly one JSON object
    # Assert
    assert code == 0 and set(result) == {"commands", "goals_met", "all_goals_met"}
    commands = result["commands"]
    assert commands["photos"] == 10 and commands["repeats"] == 1
    for name, goal in COMMAND_GOALS.items():
        row = commands[name]
        assert row["goal"] == goal and len(row["wall_s_all"]) == len(row["peak_rss_mb_all"]) == 1
        assert row["wall_s"] > 0 and row["cpu_s"] > 0 and row["peak_rss_mb"] > 10
        assert row["met"] is (row["wall_s"] <= goal["wall_s"] and row["peak_rss_mb"] <= goal["peak_rss_mb"])
    assert "met" not in commands["unenroll"] and commands["unenroll"]["wall_s"] > 0
    assert commands["met"] is all(commands[name]["met"] for name in COMMAND_GOALS)
    assert result["all_goals_met"] is commands["met"]
    for name, goal in COMMAND_GOALS.items():
        wall, rss = result["goals_met"][f"{name}_wall_s"], result["goals_met"][f"{name}_peak_rss_mb"]
        assert (wall["target"], wall["measured"], rss["target"], rss["measured"]) == (
            goal["wall_s"], commands[name]["wall_s"], goal["peak_rss_mb"], commands[name]["peak_rss_mb"])
        assert (wall["met"] and rss["met"]) is commands[name]["met"]
