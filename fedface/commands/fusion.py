"""`fedface sim fusion ...`: FedFusion (feature fusion of global and local models) on an image .npz.

``--preset`` (cpu | paper) fills every setting; a flag given explicitly overrides the preset's value.

Invariant: building this parser imports nothing heavy (simulator.fusion.config imports facecore.fusion, which
loads torch), so the choices and the presets' values its help shows are written out here; fedface/cli_test.py
checks they agree with simulator.fusion.config, which `run` uses.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from simulator.fusion.config import FusionConfig

# simulator.fusion.config's PARTITIONS, ARCHS, NORMALIZATIONS, AUGMENTATIONS and facecore.fusion's FUSIONS, LAMBDA_BOUNDS.
CHOICES: dict[str, tuple[str, ...]] = {
    "partition": ("pathological", "user-specific", "iid"),
    "fusion": ("none", "conv", "multi", "single"),
    "arch": ("small", "official"),
    "lambda-bound": ("unit", "none"),
    "normalize": ("unit", "dataset"),
    "augment": ("none", "crop-flip"),
}
# simulator.fusion.config.PRESETS, as the help shows them: the cpu preset, and what paper changes.
_CPU: dict[str, Any] = {
    "partition": "pathological", "fusion": "conv", "nodes": 10, "per_round": 5, "rounds": 30, "local_epochs": 1, "batch": 32, "lr": 0.05,
    "momentum": 0.5, "weight_decay": 0.0, "lr_decay": 1.0, "min_lr": 0.0, "arch": "small", "lambda_bound": "unit", "lambda_mu": 0.0,
    "normalize": "unit", "augment": "none", "per_node": 600, "test_size": 2000, "alpha": 0.5, "target_acc": 0.9, "late_per_node": 100,
    "late_epochs": 20, "late_target": 0.97, "seed": 0,
}
PRESET_VALUES: dict[str, dict[str, Any]] = {
    "cpu": _CPU,
    "paper": _CPU | {
        "arch": "official", "rounds": 500, "local_epochs": 5, "batch": 64, "lr": 2e-3, "momentum": 0.9, "weight_decay": 5e-4,
        "lr_decay": 0.99, "min_lr": 1e-4, "lambda_bound": "none", "lambda_mu": 0.9, "normalize": "dataset", "augment": "crop-flip",
        "nodes": 5, "per_round": 2, "per_node": 6000, "test_size": 9000,
    },
}

_SUMMARY = ("fusion", "partition", "final_acc", "rounds_to_target", "bytes_per_round", "bytes_to_target")

# flag → (type, choices, help); the dest is the FusionConfig field of the same name.
_SETTINGS: dict[str, tuple[Any, tuple[str, ...] | None, str]] = {
    "partition": (str, CHOICES["partition"], "how the training images are split over nodes"),
    "fusion": (str, CHOICES["fusion"], "none is the FedAvg baseline"),
    "nodes": (int, None, "simulated nodes"),
    "per-round": (int, None, "nodes selected per round"),
    "rounds": (int, None, "rounds to run"),
    "local-epochs": (int, None, "epochs each selected node trains"),
    "batch": (int, None, "images per local step"),
    "lr": (float, None, "local SGD learning rate (of round 1, see --lr-decay)"),
    "momentum": (float, None, "local SGD momentum"),
    "weight-decay": (float, None, "local SGD weight decay, on every trainable parameter"),
    "lr-decay": (float, None, "after every round, if lr > min-lr: lr *= lr-decay (1: fixed lr)"),
    "min-lr": (float, None, "the learning rate stops decaying once at or below this"),
    "arch": (str, CHOICES["arch"], "small: 8/16-channel CNN; official: the official 32/64-channel MNIST CNN with dropout"),
    "lambda-bound": (str, CHOICES["lambda-bound"], "unit: λ projected onto [0, 1] after every step; none: unbounded, as the official code"),
    "lambda-mu": (float, None, "server moving average of λ after averaging, λ := (1-μ)·λ_avg + μ·λ_prev (official μ 0.9); 0: none"),
    "normalize": (str, CHOICES["normalize"], "unit: pixels to [-1, 1]; dataset: (x - mean) / std of the training set (official)"),
    "augment": (str, CHOICES["augment"], "crop-flip: the official random resized crop + horizontal flip of training batches"),
    "per-node": (int, None, "training images per node"),
    "test-size": (int, None, "test images for the global accuracy (the rest are the late node's test pool)"),
    "alpha": (float, None, "Dirichlet concentration of the user-specific partition"),
    "target-acc": (float, None, "global accuracy for rounds_to_target"),
    "late-per-node": (int, None, "training images of the late-joining node"),
    "late-epochs": (int, None, "local epochs of the late-joining node (0: skip fitting)"),
    "late-target": (float, None, "accuracy the late node must reach on its own test images"),
    "seed": (int, None, "seed of partition, selection and training"),
}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", help="mnist ($FEDFACE_DATA/mnist/mnist.npz, the default), fashion-mnist (Debian's dataset-fashion-mnist, "
                                       "fetched and converted into the cache on first use), or a keras-style .npz path")
    parser.add_argument("--preset", choices=tuple(PRESET_VALUES), default="cpu",
                        help="defaults for every setting below: cpu (the CPU-sized grid) or paper (the official code's settings)")
    cpu, paper = PRESET_VALUES["cpu"], PRESET_VALUES["paper"]
    for flag, (kind, choices, text) in _SETTINGS.items():
        field = flag.replace("-", "_")
        parser.add_argument(f"--{flag}", type=kind, choices=choices, default=None,
                            help=f"{text} (cpu: {cpu[field]}; paper: {paper[field]})")
    parser.add_argument("--threads", type=int, default=1, help="torch CPU threads (tiny convolutions gain little from more)")
    parser.add_argument("--out", default="runs/fusion", help="folder for PARTITION-FUSION.json")
    parser.add_argument("--json", action="store_true", help="print the summary as one JSON line")
    parser.add_argument("--quiet", action="store_true", help="no per-round progress lines")


def config_from_args(args: argparse.Namespace) -> FusionConfig:
    """The preset, with every explicitly given flag replacing its value; validated once, all problems in one error."""
    from simulator.fusion.config import PRESETS

    overrides = {flag.replace("-", "_"): getattr(args, flag.replace("-", "_")) for flag in _SETTINGS}
    return dataclasses.replace(PRESETS[args.preset], **{k: v for k, v in overrides.items() if v is not None})


def run(args: argparse.Namespace) -> int:
    import sys

    import torch

    from simulator.fusion.config import FusionInputError
    from simulator.fusion.data import load_npz, resolve_data
    from simulator.fusion.run import run_fusion, save_report

    config = config_from_args(args)  # validate before the (slow) data load
    if args.threads < 1:
        raise FusionInputError("threads must be >= 1")
    torch.set_num_threads(args.threads)
    data = load_npz(resolve_data(args.data))
    log = (lambda _: None) if args.quiet or args.json else (lambda line: print(line, file=sys.stderr, flush=True))
    report = run_fusion(config, data, log)
    report["preset"], report["data"]["source"] = args.preset, args.data or "mnist"
    path = save_report(report, Path(args.out))
    summary = {k: report[k] for k in _SUMMARY} | {"late_epochs_to_target": report["late_join"]["epochs_to_target"], "report": str(path)}
    print(json.dumps(summary) if args.json else "\n".join(f"{k:>22}: {v}" for k, v in summary.items()))
    return 0
