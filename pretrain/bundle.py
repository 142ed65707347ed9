"""Ship a finished training run (CosFace pretraining or distillation) as the compact `mobile` model.

    python -m pretrain.bundle runs/distill [best.pt] [--int8]

Stores the chosen backbone in facecore/weights/mobile.pt, fp16 or (--int8) int8 weights with a scale per
output channel (facecore.models.checkpoint), then measures the stored (rounded) weights (`facecore.eval.model_figures`: threshold on LFW folds 1-5, LFW folds
6-10, CelebA owners) and writes them with the run's summary to facecore/weights/mobile.json.
The checkpoint must have been chosen on folds 1-5 (or be the last epoch); never on 6-10.
MODEL_CARD.md is written by hand from those figures.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from facecore.eval.model_figures import measure, write_figures
from facecore.models.checkpoint import MOBILE_MODEL, load_backbone, save_backbone
from facecore.paths import data_root


def bundle(run_dir: Path, backbone_file: str = "backbone.pt", int8: bool = False) -> dict[str, Any]:
    summary = json.loads((run_dir / "summary.json").read_text())
    history = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    model = load_backbone(run_dir / backbone_file)
    run = {"run": summary, "checkpoint": backbone_file, "trained_epochs": len(history),
           "wall_seconds": round(sum(h.get("seconds", 0.0) for h in history), 1)}
    save_backbone(model, MOBILE_MODEL, meta=run, half=not int8, int8=int8)
    shipped = {"precision": "int8" if int8 else "fp16", "shipped_bytes": MOBILE_MODEL.stat().st_size}
    figures = {**measure("mobile", data_root()), **shipped, "training": run}
    write_figures("mobile", figures)
    return figures


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run", type=Path, help="the training run's folder")
    parser.add_argument("file", nargs="?", default="backbone.pt", help="the checkpoint in it (default: backbone.pt)")
    parser.add_argument("--int8", action="store_true", help="ship int8 weights (a scale per output channel) instead of fp16")
    args = parser.parse_args()
    result = bundle(args.run, args.file, args.int8)
    print(json.dumps({k: result[k] for k in ("lfw", "verification", "precision", "shipped_bytes")}, indent=1))
