"""The paper-setting FedFusion grid, sized for two CPU cores (FEDFUSION.md, "The paper-setting grid").

Every run is `--preset paper` (the official network, SGD with momentum and weight decay, the lr decay,
5 local epochs, batch 64, unbounded λ with the server's moving average, per-dataset normalisation,
crop-and-flip) with the changes in `SIZED`, which FEDFUSION.md explains. Runs are ordered so that an
unfinished grid still holds whole comparisons: FedAvg and the paper's best fusion for each partition
over every seed first, then the other fusions.

`python -m simulator.fusion.paper_grid --shard 0/2` and `--shard 1/2` in two processes (one torch
thread each); a finished report with the same settings is skipped, so an interrupted grid resumes
and a process that finishes early can help another shard from its far end (`--reverse`).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from simulator.fusion.config import PAPER_BEST, PRESETS, FusionConfig
from simulator.fusion.data import ImageSet, load_npz, resolve_data
from simulator.fusion.run import report_name, run_fusion, save_report

DATASETS = ("mnist", "fashion-mnist")
PARTITIONS = ("pathological", "user-specific")
SEEDS = (0, 1, 2)
# The paper preset's 6,000 images per node and 500 rounds cost about 15 CPU hours per run here. Every node
# trains every round, as in the official code (2 of 2 nodes), on 200 images; lr × 10 keeps the
# distance a round moves each extractor (lr × local steps) near the paper's, since λ's gradient
# scales with the gap between E_g and E_l.
SIZED: dict[str, Any] = {"nodes": 5, "per_round": 5, "per_node": 200, "lr": 0.02, "rounds": 25, "test_size": 1000, "late_epochs": 5}


def planned_runs() -> list[tuple[str, FusionConfig]]:
    """(data, config) in priority order: FedAvg and each partition's paper-best fusion, then the rest."""
    tiers = [lambda p, f: f in ("none", PAPER_BEST[p]), lambda p, f: f in PAPER_BEST.values(), lambda p, f: True]
    runs: list[tuple[str, FusionConfig]] = []
    for tier in tiers:
        for seed in SEEDS:
            for data in DATASETS:
                for partition in PARTITIONS:
                    for fusion in ("none", "conv", "multi", "single"):
                        config = dataclasses.replace(PRESETS["paper"], partition=partition, fusion=fusion, seed=seed, **SIZED)
                        if tier(partition, fusion) and (data, config) not in runs:
                            runs.append((data, config))
    return runs


def report_path(out: Path, data: str, config: FusionConfig) -> Path:
    return out / data / f"seed{config.seed}" / report_name({"partition": config.partition, "fusion": config.fusion})


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=Path("simulator/fusion_runs/paper"))
    parser.add_argument("--shard", default="0/1", metavar="I/N", help="run every N-th planned run, starting at the I-th")
    parser.add_argument("--reverse", action="store_true",
                        help="work the shard from its last run back, e.g. to help a busy shard from the other end")
    args = parser.parse_args(argv)
    index, count = (int(part) for part in args.shard.split("/"))
    torch.set_num_threads(1)
    started = time.perf_counter()
    runs = planned_runs()[index::count]
    loaded: dict[str, ImageSet] = {}  # each data set is read once per process, not once per run
    for data, config in reversed(runs) if args.reverse else runs:
        target = report_path(args.out, data, config)
        if target.is_file() and json.loads(target.read_text())["config"] == config.to_dict():
            continue
        if data not in loaded:
            loaded[data] = load_npz(resolve_data(data))
        report = run_fusion(config, loaded[data])
        report["preset"], report["data"]["source"] = "paper (sized: paper_grid.SIZED)", data
        save_report(report, target.parent)
        print(f"{data} seed {config.seed} {config.partition}/{config.fusion}: final {report['final_acc']:.4f}, "
              f"{report['cpu_seconds']} CPU s (shard {time.perf_counter() - started:.0f} s)", file=sys.stderr, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
