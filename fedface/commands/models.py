"""`fedface models fetch|list|measure`: the named models and the registry packages that hold their weights.

Invariant: `list` reads the models' cards (facecore.models.cards: the figures files and where the weights
are, checked by sha256 or for being there) and builds no model, so it loads no torch and answers in well under a second.
"""
from __future__ import annotations

import argparse

from facecore.models.cards import TRAINED_MODELS
from fedface.cli import add_detector_option


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    fetch = actions.add_parser("fetch", help="download (npm pack), verify (sha256) and cache the published weights")
    fetch.add_argument("--force", action="store_true", help="fetch again even if the cached files verify")
    fetch.add_argument("--tarball", help="use this already downloaded package tarball (checked by sha256) instead of npm")
    actions.add_parser("list", help="the named models, their crops and where their weights are")
    measure = actions.add_parser(
        "measure", help="calibrate the verification threshold on LFW folds 1-5, then measure LFW folds 6-10 and CelebA owners",
    )
    measure.add_argument("name", choices=TRAINED_MODELS, help="the named model to measure")
    measure.add_argument("--data", help="data root (default: FEDFACE_DATA or ../shared/data)")
    measure.add_argument("--write", action="store_true", help="store the figures in facecore/weights/<model>.json")
    add_detector_option(measure)


def run(args: argparse.Namespace) -> int:
    if args.action == "list":
        return _list()
    from facecore.models.published import FACE_API, fetch

    if args.action == "fetch":
        from pathlib import Path

        from facecore.errors import FaceCoreError

        # Checked first: with the package already cached, fetch would not look at the tarball and report success.
        if args.tarball and not Path(args.tarball).is_file():
            raise FaceCoreError(f"--tarball {args.tarball} does not exist")
        folder = fetch(FACE_API, force=args.force, tarball=Path(args.tarball) if args.tarball else None)
        print(f"{FACE_API.spec}: verified in {folder}")
        from export.detectors import export_detectors  # devices detect faces with these, without torch

        for name, built in export_detectors(force=args.force).items():
            print(f"face detector {name} as ONNX: verified in {built}")
        return 0
    return _measure(args)


def _measure(args: argparse.Namespace) -> int:
    import json

    from facecore.eval.model_figures import measure, write_figures
    from facecore.paths import data_root

    figures = measure(args.name, data_root(args.data))
    print(json.dumps(figures, indent=1))
    if args.write:
        print(f"written to {write_figures(args.name, figures)}")
    return 0


def _list() -> int:
    from facecore.models.cards import figures_of, model_source, weights_problem
    from facecore.models.verification import Verification

    print(f"{'name':<14} {'backbone':<38} {'crop':<22} {'threshold':>9}  weights")
    for name in TRAINED_MODELS:
        problem = weights_problem(name)
        if problem is not None:
            print(f"{name:<14} {'-':<38} {'-':<22} {'-':>9}  not available: {problem}")
            continue
        card = figures_of(name)
        verification = Verification.from_json(card.get("verification"))
        threshold = "-" if verification is None else f"{verification.threshold:.4f}"
        crop = (card.get("geometry") or {}).get("key", "-")
        print(f"{name:<14} {card.get('backbone', '-'):<38} {crop:<22} {threshold:>9}  {model_source(name)}")
    return 0
