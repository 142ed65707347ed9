"""The device's personalised verifier (FedFusion in the face system), measured on real devices.

Each simulated device is one real identity of the split's device set. It enrolls with the first
half of its photos (shuffled by the seed) and keeps the rest held out. For every method it builds
its verifier from its enrollment photos only, then scores:
- genuine: its own held-out photos against its template;
- impostor: every other device's held-out photos against its template.
Scores are pooled over devices into one ROC: the owner-versus-others TAR at fixed FARs.

`global` is the plain downloaded model with the FedFace enrollment template (the normalised mean
feature). Every other method is `device_sdk.personal.train_personal_verifier`, the SDK's own code.
The global model is the bundled pretrained backbone, which never saw a device identity.
"""
from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from device_sdk.personal import PersonalConfig, train_personal_verifier
from device_sdk.personal_calibration import calibrate
from device_sdk.training import LocalTrainingConfig, prefix_cache, split_backbone
from facecore.align.geometry import ARCFACE_112, FaceGeometry
from facecore.align.pipeline import FaceAligner
from facecore.data.faces import load_labelled_faces
from facecore.data.records import FaceImage
from facecore.data.split import SplitManifest
from facecore.eval.metrics import roc_auc, roc_curve, tar_at_far
from facecore.eval.plots import save_roc_plot
from facecore.fusion import FUSIONS
from facecore.models.preprocess import faces_to_tensor
from facecore.templates import mean_feature_embedding
from simulator.fusion.config import FusionInputError

FARS = (1e-2, 1e-3, 1e-4)


@dataclass(frozen=True)
class FaceFusionConfig:
    devices: int = 100
    fusions: tuple[str, ...] = FUSIONS
    epochs: int = 20
    lr: float = 0.01
    margin: float = 0.9
    trainable_blocks: int = 2
    lambda_init: float = 0.5
    cohort: int = 0  # public faces (one per public identity) each device holds as impostors; 0: none
    cohort_margin: float = 0.0
    model: str = "default"
    seed: int = 0

    def __post_init__(self) -> None:
        problems = [
            m for m, bad in (
                ("devices must be >= 2 (impostors come from other devices)", self.devices < 2),
                (f"fusions must be among {', '.join(FUSIONS)}", not self.fusions or any(f not in FUSIONS for f in self.fusions)),
                ("epochs must be >= 1", self.epochs < 1), ("lr must be > 0", not self.lr > 0),
                ("trainable_blocks must be >= 1", self.trainable_blocks < 1),
                ("lambda_init must be in [0, 1]", not 0 <= self.lambda_init <= 1),
            ) if bad
        ]
        if problems:
            raise FusionInputError("; ".join(problems))

    def personal(self, fusion: str) -> PersonalConfig:
        training = LocalTrainingConfig(epochs=self.epochs, lr=self.lr, margin=self.margin, trainable_blocks=self.trainable_blocks)
        return PersonalConfig(fusion, training, self.lambda_init, cohort_margin=self.cohort_margin)


@dataclass(frozen=True)
class DeviceFaces:
    identity: str
    enroll: np.ndarray
    held_out: np.ndarray


def split_photos(identity: str, faces: np.ndarray, rng: np.random.Generator) -> DeviceFaces:
    """First ceil(n/2) shuffled photos enroll, the rest are held out; needs n >= 2."""
    if len(faces) < 2:
        raise FusionInputError(f"{identity}: a device needs 2 photos (one to enroll, one held out), has {len(faces)}")
    order = rng.permutation(len(faces))
    cut = (len(faces) + 1) // 2
    return DeviceFaces(identity, faces[order[:cut]], faces[order[cut:]])


def public_cohort(manifest: SplitManifest, root: Path, size: int, seed: int = 0, geometry: FaceGeometry = ARCFACE_112) -> np.ndarray:
    """One aligned face of each of `size` public (pretraining) identities: impostors a device may
    hold, since they are neither device owners nor evaluation people."""
    first: dict[str, FaceImage] = {}
    for image in manifest.images("public", root):
        first.setdefault(image.identity, image)
    if size > len(first):
        raise FusionInputError(f"the public split has {len(first)} identities, fewer than the cohort of {size}")
    chosen = sorted(np.random.default_rng(seed).choice(len(first), size, replace=False))
    images = list(first.values())
    return load_labelled_faces([images[i] for i in chosen], FaceAligner(geometry=geometry), desc="aligning the public cohort").faces


