"""Plots and markdown tables from a folder of FedFusion reports (PARTITION-FUSION.json).

`python -m simulator.fusion.report simulator/fusion_runs --plots simulator/fusion_plots` prints the
tables FEDFUSION.md quotes, so every number there is computed here from the saved runs.
"""
from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from facecore.eval.plots import save_line_plot
from simulator.fusion.config import FUSIONS, PARTITIONS


def load_reports(folder: Path) -> list[dict[str, Any]]:
    reports = [json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))]
    order = {(p, f): i for i, (p, f) in enumerate((p, f) for p in PARTITIONS for f in FUSIONS)}
    return sorted((r for r in reports if "history" in r), key=lambda r: order.get((r["partition"], r["fusion"]), 99))


def rounds_to(report: dict[str, Any], target: float) -> int | None:
    return next((h["round"] for h in report["history"][1:] if h["acc"] >= target), None)


def _by_partition(reports: Sequence[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    groups: dict[str, list[dict[str, Any]]] = {}
    for r in reports:
        groups.setdefault(r["partition"], []).append(r)
    return groups


def _data_name(report: dict[str, Any]) -> str:
    """The data set a run used, as its plot titles say it (reports written before it was recorded were MNIST)."""
    source = str(report.get("data", {}).get("source") or "mnist")
    return {"mnist": "MNIST", "fashion-mnist": "Fashion-MNIST"}.get(source, Path(source).name)


def write_plots(reports: Sequence[dict[str, Any]], out: Path) -> list[Path]:
    paths = []
    for partition, group in _by_partition(reports).items():
        name = _data_name(group[0])
        acc = {r["fusion"]: ([h["round"] for h in r["history"]], [h["acc"] for h in r["history"]]) for r in group}
        paths.append(save_line_plot(out / f"accuracy_{partition}.png", acc, "round", "global test accuracy", f"{name}, {partition} partition"))
        mb = {r["fusion"]: ([h["round"] * r["bytes_per_round"] / 1e6 for h in r["history"]], [h["acc"] for h in r["history"]]) for r in group}
        paths.append(save_line_plot(out / f"accuracy_vs_mb_{partition}.png", mb, "cumulative MB (all selected nodes, up + down)",
                                    "global test accuracy", f"{name}, {partition}: accuracy per communicated MB"))
        late = {r["fusion"]: (list(range(len(r["late_join"]["acc_by_epoch"]))), r["late_join"]["acc_by_epoch"]) for r in group}
        paths.append(save_line_plot(out / f"late_join_{partition}.png", late, "local epochs of the new node",
                                    "accuracy on the new node's test images", f"late-joining node, {partition}"))
    return paths


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.1f}"


def _saving(mine: int | None, base: int | None, cap: int) -> str:
    """Communication saved vs FedAvg to reach the target (same bytes model for both)."""
    if mine is None:
        return "not reached"
    if base is None:
        return f"> {100 * (1 - mine / cap):.0f}% (FedAvg not reached)"
    saved = round(100 * (1 - mine / base))
    return f"{saved + 0}%"  # + 0 turns -0 into 0


def tables(reports: Sequence[dict[str, Any]], extra_targets: Sequence[float] = (0.8, 0.85, 0.9, 0.95, 0.97)) -> str:
    lines: list[str] = []
    for partition, group in _by_partition(reports).items():
        base = next((r for r in group if r["fusion"] == "none"), None)
        target = group[0]["target_acc"]
        rounds = group[0]["config"]["rounds"]
        lines += [f"### {partition}", "",
                  f"| fusion | final acc % | mean last 5 % | best % | rounds to {_pct(target)}% | bytes/round | MB to {_pct(target)}% | "
                  f"comm. saved vs FedAvg | late node: epochs to {_pct(group[0]['late_join']['target'])}% | late acc % @0/1/5 epochs |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for r in group:
            reached = r["rounds_to_target"]
            mb = "—" if r["bytes_to_target"] is None else f"{r['bytes_to_target'] / 1e6:.1f}"
            saved = _saving(r["bytes_to_target"], base["bytes_to_target"] if base else None, (rounds + 1) * (base or r)["bytes_per_round"])
            curve = r["late_join"]["acc_by_epoch"]
            at = "/".join(_pct(curve[e]) if e < len(curve) else "—" for e in (0, 1, 5))
            lines.append(
                f"| {r['fusion']} | {_pct(r['final_acc'])} | {_pct(r['final_acc_last5_mean'])} | {_pct(r['best_acc'])} | "
                f"{reached if reached is not None else f'> {rounds}'} | {r['bytes_per_round']:,} | {mb} | "
                f"{saved if r['fusion'] != 'none' else '(baseline)'} | "
                f"{r['late_join']['epochs_to_target'] if r['late_join']['epochs_to_target'] is not None else 'not reached'} | {at} |"
            )
        lines += ["", "Rounds to other accuracy targets, same runs (communication saved vs FedAvg in brackets; rounds × bytes/round):", "",
                  "| fusion | " + " | ".join(f"{_pct(t)}%" for t in extra_targets) + " |", "| --- |" + " ---: |" * len(extra_targets)]
        for r in group:
            cells = []
            for t in extra_targets:
                mine = rounds_to(r, t)
                ref = rounds_to(base, t) if base else None
                # a partition without a FedAvg run has nothing to save against
                saved = "" if base is None or r["fusion"] == "none" or mine is None else " (" + _saving(
                    mine * r["bytes_per_round"], None if ref is None else ref * base["bytes_per_round"], (rounds + 1) * base["bytes_per_round"]) + ")"
                cells.append(("—" if mine is None else str(mine)) + saved)
            lines.append(f"| {r['fusion']} | " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("runs", type=Path)
    parser.add_argument("--plots", type=Path, default=None)
    args = parser.parse_args(argv)
    reports = load_reports(args.runs)
    if args.plots:
        for path in write_plots(reports, args.plots):
            print(f"wrote {path}")
    print(tables(reports))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
