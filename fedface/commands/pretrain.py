"""`fedface pretrain`: train the backbone on the public identities of a split (or fine-tune on devices).

Invariant: every model the flags name (--finetune-from, --teacher, --init) is checked before any data is read,
so a misspelt path is one error line at once, not after minutes of aligning faces.
"""
from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", help="data root (default: FEDFACE_DATA or ../shared/data)")
    parser.add_argument("--split", help="split manifest (default: build the seed-0 split and save it in --out)")
    parser.add_argument("--backbone", default="mobilefacenet", help="architecture to train (facecore.models.registry)")
    parser.add_argument("--loss", choices=("cosface", "arcface"), default="cosface",
                        help="margin-softmax loss over the public identities")
    parser.add_argument("--scale", type=float, default=None, help="margin-softmax scale s (default: the loss's, 64)")
    parser.add_argument("--margin", type=float, default=None, help="margin m (default: CosFace 0.35, ArcFace 0.5)")
    parser.add_argument("--epochs", type=int, default=20, help="passes over the public faces")
    parser.add_argument("--batch", type=int, default=128, help="faces per optimiser step")
    parser.add_argument("--lr", type=float, default=None,
                        help="peak learning rate (default: 0.1, or 0.02 with --teacher)")
    parser.add_argument("--optimizer", choices=("sgd", "adamw"), default="sgd",
                        help="SGD with momentum 0.9, or AdamW (its first-moment decay 0.9): per-weight steps, as a network cut from a teacher needs")
    parser.add_argument("--warmup-epochs", type=float, default=1.0, help="linear learning-rate warm-up, in epochs")
    parser.add_argument("--schedule", choices=("cosine", "step"), default="cosine",
                        help="learning-rate decay after the warm-up")
    parser.add_argument("--seed", type=int, default=0, help="seed of initialisation, shuffling and augmentation")
    parser.add_argument("--workers", type=int, default=1, help="DataLoader worker processes for augmentation")
    parser.add_argument("--compile", action="store_true", help="torch.compile the backbone")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (bf16 autocast on cuda)")
    parser.add_argument("--eval-every", type=int, default=5, help="epochs between LFW checks (pairs of the evaluation folds)")
    parser.add_argument("--max-steps-per-epoch", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument(
        "--finetune-from", default=None,
        help="start from this backbone (PATH or 'default') and train on the pooled DEVICE identities: the "
        "centralized, non-private upper bound that federated runs are compared with",
    )
    parser.add_argument("--resume", action="store_true", help="continue the run in --out from its last epoch")
    parser.add_argument("--out", default=None,
                        help="run folder (default: runs/pretrain, or runs/distill with --teacher)")
    distill = parser.add_argument_group("distillation (--teacher): see pretrain/DISTILLATION.md")
    distill.add_argument("--teacher", default=None, help="distil this model (e.g. 'default') into the student on the public faces")
    distill.add_argument("--init", default=None, help="student start: mobile, random or a backbone file (default: mobile)")
    distill.add_argument(
        "--from-teacher", default=None, metavar="MODEL",
        help="distil MODEL (default, or a dlib ResNet file) into a student cut from MODEL itself (see --width, --depth)",
    )
    distill.add_argument("--width", type=float, default=0.5, help="--from-teacher: fraction of the teacher's channels kept (default: 0.5)")
    distill.add_argument("--inner-width", type=float, default=None, metavar="I",
                         help="--from-teacher: fraction of each block's inner channels kept (default: the --width)")
    distill.add_argument("--depth", choices=("full", "short", "short-last"), default="full",
                         help="--from-teacher: every block, one identity block fewer per stage, or fewer in the last stage only (default: full)")
    distill.add_argument("--cut-by", choices=("energy", "l1"), default="energy",
                         help="--from-teacher: rank the teacher's channels by activation energy on public faces or by filter L1 norm")
    distill.add_argument("--views", type=int, default=8, help="cached jittered views per public photo")
    distill.add_argument("--view-seed", type=int, default=0, help="seed of the cached jittered views")
    distill.add_argument("--mix", type=float, default=0.0,
                         help="chance that a cached jittered view blends its photo with another one, a face the teacher "
                              "embeds and nobody photographed (needs --cosface-weight 0; default: 0)")
    distill.add_argument("--distill-weight", type=float, default=1.0, help="weight of the cosine distance to the teacher")
    distill.add_argument("--centered", action="store_true",
                         help="measure the cosine distance about the teacher's mean embedding, where faces differ")
    distill.add_argument("--relational-weight", type=float, default=0.0, help="weight of the batch similarity-matrix loss")
    distill.add_argument("--stage-weight", type=float, default=0.0,
                         help="--from-teacher: weight of the cut's stream at each stage end against the teacher's (a teacher pass a step)")
    distill.add_argument("--cosface-weight", type=float, default=0.0, help="weight of CosFace on the public labels")
    distill.add_argument("--no-init-eval", dest="init_eval", action="store_false", help="skip the LFW folds 1-5 check of the init")
    distill.add_argument("--colour-jitter", type=float, default=0.2, help="per-face brightness/contrast jitter")
    distill.add_argument(
        "--no-rotate-teacher", dest="rotate_teacher", action="store_false",
        help="match the teacher's raw space instead of its Procrustes rotation onto the init student's",
    )


def _check_models(args: argparse.Namespace) -> None:
    from fedface.cli import UsageError

    if args.from_teacher is not None:
        if args.teacher or args.init:
            raise UsageError("--from-teacher names both the teacher and the student's start: drop --teacher and --init")
        from facecore.models.dlib_cut import THIN_BLOCK_CUTS, WIDTHS

        if args.inner_width is None or args.inner_width == args.width:
            args.inner_width = None
            if args.width not in WIDTHS:
                raise UsageError(f"--width must be one of {', '.join(f'{w:g}' for w in WIDTHS)}, got {args.width:g}")
        elif (args.width, args.inner_width) not in THIN_BLOCK_CUTS:
            pairs = ", ".join(f"{w:g}/{i:g}" for w, i in THIN_BLOCK_CUTS)
            raise UsageError(f"--width/--inner-width must be one of {pairs}, got {args.width:g}/{args.inner_width:g}")
        args.teacher, args.init = args.from_teacher, "cut"
    if args.init is not None and not args.teacher:
        raise UsageError("--init is the distillation student's start: it needs --teacher")
    from facecore.errors import CheckpointError
    from facecore.models.cards import MODEL_NAMES

    teacher_flag = "--from-teacher" if args.init == "cut" else "--teacher"
    for flag, spec in (("--finetune-from", args.finetune_from), (teacher_flag, args.teacher), ("--init", args.init)):
        if spec is not None and spec != "cut" and spec not in MODEL_NAMES and not Path(spec).is_file():
            raise CheckpointError(f"{flag}: model file {spec} does not exist (or name one of {', '.join(MODEL_NAMES)})")


def run(args: argparse.Namespace) -> int:
    _check_models(args)
    if args.teacher:
        args.init = args.init or "mobile"
        from pretrain.distill_run import run_distill

        args.lr = 0.02 if args.lr is None else args.lr
        args.out = args.out or "runs/distill"
        return run_distill(args)
    args.lr = 0.1 if args.lr is None else args.lr
    args.out = args.out or "runs/pretrain"
    import torch

    from facecore.align.pipeline import FaceAligner
    from facecore.data.faces import load_labelled_faces
    from facecore.data.split import SplitConfig, SplitManifest, build_split
    from facecore.eval.plots import save_line_plot
    from facecore.models.checkpoint import load_backbone
    from facecore.models.registry import backbone_geometry
    from facecore.paths import data_root
    from pretrain.config import PretrainConfig
    from pretrain.evaluation import check_disjoint_from_evaluation, lfw_monitor
    from pretrain.trainer import Pretrainer

    root = data_root(args.data)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.split:
        manifest = SplitManifest.load(args.split)
    else:
        manifest = build_split(root, SplitConfig(seed=args.seed))
        manifest.save(out / "split.json")
    config = PretrainConfig(
        backbone=args.backbone, loss=args.loss, scale=args.scale, margin=args.margin, epochs=args.epochs, batch=args.batch, lr=args.lr,
        warmup_epochs=args.warmup_epochs, optimizer=args.optimizer, schedule=args.schedule, seed=args.seed, workers=args.workers,
        compile=args.compile, device=args.device, eval_every=args.eval_every,
        role="devices" if args.finetune_from else "public", max_steps_per_epoch=args.max_steps_per_epoch,
    )
    check_disjoint_from_evaluation(manifest, root, config.role)
    print(manifest.describe())
    init_state = None
    if args.finetune_from:
        base = load_backbone(args.finetune_from)
        config = PretrainConfig(**{**config.to_dict(), "backbone": base.name, "embedding_dim": base.embedding_dim})
        init_state = base.state_dict()
    torch.set_num_threads(torch.get_num_threads())
    geometry = backbone_geometry(config.backbone)  # the dlib ResNet trains on its own 150x150 crops
    data = load_labelled_faces(manifest.images(config.role, root), FaceAligner(geometry=geometry), desc=f"aligning {config.role} faces")
    print(f"training on {config.role}: {data.describe()}")
    monitor = lfw_monitor(root, manifest.config.eval_folds, geometry)
    trainer = Pretrainer(config, data, out, evaluate=monitor, init_state=init_state)
    if args.resume:
        trainer.resume()
        print(f"resumed after epoch {trainer.epoch}")
    started = time.time()
    result = trainer.fit()
    epochs = [h["epoch"] for h in result.history]
    save_line_plot(out / "loss.png", {"train loss": (epochs, [h["loss"] for h in result.history])}, "epoch", "loss", "pretraining loss")
    evaluated = [h for h in result.history if "lfw_accuracy" in h]
    if evaluated:
        save_line_plot(
            out / "lfw_accuracy.png", {"LFW pairs accuracy": ([h["epoch"] for h in evaluated], [h["lfw_accuracy"] for h in evaluated])},
            "epoch", "accuracy", f"LFW folds {manifest.config.eval_folds[0]}-{manifest.config.eval_folds[-1]} (monitoring only)",
        )
    summary = {
        "backbone_file": str(result.backbone_path),
        "config": config.to_dict(),
        "split_sizes": manifest.sizes(),
        "trained_on": {"identities": len(data.classes), "faces": len(data), "excluded_photos": len(data.excluded)},
        "epochs": result.epochs,
        "wall_seconds_this_invocation": round(time.time() - started, 1),
        "median_images_per_second": round(result.images_per_second, 1),
        "machine": f"{platform.machine()} {torch.get_num_threads()} threads, {config.device}",
        "final": result.history[-1],
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary["final"]))
    print(f"backbone: {result.backbone_path}; plots and metrics.jsonl in {out}")
    return 0
