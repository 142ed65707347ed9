"""`fedface pretrain --teacher NAME`: distil the teacher into the compact student on the public faces.

Invariants: only the split's PUBLIC role is read for training (guarded by
check_disjoint_from_evaluation); photos without a detected face are excluded, never fallback-cropped;
the monitor (and so best.pt) sees LFW folds 1-5 only; the test folds 6-10 are never touched here.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import time
from functools import partial
from pathlib import Path
from typing import cast

import numpy as np
import torch

from facecore.align.geometry import ARCFACE_112, geometry_of
from facecore.align.photos import load_rgb
from facecore.align.pipeline import FaceAligner, default_cache, file_key
from facecore.data.split import SplitConfig, SplitManifest, build_split
from facecore.errors import FaceCoreError
from facecore.eval.plots import save_line_plot
from facecore.models.checkpoint import load_backbone
from facecore.models.dlib_cut import cut_name
from facecore.models.dlib_resnet import DlibResNet
from facecore.models.preprocess import embed_faces
from facecore.models.registry import backbone_geometry, get_backbone
from facecore.paths import cache_root, data_root
from pretrain.distill import MONITOR_KEY, UNSEEN_KEY, DistillData, Distiller, init_targets, lfw_folds_monitor
from pretrain.distill_config import DistillConfig
from pretrain.distill_views import Photo, build_view_cache, weights_digest
from pretrain.evaluation import check_disjoint_from_evaluation
from pretrain.teacher_cut import Criterion, StageEnd, StageTeacher, cut_with_stages


def public_photos(manifest: SplitManifest, root: Path) -> tuple[list[Photo], tuple[str, ...], int]:
    """The public role's photos with a detected face, labelled; and how many were excluded."""
    images = manifest.images("public", root)
    FaceAligner().align_paths([img.path for img in images], allow_fallback=False, desc="detecting public faces")
    keys = [file_key(img.path) for img in images]
    entries = default_cache(ARCFACE_112).lookup(keys)
    usable = [(img, k) for img, k in zip(images, keys) if k in entries and entries[k].status == "ok" and entries[k].landmarks]
    classes = tuple(sorted({img.identity for img, _ in usable}))
    index = {name: i for i, name in enumerate(classes)}
    photos = [
        Photo(k, index[img.identity], np.asarray(entries[k].landmarks, dtype=np.float64), partial(load_rgb, img.path))
        for img, k in usable
    ]
    return photos, classes, len(images) - len(usable)


def config_from_args(args: argparse.Namespace) -> DistillConfig:
    cut = args.init == "cut"
    return DistillConfig(
        backbone=cut_name(args.width, args.depth, args.inner_width) if cut else "mobilefacenet", epochs=args.epochs, batch=args.batch, lr=args.lr,
        warmup_epochs=args.warmup_epochs, optimizer=args.optimizer, schedule=args.schedule, seed=args.seed, workers=args.workers,
        compile=args.compile, device=args.device,
        eval_every=args.eval_every, max_steps_per_epoch=args.max_steps_per_epoch, scale=args.scale, margin=args.margin,
        teacher=args.teacher, init=args.init, views=args.views, view_seed=args.view_seed, mix=args.mix, colour_jitter=args.colour_jitter,
        distill_weight=args.distill_weight, centered=args.centered, relational_weight=args.relational_weight, cosface_weight=args.cosface_weight,
        stage_weight=args.stage_weight,
        width=args.width, depth=args.depth, inner_width=args.inner_width, cut_by=args.cut_by,
        rotate_teacher=args.rotate_teacher and not cut,  # a cut already speaks the teacher's space
    )


RANKING_PHOTOS = 1024


def ranking_photos(data: DistillData) -> np.ndarray:
    """The photos (indices into `data`) a cut ranks the teacher's channels on: RANKING_PHOTOS spread evenly."""
    return np.linspace(0, len(data) - 1, min(RANKING_PHOTOS, len(data))).astype(np.int64)


def cut_student(teacher: torch.nn.Module, data: DistillData, config: DistillConfig, refit_head: bool = True) -> tuple[torch.nn.Module, list[StageEnd]]:
    """The teacher cut to the config's width and depth, its channels ranked on the view 0 of `ranking_photos`,
    and where its stages end in it and in the teacher (`refit_head=False`: only those are wanted)."""
    if not isinstance(teacher, DlibResNet):
        raise FaceCoreError(f"--from-teacher cuts the dlib ResNet; {config.teacher!r} is a {type(teacher).__name__}")
    faces = np.asarray(data.cache.student[ranking_photos(data) * data.cache.views])
    return cut_with_stages(teacher, faces, config.width, config.depth, cast(Criterion, config.cut_by), refit_head, config.inner_width)


