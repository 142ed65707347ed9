"""Bundle a finished pretraining run as the package's compact `mobile` model, with its model card.

    python -m pretrain.bundle runs/pretrain

Stores the backbone as an fp16 state dict in facecore/weights/mobile.pt, evaluates the
stored (fp16-rounded) weights with the full LFW protocol on the split's evaluation folds, and
writes facecore/weights/MODEL_CARD.md and mobile.json from measured figures only.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from facecore.data.split import SplitManifest
from facecore.eval.baselines import lbp_features
from facecore.eval.lfw import evaluate, load_lfw_faces
from facecore.models.checkpoint import MOBILE_MODEL, load_backbone, save_backbone
from facecore.models.preprocess import embed_faces
from facecore.paths import data_root

PAPER_LFW = 0.9915  # FedFace paper: CosFace pretrained on 9,000 CASIA-WebFace subjects


def bundle(run_dir: Path) -> dict[str, object]:
    summary = json.loads((run_dir / "summary.json").read_text())
    manifest = SplitManifest.load(run_dir / "split.json")
    model = load_backbone(run_dir / "backbone.pt")
    history = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    root = data_root()
    folds = manifest.config.eval_folds
    meta = {
        "run": summary, "trained_epochs": len(history), "wall_seconds": round(sum(h["seconds"] for h in history), 1),
        "verification": calibrate_threshold(model, root, folds[:2]),
    }
    save_backbone(model, MOBILE_MODEL, meta=meta, half=True)
    shipped = load_backbone("mobile")
    data = load_lfw_faces(root / "lfw", folds)
    report = evaluate(data, lambda f: embed_faces(shipped, f)).report.to_json_dict()
    classical = evaluate(data, lbp_features).report.to_json_dict()
    card = {
        "backbone": shipped.name, "embedding_dim": shipped.embedding_dim, "file_bytes": MOBILE_MODEL.stat().st_size,
        "eval_folds": list(folds), "lfw": report, "lbp_baseline": {k: classical[k] for k in ("accuracy", "accuracy_std", "auc", "tar_at_far")},
        "split_sizes": manifest.sizes(), "split_seed": manifest.config.seed, **meta,
    }
    (MOBILE_MODEL.parent / "mobile.json").write_text(json.dumps(card, indent=1))
    (MOBILE_MODEL.parent / "MODEL_CARD.md").write_text(model_card(card, history))
    return card


def calibrate_threshold(model, root: Path, folds: tuple[int, ...], far: float = 1e-3) -> dict[str, object]:  # type: ignore[no-untyped-def]
    """The cosine threshold devices verify with: FAR 1e-3 over all impostor pairs of unseen people.

    Calibrated on people the model never trained on (two evaluation folds), because impostor scores
    among training identities are lower and would set the threshold too low. The threshold is one
    scalar and every reported metric chooses its own thresholds, so no reported figure depends on it."""
    from facecore.eval.metrics import all_pairs_scores, threshold_at_far

    data = load_lfw_faces(root / "lfw", folds)
    _, impostor = all_pairs_scores(embed_faces(model, data.faces), data.identities)
    return {"threshold": threshold_at_far(impostor, far), "far": far,
            "calibration": f"all {impostor.size:,} impostor pairs of LFW people folds {','.join(map(str, folds))}"}


def model_card(card: dict, history: list[dict]) -> str:  # type: ignore[type-arg]
    lfw, lbp, run = card["lfw"], card["lbp_baseline"], card["run"]
    config, sizes = run["config"], card["split_sizes"]
    tar = lfw["tar_at_far"]
    folds = card["eval_folds"]
    hours = card["wall_seconds"] / 3600
    return f"""# Default FedFace backbone: {card['backbone']} ({card['embedding_dim']}-d)

The model every component uses when no checkpoint is given (`--model default`). Shipped as an fp16
state dict of {card['file_bytes'] / 1e6:.2f} MB. All figures below are measured on the shipped fp16 weights.

## Data
Split seed {card['split_seed']} (`fedface data split --seed {card['split_seed']}`):

| set | identities | images |
| --- | ---: | ---: |
| public (trained on) | {sizes['public']['identities']:,} | {sizes['public']['images']:,} |
| devices (not used here) | {sizes['devices']['identities']:,} | {sizes['devices']['images']:,} |
| evaluation: LFW people folds {folds[0]}-{folds[-1]} | {sizes['evaluation']['identities']:,} | {sizes['evaluation']['images']:,} |

