"""`fedface sim fusion-faces ...`: the device's personalised (fused) verifier against the plain
global model, owner versus others on the devices' held-out photos.

Invariant: building this parser imports nothing heavy (facecore.fusion and simulator.fusion.faces load
torch), so the fusions and FaceFusionConfig's defaults are written out here; fedface/cli_test.py checks
they agree with the code `run` uses.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from types import SimpleNamespace

FUSIONS = ("none", "conv", "multi", "single")  # facecore.fusion.FUSIONS
# simulator.fusion.faces.FaceFusionConfig's defaults.
DEFAULTS = {
    "devices": 100, "fusions": FUSIONS, "epochs": 20, "lr": 0.01, "margin": 0.9, "trainable_blocks": 2, "lambda_init": 0.5, "cohort": 0,
    "cohort_margin": 0.0, "model": "default", "seed": 0,
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = SimpleNamespace(**DEFAULTS)
    parser.add_argument("--devices", type=int, default=d.devices, help="device identities (real ones from the split's device set)")
    parser.add_argument("--fusions", nargs="+", choices=FUSIONS, default=list(d.fusions), help="none: the locally fine-tuned model alone")
    parser.add_argument("--epochs", type=int, default=d.epochs, help="local epochs over the enrollment photos")
    parser.add_argument("--lr", type=float, default=d.lr, help="local learning rate")
    parser.add_argument("--margin", type=float, default=d.margin, help="margin of the positive-only loss")
    parser.add_argument("--trainable-blocks", type=int, default=d.trainable_blocks, help="last blocks (+ head) of E_l that train")
    parser.add_argument("--lambda-init", type=float, default=d.lambda_init, help="multi/single: starting λ in [0, 1]")
    parser.add_argument("--cohort", type=int, default=d.cohort, help="public impostor faces each device trains against (0: none)")
    parser.add_argument("--cohort-margin", type=float, default=d.cohort_margin, help="impostors are pushed below this cosine")
    parser.add_argument("--holdout", type=float, default=None, metavar="FRACTION",
                        help="hold out this share of each owner's photos, the same ones as `fedface eval owners` (default: half)")
    parser.add_argument("--calibration-faces", type=int, default=0, metavar="N",
                        help="also set each verifier's own threshold on N public faces, as the SDK does, and report accept rates there")
    parser.add_argument("--model", default=d.model, help="the global backbone: default or PATH")
    parser.add_argument("--seed", type=int, default=d.seed, help="seed of device choice and training")
    parser.add_argument("--data", help="data root (default: $FEDFACE_DATA, else ../shared/data)")
    parser.add_argument("--split", help="split manifest (default: the seed-0 split)")
    parser.add_argument("--out", default="runs/fusion_faces", help="folder for the report")
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON line")


def run(args: argparse.Namespace) -> int:
    import numpy as np

    from device_sdk.personal_calibration import public_impostor_faces
    from facecore.align.geometry import geometry_of
    from facecore.data.split import SplitConfig, SplitManifest, build_split
    from facecore.errors import FaceCoreError
    from facecore.eval.owners import holdout_split
    from facecore.models.checkpoint import load_backbone
    from facecore.paths import data_root
    from simulator.cross_device.evaluation import published_threshold
    from simulator.cross_device.population import load_population
    from simulator.fusion.faces import DeviceFaces, FaceFusionConfig, markdown_table, public_cohort, run_face_fusion, split_photos

    config = FaceFusionConfig(
        devices=args.devices, fusions=tuple(args.fusions), epochs=args.epochs, lr=args.lr, margin=args.margin,
        trainable_blocks=args.trainable_blocks, lambda_init=args.lambda_init, cohort=args.cohort,
        cohort_margin=args.cohort_margin, model=args.model, seed=args.seed,
    )
    root = data_root(args.data)
    manifest = SplitManifest.load(args.split) if args.split else build_split(root, SplitConfig(seed=0))
    backbone = load_backbone(config.model)
    population = load_population(manifest, root, config.devices, config.seed, geometry=geometry_of(backbone))
    if population.notice():
        print(population.notice())
    if args.holdout is not None:
        if not 0 < args.holdout < 1:
            raise FaceCoreError(f"--holdout must be between 0 and 1, got {args.holdout}")
        devices = [DeviceFaces(d.identity, *holdout_split(d.faces, args.holdout, config.seed, d.index)) for d in population.devices]
    else:
        rng = np.random.default_rng(config.seed)
        devices = [split_photos(d.identity, d.faces, rng) for d in population.devices]
    log = (lambda _: None) if args.json else print
    cohort = public_cohort(manifest, root, config.cohort, config.seed, geometry_of(backbone)) if config.cohort else None
    if cohort is not None and args.calibration_faces:
        raise FaceCoreError("--calibration-faces with a --cohort would set thresholds on faces the verifiers may have trained against")
    calibration = public_impostor_faces(geometry_of(backbone), args.calibration_faces, config.seed, root) if args.calibration_faces else None
    report = run_face_fusion(config, devices, backbone, Path(args.out), log, cohort, published_threshold(backbone), calibration)
    if args.json:
        keep = ("tar_at_far", "auc", "at_threshold", "at_own_threshold")
        print(json.dumps({name: {k: m[k] for k in keep if k in m} for name, m in report["methods"].items()}))
    else:
        print(markdown_table(report))
        print(f"report: {Path(args.out) / 'face_fusion.json'}, plot: {report['plot']}")
    return 0
