"""`fedface demo` (what `make run` runs): the whole system on one machine, over real HTTP.

Starts the round server (SQLite, the default model) as its own process, enrolls real-face devices
through the device SDK, runs a few FedFace rounds, and prints LFW accuracy on identity-disjoint
folds before and after, plus where the report and plots went.

The fleet has one camera (`capture`, a facecore.capture model; None: none): each device enrolls its
owner from the ordinary photos, then adds the same photos as its camera takes them
(`FaceDevice.add_faces`), and the rounds run the fleet-camera settings
(facecore.federation.fleet_camera) on the model's published feature centre, which the demo computes
and publishes first for a model that has none. LFW is scored on the clean photos and on the photos
as the camera takes them. Stops the server and removes its
scratch folder (unless `keep`) on the way out, also on an error, Ctrl-C, SIGTERM or SIGHUP
(fedface.cli); killed outright, it leaves no server either (the launcher's lifeline).

Where the time goes, and what keeps it short without changing what a round computes:
- The server boots (imports, the model, its ONNX export) while this process reads the split and
  the evaluation faces; the devices share one face detector instead of loading one each.
- An evaluation is a function of the weights and the faces, so it is remembered in the cache
  under both (`remembered`): the model a run starts from is scored once per machine, and a round
  that leaves the weights as they were costs nothing to score again.
- The devices train two at a time and still upload in fleet order (`UploadTurns`): the server
  averages the same updates in the same order as when they take turns, so a round's model is the
  same to the bit.
- Each round's model is scored while the devices train the next round; the last one while the
  server stops.
- `eval_photos`: a seeded subset of the folds' photos (facecore.eval.lfw.subset_pairs), which is
  also all a first run aligns; the report says so (`subset`).
The report's `seconds` holds each phase's wall time.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import hashlib
import json
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tqdm import tqdm

from device_sdk.device import FaceDevice
from facecore.align.geometry import FaceGeometry, geometry_of
from facecore.align.pipeline import FaceAligner
from facecore.capture import CaptureModel, get_capture
from facecore.data.split import SplitConfig, SplitManifest, build_split
from facecore.eval.feature_center import center_source, public_feature_center
from facecore.eval.lfw import LFWFaces, evaluate, folds_text, load_lfw_faces
from facecore.eval.plots import save_line_plot
from facecore.federation.fleet_camera import fleet_camera_settings
from facecore.federation.status import FINAL_ROUND_STATUSES, RoundStatus
from facecore.lifetime import scratch_folder
from facecore.models.checkpoint import load_backbone
from facecore.models.preprocess import embed_faces
from server_api.launcher import MANY_DEVICES_ON_LOOPBACK, LocalServer
from simulator.cross_device.evaluation import LFW_CAPTURE_SEED, LFW_CAPTURE_STREAM, remembered
from simulator.cross_device.population import DEVICE_STREAM

TRAINING_SLOTS = 2  # 2 cores gain nothing from more
# The scheduler closes a round once every update is in; ticking every 0.2 s instead of 1 s ends each
# round's wait sooner. A tick is two small queries, so it costs the server nothing measurable.
DEMO_SERVER_ENV = {**MANY_DEVICES_ON_LOOPBACK, "FEDFACE_SCHEDULER_INTERVAL_S": "0.2"}
ROUND_POLL_S = 0.1  # how often the demo asks whether a round has completed
# Bump when what the demo's evaluation computes changes: a remembered result would be stale.
DEMO_EVALUATION_VERSION = 2
DEFAULT_CAPTURE = "lowlight-ir"


def run_demo(
    root: Path, out: Path, devices: int = 20, rounds: int = 6, model: str = "default", folds: tuple[int, ...] = (6, 7, 8, 9, 10),
    secure: bool = False, eval_photos: int | None = None, keep: bool = False, capture: str | None = DEFAULT_CAPTURE,
) -> dict[str, Any]:
    """`secure`: rounds use secure aggregation, so the devices train side by side (each key step
    waits for all of them) instead of one after another. `eval_photos`: score on a seeded subset of
    at most this many of the folds' photos (None: all of them). `keep`: leave the scratch folder (the
    server's database, the devices' states) in place and name it, instead of removing it however the run ends.
    `capture`: the fleet's camera (None: the devices train on their enrolment photos only)."""
    camera = None if capture is None else get_capture(capture)
    out.mkdir(parents=True, exist_ok=True)
    clock = PhaseClock()
    # The server's log goes to `out`, where it outlives the scratch folder (a failed start names it).
    with scratch_folder("fedface-demo-", keep) as scratch:
        server = LocalServer(Path(scratch) / "server", model=model, env=DEMO_SERVER_ENV, log=out / "server.log")
        server.launch()  # it boots while this process reads the split and the evaluation faces
        try:
            with clock("prepare"):
                split = build_split(root, SplitConfig(seed=0))
                owners = [(identity, [root / p for p in paths]) for identity, paths in sorted(split.sets["devices"].items()) if len(paths) >= 8][:devices]
                geometry = geometry_of(load_backbone(model))
                lfw = load_lfw_faces(root / "lfw", folds, aligner=FaceAligner(geometry=geometry), max_photos=eval_photos)
                score = lfw_scorer(lfw, capture, geometry)
            with clock("server_start"):  # what is left of the server's start once this process is ready
                server.wait_ready()
            print(f"server up at {server.url} (SQLite, model {model}); enrolling {len(owners)} real-face devices")
            with clock("enrolment"):
                turns = UploadTurns(TRAINING_SLOTS)
                fleet = _enroll(server, Path(scratch) / "devices", owners, FaceAligner(geometry=geometry), turns, camera)
            history: list[dict[str, Any]] = []
            start = _current_model(fleet[0])
            scoring = _score_later(score, start, 0, clock, history)
            with clock("feature_centre"):
                center = _published_center(server, split, root, start)
            for number in range(1, rounds + 1):
                config: dict[str, Any] = {
                    "target_participants": len(fleet), "min_participants": max(2, len(fleet) // 2), "deadline_s": 900, "selection_window_s": 1,
                    **fleet_camera_settings(center, secure),
                }
                if secure:
                    config["secure_aggregation"] = {**config.get("secure_aggregation", {}), "enabled": True, "key_phase_s": 120, "unmask_phase_s": 120}
                opened = server.admin("POST", "/v1/admin/rounds", json=config)
                with clock(f"round {number} training"):
                    losses = _train_all(fleet, number, turns, secure)
                with clock(f"round {number} aggregation"):
                    status = _wait_completed(server, opened["id"])
                scoring.result()  # the previous round's score, while the devices trained this one
                scoring = _score_later(score, _current_model(fleet[0]), number, clock, history, {
                    "train_loss_before": sum(s.loss_before for s in losses) / len(losses), "train_loss_after": sum(s.loss_after for s in losses) / len(losses),
                    "bytes_up_per_device": sum(s.bytes_up for s in losses) // len(losses), "seconds_per_device": sum(s.seconds for s in losses) / len(losses),
                    "aggregation": status.get("summary"),
                })
        finally:
            with clock("server_stop"):
                server.stop()  # the last round is scored meanwhile
        with clock("last_evaluation_wait"):
            scoring.result()
    report = {
        "devices": len(fleet), "rounds": rounds, "secure_aggregation": secure, "folds": list(folds), "subset": lfw.subset,
        "capture": capture,
        "before": history[0], "after": history[-1], "history": history, "seconds": clock.seconds,
    }
    (out / "demo.json").write_text(json.dumps(report, indent=1, default=str))
    curve = ([h["round"] for h in history], [h["accuracy"] for h in history])
    title = f"LFW folds {folds_text(folds)} during the demo" + (f" ({lfw.subset['pairs']} pairs of a seeded subset)" if lfw.subset else "")
    save_line_plot(out / "demo_accuracy.png", {"FedFace over HTTP": curve}, "round", "LFW accuracy", title)
    # Clean and captured TAR lie 85 points apart: their changes since round 0 share one readable axis.
    views: dict[str, Callable[[dict[str, Any]], float]] = {"clean photos": lambda h: h["tar_at_far"]["1e-3"]}
    if capture is not None:
        views[f"under {capture}"] = lambda h: h["captured"]["tar_at_far"]["1e-3"]
    gains = {name: ([h["round"] for h in history], [100 * (tar(h) - tar(history[0])) for h in history]) for name, tar in views.items()}
    save_line_plot(out / "demo_tar.png", gains, "round", "TAR@FAR=1e-3 change since round 0 (points)", title.replace("during", "TAR@1e-3 during"))
    return report


class PhaseClock:
    """Wall seconds per named phase, in the order they ran; a phase run twice adds up."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._lock = threading.Lock()

    @contextmanager
    def __call__(self, name: str) -> Iterator[None]:
        started = time.perf_counter()
        try:
            yield
        finally:
            with self._lock:
                self.seconds[name] = round(self.seconds.get(name, 0.0) + time.perf_counter() - started, 2)


def faces_digest(data: LFWFaces) -> str:
    """The sha256 of what an LFW evaluation scores: the aligned faces (so the detector and the crop
    that made them), whose they are, and the pairs."""
    digest = hashlib.sha256()
    for array in (data.faces, data.identities.astype(str), data.pair_index, data.pair_same, data.pair_fold,
                  np.zeros(0) if data.face_fold is None else data.face_fold):
        digest.update(str((array.dtype, array.shape)).encode())
        digest.update(np.ascontiguousarray(array).tobytes())
    return digest.hexdigest()


def lfw_scorer(lfw: LFWFaces, capture: str | None = None, geometry: FaceGeometry | None = None) -> Callable[[torch.nn.Module], dict[str, Any]]:
    """The demo's LFW figures of a model, remembered in the cache by its weights and the faces; with
    `capture`, also on the photos as that camera takes them (`captured`), which are made the first
    time a score is not remembered (the same draws as the simulator's: evaluation.LFW_CAPTURE_SEED)."""
    taken: list[LFWFaces] = []

    def figures(data: LFWFaces, model: torch.nn.Module) -> dict[str, Any]:
        report = evaluate(data, lambda faces: embed_faces(model, faces)).report
        return {"accuracy": report.accuracy, "accuracy_std": report.accuracy_std, "auc": report.auc, "tar_at_far": report.tar_at_far}

    def score(model: torch.nn.Module) -> dict[str, Any]:
        result = figures(lfw, model)
        if capture is not None:
            if not taken:
                assert geometry is not None
                taken.append(replace(lfw, faces=get_capture(capture).capture(lfw.faces, geometry, LFW_CAPTURE_SEED, LFW_CAPTURE_STREAM)))
            result["captured"] = figures(taken[0], model)
        return result

    camera = {} if capture is None else {"capture": capture, "capture_version": get_capture(capture).version, "capture_seed": LFW_CAPTURE_SEED,
                                         "capture_stream": LFW_CAPTURE_STREAM}
    return remembered(score, {"kind": "demo-lfw", "faces": faces_digest(lfw), "demo_version": DEMO_EVALUATION_VERSION, **camera})


class Background:
    """A function run in a daemon thread, so that Ctrl-C in the main thread is not held up by it."""

    def __init__(self, function: Callable[[], None]) -> None:
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(function,), name="demo-evaluation", daemon=True)
        self._thread.start()

    def _run(self, function: Callable[[], None]) -> None:
        try:
            function()
        except BaseException as error:  # noqa: BLE001 -- handed to the main thread by result()
            self._error = error

    def result(self) -> None:
        """Wait for it; its error, if any, is raised here."""
        self._thread.join()
        if self._error is not None:
            raise self._error


def _score_later(
    score: Callable[[torch.nn.Module], dict[str, Any]], model: torch.nn.Module, number: int, clock: PhaseClock, history: list[dict[str, Any]],
    extra: dict[str, Any] | None = None,
) -> Background:
    """Score round `number`'s model in the background; its record joins `history` and is printed
    when done. The caller waits for one before it starts the next, so records arrive in round order."""

    def run() -> None:
        with clock(f"round {number} evaluation"):
            record = {"round": number, **score(model), **(extra or {})}
        history.append(record)
        losses = "" if extra is None else f", local loss {record['train_loss_before']:.4f} -> {record['train_loss_after']:.4f}"
        clean = f"{100 * record['tar_at_far']['1e-3']:.2f}%"
        tar = f"TAR@1e-3 {clean}"
        if "captured" in record:
            tar = f"TAR@1e-3 under the fleet camera {100 * record['captured']['tar_at_far']['1e-3']:.2f}% (clean photos {clean})"
        tqdm.write(f"round {number}: LFW accuracy {100 * record['accuracy']:.2f}%, {tar}{losses}")

    return Background(run)


def _enroll(
    server: LocalServer, folder: Path, owners: list[tuple[str, list[Path]]], aligner: FaceAligner, turns: UploadTurns, camera: CaptureModel | None,
) -> list[FaceDevice]:
    """Register and enroll one device per owner; with a `camera`, each then adds its enrolment faces
    as the camera takes them (device i draws from the simulator's stream for device i). They align
    with one shared detector: each device aligns in memory only (FaceDevice), so sharing it shares no
    faces, and loads it once, not 20 times."""
    fleet = []
    for index, (identity, photos) in enumerate(tqdm(owners, desc="register + enroll", unit="device")):
        device = FaceDevice(server.url, folder / identity.replace(":", "_"), training_slot=turns.slot(index), aligner=aligner)
        device.register()
        device.enroll(photos)
        if camera is not None:
            enrolled = device.state.faces()
            assert enrolled is not None  # enroll() saved them
            device.add_faces(camera.capture(enrolled, aligner.geometry, seed=0, stream=DEVICE_STREAM + 2 * index))
        fleet.append(device)
    return fleet


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


class UploadTurns:
    """Devices that train side by side (`TRAINING_SLOTS` at once) and yet upload one after another in
    the fleet's order. The server averages updates in the order they arrive, so a round's model is the
    same, to the bit, as when the devices take turns from check-in to upload; only the waits overlap
    (check-in, download, upload, the server's checks) and the two cores train two devices.

    A device's `slot(index)` is its training slot: the SDK enters it around local training; on leaving
    it, the device lets the next one train, then waits until every device before it has finished its
    round (`finished`, whether it uploaded or failed) before it uploads. With secure aggregation the
    order is not kept: masked updates add up exactly in any order."""

    def __init__(self, n: int) -> None:
        self._slots = TrainingSlots(n)
        self._turn = threading.Condition()
        self._finished: set[int] = set()
        self.ordered = True

    def begin_round(self, ordered: bool = True) -> None:
        with self._turn:
            self._finished.clear()
            self.ordered = ordered

    def finished(self, index: int) -> None:
        with self._turn:
            self._finished.add(index)
            self._turn.notify_all()

    def slot(self, index: int) -> _Turn:
        return _Turn(self, index)

    def _enter(self) -> None:
        self._slots.__enter__()

    def _leave(self, index: int) -> None:
        self._slots.__exit__()
        if self.ordered:
            with self._turn:
                self._turn.wait_for(lambda: self._finished.issuperset(range(index)))


class _Turn:
    def __init__(self, turns: UploadTurns, index: int) -> None:
        self._turns, self._index = turns, index

    def __enter__(self) -> None:
        self._turns._enter()

    def __exit__(self, *_: object) -> None:
        self._turns._leave(self._index)


def _train_all(fleet: list[FaceDevice], number: int, turns: UploadTurns, secure: bool) -> list[Any]:
    """Every device's round, side by side; without secure aggregation they upload in fleet order."""
    turns.begin_round(ordered=not secure)

    def train(index: int) -> Any:
        try:
            # secure aggregation: each key step waits for every device, so all of them check in at once
            return fleet[index].train_round(60, 0.5) if secure else fleet[index].train_round(wait=60)
        finally:
            turns.finished(index)

    workers = len(fleet) if secure else TRAINING_SLOTS
    label = f"round {number}" + (" (secure aggregation)" if secure else "")
    pool = ThreadPoolExecutor(workers, thread_name_prefix="demo-device")
    try:
        with tqdm(total=len(fleet), desc=label, unit="device") as bar:
            futures = [pool.submit(train, index) for index in range(len(fleet))]
            for _ in as_completed(futures):
                bar.update()
            return [f.result() for f in futures]
    finally:
        # A stopped or failed round waits for no device: the queued ones never start, and the ones training
        # fail at their upload once the server is stopped, rather than wait for turns that will not come.
        pool.shutdown(wait=False, cancel_futures=True)
        for index in range(len(fleet)):
            turns.finished(index)


def _published_center(server: LocalServer, split: SplitManifest, root: Path, model: torch.nn.Module) -> list[float]:
    """The current version's feature centre; a model that publishes none (`random`, a file) gets one
    computed and published the way `fedface admin model center` does it."""
    current = server.admin("GET", "/v1/admin/models?limit=1")[0]
    if current.get("feature_center") is None:
        vector = public_feature_center(split, root, model, geometry_of(model))
        current = server.admin("PUT", f"/v1/admin/models/{current['version']}/feature-center", json={"vector": vector.tolist(), "source": center_source()})
    return [float(x) for x in current["feature_center"]]


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
        time.sleep(ROUND_POLL_S)
    raise RuntimeError(f"round {round_id} did not complete in {timeout} s")


__all__ = ["run_demo"]
