"""One FedFusion experiment end to end: partition, federated rounds, the late-joining node, the report."""
from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from simulator.fusion.config import FusionConfig, FusionInputError
from simulator.fusion.data import ImageSet, to_tensors
from simulator.fusion.engine import Federation, LocalTraining, accuracy, fit_new_node, refreshed
from simulator.fusion.model import FusedCNN, count_trainable, extractor_gap
from simulator.fusion.partition import apportion, partition

BYTES_PER_PARAM = 4  # float32 on the wire
GAP_IMAGES = 200  # test images the per-round E_g − E_l gap is measured on


def bytes_per_round(model: FusedCNN, per_round: int) -> int:
    """Download + upload of the trainable parameters for every selected node.

    E_g is not counted: it is the extractor the node has just downloaded as the start of E_l,
    copied and frozen on the device, so it never crosses the network a second time.
    """
    return 2 * BYTES_PER_PARAM * count_trainable(model) * per_round


def run_fusion(config: FusionConfig, data: ImageSet, log: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    started, cpu_started = time.perf_counter(), time.process_time()
    # Separate streams per purpose, so partitions and test images are identical for every fusion kind.
    split = partition(data.y_train, config.partition, config.nodes, config.per_node, np.random.default_rng([config.seed, 1]),
                      alpha=config.alpha)
    if config.test_size >= len(data.y_test):
        raise FusionInputError(f"test-size {config.test_size} must be below the {len(data.y_test)} test images (the rest are the late node's test pool)")
    test_idx = np.sort(np.random.default_rng([config.seed, 2]).choice(len(data.y_test), config.test_size, replace=False))
    stats = data.channel_stats() if config.normalize == "dataset" else None
    nodes = [to_tensors(data.x_train[idx], data.y_train[idx], stats=stats) for idx in split.nodes]
    test = to_tensors(data.x_test[test_idx], data.y_test[test_idx], stats=stats)
    model = FusedCNN(data.image_shape, data.classes, config.fusion, seed=config.seed, arch=config.arch, lambda_bound=config.lambda_bound)
    local = LocalTraining(config.local_epochs, config.batch, config.lr, config.momentum, weight_decay=config.weight_decay,
                          lr_decay=config.lr_decay, min_lr=config.min_lr, augment=config.augment == "crop-flip")
    federation = Federation(model, nodes, config.per_round, local, seed=config.seed, lambda_mu=config.lambda_mu)

    history: list[dict[str, Any]] = [{"round": 0, "acc": accuracy(model, test)}]
    for t in range(1, config.rounds + 1):
        tick = time.perf_counter()
        record = federation.round(t)
        record["acc"] = accuracy(model, test)
        record.update(model.fusion.summary())
        record["extractor_gap"] = extractor_gap(model, test[0][:GAP_IMAGES])
        record["seconds"] = round(time.perf_counter() - tick, 3)
        history.append(record)
        log(f"{config.partition}/{config.fusion} round {t}/{config.rounds}: acc {record['acc']:.4f} loss {record['train_loss']:.4f}")

    # The late node trains at the rate the schedule would give the next round.
    late = _late_join(config, data, model, replace(local, lr=local.lr_at(config.rounds + 1)), stats, exclude_train=split.pool,
                      exclude_test=test_idx)
    per_round = bytes_per_round(model, config.per_round)
    reached = next((h["round"] for h in history[1:] if h["acc"] >= config.target_acc), None)
    accs = [h["acc"] for h in history[1:]]
    return {
        "fusion": config.fusion, "partition": config.partition,
        "final_acc": accs[-1] if accs else history[0]["acc"],
        "final_acc_last5_mean": float(np.mean(accs[-5:])) if accs else None,
        "best_acc": max(accs) if accs else None,
        # The final model once E_g := E_l (what a new download holds; see engine.py); once, to save CPU.
        "final_acc_refreshed": accuracy(refreshed(model), test),
        "target_acc": config.target_acc, "rounds_to_target": reached,
        "bytes_per_round": per_round, "bytes_to_target": reached * per_round if reached is not None else None,
        "trainable_params": count_trainable(model), "fusion_params": count_trainable(model.fusion),
        "late_join": late, "history": history,
        "node_class_counts": split.class_counts(data.y_train, data.classes).tolist(),
        "data": {"train": list(data.x_train.shape), "test": list(data.x_test.shape), "classes": data.classes},
        "seed": config.seed, "config": config.to_dict(), "wall_seconds": round(time.perf_counter() - started, 1),
        "cpu_seconds": round(time.process_time() - cpu_started, 1),  # wall time on a shared machine says little
    }


def _late_join(
    config: FusionConfig, data: ImageSet, model: FusedCNN, local: LocalTraining, stats: tuple[np.ndarray, np.ndarray] | None,
    exclude_train: np.ndarray, exclude_test: np.ndarray,
) -> dict[str, Any]:
    """A fresh node drawn by the same scheme from images no federated node held.

    Its own test set comes from test images outside the global test subset, with the class
    proportions of its training data: "accuracy on its own data" without scoring training images.
    """
    rng = np.random.default_rng([config.seed, 3])
    node = partition(data.y_train, config.partition, 1, config.late_per_node, rng, alpha=config.alpha, exclude=exclude_train).nodes[0]
    counts = np.bincount(data.y_train[node], minlength=data.classes)
    spare = np.setdiff1d(np.arange(len(data.y_test)), exclude_test)
    picked = [rng.choice(spare[data.y_test[spare] == c], min(n, int((data.y_test[spare] == c).sum())), replace=False)
              for c, n in enumerate(apportion(counts, config.late_test)) if n > 0]
    test_idx = np.sort(np.concatenate(picked))
    curve = fit_new_node(model, to_tensors(data.x_train[node], data.y_train[node], stats=stats),
                         to_tensors(data.x_test[test_idx], data.y_test[test_idx], stats=stats), local, config.late_epochs, config.seed)
    reached = next((epoch for epoch, acc in enumerate(curve) if acc >= config.late_target), None)
    return {"target": config.late_target, "epochs_to_target": reached, "acc_by_epoch": curve,
            "train_images": int(len(node)), "test_images": int(len(test_idx)), "classes": [int(c) for c in np.flatnonzero(counts)]}


def report_name(report: dict[str, Any]) -> str:
    return f"{report['partition']}-{report['fusion']}.json"


def save_report(report: dict[str, Any], out: Path) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / report_name(report)
    path.write_text(json.dumps(report, indent=1))
    return path
