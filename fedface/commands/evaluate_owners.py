"""`fedface eval owners`: what a phone's owner gets from a model (facecore.eval.owners).

The split's device identities each enroll from their own photos and are verified on held-out ones,
against every other device identity's held-out photos, at the model's published threshold.
"""
from __future__ import annotations

import argparse
import json


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", default="default", help="'default', 'mobile', 'mobilefacenet' or a checkpoint PATH")
    parser.add_argument("--holdout", type=float, default=0.3, metavar="FRACTION",
                        help="share of each owner's photos held out for verification (at least one)")
    parser.add_argument("--threshold", type=float, metavar="COSINE",
                        help="score at this threshold instead of the model's published one")
    parser.add_argument("--seed", type=int, default=0, help="split seed (device identities and held-out photos)")
    parser.add_argument("--data", metavar="DIR", help="data root (default: FEDFACE_DATA or ../shared/data)")
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object")


def run(args: argparse.Namespace) -> int:
    from facecore.align.geometry import geometry_of
    from facecore.data.split import SplitConfig, build_split
    from facecore.errors import FaceCoreError
    from facecore.eval.folder import embed_with_progress
    from facecore.eval.owners import OwnerFaces, owner_verification
    from facecore.models.checkpoint import load_backbone, shipped_verification
    from facecore.paths import data_root
    from simulator.cross_device.population import load_population

    if not 0 < args.holdout < 1:
        raise FaceCoreError(f"--holdout must be between 0 and 1, got {args.holdout}")
    model = load_backbone(args.model)
    shipped = shipped_verification(model)
    threshold = args.threshold if args.threshold is not None or shipped is None else shipped.threshold
    if threshold is None:
        raise FaceCoreError(f"model {args.model} publishes no verification threshold: pass --threshold")
    root = data_root(args.data)
    manifest = build_split(root, SplitConfig(seed=args.seed))
    population = load_population(manifest, root, requested=10**6, seed=args.seed, geometry=geometry_of(model), holdout=args.holdout)
    owners = [OwnerFaces(d.identity, d.faces, d.held_out) for d in population.devices if d.held_out is not None]
    report = owner_verification(lambda faces: embed_with_progress(model, faces, progress=False), owners, float(threshold))
    if args.json:
        print(json.dumps({"model": args.model, "holdout": args.holdout, "seed": args.seed, **report.to_dict()}))
        return 0
    pct = lambda v: f"{100 * v:.2f}%"  # noqa: E731
    print(f"Owners: {report.identities} device identities, model {args.model}, threshold {report.threshold:.4f}")
    print(f"  genuine accept  {pct(report.genuine_accept)} of {report.genuine_pairs} held-out owner photos "
          f"(every photo accepted for {pct(report.owners_all_accepted)} of owners; worst owner {pct(report.worst_owner_accept)})")
    print(f"  impostor accept {pct(report.impostor_accept)} of {report.impostor_pairs:,} other owners' photos "
          f"(worst template {pct(report.impostor_accept_worst_template)})")
    return 0
