"""The markdown side of a cross-device report: one table row per run, then per-round curves.

Plots say the same thing faster; this is for reading in a pull request or a terminal, and it
carries the numbers (split sizes, seeds, configuration) a plot leaves out.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any


def label(report: dict[str, Any]) -> str:
    if report["method"] in ("central", "pretrained"):
        return report["method"]  # no class embeddings trained, so no init to name
    dp = (report.get("config") or {}).get("dp_epsilon")
    privacy = "" if dp is None else f", DP ε={dp:g}"
    blur = (report.get("config") or {}).get("template_noise_cos")
    privacy += "" if blur is None else f", template noise cos {blur:g}"
    return f"{report['method']} ({report['init']} init{privacy})"


def rounds_to_loss(report: dict[str, Any], target: float) -> int | None:
    """First round whose devices start training (loss_before, averaged over that round's devices)
    at or below `target`: how fast the class embeddings and the backbone agree, independent of
    the evaluation cadence."""
    for record in report["history"]:
        loss = record.get("loss_before")
        if record.get("round", 0) > 0 and loss is not None and loss <= target:
            return int(record["round"])
    return None


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.2f}"


def _final_spread(report: dict[str, Any]) -> str:
    spreads = [h["embedding_mean_cos"] for h in report["history"] if "embedding_mean_cos" in h]
    return f"{spreads[0]:.5f} → {spreads[-1]:.5f}" if spreads else "n/a"  # collapse starts in the 4th decimal


def summary_table(reports: Sequence[dict[str, Any]], loss_target: float | None = None) -> str:
    head = ["run", "devices", "rounds", "LFW acc % (start → end)", "TAR@1e-3 %", "TAR@1e-4 %", "embedding mean cos", "rounds to acc target",
            "s/round"]
    if loss_target is not None:
        head.insert(-1, f"rounds to loss ≤ {loss_target:g}")
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in reports:
        tar, tar0 = r["tar_at_far"], r["initial_tar_at_far"]
        cells = [
            label(r), str(r["devices"]), str(r["rounds"]), f"{_pct(r['initial_accuracy'])} → {_pct(r['accuracy'])}",
            f"{_pct(tar0.get('1e-3'))} → {_pct(tar.get('1e-3'))}", f"{_pct(tar0.get('1e-4'))} → {_pct(tar.get('1e-4'))}",
            _final_spread(r),
            "n/a" if r.get("target_accuracy") is None else str(r["rounds_to_target"] or f"not in {r['rounds']}"),
            f"{r['seconds_per_round']:.1f}",
        ]
        if loss_target is not None:
            reached = rounds_to_loss(r, loss_target)
            cells.insert(-1, str(reached) if reached is not None else f"not in {r['rounds']}")
        rows.append("| " + " | ".join(cells) + " |")
    return "\n".join(rows)


def history_table(report: dict[str, Any]) -> str:
    rows = ["| round | train loss (before → after) | embedding mean cos | LFW acc % | TAR@1e-3 % | s |", "|---|---|---|---|---|---|"]
    for h in report["history"]:
        loss = "" if h.get("loss_before") is None else f"{h['loss_before']:.4f} → {h.get('train_loss', float('nan')):.4f}"
        spread = "" if h.get("embedding_mean_cos") is None else f"{h['embedding_mean_cos']:.4f}"
        acc = "" if "accuracy" not in h else _pct(h["accuracy"])
        tar = "" if "tar_at_far" not in h else _pct(h["tar_at_far"].get("1e-3"))
        seconds = "" if h.get("seconds") is None else f"{h['seconds']:.1f}"
        rows.append(f"| {h['round']} | {loss} | {spread} | {acc} | {tar} | {seconds} |")
    return "\n".join(rows)


def write_markdown(reports: Sequence[dict[str, Any]], out: Path, plots: Sequence[Path], loss_target: float | None = None) -> Path:
    first = reports[0]
    lines = [
        "# Cross-device FedFace simulation", "",
        f"Seed(s): {sorted({r['seed'] for r in reports})}. Split sizes: {first['split_sizes']}. "
        f"Device photos: {first['device_images']} over {first['devices']} devices (one identity each). "
        "Evaluation: LFW folds disjoint from every training identity.", "",
        summary_table(reports, loss_target), "",
        *[f"![{p.stem}]({p.name})" for p in plots], "",
    ]
    for r in reports:
        local = r["config"]["local"]
        lines += [
            f"## {label(r)}", "",
            f"per round {r['per_round']} devices; local: epochs {local['epochs']}, lr {local['lr']}, momentum {local['momentum']}, "
            f"margin {local['margin']}, batch {local['batch']}, trainable blocks {local['trainable_blocks'] or 'all'}; "
            f"wall {r['wall_seconds'] / 60:.1f} min", "",
            history_table(r), "",
        ]
    path = out / "report.md"
    path.write_text("\n".join(lines))
    return path
