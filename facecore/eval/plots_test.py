from __future__ import annotations

from pathlib import Path

import numpy as np

from facecore.eval.metrics import roc_curve
from facecore.eval.plots import save_line_plot, save_roc_plot

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def test_save_roc_plot_writes_png(tmp_path: Path) -> None:
    # Prepare
    rng = np.random.default_rng(0)
    scores = np.r_[rng.normal(1.0, 1.0, 2000), rng.normal(0.0, 1.0, 20000)]
    labels = np.r_[np.ones(2000, int), np.zeros(20000, int)]
    far, tar, _ = roc_curve(scores, labels)
    target = tmp_path / "plots" / "roc.png"
    # Execute
    written = save_roc_plot(target, {"lbp": (far, tar), "chance": (far, far)}, "ROC")
    # Assert
    assert written == target
    assert target.read_bytes().startswith(PNG_SIGNATURE)
    assert [p.name for p in target.parent.iterdir()] == ["roc.png"]  # no temp file left


def test_save_line_plot_overwrites_atomically(tmp_path: Path) -> None:
    # Prepare
    target = tmp_path / "loss.png"
    target.write_bytes(b"old")
    rounds = np.arange(10)
    # Execute
    save_line_plot(target, {"train": (rounds, 1 / (rounds + 1))}, "round", "loss", "Loss")
    # Assert
    assert target.read_bytes().startswith(PNG_SIGNATURE)
    assert [p.name for p in tmp_path.iterdir()] == ["loss.png"]