def run_distill(args: argparse.Namespace) -> int:
    started = time.time()
    root = data_root(args.data)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    manifest = SplitManifest.load(args.split) if args.split else build_split(root, SplitConfig(seed=0))
    manifest.save(out / "split.json")
    check_disjoint_from_evaluation(manifest, root, "public")
    config = config_from_args(args)
    cut = config.init == "cut"
    student = None if cut else load_backbone(config.init, backbone=config.backbone, seed=config.seed)
    photos, classes, excluded = public_photos(manifest, root)
    print(f"public split: {len(photos)} photos of {len(classes)} identities ({excluded} without a detected face excluded)")
    teacher = load_backbone(config.teacher)
    cache_started = time.time()
    cache = build_view_cache(
        photos, teacher, config.teacher, backbone_geometry(config.backbone) if student is None else geometry_of(student),
        cache_root() / "distill", views=config.views, seed=config.view_seed, jitter=config.jitter,
    )
    cache_seconds = time.time() - cache_started
    print(f"views: {cache.folder} ({len(cache) * cache.views} rows, {cache_seconds:.0f} s)")
    data = DistillData(cache, np.array([p.label for p in photos], dtype=np.int64), classes)
    stages: list[StageEnd] = []
    if student is None:
        # A resumed run's weights come from its checkpoint; only a new one ranks the teacher's channels, and a resumed
        # one that matches stages ranks them again for the same channels (the cut is a function of the teacher and the views).
        if args.resume:
            student = get_backbone(config.backbone)
            if config.stage_weight:
                stages = cut_student(teacher, data, config, refit_head=False)[1]
        else:
            student, stages = cut_student(teacher, data, config)
        print(f"student: {config.backbone}, {sum(p.numel() for p in student.parameters()):,} parameters cut from {config.teacher} "
              f"by {config.cut_by}", flush=True)
    stage_teacher = StageTeacher(cast(DlibResNet, teacher), stages) if config.stage_weight else None
    del teacher
    monitor = lfw_folds_monitor(root, geometry=geometry_of(student), trained_on=manifest.sets["public"])
    # A student file (a cut trained before, continued) brings its own architecture
    config = DistillConfig(**{**config.to_dict(), "backbone": student.name, "embedding_dim": student.embedding_dim})
    if args.resume:
        trainer = Distiller(config, data, out, evaluate=monitor, init_state=student.state_dict(), stages=stage_teacher)
        trainer.resume()
        print(f"resumed after epoch {trainer.epoch}")
    else:
        embeddings = _first_view_embeddings(student, data)
        rotation, head, distances = init_targets(student, data, config.rotate_teacher and config.init != "random", embeddings)
        print("init student vs teacher (view 0): " + json.dumps(distances), flush=True)
        trainer = Distiller(config, data, out, evaluate=monitor, init_state=student.state_dict(), init_head=head, rotation=rotation,
                            stages=stage_teacher)
        (out / "metrics.jsonl").unlink(missing_ok=True)
        baseline = {"epoch": 0, **distances, **(monitor(trainer.model) if args.init_eval else {})}
        with open(out / "metrics.jsonl", "a") as log:
            log.write(json.dumps(baseline) + "\n")
        print("init: " + " ".join(f"{k}={v:.4g}" for k, v in baseline.items()), flush=True)
    train_started = time.time()
    result = trainer.fit()
    train_seconds = time.time() - train_started
    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines() if line.strip()]
    _plots(out, records)
    evaluated = [r for r in records if MONITOR_KEY in r and r["epoch"] > 0]
    best = max(evaluated, key=lambda r: r[MONITOR_KEY]) if evaluated else None
    images = sum(h["images_per_second"] * h["seconds"] for h in result.history)
    summary = {
        "config": config.to_dict(),
        "view_cache": cache.folder.name,  # a folder of the distillation cache; no machine's absolute path
        "view_cache_seconds_this_invocation": round(cache_seconds, 1),
        "trained_on": {"role": "public", "identities": len(classes), "photos": len(photos), "excluded_photos": excluded, "views_per_photo": cache.views},
        "epochs": result.epochs,
        "init": records[0] if records and records[0]["epoch"] == 0 else None,
        "best": best,
        "best_checkpoint": str(out / "best.pt") if best else None,
        "last": result.history[-1],
        "train_seconds_all_epochs": round(sum(h["seconds"] for h in result.history), 1),
        "images_per_second_overall": round(images / max(sum(h["seconds"] for h in result.history), 1e-9), 1),
        "median_images_per_second": round(result.images_per_second, 1),
        "train_wall_seconds_this_invocation": round(train_seconds, 1),
        "wall_seconds_this_invocation": round(time.time() - started, 1),
        "machine": f"{platform.machine()} {torch.get_num_threads()} threads, {config.device}",
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    print(f"throughput {summary['images_per_second_overall']} img/s; training {summary['train_seconds_all_epochs']} s; "
          f"wall {summary['wall_seconds_this_invocation']} s this invocation")
    print(f"best (LFW folds 1-5): {json.dumps(best)}; backbone: {result.backbone_path}; summary in {out / 'summary.json'}")
    return 0


def _first_view_embeddings(student: torch.nn.Module, data: DistillData) -> np.ndarray:
    """The init student's embeddings of view 0, cached beside the view cache (keyed by both)."""
    path = data.cache.folder.parent / f"init-{weights_digest(student)}-{data.cache.folder.name}.npy"
    if path.is_file():
        return np.load(path)
    embeddings = embed_faces(student, data.first_views())
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}.npy")
    np.save(tmp, embeddings)
    os.replace(tmp, path)
    return embeddings


def _plots(out: Path, records: list[dict[str, float]]) -> None:
    trained = [r for r in records if "loss" in r]
    if trained:
        save_line_plot(out / "loss.png", {"train loss": ([r["epoch"] for r in trained], [r["loss"] for r in trained])}, "epoch", "loss", "distillation loss")
    monitored = [r for r in records if MONITOR_KEY in r]
    if monitored:
        epochs = [r["epoch"] for r in monitored]
        curves = {"pairs accuracy": (epochs, [r[MONITOR_KEY] for r in monitored]),
                  "TAR@FAR1e-3 (all pairs)": (epochs, [r["lfw_1_5_tar_1e-3"] for r in monitored])}
        unseen = [r for r in monitored if UNSEEN_KEY in r]
        if unseen:
            curves["TAR@FAR1e-3, people it never trained on (per person)"] = ([r["epoch"] for r in unseen], [r[UNSEEN_KEY] for r in unseen])
        save_line_plot(out / "learning_curve.png", curves, "epoch", "LFW folds 1-5", "distillation: LFW folds 1-5 (choosing folds)")
