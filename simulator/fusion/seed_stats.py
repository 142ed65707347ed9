"""Mean ± std over seeds for a FedFusion grid: rounds and megabytes to each accuracy target, the
communication each fusion saves against FedAvg, one statement per paper claim, and the plots.

A saving is paired by seed: 1 − MB(fusion) / MB(FedAvg) for the same data, partition and seed, which
share the partition, the test images and the node order. A seed where either run misses the target
has no saving and is left out of the mean; every row says how many seeds it stands on. The 95%
interval is mean ± t(0.975, n − 1) · std / √n. A claim holds only if that interval lies wholly at
or above the claimed saving.

`python -m simulator.fusion.seed_stats simulator/fusion_runs/paper --plots simulator/fusion_plots/paper`
prints the tables FEDFUSION.md quotes.
"""
from __future__ import annotations

import argparse
import json
import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from facecore.eval.plots import save_line_plot
from simulator.fusion.config import PAPER_BEST, TARGETS
from simulator.fusion.report import rounds_to

PAPER_SAVING = 0.60
# Two-sided 95% Student t quantiles by degrees of freedom; more seeds than this use the normal's.
_T975 = {1: 12.706, 2: 4.303, 3: 3.182, 4: 2.776, 5: 2.571, 6: 2.447, 7: 2.365, 8: 2.306, 9: 2.262}

Key = tuple[str, str, str]  # data, partition, fusion


def load_grid(root: Path) -> dict[Key, dict[int, dict[str, Any]]]:
    """Every report under `root` (any depth), as {(data, partition, fusion): {seed: report}}."""
    grid: dict[Key, dict[int, dict[str, Any]]] = {}
    for path in sorted(root.rglob("*.json")):
        report = json.loads(path.read_text())
        if "history" not in report:
            continue
        key = (str(report["data"].get("source") or "mnist"), report["partition"], report["fusion"])
        if report["seed"] in grid.setdefault(key, {}):
            raise ValueError(f"{path}: a second report for {key} seed {report['seed']}")
        grid[key][report["seed"]] = report
    return grid


def interval(values: Sequence[float]) -> tuple[float, float, float, float]:
    """(mean, std, low, high): sample std and the 95% t interval; std and bounds are NaN for one value."""
    x = np.asarray(values, dtype=float)
    if x.size == 0:
        return math.nan, math.nan, math.nan, math.nan
    mean = float(x.mean())
    if x.size == 1:
        return mean, math.nan, math.nan, math.nan
    std = float(x.std(ddof=1))
    half = _T975.get(x.size - 1, 1.960) * std / math.sqrt(x.size)
    return mean, std, mean - half, mean + half


def saving_rows(
    grid: Mapping[Key, Mapping[int, dict[str, Any]]], targets: Mapping[tuple[str, str], Sequence[float]],
) -> list[dict[str, Any]]:
    """One row per (data, partition, fusion, target), targets by (data, partition): rounds and MB to
    it over seeds, and the paired saving."""
    rows = []
    for (data, partition, fusion), runs in sorted(grid.items()):
        base = grid.get((data, partition, "none"), {})
        for target in targets.get((data, partition), ()):
            reached = {seed: rounds_to(run, target) for seed, run in runs.items()}
            rounds = [r for r in reached.values() if r is not None]
            mb = [r * runs[seed]["bytes_per_round"] / 1e6 for seed, r in reached.items() if r is not None]
            savings, same_rounds = [], []
            for seed, mine in reached.items():
                ref = rounds_to(base[seed], target) if seed in base else None
                if mine is not None and ref is not None:
                    savings.append(1 - (mine * runs[seed]["bytes_per_round"]) / (ref * base[seed]["bytes_per_round"]))
                    same_rounds.append(mine == ref)
            rows.append({
                "data": data, "partition": partition, "fusion": fusion, "target": target, "seeds": len(runs),
                "reached": len(rounds), "rounds": interval(rounds), "mb": interval(mb),
                "saving": interval(savings) if fusion != "none" else None, "paired": len(savings),
                "same_rounds": bool(same_rounds) and all(same_rounds),
            })
    return rows


def _pm(stats: tuple[float, ...], scale: float = 1.0, digits: int = 1) -> str:
    mean, std = stats[0], stats[1]
    if math.isnan(mean):
        return "—"
    return f"{scale * mean:.{digits}f}" + ("" if math.isnan(std) else f" ± {scale * std:.{digits}f}")


def _saving_cell(row: dict[str, Any]) -> str:
    saving = row["saving"]
    if saving is None:
        return "(baseline)"
    if row["paired"] == 0:
        return "—"
    if math.isnan(saving[2]):
        return _pm(saving, 100, 0) + " (one seed)"
    return f"{_pm(saving, 100, 0)} [{100 * saving[2]:.0f}, {100 * saving[3]:.0f}]"


