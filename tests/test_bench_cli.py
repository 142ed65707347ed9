"""`fedface bench` as a script or a person meets it (issue 37): stdout is the result alone (one JSON line
with --json), progress goes to stderr while it runs, and every goal says whether this run met it.

The smallest real runs: secure aggregation of a few devices (no goals), and detection on 16 LFW photos
(goals judged). Timings are the benchmarks' output, never asserted here.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "fedface", "bench", *args], capture_output=True, text=True, cwd=REPO,
                          env={**os.environ, "PYTHONUNBUFFERED": "1"}, timeout=600)


def test_secagg_prints_one_json_line_and_its_steps_on_stderr() -> None:
    # Execute: three and five devices of a 1,000-parameter update, the second timed by units
    result = _bench("secagg", "--devices", "3,5", "--dim", "1000", "--full-protocol-max", "3", "--json")
    # Assert: stdout is one JSON object with the goal keys every bench has; stderr says what ran
    assert result.returncode == 0, result.stderr
    (line,) = result.stdout.splitlines()
    report = json.loads(line)
    assert [row["devices"] for row in report["rows"]] == [3, 5]
    assert report["goals_met"] == {} and report["all_goals_met"] is None  # secure aggregation has no speed goal
    steps = [text for text in result.stderr.splitlines() if text.startswith("fedface bench secagg [")]
    assert len(steps) == 2 and "3 devices, 1,000 parameters: every device for real" in steps[0]
    assert "5 devices" in steps[1] and "timed" in steps[1]


def test_detect_says_for_each_goal_its_target_measure_and_verdict(real_data: Path) -> None:
    # Execute: 16 LFW photos, one round, no tight crops
    result = _bench("detect", "--photos", "16", "--rounds", "1", "--tight", "0", "--data", str(real_data), "--json")
    # Assert: each goal judged from its own measured value, the verdicts agree with the older `goals` list
    assert result.returncode == 0, result.stderr
    (line,) = result.stdout.splitlines()
    report = json.loads(line)
    goals = report["goals_met"]
    assert set(goals) == {"photos_per_s", "over_mtcnn"}
    for goal in goals.values():
        assert set(goal) == {"target", "compare", "measured", "met"} and goal["compare"] == ">="
        assert goal["met"] is (goal["measured"] >= goal["target"])
    assert report["all_goals_met"] is all(goal["met"] for goal in goals.values())
    assert [goal["met"] for goal in goals.values()] == [goal["met"] for goal in report["goals"]]
    assert "fedface bench detect [" in result.stderr and "loading the detectors" in result.stderr
