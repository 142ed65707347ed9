"""PNG plots for evaluation reports: ROC curves and training curves.

Files are written atomically (temp file in the target folder, then os.replace), so
a reader such as the server never sees a half-written image.
"""
from __future__ import annotations

import os
import tempfile
import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

FAR_MIN = 1e-5
FAR_MARKS = (1e-3, 1e-4)
LEGEND_WIDTH = 70  # characters a legend line holds below a 6-inch plot


def _pyplot() -> Any:
    import matplotlib

    # Headless servers and CI have no display; Agg renders straight to PNG.
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save_atomic(fig: Any, path: str | os.PathLike[str]) -> Path:
    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fig.savefig(fh, format="png", dpi=120, bbox_inches="tight")
        os.replace(tmp, target)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return target


def save_roc_plot(
    path: str | os.PathLike[str],
    curves: Mapping[str, tuple[Any, Any]],
    title: str,
) -> Path:
    """ROC curves (TAR against log-scale FAR from 1e-5 to 1), one per model label.

    Points at FAR 0 cannot sit on a log axis and are dropped; dashed lines mark
    FAR 1e-3 and 1e-4, the operating points reported as TAR@FAR.
    """
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4.5))
    try:
        for label, (far, tar) in curves.items():
            far_a, tar_a = np.asarray(far, dtype=float), np.asarray(tar, dtype=float)
            keep = far_a > 0
            ax.plot(far_a[keep], tar_a[keep], label=label)
        for mark in FAR_MARKS:
            ax.axvline(mark, color="grey", linestyle="--", linewidth=0.8)
        ax.set_xscale("log")
        ax.set_xlim(FAR_MIN, 1.0)
        ax.set_ylim(0.0, 1.0)
        ax.set_xlabel("False accept rate")
        ax.set_ylabel("True accept rate")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        if curves:
            ax.legend(loc="lower right")
        return _save_atomic(fig, path)
    finally:
        plt.close(fig)


def save_line_plot(
    path: str | os.PathLike[str],
    series: Mapping[str, tuple[Any, Any]],
    xlabel: str,
    ylabel: str,
    title: str,
    bands: Mapping[str, tuple[Any, Any, Any]] | None = None,
) -> Path:
    """Line plot of one or more (x, y) series, e.g. loss or accuracy per round; `bands` shades a
    series' (x, low, high) range in its colour, e.g. the spread over seeds around their mean."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 4.5))
    try:
        for label, (x, y) in series.items():
            (line,) = ax.plot(np.asarray(x, dtype=float), np.asarray(y, dtype=float), label=label)
            if bands and label in bands:
                bx, low, high = (np.asarray(v, dtype=float) for v in bands[label])
                ax.fill_between(bx, low, high, color=line.get_color(), alpha=0.2, linewidth=0)
        ax.set_xlabel(xlabel)
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(True, alpha=0.3)
        if series:  # below the axes, wrapped: a run's label is often wider than the plot, and inside it would hide the lines
            handles, labels = ax.get_legend_handles_labels()
            ax.legend(handles, [textwrap.fill(label, LEGEND_WIDTH) for label in labels], loc="upper center",
                      bbox_to_anchor=(0.5, -0.14), fontsize="small", frameon=False)
        return _save_atomic(fig, path)
    finally:
        plt.close(fig)