@torch.no_grad()
def _activations(prefix: torch.nn.Module, faces: np.ndarray, batch: int = 64) -> torch.Tensor:
    inputs = faces_to_tensor(faces)
    return torch.cat([prefix(inputs[i : i + batch]) for i in range(0, len(inputs), batch)])


def pooled_scores(templates: np.ndarray, held_embeddings: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Genuine and impostor cosines, for one shared embedding of the held-out photos."""
    genuine, impostor = [], []
    owners = np.concatenate([np.full(len(e), i) for i, e in enumerate(held_embeddings)])
    scores = np.concatenate(held_embeddings) @ templates.T  # (photos, devices)
    for device in range(len(templates)):
        genuine.append(scores[owners == device, device])
        impostor.append(scores[owners != device, device])
    return np.concatenate(genuine), np.concatenate(impostor)


def accept_rates(genuine: np.ndarray, impostor: np.ndarray, threshold: float | np.ndarray,
                 impostor_threshold: float | np.ndarray | None = None) -> dict[str, float]:
    """What the owners get at a fixed threshold (verify accepts score >= threshold): one for all, or
    each pair judged at its template's own (genuine and impostor thresholds per score)."""
    impostor_threshold = threshold if impostor_threshold is None else impostor_threshold
    return {"genuine_accept": float(np.mean(genuine >= threshold)), "impostor_accept": float(np.mean(impostor >= impostor_threshold))}


def _summary(genuine: np.ndarray, impostor: np.ndarray, seconds: float, extra: dict[str, Any]) -> dict[str, Any]:
    scores = np.concatenate([genuine, impostor])
    labels = np.concatenate([np.ones(len(genuine)), np.zeros(len(impostor))])
    return {
        "tar_at_far": tar_at_far(genuine, impostor, FARS), "auc": roc_auc(scores, labels),
        "genuine_mean": float(genuine.mean()), "impostor_mean": float(impostor.mean()),
        "genuine": len(genuine), "impostor": len(impostor), "seconds": round(seconds, 1), **extra,
    }


def run_face_fusion(config: FaceFusionConfig, devices: list[DeviceFaces], model: torch.nn.Module, out: Path,
                    log: Callable[[str], None] = print, cohort: np.ndarray | None = None, threshold: float | None = None,
                    calibration: np.ndarray | None = None) -> dict[str, Any]:
    """Score the global model and each fused verifier; write face_fusion.json and roc.png under `out`.
    `threshold`: the global model's published one, where the global method's accept rates are read.
    `calibration`: public faces (not the cohort) that set each verifier's own threshold at
    PersonalConfig.calibration_far, as the SDK does; its accept rates are read there."""
    if len(devices) < 2:
        raise FusionInputError(f"need at least 2 devices, got {len(devices)}")
    model = model.float().eval()
    prefix, global_suffix = split_backbone(model, config.trainable_blocks)
    started = time.perf_counter()
    enroll = [prefix_cache(model, d.enroll, config.trainable_blocks) for d in tqdm(devices, desc="prefix: enrollment photos", leave=False)]
    cohort_acts = _activations(prefix, cohort) if cohort is not None and len(cohort) else None
    held_acts = torch.cat([_activations(prefix, d.held_out) for d in tqdm(devices, desc="prefix: held-out photos", leave=False)])
    with torch.no_grad():
        held_global = torch.cat([global_suffix(held_acts[i : i + 128]) for i in range(0, len(held_acts), 128)])
    sizes = [len(d.held_out) for d in devices]
    split_global = list(torch.nn.functional.normalize(held_global, dim=1).split(sizes))
    templates = np.stack([mean_feature_embedding(global_suffix(c.plain).detach()) for c in enroll])
    genuine, impostor = pooled_scores(templates, [e.numpy() for e in split_global])
    calibration_acts = _activations(prefix, calibration) if calibration is not None and len(calibration) else None
    at_threshold = {} if threshold is None else {"at_threshold": {"threshold": threshold, **accept_rates(genuine, impostor, threshold)}}
    methods: dict[str, dict[str, Any]] = {"global": _summary(genuine, impostor, time.perf_counter() - started, at_threshold)}
    curves = {"global": _curve(genuine, impostor)}
    log(f"global: TAR@FAR {methods['global']['tar_at_far']}")
    for fusion in config.fusions:
        started = time.perf_counter()
        genuine_parts, impostor_parts, summaries, losses, own_thresholds = [], [], [], [], []
        for i, device in enumerate(tqdm(devices, desc=f"personalising ({fusion})", leave=False)):
            verifier, report = train_personal_verifier(model, device.enroll, config.personal(fusion), seed=config.seed + i, cache=enroll[i], cohort=cohort_acts)
            scores = (verifier.embed_prefix(held_acts, held_global) @ verifier.template).numpy()
            owner = np.zeros(len(held_acts), bool)
            owner[sum(sizes[:i]) : sum(sizes[: i + 1])] = True
            genuine_parts.append(scores[owner])
            impostor_parts.append(scores[~owner])
            if calibration_acts is not None:
                public = (verifier.embed_prefix(calibration_acts) @ verifier.template).numpy()
                enrolled = verifier.enrollment_scores if verifier.enrollment_scores is not None else np.zeros(0)  # set by training
                own = calibrate(enrolled, public, verifier.config.calibration_far)
                own_thresholds.append(np.inf if own is None else own.threshold)  # no threshold: the verifier accepts nobody
            summaries.append(report.fusion_summary)
            losses.append((report.loss_before, report.loss_after))
        genuine, impostor = np.concatenate(genuine_parts), np.concatenate(impostor_parts)
        extra: dict[str, Any] = {"loss_before": float(np.mean([a for a, _ in losses])), "loss_after": float(np.mean([b for _, b in losses])),
                 "fusion": {k: float(np.mean([s[k] for s in summaries])) for k in (summaries[0] if summaries else {})}}
        if calibration_acts is not None:
            genuine_at = np.repeat(own_thresholds, [len(g) for g in genuine_parts])
            impostor_at = np.repeat(own_thresholds, [len(m) for m in impostor_parts])
            extra["at_own_threshold"] = {"far": config.personal(fusion).calibration_far, "public_faces": len(calibration_acts),
                                         "median_threshold": float(np.median(own_thresholds)),
                                         **accept_rates(genuine, impostor, genuine_at, impostor_at)}
        methods[fusion] = _summary(genuine, impostor, time.perf_counter() - started, extra)
        curves[f"fused: {fusion}" if fusion != "none" else "local only (none)"] = _curve(genuine, impostor)
        log(f"{fusion}: TAR@FAR {methods[fusion]['tar_at_far']}, loss {extra['loss_before']:.4f} -> {extra['loss_after']:.4f}")
    out.mkdir(parents=True, exist_ok=True)
    plot = save_roc_plot(out / "owner_vs_others_roc.png", curves, f"Owner vs others, {len(devices)} devices")
    result = {
        "config": asdict(config), "devices": len(devices), "enroll_photos": int(sum(len(d.enroll) for d in devices)),
        "held_out_photos": int(sum(sizes)), "cohort_faces": 0 if cohort is None else len(cohort), "methods": methods, "plot": str(plot),
    }
    (out / "face_fusion.json").write_text(json.dumps(result, indent=1))
    return result


def _curve(genuine: np.ndarray, impostor: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    far, tar, _ = roc_curve(np.concatenate([genuine, impostor]), np.concatenate([np.ones(len(genuine)), np.zeros(len(impostor))]))
    return far, tar


def markdown_table(report: dict[str, Any]) -> str:
    rows = ["| method | TAR@FAR=1e-2 | TAR@FAR=1e-3 | TAR@FAR=1e-4 | AUC | mean genuine cos | mean impostor cos | fusion use "
            "| genuine / impostor accept % at its threshold |",
            "| --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |"]
    for name, m in report["methods"].items():
        tar = m["tar_at_far"]
        use = ", ".join(f"{k} {v:.3f}" for k, v in m.get("fusion", {}).items())
        at = m.get("at_threshold") or m.get("at_own_threshold")
        accepts = "" if at is None else f"{100 * at['genuine_accept']:.2f} / {100 * at['impostor_accept']:.3f}"
        rows.append(f"| {name} | {100 * tar['1e-2']:.2f} | {100 * tar['1e-3']:.2f} | {100 * tar['1e-4']:.2f} | {m['auc']:.4f} | "
                    f"{m['genuine_mean']:.3f} | {m['impostor_mean']:.3f} | {use} | {accepts} |")
    return "\n".join(rows)
