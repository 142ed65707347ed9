"""Run one cross-device experiment end to end and write its report, plots and markdown."""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from facecore.align.geometry import geometry_of
from facecore.data.split import SplitConfig, SplitManifest, build_split
from facecore.errors import FaceCoreError
from facecore.eval.feature_center import public_feature_center
from facecore.eval.plots import save_line_plot
from facecore.models.checkpoint import feature_center_of, load_backbone, save_backbone, shipped_verification
from facecore.models.preprocess import embed_faces
from facecore.models.verification import shipping
from simulator.cross_device.config import CrossDeviceConfig
from simulator.cross_device.engine import CrossDeviceSimulation, Evaluator
from simulator.cross_device.evaluation import EVALUATED, evaluators
from simulator.cross_device.markdown import label, write_markdown
from simulator.cross_device.negatives import load_public_negatives
from simulator.cross_device.population import load_population


def run_cross_device(config: CrossDeviceConfig, root: Path, out: Path, manifest: SplitManifest | None = None, resume: bool = True) -> dict[str, Any]:
    # The split always keeps folds 6-10 out: tuning on folds 1-5 must not put test-fold people on devices.
    manifest = manifest or build_split(root, SplitConfig(seed=0))
    model = load_backbone(config.model)
    population = load_population(manifest, root, config.devices, config.seed, geometry=geometry_of(model), holdout=config.owner_holdout,
                                 capture=config.capture)
    if population.notice():
        print(population.notice())
    negatives = load_public_negatives(manifest, root, config.public_negatives, geometry_of(model), config.seed) if config.public_negatives else None
    evaluator, owners = evaluators(root, config.eval_folds, model, population, negatives.identities if negatives else (), config.eval_photos,
                                   config.capture, config.enrolment, manifest)
    started = time.perf_counter()
    if config.method == "central":
        history, trained = _central(config, population, model, evaluator, out)
    else:
        center = _feature_center(config, manifest, root, model) if config.center_features else None
        simulation = CrossDeviceSimulation(config, population, model, out, evaluator, negatives, center)
        history = simulation.run(resume=resume).history
        trained = simulation.model
    # A federated version keeps its ancestor's threshold, as the server publishes it.
    save_backbone(trained, out / "model.pt", meta=shipping({}, shipped_verification(model)))
    if owners is not None:  # the owners' figures of the start and of the end: they cost as much as an LFW evaluation
        history[0] |= owners(model)
        history[-1] |= owners(trained)
    report = summarize(config, population, history, time.perf_counter() - started, manifest)
    (out / "report.json").write_text(json.dumps(report, indent=1))
    write_markdown([report], out, write_plots([report], out))
    return report


def _feature_center(config: CrossDeviceConfig, manifest: SplitManifest, root: Path, model: torch.nn.Module) -> np.ndarray:
    if config.center_source != "model":
        return public_feature_center(manifest, root, model, geometry_of(model), config.seed, config.center_source)
    published = feature_center_of(model)
    if published is None:
        raise FaceCoreError(f"--center-source model: {config.model!r} publishes no feature centre (fedface admin model center sets one)")
    return np.asarray(published, np.float32)


def _central(config: CrossDeviceConfig, population, model, evaluator: Evaluator, out: Path) -> tuple[list[dict[str, Any]], torch.nn.Module]:  # type: ignore[no-untyped-def]
    """The non-private upper bound: pool every device's photos and fine-tune centrally (pretrain's fine-tune mode).

    Like FedFace, the classifier starts from each identity's mean feature and trains at the devices'
    learning rate: a random head at 10x that rate first wrecked the backbone (LFW 85.3 -> 68.5% after
    one epoch, seed 0), which measured the recovery, not an upper bound."""
    from facecore.data.faces import LabelledFaces
    from facecore.templates import mean_feature_embedding
    from pretrain.config import PretrainConfig
    from pretrain.trainer import Pretrainer

    faces = np.concatenate([d.faces for d in population.devices])
    labels = np.concatenate([np.full(len(d.faces), d.index) for d in population.devices])
    data = LabelledFaces(faces, labels, tuple(d.identity for d in population.devices), tuple(), ())
    head = torch.from_numpy(np.stack([mean_feature_embedding(embed_faces(model, d.faces)) for d in population.devices]))
    pre = PretrainConfig(backbone=model.name, embedding_dim=model.embedding_dim, epochs=max(1, config.rounds), batch=64, lr=config.local.lr,
                         warmup_epochs=0.0, role="devices", workers=0, eval_every=config.eval_every, seed=config.seed)
    history = [{"round": 0, **evaluator(model)}]
    trainer = Pretrainer(pre, data, out / "central", evaluate=evaluator, init_state=model.state_dict(), init_head=head)
    for record in trainer.fit().history:
        history.append({"round": record["epoch"], "train_loss": record["loss"], "seconds": record["seconds"],
                        **{k: v for k, v in record.items() if k in EVALUATED}})
    return history, trainer.model


