"""`fedface sim cross-silo ...`: PFM and FV (Bai et al. 2021) over heterogeneous silos of real faces."""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

# Copies of simulator.cross_silo.config's lists (cli_test checks they agree): importing it here would
# import torch whenever any `fedface` command builds its parser.
METHODS = ("central", "solo", "fedavg", "fedavg+fv", "pfm", "pfm+fv")
BACKBONES = ("iresnet18", "iresnet34", "mobilefacenet", "mobilefacenet_s", "tiny")
FV_MODES = ("sync", "thread")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--trainers", type=int, default=3, help="source silos: lfw-many, lfw-few, celeba (in that order)")
    parser.add_argument("--parties", type=int, default=None, help="trainers after splitting each silo by identity (12 = the paper's 12-party setting)")
    parser.add_argument("--validators", type=int, default=2, help="0-2: LFW View-2 pairs of folds 1-2, then CelebA pairs")
    parser.add_argument("--method", choices=METHODS, default="pfm+fv",
                        help="training scheme; pfm: Partially Federated Momentum, fv: Federated Validation")
    parser.add_argument("--K", type=int, default=100, help="local steps per round")
    parser.add_argument("--rounds", type=int, default=10, help="communication rounds")
    parser.add_argument("--batch", type=int, default=64, help="per trainer and step")
    parser.add_argument("--lr", type=float, default=0.1, help="learning rate")
    parser.add_argument("--lr-milestones", default=None, help="fractions of the rounds where lr drops 10x (default: the paper's 10/26,18/26,24/26)")
    parser.add_argument("--beta", type=float, default=0.9, help="momentum of PFM")
    parser.add_argument("--loss", choices=("arcface", "cosface"), default="arcface",
                        help="margin-softmax loss of the trainers")
    parser.add_argument("--backbone", choices=BACKBONES, default="iresnet18", help="tiny: 32x32 CPU smoke net")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="torch device of every party")
    parser.add_argument("--seed", type=int, default=0, help="seed of splits and training")
    parser.add_argument("--fv-norm", choices=("local", "moving"), default="local", help="FV score normalisation")
    parser.add_argument("--fv-mode", choices=FV_MODES, default="thread", help="thread: asynchronous beside training; sync: a search every --fv-every rounds")
    parser.add_argument("--fv-every", type=int, default=1, help="--fv-mode sync: rounds between searches")
    parser.add_argument("--processes", action="store_true", help="one process per server, trainer and validator (torch.distributed, gloo)")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads per process")
    parser.add_argument("--synthetic", action="store_true", help="synthetic faces: a wiring check, never an accuracy claim")
    parser.add_argument("--data", help="data root (default: $FEDFACE_DATA, else ../shared/data)")
    parser.add_argument("--split", help="split manifest (default: the seed-0 split)")
    parser.add_argument("--pack-faces", metavar="FILE", help="write the faces this run would load to FILE (JPEG, one file) and exit")
    parser.add_argument("--faces", metavar="FILE", help="train on a --pack-faces FILE instead of the data root (a machine without the data set)")
    parser.add_argument("--pack-quality", type=int, default=90, help="--pack-faces: JPEG quality, 50-100")
    parser.add_argument("--out", default="runs/cross-silo", help="run folder")
    parser.add_argument("--json", action="store_true", help="print the summary as JSON")


