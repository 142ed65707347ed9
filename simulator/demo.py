"""`fedface demo` (what `make run` runs): the whole system on one machine, over real HTTP.

Starts the round server (SQLite, the default model) as its own process, enrolls real-face devices
through the device SDK, runs a few FedFace rounds, and prints LFW accuracy on identity-disjoint
folds before and after, plus where the report and plots went. Stops the server on the way out,
also on Ctrl-C or an error.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import json
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from device_sdk.device import FaceDevice
from facecore.align.geometry import geometry_of
from facecore.align.pipeline import FaceAligner
from facecore.data.split import SplitConfig, build_split
from facecore.eval.lfw import evaluate, load_lfw_faces
from facecore.eval.plots import save_line_plot
from facecore.federation.status import FINAL_ROUND_STATUSES, RoundStatus
from facecore.models.checkpoint import load_backbone
from facecore.models.preprocess import embed_faces
from server_api.launcher import MANY_DEVICES_ON_LOOPBACK, LocalServer

TRAINING_SLOTS = 2  # 2 cores gain nothing from more


def run_demo(
    root: Path, out: Path, devices: int = 20, rounds: int = 3, model: str = "default", folds: tuple[int, ...] = (6, 7, 8, 9, 10),
    secure: bool = False,
) -> dict[str, Any]:
    """`secure`: rounds use secure aggregation, so the devices train side by side (each key step
    waits for all of them) instead of one after another."""
    out.mkdir(parents=True, exist_ok=True)
    split = build_split(root, SplitConfig(seed=0))
    owners = [(identity, [root / p for p in paths]) for identity, paths in sorted(split.sets["devices"].items()) if len(paths) >= 8][:devices]
    lfw = load_lfw_faces(root / "lfw", folds, aligner=FaceAligner(geometry=geometry_of(load_backbone(model))))
    # The server's log goes to `out`, where it outlives the scratch folder (a failed start names it).
    with tempfile.TemporaryDirectory(prefix="fedface-demo-") as scratch, LocalServer(
        Path(scratch) / "server", model=model, env=MANY_DEVICES_ON_LOOPBACK, log=out / "server.log",
    ) as server:
        print(f"server up at {server.url} (SQLite, model {model}); enrolling {len(owners)} real-face devices")
        fleet = []
        slot = TrainingSlots(TRAINING_SLOTS)
        for identity, photos in tqdm(owners, desc="register + enroll", unit="device"):
            device = FaceDevice(server.url, Path(scratch) / "devices" / identity.replace(":", "_"), training_slot=slot)
            device.register()
            device.enroll(photos)
            fleet.append(device)
        history = [_score(lfw, _current_model(fleet[0]), 0)]
        print(f"round 0: LFW accuracy {100 * history[0]['accuracy']:.2f}%")
        for number in range(1, rounds + 1):
            config: dict[str, Any] = {
                "target_participants": len(fleet), "min_participants": max(2, len(fleet) // 2), "deadline_s": 900, "selection_window_s": 1,
            }
            if secure:
                config["secure_aggregation"] = {"enabled": True, "key_phase_s": 120, "unmask_phase_s": 120}
            opened = server.admin("POST", "/v1/admin/rounds", json=config)
            losses = _train_all(fleet, number, parallel=secure)
            status = _wait_completed(server, opened["id"])
            record = _score(lfw, _current_model(fleet[0]), number)
            record |= {
                "train_loss_before": sum(s.loss_before for s in losses) / len(losses), "train_loss_after": sum(s.loss_after for s in losses) / len(losses),
                "bytes_up_per_device": sum(s.bytes_up for s in losses) // len(losses), "seconds_per_device": sum(s.seconds for s in losses) / len(losses),
                "aggregation": status.get("summary"),
            }
            history.append(record)
            print(f"round {number}: LFW accuracy {100 * record['accuracy']:.2f}%, "
                  f"local loss {record['train_loss_before']:.4f} -> {record['train_loss_after']:.4f}")
    report = {
        "devices": len(fleet), "rounds": rounds, "secure_aggregation": secure, "folds": list(folds),
        "before": history[0], "after": history[-1], "history": history,
    }
    (out / "demo.json").write_text(json.dumps(report, indent=1, default=str))
    curve = ([h["round"] for h in history], [h["accuracy"] for h in history])
    save_line_plot(out / "demo_accuracy.png", {"FedFace over HTTP": curve}, "round", "LFW accuracy", f"LFW folds {folds[0]}-{folds[-1]} during the demo")
    return report


class TrainingSlots:
    """At most `n` of the demo's parallel devices train at once, since one local training holds about
    1 GB of activations. On leaving, freed memory goes back to the OS: glibc keeps it in per-thread
    arenas otherwise, and 20 device threads kept 16 GB resident after their trainings."""

    def __init__(self, n: int) -> None:
        self._semaphore = threading.Semaphore(n)
        self._libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6") if sys.platform == "linux" else None

    def __enter__(self) -> None:
        self._semaphore.acquire()

    def __exit__(self, *_: object) -> None:
        if self._libc is not None:
            self._libc.malloc_trim(0)
        self._semaphore.release()


def _train_all(fleet: list[FaceDevice], number: int, parallel: bool) -> list[Any]:
    if not parallel:
        return [device.train_round(wait=60) for device in tqdm(fleet, desc=f"round {number}", unit="device")]
    with ThreadPoolExecutor(len(fleet)) as pool, tqdm(total=len(fleet), desc=f"round {number} (secure aggregation)", unit="device") as bar:
        futures = [pool.submit(device.train_round, 60, 0.5) for device in fleet]
        for _ in as_completed(futures):
            bar.update()
        return [f.result() for f in futures]


def _score(lfw: Any, model: torch.nn.Module, number: int) -> dict[str, Any]:
    report = evaluate(lfw, lambda faces: embed_faces(model, faces)).report
    return {"round": number, "accuracy": report.accuracy, "accuracy_std": report.accuracy_std, "auc": report.auc, "tar_at_far": report.tar_at_far}


def _current_model(device: FaceDevice) -> torch.nn.Module:
    """The current global backbone, fetched the way a device fetches it."""
    info = device._model()
    return device._load_backbone(info["backbone_url"], info["version"])


def _wait_completed(server: LocalServer, round_id: int, timeout: float = 600) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        status = server.admin("GET", f"/v1/admin/rounds/{round_id}")
        if status["status"] in FINAL_ROUND_STATUSES:
            if status["status"] == RoundStatus.FAILED:
                raise RuntimeError(f"round {round_id} failed: {status['failure_reason']}")
            return status
        time.sleep(0.5)
    raise RuntimeError(f"round {round_id} did not complete in {timeout} s")


__all__ = ["run_demo"]
