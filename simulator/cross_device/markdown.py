"""The markdown side of a cross-device report: one table row per run, then per-round curves.

Plots say the same thing faster; this is for reading in a pull request or a terminal, and it
carries the numbers (split sizes, seeds, configuration) a plot leaves out.
"""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any


def label(report: dict[str, Any]) -> str:
    """The run's name in tables and plots; a figure on a subset of the LFW photos, or through a fleet
    camera, says so."""
    subset, capture = report.get("lfw_subset"), report.get("capture")
    return (_method_label(report) + ("" if not subset else f" [LFW subset: {subset['photos']} photos, {subset['pairs']} pairs]")
            + ("" if not capture else f" [camera: {capture}]"))


def _method_label(report: dict[str, Any]) -> str:
    if report["method"] == "pretrained":
        return "pretrained"
    if report["method"] == "central":
        return f"central ({report['rounds']} epochs)"  # no class embeddings trained, so no init to name
    config = report.get("config") or {}
    local = config.get("local") or {}
    dp, blur = config.get("dp_epsilon"), config.get("template_noise_cos")
    details = "" if dp is None else f", DP ε={dp:g}"
    details += "" if blur is None else f", template noise cos {blur:g}"
    details += "" if local.get("margin", 0.9) == 0.9 else f", m={local['margin']:g}"
    details += "" if local.get("trainable_blocks") is None else f", last {local['trainable_blocks']} blocks"
    details += "" if config.get("enrolment", "captured") == "captured" else f", {config['enrolment']} enrolment"
    details += ", trained on" if config.get("train_enrolment") else ""
    details += "" if local.get("train_embedding", True) else ", templates fixed"
    return f"{report['method']} ({report['init']} init{details})"


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


def fold_gain(report: dict[str, Any], far: str = "1e-3") -> tuple[float, float, int] | None:
    """TAR gain in points from the run's start to its end, fold by fold on the same people: (mean,
    standard deviation over folds, folds that gained). A gain beats the fold-to-fold noise when
    its mean exceeds twice the standard error, std / sqrt(folds)."""
    start, end = report.get("initial_tar_at_far_per_fold"), report.get("tar_at_far_per_fold")
    if not start or not end or far not in start or far not in end:
        return None
    return paired_gain(start[far], end[far])


def paired_gain(start: Sequence[float], end: Sequence[float]) -> tuple[float, float, int]:
    """(mean, standard deviation, how many gained) of `end - start` in points, pair by pair."""
    gains = [100 * (b - a) for a, b in zip(start, end, strict=True)]
    mean = sum(gains) / len(gains)
    std = (sum((g - mean) ** 2 for g in gains) / (len(gains) - 1)) ** 0.5 if len(gains) > 1 else 0.0
    return mean, std, sum(g > 0 for g in gains)


def beyond_noise(mean: float, std: float, pairs: int) -> bool:
    """A paired gain (or loss) counts when its mean exceeds twice its standard error."""
    return pairs >= 2 and abs(mean) > 2 * std / pairs ** 0.5


def _owner_cell(report: dict[str, Any], key: str) -> str:
    start, end = report.get(f"initial_{key}") or {}, report.get(key) or {}
    if not end:
        return "n/a"
    pair = lambda o: f"{_pct(o.get('genuine_accept'))} / {_pct(o.get('impostor_accept'))}"  # noqa: E731
    return f"{pair(start)} → {pair(end)}"


def gain_table(reports: Sequence[dict[str, Any]]) -> str:
    """Each run against its own start: the paired TAR gain per fold, and what the owners get on
    photos no device trained on, at the published threshold and at one recalibrated on folds 1-5."""
    head = ["run", "TAR@1e-3 gain (mean ± std over folds)", "folds up", "TAR@1e-4 gain", "beyond noise (1e-3)",
            "owners: genuine / impostor accept %, published threshold (start → end)", "same, threshold recalibrated"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in reports:
        g3, g4 = fold_gain(r, "1e-3"), fold_gain(r, "1e-4")
        folds = len((r.get("tar_at_far_per_fold") or {}).get("1e-3", []))
        beyond = "n/a" if g3 is None or folds < 2 else ("yes" if g3[0] > 0 and beyond_noise(g3[0], g3[1], folds) else "no")
        rows.append("| " + " | ".join([
            label(r), "n/a" if g3 is None else f"{g3[0]:+.2f} ± {g3[1]:.2f}", "n/a" if g3 is None else f"{g3[2]}/{folds}",
            "n/a" if g4 is None else f"{g4[0]:+.2f} ± {g4[1]:.2f}", beyond, _owner_cell(r, "owners"), _owner_cell(r, "owners_recalibrated"),
        ]) + " |")
    return "\n".join(rows)


def clean_table(reports: Sequence[dict[str, Any]]) -> str:
    """Runs through a fleet camera: their figures on the captured photos beside those on the same
    photos clean, so a gain on the camera is read against what the web photos lose."""
    head = ["run", "camera", "LFW acc % captured (start → end)", "LFW acc % clean", "TAR@1e-3 % captured", "TAR@1e-3 % clean"]
    rows = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in reports:
        if not r.get("capture"):
            continue
        clean, clean0 = r.get("clean") or {}, r.get("initial_clean") or {}
        tar = lambda figures: (figures.get("tar_at_far") or {}).get("1e-3")  # noqa: E731
        rows.append("| " + " | ".join([
            label(r), r["capture"], f"{_pct(r['initial_accuracy'])} → {_pct(r['accuracy'])}",
            f"{_pct(clean0.get('accuracy'))} → {_pct(clean.get('accuracy'))}",
            f"{_pct(r['initial_tar_at_far'].get('1e-3'))} → {_pct(r['tar_at_far'].get('1e-3'))}", f"{_pct(tar(clean0))} → {_pct(tar(clean))}",
        ]) + " |")
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
        *([f"Fleet camera(s): {sorted({r['capture'] for r in reports if r.get('capture')})}: every device photo and the evaluation's "
           "LFW photos as that camera takes them (facecore.capture; on the aligned crop, the detector is not simulated).", ""]
          if any(r.get("capture") for r in reports) else []),
        summary_table(reports, loss_target), "",
        *([clean_table(reports), ""] if any(r.get("capture") for r in reports) else []),
        *([gain_table(reports), ""] if any(r.get("tar_at_far_per_fold") for r in reports) else []),
        *[f"![{p.stem}]({p.name})" for p in plots], "",
    ]
    for r in reports:
        local = r["config"]["local"]
        lines += [
            f"## {label(r)}", "",
            f"per round {r['per_round']} devices; local: epochs {local['epochs']}, lr {local['lr']}, momentum {local['momentum']}, "
            f"margin {local['margin']}, batch {local['batch']}, trainable blocks {local['trainable_blocks'] or 'all'}; "
            f"camera {r.get('capture') or 'none (the photos as they are)'}; "
            f"wall {r['wall_seconds'] / 60:.1f} min", "",
            history_table(r), "",
        ]
    path = out / "report.md"
    path.write_text("\n".join(lines))
    return path
