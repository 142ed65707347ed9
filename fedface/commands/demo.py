"""`fedface demo`: the system's main job on one machine (`make run`)."""
from __future__ import annotations

import argparse
import os
from pathlib import Path

from fedface.commands.evaluation_options import add_eval_photos, evaluation_choice, subset_line
from fedface.commands.sim import CAPTURE_NAMES


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--devices", type=int, default=20, metavar="N",
                        help="real-face devices enrolled through the SDK")
    parser.add_argument("--rounds", type=int, default=6, metavar="N", help="FedFace rounds to run")
    parser.add_argument("--model", default="default",
                        help="the server's initial model: default, mobile, random or PATH")
    parser.add_argument("--folds", default="6-10", help="LFW test folds to score on: at least 2 of 6-10, e.g. 6,7")
    add_eval_photos(parser)
    parser.add_argument("--data", help="data root (default: $FEDFACE_DATA, else ../shared/data)")
    parser.add_argument("--out", default="reports/demo", metavar="DIR", help="folder for the report")
    parser.add_argument("--capture", choices=(*CAPTURE_NAMES, "none"), default="lowlight-ir", metavar="NAME",
                        help="the fleet's camera: each device adds its owner's photos as this capture model takes them, and LFW "
                        "is also scored under it: " + ", ".join(CAPTURE_NAMES) + " or none (the devices train on their enrolment photos only)")
    parser.add_argument("--secure-aggregation", action="store_true", help="rounds mask every backbone update (the server sees only their sum)")
    parser.add_argument("--keep", action="store_true",
                        help="keep the scratch folder (the server's database, the devices' states) and print its path (default: removed "
                             "when the demo ends, also on an error, Ctrl-C, SIGTERM or SIGHUP)")


def passive_openmp() -> None:
    """Let torch's OpenMP threads sleep at the end of each parallel region instead of spinning, unless
    OMP_WAIT_POLICY says otherwise; it changes no result, only how threads wait. Call before torch is
    imported. The demo runs the server, several devices and an evaluation at once: spinning threads took
    the cores from them, and from anything else running, and an evaluation took twice as long (2 cores)."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def run(args: argparse.Namespace) -> int:
    folds, eval_photos = evaluation_choice(args.folds, args.eval_photos)
    passive_openmp()
    from facecore.eval.lfw import folds_text
    from facecore.paths import data_root
    from simulator.demo import run_demo

    capture = None if args.capture == "none" else args.capture
    report = run_demo(data_root(args.data), Path(args.out), args.devices, args.rounds, args.model, folds=folds, secure=args.secure_aggregation,
                      eval_photos=eval_photos, keep=args.keep, capture=capture)
    before, after = report["before"], report["after"]
    mode = " with secure aggregation" if report["secure_aggregation"] else ""
    print(f"\nFedFace demo: {report['devices']} devices, {report['rounds']} rounds over HTTP{mode}")
    if report.get("subset"):
        print(f"LFW folds {folds_text(folds)} {subset_line(report['subset'])}; the full figure: drop --eval-photos")
    print(f"LFW folds {folds_text(folds)} accuracy: {100 * before['accuracy']:.2f}% before -> {100 * after['accuracy']:.2f}% after")
    print(f"TAR@FAR=1e-3: {100 * before['tar_at_far']['1e-3']:.2f}% -> {100 * after['tar_at_far']['1e-3']:.2f}%")
    if capture is not None:
        print(f"under the fleet camera ({capture}): TAR@FAR=1e-3 {100 * before['captured']['tar_at_far']['1e-3']:.2f}% -> "
              f"{100 * after['captured']['tar_at_far']['1e-3']:.2f}%, accuracy {100 * before['captured']['accuracy']:.2f}% -> "
              f"{100 * after['captured']['accuracy']:.2f}%")
    print(f"report: {args.out}/demo.json, plots: {args.out}/demo_accuracy.png, {args.out}/demo_tar.png")
    return 0