def run(args: argparse.Namespace) -> int:
    import dataclasses

    import numpy as np
    import torch

    from facecore.errors import FaceCoreError
    from facecore.federation.strategies.fedval import FVConfig
    from simulator.cross_silo.config import PAPER_MILESTONES, CrossSiloConfig
    from simulator.cross_silo.data import RealData, SyntheticData
    from simulator.cross_silo.models import TINY_INPUT
    from simulator.cross_silo.packed import PackedData

    milestones = PAPER_MILESTONES if args.lr_milestones is None else tuple(float(x) for x in args.lr_milestones.split(",") if x)
    config = CrossSiloConfig(
        trainers=args.trainers, parties=args.parties, validators=args.validators, method=args.method, K=args.K, rounds=args.rounds,
        batch=args.batch, lr=args.lr, lr_milestones=milestones, beta=args.beta, loss=args.loss, backbone=args.backbone,
        device=args.device, seed=args.seed, fv=FVConfig(norm=args.fv_norm), fv_mode=args.fv_mode, fv_every=args.fv_every,
    )
    if args.device == "cuda" and not torch.cuda.is_available():
        raise FaceCoreError("--device cuda but torch sees no CUDA device")
    torch.set_num_threads(max(1, args.threads))
    size = TINY_INPUT if args.backbone == "tiny" else 112
    if args.synthetic and args.faces:
        raise FaceCoreError("--synthetic and --faces name two sources of faces; give one")
    if args.pack_faces and (args.synthetic or args.faces):
        raise FaceCoreError("--pack-faces packs the data root's faces; drop --synthetic / --faces")
    if args.synthetic:
        spec: Any = SyntheticData(trainer_identities=tuple([5, 7, 5, 6] * 3)[: config.n_parties], validators=config.validators, size=size, with_evaluation=True)
    else:
        from facecore.paths import data_root

        root = "" if args.faces else str(data_root(args.data))  # a pack needs no data set: only the settings below
        spec = RealData(root, args.split, config.trainers, config.n_parties, config.validators, config.seed, size, config.eval_folds)
        if args.faces:
            packed = PackedData(args.faces)
            packed.check(spec.settings())
            spec = packed
    if args.pack_faces:
        return _pack(args, spec, config)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    if args.processes and config.method in ("central", "solo"):
        print(f"note: {config.method} has no parties to distribute; running it in one process")
    if args.processes and config.method not in ("central", "solo"):
        from simulator.cross_silo.distributed import run_distributed

        report = run_distributed(config, spec, weights_out=out / "backbone.npz")
    else:
        from simulator.cross_silo.engine import CrossSiloSimulation

        silos = [spec.trainer(i) for i in range(config.n_parties)]
        validators = [spec.validator(i) for i in range(config.validators)]  # FV's, and every method's validation score
        simulation = CrossSiloSimulation(config, silos, validators, spec.evaluation())
        report = {**simulation.run(), "mode": "in-process", "data": {s.name: {"faces": len(s.labels), "classes": s.classes} for s in silos}}
        if simulation.final_weights is not None:
            # numpy's stub lets a ** mapping reach savez's allow_pickle: bool; these keys are parameter names
            np.savez(out / "backbone.npz", **simulation.final_weights)  # type: ignore[arg-type]
    if isinstance(spec, RealData | PackedData):
        report["plan"] = spec.describe_plan()
    report["total_seconds"] = time.perf_counter() - started
    report["config"] = dataclasses.asdict(config)
    (out / "report.json").write_text(json.dumps(report, indent=1, default=float))
    shown = ("method", "mode", "parties", "loss_ema", "validation", "eval", "weighting", "seconds_per_local_step", "seconds_per_step", "total_seconds")
    summary = {k: report.get(k) for k in shown}
    print(json.dumps(summary, default=float) if args.json else "\n".join(f"{k:>22}: {v}" for k, v in summary.items()))
    return 0


def _pack(args: argparse.Namespace, spec: Any, config: Any) -> int:
    from facecore.errors import FaceCoreError
    from simulator.cross_silo.packed import pack_faces

    if not 50 <= args.pack_quality <= 100:
        raise FaceCoreError(f"--pack-quality must be 50-100, got {args.pack_quality}")
    summary = pack_faces(spec, config.n_parties, config.validators, spec.settings(), Path(args.pack_faces), args.pack_quality)
    print(json.dumps(summary, default=float) if args.json else f"packed {args.pack_faces}: {summary['bytes'] / 2**20:.1f} MiB")
    return 0
