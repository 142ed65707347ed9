"""Every cut of the teacher at its start, before any training: `python -m pretrain.cut_grid --out FILE`.

For each width (a stream width W, or W/I with inner width I), depth and channel criterion, the cut's LFW folds 1-5 figures (the choosing folds;
never 6-10), its mean cosine to the teacher on public faces it was not ranked on, and its fp16 and int8 file sizes. This is what
chooses the criterion and the cuts worth training; the teacher's channels are ranked on the same
1,024 public photos as `fedface pretrain --from-teacher` ranks them. `--owners` adds the CelebA owners' all-pairs
figures (measured, never chosen on), and `--save DIR` keeps each cut's start weights, so that `fedface bench export
--model DIR/CUT.pt ...` times them all side by side (latency depends on the architecture, not on the weights).
"""
from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from facecore.data.split import SplitConfig, SplitManifest, build_split
from facecore.eval.cross_source import celeba_owner_check
from facecore.models.checkpoint import backbone_file_bytes, load_backbone, save_backbone
from facecore.models.dlib_cut import DEPTHS, THIN_BLOCK_CUTS, WIDTHS, cut_name
from facecore.models.dlib_resnet import DlibResNet
from facecore.models.preprocess import embed_faces
from facecore.models.registry import backbone_geometry
from facecore.paths import cache_root, data_root
from pretrain.distill import DistillData, lfw_folds_monitor
from pretrain.distill_config import DistillConfig
from pretrain.distill_run import cut_student, public_photos, ranking_photos
from pretrain.distill_views import build_view_cache
from pretrain.teacher_cut import CRITERIA


def held_out_rows(data: DistillData, count: int = 1024) -> np.ndarray:
    """View-0 rows of public photos between the ones the cut ranks channels on."""
    others = np.setdiff1d(np.arange(len(data)), ranking_photos(data))
    return others[np.linspace(0, len(others) - 1, min(count, len(others))).astype(np.int64)] * data.cache.views


def file_sizes(model: torch.nn.Module) -> dict[str, int]:
    return {"fp16_bytes": backbone_file_bytes(model, half=True), "int8_bytes": backbone_file_bytes(model, int8=True)}


def owner_figures(model: torch.nn.Module, root: Path, manifest: SplitManifest) -> dict[str, float]:
    report = celeba_owner_check(model, root, manifest, progress=False)
    return {"owners_auc": report.auc, "owners_eer": report.eer, "owners_tar_1e-3": report.tar_at_far["1e-3"]}


def measure(
    widths: Sequence[tuple[float, float | None]], depths: Sequence[str], criteria: Sequence[str], views: int, data_dir: str | None,
    owners: bool = False, save: Path | None = None,
) -> list[dict[str, object]]:
    root = data_root(data_dir)
    manifest = build_split(root, SplitConfig(seed=0))
    photos, classes, _ = public_photos(manifest, root)
    teacher = load_backbone("default")
    assert isinstance(teacher, DlibResNet)
    geometry = backbone_geometry(teacher.name)  # every cut embeds the teacher's crop (facecore.models.dlib_cut)
    cache = build_view_cache(photos, teacher, "default", geometry, cache_root() / "distill", views=views)
    data = DistillData(cache, np.array([p.label for p in photos], dtype=np.int64), classes)
    rows = held_out_rows(data)
    faces, targets = np.asarray(cache.student[rows]), np.asarray(cache.teacher[rows])
    monitor = lfw_folds_monitor(root, geometry=geometry)
    extras = (lambda model: owner_figures(model, root, manifest)) if owners else (lambda model: {})
    results: list[dict[str, object]] = [{"model": "teacher", **file_sizes(teacher), **monitor(teacher), **extras(teacher)}]
    print(json.dumps(results[-1]), flush=True)
    for width, inner in widths:
        for depth in depths:
            for criterion in criteria:
                name = cut_name(width, depth, inner)
                config = DistillConfig(backbone=name, init="cut", width=width, depth=depth, inner_width=inner, cut_by=criterion)
                student, _ = cut_student(teacher, data, config)
                cosine = float(np.mean(np.sum(embed_faces(student, faces) * targets, axis=1)))
                record: dict[str, object] = {"model": name, "width": width, "inner_width": inner, "depth": depth, "cut_by": criterion,
                          "parameters": sum(p.numel() for p in student.parameters()), "cosine_to_teacher": cosine,
                          **file_sizes(student), **monitor(student), **extras(student)}
                if save is not None:
                    save.mkdir(parents=True, exist_ok=True)
                    record["saved"] = str(save_backbone(student, save / f"{name}-{criterion}.pt"))
                results.append(record)
                print(json.dumps(record), flush=True)
    return results


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", default=None)
    parser.add_argument("--widths", default=",".join([f"{w:g}" for w in WIDTHS] + [f"{w:g}/{i:g}" for w, i in THIN_BLOCK_CUTS]),
                        help="comma-separated stream widths W, or W/I for inner width I")
    parser.add_argument("--depths", default=",".join(DEPTHS))
    parser.add_argument("--criteria", default=",".join(CRITERIA))
    parser.add_argument("--views", type=int, default=8, help="the view cache to rank on (as `fedface pretrain --views`)")
    parser.add_argument("--owners", action="store_true", help="also the CelebA owners' all-pairs AUC, EER and TAR@1e-3")
    parser.add_argument("--save", type=Path, metavar="DIR", help="keep each cut's start weights here, as DIR/<cut>-<criterion>.pt")
    parser.add_argument("--out", type=Path, required=True, help="JSON lines, one per cut")
    args = parser.parse_args(argv)
    torch.set_num_threads(torch.get_num_threads())
    widths = [(float(w), float(i) if i else None) for w, _, i in (spec.partition("/") for spec in args.widths.split(","))]
    results = measure(widths, args.depths.split(","), args.criteria.split(","), args.views, args.data, owners=args.owners, save=args.save)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text("".join(json.dumps(r) + "\n" for r in results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
