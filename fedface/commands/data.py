"""`fedface data split|align|stats`."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from facecore.data.split import ROLES, SplitConfig, SplitManifest, build_split
from facecore.paths import data_root
from fedface.cli import add_detector_option


def add_arguments(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    split = actions.add_parser("split", help="build an identity-disjoint split manifest")
    split.add_argument("--data", help="data root (default: FEDFACE_DATA or ../shared/data)")
    split.add_argument("--seed", type=int, default=0,
                       help="seed of the identity shuffle: the same seed gives the same split")
    split.add_argument("--eval-folds", default="6-10", help="LFW View-2 people folds kept for evaluation")
    split.add_argument("--device-fraction", type=float, default=0.5, help="share of eligible identities that become devices")
    split.add_argument("--device-min-photos", type=int, default=5, help="photos an identity needs to be a device")
    split.add_argument("--no-celeba", action="store_true", help="build devices from LFW only")
    split.add_argument("--out", default="split.json", help="manifest path")

    align = actions.add_parser("align", help="detect, align and cache the faces of a split (or of everything)")
    align.add_argument("--data", help="data root (default: $FEDFACE_DATA, else ../shared/data)")
    align.add_argument("--split", help="split manifest (default: every LFW and CelebA image)")
    align.add_argument("--role", choices=(*ROLES, "all"), default="all",
                       help="align only this set of the --split manifest")
    align.add_argument("--report", default=None, help="write the per-file status list (JSON) here")
    add_detector_option(align)

    stats = actions.add_parser("stats", help="print the sizes of a split manifest")
    stats.add_argument("manifest", help="a manifest written by `fedface data split`")


def run(args: argparse.Namespace) -> int:
    from facecore.data.lfw import parse_folds

    if args.action == "split":
        config = SplitConfig(
            seed=args.seed,
            eval_folds=parse_folds(args.eval_folds),
            device_fraction=args.device_fraction,
            device_min_photos=args.device_min_photos,
            use_celeba=not args.no_celeba,
        )
        manifest = build_split(data_root(args.data), config)
        manifest.save(args.out)
        print(manifest.describe())
        print(f"wrote {args.out}")
        return 0
    if args.action == "stats":
        print(SplitManifest.load(args.manifest).describe())
        return 0
    return _align(args)


def _align(args: argparse.Namespace) -> int:
    from facecore.align.pipeline import FaceAligner
    from facecore.data.celeba import read_celeba
    from facecore.data.lfw import LFW

    root = data_root(args.data)
    if args.split:
        manifest = SplitManifest.load(args.split)
        roles = ROLES if args.role == "all" else (args.role,)
        paths = [img.path for role in roles for img in manifest.images(role, root)]
    else:
        paths = [img.path for img in LFW(root / "lfw").all_images()]
        if (root / "celeba_subset").is_dir():
            paths += [img.path for img in read_celeba(root / "celeba_subset")]
    aligned = FaceAligner().align_paths(paths, allow_fallback=True)
    print(aligned.summary())
    for status in ("fallback", "noface", "unreadable"):
        files = aligned.with_status(status)
        if files:
            print(f"{status} ({len(files)}): " + ", ".join(str(p.relative_to(root)) for p in files[:20]) + (" ..." if len(files) > 20 else ""))
    if args.report:
        report = {str(p.relative_to(root)): s for p, s in zip(aligned.paths, aligned.statuses)}
        Path(args.report).write_text(json.dumps(report, indent=1))
    return 0
