"""`fedface bench detect` on a few real LFW photos: its JSON contract and verdicts that follow from its figures."""
import json
import subprocess
import sys
from pathlib import Path

from fedface_bench.detect import PHOTOS_PER_S_GOAL, RATIO_GOAL, goals


def test_the_json_line_names_each_detector_and_judges_each_goal(real_data: Path) -> None:
    # Prepare / Execute: the real command, small
    done = subprocess.run(
        [sys.executable, "-m", "fedface", "bench", "detect", "--photos", "16", "--rounds", "1", "--tight", "24", "--json",
         "--data", str(real_data)],
        capture_output=True, text=True, timeout=600, check=False,
    )
    # Assert
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["default_detector"] == "tinyface" and set(report["detectors"]) == {"tinyface", "mtcnn"}
    for row in report["detectors"].values():
        assert row["photos_per_s"] == max(row["photos_per_s_batch1"], row["photos_per_s_batch16"]) > 0
        assert 0 <= row["tight_found"] <= report["tight_crops"] <= 24
    assert [g["met"] for g in report["goals"]] == [g["met"] for g in goals(report)]


def test_verdicts_follow_the_figures() -> None:
    # Prepare: a report just under the speed goal and just over the ratio goal
    def row(speed: float, tight: float) -> dict[str, float]:
        return {"photos_per_s": speed, "tight_found_fraction": tight}

    report = {"default_detector": "tinyface",
              "detectors": {"tinyface": row(PHOTOS_PER_S_GOAL - 1, 0.995), "mtcnn": row((PHOTOS_PER_S_GOAL - 1) / (RATIO_GOAL + 0.1), 1.0)}}
    # Execute
    verdicts = [g["met"] for g in goals(report)]
    # Assert
    assert verdicts == [False, True, True]