Trained on {run['trained_on']['faces']:,} aligned faces of {run['trained_on']['identities']:,} public identities
({run['trained_on']['excluded_photos']} photos without a detected face excluded). No evaluation identity was seen.

## Training
`fedface pretrain --backbone {config['backbone']} --loss {config['loss']}{_option('scale', config.get('scale'))}{_option('margin', config.get('margin'))} --epochs {config['epochs']} --batch {config['batch']} --lr {config['lr']} --workers {config['workers']}`
(SGD momentum {config['momentum']}, weight decay {config['weight_decay']}, {config['warmup_epochs']} warm-up epoch(s), {config['schedule']} schedule,
flip + mild crop + colour jitter). {card['trained_epochs']} epochs, {hours:.2f} h wall time on {run['machine']},
median {run['median_images_per_second']} img/s. Final training loss {history[-1]['loss']:.3f}.
{_scale_note(config)}
## LFW, identity-disjoint folds {folds[0]}-{folds[-1]}

| model | accuracy | AUC | TAR@FAR=1e-3 | TAR@FAR=1e-4 |
| --- | ---: | ---: | ---: | ---: |
| this model | {100 * lfw['accuracy']:.2f}% ± {100 * lfw['accuracy_std']:.2f} | {lfw['auc']:.4f} | {_pct(tar['1e-3'])} | {_pct(tar['1e-4'])} |
| LBP histograms (classical) | {100 * lbp['accuracy']:.2f}% ± {100 * lbp['accuracy_std']:.2f} | {lbp['auc']:.4f} | {_pct(lbp['tar_at_far']['1e-3'])} | {_pct(lbp['tar_at_far']['1e-4'])} |

Accuracy: {lfw['pairs']} View-2 pairs, threshold chosen on the other folds. TAR@FAR: all
{lfw['all_pairs']['genuine']:,} genuine and {lfw['all_pairs']['impostor']:,} impostor pairs among the folds' photos.
{lfw['fallback_images']} evaluation photos had no detected face and were scored on a median-landmark crop.

Against the FedFace paper's CASIA-WebFace CosFace model (99.15% on LFW): {100 * (PAPER_LFW - lfw['accuracy']):.2f} points
lower. That model saw 9,000 CASIA-WebFace subjects (roughly 420,000 photos); this one saw
{run['trained_on']['identities']:,} identities ({run['trained_on']['identities'] / 9000:.0%} as many) and {run['trained_on']['faces']:,} photos
(about 1/{420_000 / run['trained_on']['faces']:.0f} as many), most of its identities with a single photo.

Devices verify at cosine {card['verification']['threshold']:.4f}, the FAR {card['verification']['far']:g} threshold over
{card['verification']['calibration']}; the server publishes it with every model version.

Training curves, per-epoch metrics and the split manifest: `pretrain/default_run/` (the LFW accuracy
there was only monitored, on the evaluation folds' pairs; no epoch was chosen by it: the product is the last epoch).

Reproduce: `fedface eval lfw --model default --folds {folds[0]}-{folds[-1]} --json`.
"""


def _scale_note(config: dict) -> str:  # type: ignore[type-arg]
    if config.get("scale") in (None, 64.0):
        return ""
    return (f"CosFace's scale is {config['scale']:g} here instead of 64 (AM-Softmax's setting): a first run with s = 64, lr 0.1 and\n"
            "batch 128 had a rising loss (42 -> 54) after a whole epoch of warm-up, and this data set allows only ~120 steps per epoch.\n")


def _option(name: str, value: object) -> str:
    return "" if value is None else f" --{name} {value}"


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.2f}%"


def rewrite_card(run_dir: Path) -> None:
    """Regenerate MODEL_CARD.md from the stored figures (mobile.json) without re-evaluating."""
    card = json.loads((MOBILE_MODEL.parent / "mobile.json").read_text())
    history = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    (MOBILE_MODEL.parent / "MODEL_CARD.md").write_text(model_card(card, history))


if __name__ == "__main__":
    if sys.argv[1:2] == ["--card-only"]:
        rewrite_card(Path(sys.argv[2]))
    else:
        print(json.dumps(bundle(Path(sys.argv[1]))["lfw"], indent=1))
