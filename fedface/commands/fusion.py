"""`fedface sim fusion ...`: FedFusion (feature fusion of global and local models) on an image .npz."""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from simulator.fusion.config import FUSIONS, PARTITIONS, FusionConfig

_SUMMARY = ("fusion", "partition", "final_acc", "rounds_to_target", "bytes_per_round", "bytes_to_target")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    d = FusionConfig()
    parser.add_argument("--data", help="keras-style .npz (default: $FEDFACE_DATA/mnist/mnist.npz, else ../shared/data/mnist/mnist.npz)")
    parser.add_argument("--partition", choices=PARTITIONS, default=d.partition,
                        help="how the training images are split over nodes")
    parser.add_argument("--fusion", choices=FUSIONS, default=d.fusion, help="none is the FedAvg baseline")
    parser.add_argument("--nodes", type=int, default=d.nodes, help="simulated nodes")
    parser.add_argument("--per-round", type=int, default=d.per_round, help="nodes selected per round")
    parser.add_argument("--rounds", type=int, default=d.rounds, help="rounds to run")
    parser.add_argument("--local-epochs", type=int, default=d.local_epochs, help="epochs each selected node trains")
    parser.add_argument("--batch", type=int, default=d.batch, help="images per local step")
    parser.add_argument("--lr", type=float, default=d.lr, help="local SGD learning rate")
    parser.add_argument("--momentum", type=float, default=d.momentum, help="local SGD momentum")
    parser.add_argument("--per-node", type=int, default=d.per_node, help="training images per node")
    parser.add_argument("--test-size", type=int, default=d.test_size, help="test images for the global accuracy")
    parser.add_argument("--alpha", type=float, default=d.alpha, help="Dirichlet concentration of the user-specific partition")
    parser.add_argument("--target-acc", type=float, default=d.target_acc, help="global accuracy for rounds_to_target")
    parser.add_argument("--late-per-node", type=int, default=d.late_per_node, help="training images of the late-joining node")
    parser.add_argument("--late-epochs", type=int, default=d.late_epochs, help="local epochs of the late-joining node (0: skip fitting)")
    parser.add_argument("--late-target", type=float, default=d.late_target, help="accuracy the late node must reach on its own test images")
    parser.add_argument("--seed", type=int, default=d.seed, help="seed of partition, selection and training")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (tiny convolutions gain little from more)")
    parser.add_argument("--out", default="runs/fusion", help="folder for PARTITION-FUSION.json")
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON line")
    parser.add_argument("--quiet", action="store_true", help="no per-round progress lines")


def config_from_args(args: argparse.Namespace) -> FusionConfig:
    return FusionConfig(
        partition=args.partition, fusion=args.fusion, nodes=args.nodes, per_round=args.per_round, rounds=args.rounds,
        local_epochs=args.local_epochs, batch=args.batch, lr=args.lr, momentum=args.momentum, per_node=args.per_node,
        test_size=args.test_size, alpha=args.alpha, target_acc=args.target_acc, seed=args.seed,
        late_per_node=args.late_per_node, late_epochs=args.late_epochs, late_target=args.late_target,
    )


def run(args: argparse.Namespace) -> int:
    import sys

    import torch

    from simulator.fusion.config import FusionInputError
    from simulator.fusion.data import load_npz
    from simulator.fusion.run import run_fusion, save_report

    config = config_from_args(args)  # validate before the (slow) data load
    if args.threads < 1:
        raise FusionInputError("threads must be >= 1")
    torch.set_num_threads(args.threads)
    data = load_npz(args.data)
    log = (lambda _: None) if args.quiet or args.json else (lambda line: print(line, file=sys.stderr, flush=True))
    report = run_fusion(config, data, log)
    path = save_report(report, Path(args.out))
    summary = {k: report[k] for k in _SUMMARY} | {"late_epochs_to_target": report["late_join"]["epochs_to_target"], "report": str(path)}
    print(json.dumps(summary) if args.json else "\n".join(f"{k:>22}: {v}" for k, v in summary.items()))
    return 0
