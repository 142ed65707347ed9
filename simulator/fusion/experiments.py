"""The FEDFUSION.md grid: every fusion kind on every partition, one seed, then plots and tables.

Run under `nice -n 19 .venv/bin/python -m simulator.fusion.experiments`; sized to finish in about
15 minutes on two busy cores (two processes, e.g. `--fusions none multi` and `--fusions conv single`). Finished reports are
skipped, so an interrupted grid resumes.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch

from simulator.fusion.config import FUSIONS, PARTITIONS, FusionConfig
from simulator.fusion.data import load_npz
from simulator.fusion.report import load_reports, tables, write_plots
from simulator.fusion.run import report_name, run_fusion, save_report

# One budget for every run: 10 nodes, 5 per round, 600 images each, 1 local epoch (a 2-epoch pilot
# on the pathological split gave the same picture at twice the CPU).
BASE = FusionConfig(nodes=10, per_round=5, rounds=30, local_epochs=1, batch=32, lr=0.05, momentum=0.5,
                    per_node=600, test_size=2000, target_acc=0.9, seed=0, late_per_node=100, late_epochs=20)
# A two-class late node is at ~94% before it trains and past 97% after one 4-step epoch, so its
# bar is 99%; a ten-class node starts near the global accuracy, so 95%.
LATE_TARGET = {"pathological": 0.99, "user-specific": 0.95, "iid": 0.95}


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", default=None)
    parser.add_argument("--out", type=Path, default=Path("simulator/fusion_runs"))
    parser.add_argument("--plots", type=Path, default=Path("simulator/fusion_plots"))
    parser.add_argument("--partitions", nargs="+", choices=PARTITIONS, default=list(PARTITIONS))
    parser.add_argument("--fusions", nargs="+", choices=FUSIONS, default=list(FUSIONS))
    parser.add_argument("--rounds", type=int, default=BASE.rounds)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    data = load_npz(args.data)
    started = time.perf_counter()
    for partition in args.partitions:
        for fusion in args.fusions:
            config = dataclasses.replace(BASE, partition=partition, fusion=fusion, rounds=args.rounds, late_target=LATE_TARGET[partition])
            target = args.out / report_name({"partition": partition, "fusion": fusion})
            if target.is_file() and json.loads(target.read_text())["config"] == config.to_dict():
                print(f"skip {target} (done)", file=sys.stderr)
                continue
            report = run_fusion(config, data)
            save_report(report, args.out)
            print(f"{partition}/{fusion}: final {report['final_acc']:.4f}, to target {report['rounds_to_target']}, "
                  f"{report['wall_seconds']} s (grid {time.perf_counter() - started:.0f} s)", file=sys.stderr, flush=True)
    reports = load_reports(args.out)
    write_plots(reports, args.plots)
    print(tables(reports))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