def saving_table(rows: Sequence[dict[str, Any]]) -> str:
    lines = ["| data | partition | target % | fusion | seeds reached | rounds | MB | saved vs FedAvg % (95% CI) |",
             "| --- | --- | ---: | --- | ---: | ---: | ---: | ---: |"]
    for row in rows:
        saved = _saving_cell(row)
        lines.append(f"| {row['data']} | {row['partition']} | {100 * row['target']:g} | {row['fusion']} | "
                     f"{row['reached']}/{row['seeds']} | {_pm(row['rounds'])} | {_pm(row['mb'])} | {saved} |")
    return "\n".join(lines)


def accuracy_table(grid: Mapping[Key, Mapping[int, dict[str, Any]]]) -> str:
    """Accuracy over seeds, and each fusion's last-5-rounds mean against FedAvg's on the same seed."""
    lines = ["| data | partition | fusion | seeds | final acc % | mean of last 5 % | best % | last 5 − FedAvg's, paired (95% CI) | "
             "final λ mean / conv E_g share | CPU s per run |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for (data, partition, fusion), runs in sorted(grid.items()):
        rs = list(runs.values())
        last = [r["history"][-1] for r in rs]
        use = [h.get("lambda_mean", h.get("global_weight_share")) for h in last]
        base = grid.get((data, partition, "none"), {})
        gain = interval([100 * (run["final_acc_last5_mean"] - base[seed]["final_acc_last5_mean"]) for seed, run in runs.items() if seed in base])
        paired = "(baseline)" if fusion == "none" else _pm(gain) + ("" if math.isnan(gain[2]) else f" [{gain[2]:.1f}, {gain[3]:.1f}]")
        lines.append(
            f"| {data} | {partition} | {fusion} | {len(rs)} | {_pm(interval([r['final_acc'] for r in rs]), 100)} | "
            f"{_pm(interval([r['final_acc_last5_mean'] for r in rs]), 100)} | {_pm(interval([r['best_acc'] for r in rs]), 100)} | {paired} | "
            f"{'—' if None in use else _pm(interval(use), 1, 3)} | {_pm(interval([r['cpu_seconds'] for r in rs]), 1, 0)} |")
    return "\n".join(lines)


def why_table(grid: Mapping[Key, Mapping[int, dict[str, Any]]]) -> str:
    """What the fused models did with E_g: the per-round gap E_g − E_l, and which way local training
    moved λ (λ's gradient sign): the nodes' averaged λ̄_t against the λ_{t-1} they started from."""
    lines = ["| data | partition | fusion | gap E_g − E_l, rounds 1-5 | gap, last 5 rounds | rounds where local training lowered λ % | "
             "final λ mean | sum of the rounds' local λ steps |",
             "| --- | --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for (data, partition, fusion), runs in sorted(grid.items()):
        if fusion == "none":
            continue
        early, late, lowered, final, stepped = [], [], [], [], []
        for run in runs.values():
            gaps = [h["extractor_gap"] for h in run["history"][1:] if h.get("extractor_gap") is not None]
            early.append(float(np.mean(gaps[:5])) if gaps else math.nan)
            late.append(float(np.mean(gaps[-5:])) if gaps else math.nan)
            history = run["history"]
            steps = [(h["lambda_mean_averaged"], history[i - 1].get("lambda_mean", 0.0))
                     for i, h in enumerate(history) if i and "lambda_mean_averaged" in h]
            if steps:
                lowered.append(100 * float(np.mean([averaged < before for averaged, before in steps])))
                final.append(history[-1]["lambda_mean"])
                # where λ would stand had the server not damped each round's step by the moving average
                stepped.append(float(sum(averaged - before for averaged, before in steps)))
        lines.append(f"| {data} | {partition} | {fusion} | {_pm(interval(early), 1, 3)} | {_pm(interval(late), 1, 3)} | "
                     f"{_pm(interval(lowered), 1, 0)} | {_pm(interval(final), 1, 3)} | {_pm(interval(stepped), 1, 3)} |")
    return "\n".join(lines)


def _verdict(low: float, high: float) -> str:
    if math.isnan(low):
        return "one seed: no verdict"
    claim = (f"the ≥ {100 * PAPER_SAVING:.0f}% claim " + ("holds" if low >= PAPER_SAVING else "does not hold" if high < PAPER_SAVING
             else f"is not settled (the interval spans {100 * PAPER_SAVING:.0f}%)"))
    against = "a saving beyond the seed noise" if low > 0 else "a cost beyond the seed noise" if high < 0 else "no difference from FedAvg beyond the seed noise"
    return f"{against}; {claim}"


def statements(rows: Sequence[dict[str, Any]]) -> list[str]:
    """One line per (data, partition, target) for the paper's best fusion on that partition."""
    out = []
    for row in rows:
        if PAPER_BEST.get(row["partition"]) != row["fusion"]:
            continue
        head = f"{row['data']}, {row['partition']}, {row['fusion']} (the paper's best there), target {100 * row['target']:g}%"
        mean, std, low, high = row["saving"]
        if row["paired"] == 0:
            out.append(f"{head}: untestable, no seed where both it and FedAvg reach the target ({row['reached']}/{row['seeds']} seeds for it)")
            continue
        if row.get("same_rounds"):
            out.append(f"{head}: the same rounds as FedAvg on all {row['paired']} seeds, so no saving (its larger update "
                       f"costs {-100 * mean:.2g}% more megabytes); the ≥ {100 * PAPER_SAVING:.0f}% claim does not hold")
            continue
        spread = "" if math.isnan(std) else f" ± {100 * std:.0f}% (95% CI {100 * low:.0f} to {100 * high:.0f}%)"
        out.append(f"{head}: saves {100 * mean:.0f}%{spread} of FedAvg's megabytes over {row['paired']} seeds: {_verdict(low, high)}")
    return out


def _mean_curve(runs: Sequence[dict[str, Any]], field: str) -> tuple[list[float], list[float], list[float], list[float]]:
    """Round-by-round mean, min and max of `field` over the seeds that record it in every round."""
    steps = min(len(r["history"]) for r in runs)
    rounds, mean, low, high = [], [], [], []
    for i in range(steps):
        values = [r["history"][i].get(field) for r in runs]
        if any(v is None for v in values):
            continue
        rounds.append(float(runs[0]["history"][i]["round"]))
        mean.append(float(np.mean(values)))
        low.append(float(np.min(values)))
        high.append(float(np.max(values)))
    return rounds, mean, low, high


def write_plots(grid: Mapping[Key, Mapping[int, dict[str, Any]]], out: Path) -> list[Path]:
    """Per (data, partition): accuracy against MB, the fusion weights, and E_g − E_l, seed mean with min-max bands."""
    paths = []
    cells = sorted({(d, p) for d, p, _ in grid})
    for data, partition in cells:
        fusions = {f: list(runs.values()) for (d, p, f), runs in sorted(grid.items()) if (d, p) == (data, partition)}
        acc, acc_band, use, use_band, gap, gap_band = {}, {}, {}, {}, {}, {}
        for fusion, runs in fusions.items():
            rounds, mean, low, high = _mean_curve(runs, "acc")
            mb = [x * runs[0]["bytes_per_round"] / 1e6 for x in rounds]
            acc[fusion], acc_band[fusion] = (mb, mean), (mb, low, high)
            field = {"conv": "global_weight_share", "multi": "lambda_mean", "single": "lambda_mean"}.get(fusion)
            if field:
                rounds, mean, low, high = _mean_curve(runs, field)
                label = "conv: share of |W| on E_g" if fusion == "conv" else f"{fusion}: mean λ"
                use[label], use_band[label] = (rounds, mean), (rounds, low, high)
                rounds, mean, low, high = _mean_curve(runs, "extractor_gap")
                if rounds:
                    gap[fusion], gap_band[fusion] = (rounds, mean), (rounds, low, high)
        seeds = max(len(r) for r in fusions.values())
        name = f"{data}_{partition}"
        paths.append(save_line_plot(out / f"accuracy_vs_mb_{name}.png", acc, "cumulative MB (all selected nodes, up + down)",
                                    "global test accuracy", f"{data}, {partition}: mean of {seeds} seeds (band: min-max)", acc_band))
        if use:
            paths.append(save_line_plot(out / f"fusion_weights_{name}.png", use, "round", "weight on the global extractor E_g",
                                        f"{data}, {partition}: how much the fused models use E_g", use_band))
        if gap:
            paths.append(save_line_plot(out / f"extractor_gap_{name}.png", gap, "round", "‖E_g(x) − E_l(x)‖ / ‖E_g(x)‖",
                                        f"{data}, {partition}: how far a round moves the extractor", gap_band))
    return paths


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("runs", type=Path)
    parser.add_argument("--plots", type=Path, default=None)
    args = parser.parse_args(argv)
    grid = load_grid(args.runs)
    if args.plots:
        for path in write_plots(grid, args.plots):
            print(f"wrote {path}")
    rows = saving_rows(grid, TARGETS)
    print(accuracy_table(grid), "", saving_table(rows), "", why_table(grid), "", *(f"- {line}" for line in statements(rows)), sep="\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
