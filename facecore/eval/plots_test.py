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


def test_a_long_label_goes_below_the_plot_without_widening_it(tmp_path: Path) -> None:
    # Prepare: a simulator run's label, wider than the axes
    from PIL import Image

    label = "fedface-no-spreadout (mean init, last 8 blocks, clean enrolment, trained on, templates fixed) [camera: lowlight-ir]"
    rounds = np.arange(3)
    # Execute
    save_line_plot(tmp_path / "short.png", {"train": (rounds, rounds)}, "round", "TAR", "TAR")
    save_line_plot(tmp_path / "long.png", {label: (rounds, rounds), "seed 1": (rounds, rounds + 1)}, "round", "TAR", "TAR")
    # Assert: the figure keeps its width (a legend placed beside or across the axes widens the saved image)
    short, long = (Image.open(tmp_path / f"{name}.png").size for name in ("short", "long"))
    assert long[0] <= short[0] * 1.05 and long[1] > short[1]  # wrapped below, so only taller