# What a report gives at the run's end and at its start (`initial_...`), as the evaluators return it.
START_AND_END = ("owners", "owners_recalibrated", "owners_camera_enrolled", "celeba")


def summarize(config: CrossDeviceConfig, population, history: list[dict[str, Any]], seconds: float, manifest: SplitManifest) -> dict[str, Any]:  # type: ignore[no-untyped-def]
    evaluated = [h for h in history if "accuracy" in h]
    final = evaluated[-1]
    target = config.target_accuracy
    reached = next((h["round"] for h in evaluated if target is not None and h["accuracy"] >= target), None)
    trained = [h["seconds"] for h in history if h.get("round", 0) > 0 and "seconds" in h]
    return {
        "method": config.method if config.method != "fedface" or config.spreadout else "fedface-no-spreadout",
        "init": config.init, "devices": len(population.devices), "rounds": history[-1]["round"],
        "per_round": config.per_round, "capture": config.capture, "clean": final.get("clean"), "initial_clean": evaluated[0].get("clean"),
        "accuracy": final["accuracy"], "accuracy_std": final.get("accuracy_std"),
        "tar_at_far": final["tar_at_far"], "initial_accuracy": evaluated[0]["accuracy"], "initial_tar_at_far": evaluated[0]["tar_at_far"],
        "tar_at_far_per_fold": final.get("tar_at_far_per_fold"), "initial_tar_at_far_per_fold": evaluated[0].get("tar_at_far_per_fold"),
        **{key: final.get(key) for key in START_AND_END}, **{f"initial_{key}": evaluated[0].get(key) for key in START_AND_END},
        "rounds_to_target": reached, "target_accuracy": target, "lfw_subset": final.get("lfw_subset"),
        "seconds_per_round": sum(trained) / len(trained) if trained else 0.0, "wall_seconds": seconds,
        "device_images": int(sum(len(d.faces) for d in population.devices)), "split_sizes": manifest.sizes(),
        "seed": config.seed, "config": config.to_dict(), "history": history,
        "dp_epsilon": next((h["dp_epsilon"] for h in reversed(history) if "dp_epsilon" in h), None) if config.dp_epsilon is not None else None,
    }


def write_plots(reports: list[dict[str, Any]], out: Path) -> list[Path]:
    def series(key: str, pick=lambda v: v) -> dict[str, tuple[list[int], list[float]]]:  # type: ignore[no-untyped-def]
        return {
            label(r): ([h["round"] for h in r["history"] if key in h], [pick(h[key]) for h in r["history"] if key in h])
            for r in reports
        }

    paths = [
        save_line_plot(out / "accuracy.png", series("accuracy"), "round", "LFW accuracy", "LFW accuracy (identity-disjoint folds)"),
        save_line_plot(out / "tar.png", series("tar_at_far", lambda t: t["1e-3"]), "round", "TAR@FAR=1e-3", "TAR at FAR 1e-3"),
        save_line_plot(out / "embedding_spread.png", series("embedding_mean_cos"), "round", "mean pairwise cosine", "class-embedding spread"),
        save_line_plot(out / "train_loss.png", series("loss_before"), "round", "positive loss at round start", "device training loss"),
    ]
    return paths
