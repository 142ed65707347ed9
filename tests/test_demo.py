"""`fedface demo` (what `make run` runs) to the end, small: a real server process, real faces through the
SDK, a fleet camera on every device, and rounds whose device loss is not zero."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from simulator.demo import run_demo


@pytest.mark.slow
def test_the_demo_adapts_to_its_fleet_camera_and_scores_both_views(real_data: Path, tmp_path: Path) -> None:
    # Execute: 2 devices, 2 rounds on `mobile` (it ships a feature centre), a small seeded evaluation
    report = run_demo(real_data, tmp_path / "out", devices=2, rounds=2, model="mobile", folds=(6, 7), eval_photos=40, capture="lowlight-ir")
    # Assert: every round trained on a loss that is not zero, and each model was scored clean and under the camera
    history = report["history"]
    assert report["capture"] == "lowlight-ir" and [h["round"] for h in history] == [0, 1, 2]
    assert all(h["train_loss_before"] > 0.01 and h["train_loss_after"] < h["train_loss_before"] for h in history[1:])
    assert all({"accuracy", "auc", "tar_at_far"} <= h["captured"].keys() for h in history)
    assert history[0]["captured"]["auc"] < history[0]["auc"]  # the camera makes faces harder to tell apart
    assert json.loads((tmp_path / "out" / "demo.json").read_text())["history"] == json.loads(json.dumps(history, default=str))
    assert (tmp_path / "out" / "demo_tar.png").stat().st_size > 0
