"""Ship a finished training run (CosFace pretraining or distillation) as the compact `mobile` model.

    python -m pretrain.bundle runs/distill [best.pt]

Stores the chosen backbone as an fp16 state dict in facecore/weights/mobile.pt, then measures the
stored (fp16-rounded) weights (`facecore.eval.model_figures`: threshold on LFW folds 1-5, LFW folds
6-10, CelebA owners) and writes them with the run's summary to facecore/weights/mobile.json.
The checkpoint must have been chosen on folds 1-5 (or be the last epoch); never on 6-10.
MODEL_CARD.md is written by hand from those figures.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from facecore.eval.model_figures import measure, write_figures
from facecore.models.checkpoint import MOBILE_MODEL, load_backbone, save_backbone
from facecore.paths import data_root


def bundle(run_dir: Path, backbone_file: str = "backbone.pt") -> dict[str, Any]:
    summary = json.loads((run_dir / "summary.json").read_text())
    history = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    model = load_backbone(run_dir / backbone_file)
    run = {"run": summary, "checkpoint": backbone_file, "trained_epochs": len(history),
           "wall_seconds": round(sum(h.get("seconds", 0.0) for h in history), 1)}
    save_backbone(model, MOBILE_MODEL, meta=run, half=True)
    figures = {**measure("mobile", data_root()), "training": run}
    write_figures("mobile", figures)
    return figures


if __name__ == "__main__":
    result = bundle(Path(sys.argv[1]), *(sys.argv[2:3]))
    print(json.dumps({k: result[k] for k in ("lfw", "verification", "fp16_bytes")}, indent=1))
