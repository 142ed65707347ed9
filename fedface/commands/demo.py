"""`fedface demo`: the system's main job on one machine (`make run`)."""
from __future__ import annotations

import argparse
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--devices", type=int, default=20, metavar="N",
                        help="real-face devices enrolled through the SDK")
    parser.add_argument("--rounds", type=int, default=3, metavar="N", help="FedFace rounds to run")
    parser.add_argument("--model", default="default",
                        help="the server's initial model: default, mobile, random or PATH")
    parser.add_argument("--data", help="data root (default: $FEDFACE_DATA, else ../shared/data)")
    parser.add_argument("--out", default="reports/demo", metavar="DIR", help="folder for the report")
    parser.add_argument("--secure-aggregation", action="store_true", help="rounds mask every backbone update (the server sees only their sum)")


def run(args: argparse.Namespace) -> int:
    from facecore.paths import data_root
    from simulator.demo import run_demo

    report = run_demo(data_root(args.data), Path(args.out), args.devices, args.rounds, args.model, secure=args.secure_aggregation)
    before, after = report["before"], report["after"]
    mode = " with secure aggregation" if report["secure_aggregation"] else ""
    print(f"\nFedFace demo: {report['devices']} devices, {report['rounds']} rounds over HTTP{mode}")
    print(f"LFW folds {report['folds'][0]}-{report['folds'][-1]} accuracy: {100 * before['accuracy']:.2f}% before -> {100 * after['accuracy']:.2f}% after")
    print(f"TAR@FAR=1e-3: {100 * before['tar_at_far']['1e-3']:.2f}% -> {100 * after['tar_at_far']['1e-3']:.2f}%")
    print(f"report: {args.out}/demo.json, plot: {args.out}/demo_accuracy.png")
    return 0
