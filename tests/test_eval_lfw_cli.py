"""`fedface eval lfw` end to end: real LFW photos, real MTCNN, a real (untrained) backbone."""
import json
import os
import subprocess
import sys
from pathlib import Path


def test_eval_lfw_json_report_and_roc_plot(real_data: Path, tmp_path: Path, isolated_cache: Path) -> None:
    # Execute: 2 folds, 16 pairs each, TAR@FAR from the pairs' own photos
    result = subprocess.run(
        [sys.executable, "-m", "fedface", "eval", "lfw", "--model", "random", "--model", "lbp", "--folds", "6-7",
         "--max-pairs-per-fold", "16", "--pairs-only", "--json", "--out", str(tmp_path)],
        capture_output=True, text=True, env=dict(os.environ), timeout=900,
    )
    # Assert
    assert result.returncode == 0, result.stderr[-2000:]
    reports = json.loads(result.stdout)
    assert set(reports) == {"untrained", "LBP (classical)"}
    for report in reports.values():
        assert {"accuracy", "accuracy_std", "auc", "tar_at_far", "folds", "pairs"} <= set(report)
        assert report["folds"] == [6, 7] and report["pairs"] == 32
        assert set(report["tar_at_far"]) == {"1e-3", "1e-4"}
        assert 0.0 <= report["accuracy"] <= 1.0
    # too few impostor pairs among 60-odd photos for FAR 1e-4: reported as unmeasurable, not invented
    assert reports["untrained"]["tar_at_far"]["1e-4"] is None
    assert (tmp_path / "lfw_roc.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "lfw_untrained.json").is_file()
