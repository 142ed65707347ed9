"""`fedface eval lfw`: verification accuracy, AUC and TAR@FAR on identity-disjoint LFW folds.

`fedface eval folder DIR`: TAR@FAR, AUC and EER over all pairs of a user's own folder of people
(one subfolder per person), and what the model's shipped threshold does on it.

`fedface eval geometry`: choose a backbone's crop (template scale and shift) on LFW folds 1-5.

`fedface eval owners`: each device identity enrolls and is verified on held-out photos, against
the other owners, at the model's published threshold (fedface/commands/evaluate_owners.py).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from facecore.models.cards import MODEL_NAMES
from fedface.cli import add_detector_option

CLASSICAL = ("lbp", "pca")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    targets = parser.add_subparsers(dest="target", metavar="BENCHMARK", required=True)
    lfw = targets.add_parser("lfw", help="LFW View-2 verification")
    lfw.add_argument(
        "--model", action="append", default=None,
        help="'default' (the dlib ResNet), 'mobile' (the compact model), checkpoint PATH, 'random' (untrained "
        "backbone), or a classical baseline 'lbp' / 'pca'; repeat to compare several (default: default)",
    )
    lfw.add_argument("--baselines", action="store_true", help="also score the untrained backbone and LBP")
    lfw.add_argument("--backbone", default="mobilefacenet", help="architecture for --model random")
    lfw.add_argument("--folds", default="6-10", help="pairs/people folds to score, e.g. 6-10 (identity-disjoint from 1-5)")
    lfw.add_argument("--flip", action="store_true", help="average each embedding with its mirror image's")
    lfw.add_argument("--data", help="data root (default: FEDFACE_DATA or ../shared/data)")
    lfw.add_argument("--out", default="reports", help="folder for the JSON report and ROC plot")
    lfw.add_argument("--max-pairs-per-fold", type=int, default=None, help="score fewer pairs (quick look only)")
    lfw.add_argument("--pairs-only", action="store_true", help="TAR@FAR from the pairs only, not all people of the folds")
    lfw.add_argument("--json", action="store_true", help="print one JSON object (one per model, keyed by model) on stdout")
    add_detector_option(lfw)
    folder = targets.add_parser(
        "folder", help="all-pairs verification on your own photos: DIR/<person>/<photos>",
        description="Score every pair of photos in DIR (one subfolder per person, any image format Pillow reads): "
        "TAR at FAR 1e-2/1e-3/1e-4, AUC, EER, and FAR/TAR at the model's own verification threshold. "
        "Files that are not images, cannot be decoded or show no detected face are skipped and reported.",
    )
    folder.add_argument("dir", metavar="DIR", help="folder with one subfolder of photos per person")
    folder.add_argument(
        "--model", default="default",
        help="'default' (the dlib ResNet), 'mobile' (the compact model), 'random' (untrained), or a checkpoint PATH (default: default)",
    )
    folder.add_argument("--json", action="store_true", help="print one JSON object on stdout (skipped files listed by name)")
    add_detector_option(folder)
    crop = targets.add_parser(
        "geometry", help="choose a backbone's crop on LFW folds 1-5 (never the test folds 6-10)",
        description="Score crops of the ArcFace template scaled about the crop centre and moved up, on LFW folds that "
        "are not the test set; ranked by pairs accuracy, then TAR@FAR=1e-3 over all pairs. Needs the folds' detections "
        "in the cache (`fedface eval lfw --model mobile --folds 1-5` makes them).",
    )
    crop.add_argument("--model", default="default", help="'default', 'mobile' or a checkpoint PATH (default: default)")
    crop.add_argument("--folds", default="1-5", help="LFW folds to choose on; 6-10 are refused")
    crop.add_argument("--scales", default="1.05,1.12,1.2,1.28", help="comma-separated template scales (default: the grid the dlib crop was chosen from)")
    crop.add_argument("--shifts", default="12,18,24,30", help="comma-separated upward shifts in pixels of the crop")
    crop.add_argument("--data", help="data root (default: FEDFACE_DATA or ../shared/data)")
    crop.add_argument("--json", action="store_true", help="print the ranked candidates as JSON")
    add_detector_option(crop)
    from fedface.commands import evaluate_owners

    evaluate_owners.add_arguments(targets.add_parser(
        "owners", help="what a phone's owner gets: held-out owner photos against every other owner, at the model's threshold",
        description="Each device identity of the split enrolls from its own photos and is verified on held-out ones, "
        "against every other device identity's held-out photos, at the model's published threshold.",
    ))


def run(args: argparse.Namespace) -> int:
    if args.target == "folder":
        return run_folder(args)
    if args.target == "geometry":
        return run_geometry(args)
    if args.target == "owners":
        from fedface.commands import evaluate_owners

        return evaluate_owners.run(args)
    from facecore.align.geometry import ARCFACE_112, geometry_of
    from facecore.align.pipeline import FaceAligner
    from facecore.data.lfw import parse_folds
    from facecore.eval.lfw import LFWFaces, evaluate, load_lfw_faces
    from facecore.eval.plots import save_roc_plot
    from facecore.paths import data_root

    specs = args.model or ["default"]
    if args.baselines:
        specs += [s for s in ("random", "lbp") if s not in specs]
    folds = parse_folds(args.folds)
    root = data_root(args.data)
    embedders = {spec: _embedder(spec, args, root, folds) for spec in specs}  # fail fast on a bad --model
    by_geometry: dict[str, LFWFaces] = {}  # each backbone is scored on crops of its own geometry
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    reports, curves = {}, {}
    for spec, (embed, model) in embedders.items():
        geometry = geometry_of(model) if model is not None else ARCFACE_112
        if geometry.key not in by_geometry:
            by_geometry[geometry.key] = load_lfw_faces(
                root / "lfw", folds, aligner=FaceAligner(geometry=geometry), max_pairs_per_fold=args.max_pairs_per_fold,
                all_people=not args.pairs_only,
            )
        data = by_geometry[geometry.key]
        result = evaluate(data, embed)
        label = _label(spec)
        reports[label] = {"model": spec, "geometry": geometry.key, **result.report.to_json_dict()}
        curves[label] = result.roc
        (out / f"lfw_{_slug(label)}.json").write_text(json.dumps(reports[label], indent=1))
    plot = save_roc_plot(out / "lfw_roc.png", curves, f"LFW folds {args.folds}: all-pairs ROC")
    if args.json:
        print(json.dumps(next(iter(reports.values())) if len(reports) == 1 else reports))
    else:
        _print_table(reports, next(iter(by_geometry.values())).alignment.summary(), plot)
    return 0


def run_geometry(args: argparse.Namespace) -> int:
    from facecore.data.lfw import parse_folds
    from facecore.errors import FaceCoreError
    from facecore.eval.geometry_search import search_geometry
    from facecore.models.checkpoint import load_backbone
    from facecore.paths import data_root

    try:
        scales = [float(v) for v in args.scales.split(",")]
        shifts = [float(v) for v in args.shifts.split(",")]
    except ValueError:
        raise FaceCoreError(f"--scales and --shifts take comma-separated numbers, got {args.scales!r} and {args.shifts!r}") from None
    model = load_backbone(args.model)
    ranked = search_geometry(model, data_root(args.data) / "lfw", parse_folds(args.folds), scales, shifts)
    if args.json:
        print(json.dumps([score.row() for score in ranked]))
        return 0
    print(f"{'crop':<28} {'accuracy':>16} {'TAR@1e-3':>9} {'TAR@1e-4':>9}   (LFW folds {args.folds}, best first)")
    for score in ranked:
        tar4 = "n/a" if score.tar_1e4 is None else f"{100 * score.tar_1e4:.2f}%"
        print(f"{score.geometry.key:<28} {100 * score.accuracy:7.2f}% ± {100 * score.accuracy_std:4.2f} {100 * score.tar_1e3:8.2f}% {tar4:>9}")
    return 0


def _embedder(spec: str, args: argparse.Namespace, root: Path, folds: tuple[int, ...]):  # type: ignore[no-untyped-def]
    """(embed function, backbone or None for the classical baselines)."""
    from facecore.eval.baselines import lbp_features

    if spec == "lbp":
        return lbp_features, None
    if spec == "pca":
        return _pca_embedder(root, folds), None
    from functools import partial

    import torch

    from facecore.models.checkpoint import load_backbone
    from facecore.models.preprocess import embed_faces

    torch.set_num_threads(max(torch.get_num_threads(), 1))
    model = load_backbone(spec, backbone=args.backbone)
    return partial(embed_faces, model, flip=args.flip), model


def _pca_embedder(root: Path, folds: tuple[int, ...]):  # type: ignore[no-untyped-def]
    """PCA is fitted on LFW people outside the evaluated folds, never on the evaluated people."""
    from facecore.align.pipeline import FaceAligner
    from facecore.data.lfw import LFW
    from facecore.eval.baselines import PCABaseline

    lfw = LFW(root / "lfw")
    train = [img.path for k, people in enumerate(lfw.people_folds(), 1) if k not in folds for n, c in people.items() for img in lfw.images_of(n, c)]
    sample = [train[i] for i in np.random.default_rng(0).choice(len(train), min(2000, len(train)), replace=False)]
    faces = FaceAligner().align_paths(sample, desc="aligning PCA training faces").faces
    return PCABaseline().fit(faces, n_components=128).transform


def _label(spec: str) -> str:
    named = spec if spec in MODEL_NAMES else Path(spec).stem
    return {"random": "untrained", "lbp": "LBP (classical)", "pca": "PCA (classical)"}.get(spec, named)


def _slug(label: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in label).strip("_").lower()


def _print_table(reports: dict[str, dict], alignment: str, plot: Path) -> None:  # type: ignore[type-arg]
    first = next(iter(reports.values()))
    print(f"LFW verification, folds {first['folds']}, {first['pairs']} pairs; {alignment}")
    print(f"TAR@FAR over all pairs of the folds' people: {first['all_pairs']['genuine']:,} genuine, {first['all_pairs']['impostor']:,} impostor")
    print(f"{'model':<22} {'accuracy':>16} {'AUC':>7} {'TAR@1e-3':>9} {'TAR@1e-4':>9}")
    for label, r in reports.items():
        tar = r["tar_at_far"]
        fmt = lambda v: "   n/a" if v is None else f"{100 * v:6.2f}%"  # noqa: E731
        print(f"{label:<22} {100 * r['accuracy']:7.2f}% ± {100 * r['accuracy_std']:4.2f} {r['auc']:7.4f} {fmt(tar['1e-3']):>9} {fmt(tar['1e-4']):>9}")
    print(f"ROC plot: {plot}", file=sys.stdout)


def run_folder(args: argparse.Namespace) -> int:
    from facecore.eval.folder import evaluate_folder
    from facecore.models.checkpoint import load_backbone

    model = load_backbone(args.model)
    report = evaluate_folder(Path(args.dir), model)
    if args.json:
        print(json.dumps({"model_spec": args.model, **report.to_json_dict()}, allow_nan=False))
    else:
        _print_folder(report, args.model)
    return 0


def _print_folder(report, spec: str) -> None:  # type: ignore[no-untyped-def]
    from facecore.eval.folder import REASONS

    pct = lambda v: f"{100 * v:.2f}%"  # noqa: E731
    print(f"Folder {report.folder}, model {spec} ({report.model}, {report.geometry} crops)")
    print(f"photos used: {report.photos} of {report.files} files; persons: {len(report.persons)}")
    if report.single_photo_persons:
        names = ", ".join(report.single_photo_persons)
        print(f"  {len(report.single_photo_persons)} person(s) with only 1 usable photo contribute impostor pairs only: {names}")
    if report.empty_persons:
        print(f"  {len(report.empty_persons)} person folder(s) without a usable photo are not scored: {', '.join(report.empty_persons)}")
    counts = report.skipped_counts()
    if counts:
        print(f"skipped: {sum(counts.values())} file(s): " + ", ".join(f"{n} {REASONS[r]}" for r, n in counts.items()))
        for reason in counts:
            files = [s.path for s in report.skipped if s.reason == reason]
            print(f"  {REASONS[reason]}: {', '.join(files[:5])}" + (f" ... (+{len(files) - 5}, see --json)" if len(files) > 5 else ""))
    else:
        print("skipped: none")
    print(f"pairs: {report.genuine_pairs:,} genuine, {report.impostor_pairs:,} impostor")
    print(f"mean cosine: genuine {report.genuine_mean:.4f}, impostor {report.impostor_mean:.4f}")
    print(f"AUC {report.auc:.4f}   EER {pct(report.eer)}")
    for key, tar in report.tar_at_far.items():
        shown = "n/a" if tar != tar else pct(tar)  # NaN: fewer impostor pairs than 1/FAR
        why = f"  (needs >= {round(1 / float(key)):,} impostor pairs)" if tar != tar else ""
        print(f"TAR@FAR {key:<5} {shown}{why}")
    check = report.verification
    if check is None:
        print("model threshold: none shipped with this model")
    else:
        calibrated = f", calibrated for FAR {check.calibrated_far:g}" if check.calibrated_far is not None else ""
        print(f"model threshold {check.threshold:.4f}{calibrated} (accepts score >= threshold); on this folder:")
        print(f"  FAR {pct(check.far)} ({check.false_accepts:,} of {report.impostor_pairs:,} impostor pairs accepted)")
        print(f"  TAR {pct(check.tar)} ({check.false_rejects:,} of {report.genuine_pairs:,} genuine pairs rejected)")
