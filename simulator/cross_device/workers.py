"""Persistent device-training processes: one per core, each with its own copy of the model, its own
reused workspace, and the photos or prefix activations of the devices it trains, kept across rounds.

On 2 cores, one process with 2 torch threads leaves most of each small device step to thread
hand-offs; two single-threaded processes each train whole devices. A device always goes to the
same worker (index mod workers), and a worker keeps one copy of each set of photos or activations
it was sent, named by `DeviceTask.data`: devices that share their photos (a benchmark's devices
reusing real identities) cross the pipe and take memory once per worker, so a worker's memory grows
with the distinct data, not with the number of devices. Each round, a worker gets the weights that
train (the suffix, with a frozen prefix) and its devices' embeddings and seeds, runs the SDK's own
`train_local` per device, and streams back deltas in its task order; the simulator reads them in
the round's device order, so the strategy sees the same sequence as in process. Updates match the
in-process ones to float rounding (thread counts change summation order). Workers end when the pool
closes, at once if a round is still out (nobody wants it any more), and on their own within a second
of the simulator's death, however it died (facecore.lifetime.exit_with_parent).
"""
from __future__ import annotations

import copy
import dataclasses
import multiprocessing as mp
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np
import torch

from device_sdk.training import LocalTrainingConfig, PrefixCache, Workspace, train_local
from facecore.federation.packed import PackedArrays
from facecore.lifetime import exit_with_parent
from facecore.models.checkpoint import load_backbone, save_backbone


@dataclass(frozen=True)
class DeviceTask:
    index: int
    data: int  # names the device's photos; devices that share them share one copy in a worker
    embedding: np.ndarray
    seed: int
    n_faces: int
    faces: np.ndarray | None = None  # only the first time this worker gets these photos (full backbone)
    cache: tuple[np.ndarray, np.ndarray] | None = None  # likewise, prefix activations (plain, mirrored)
    template_length: float = 1.0  # train_local's


@dataclass(frozen=True)
class DeviceResult:
    index: int
    delta: PackedArrays  # float32
    embedding: np.ndarray
    n_samples: int
    loss_before: float
    loss_after: float


class DeviceWorker:
    """What one worker holds across rounds: the model, its workspace, and the photos or prefix
    activations of the devices it has seen. Runs the same in a spawned process and in a Ray actor."""

    def __init__(self, model: torch.nn.Module, local: dict[str, Any], threads: int) -> None:
        torch.set_num_threads(threads)
        self.model = model
        self.workspace = Workspace(copy.deepcopy(model))
        self.config = LocalTrainingConfig(**local)
        self.faces: dict[int, np.ndarray] = {}
        self.caches: dict[int, PrefixCache] = {}

    def train(self, weights: Mapping[str, np.ndarray], tasks: Sequence[DeviceTask]) -> Iterator[DeviceResult]:
        """This round's trainable weights in, one result per task out, in task order."""
        entries = self.workspace.source_entries(self.model)  # the live tensors the workspace copies from
        with torch.no_grad():
            for key, value in weights.items():
                entries[key].copy_(torch.tensor(value))  # in place, so the workspace's view of the model stays live
        packed_base = self.workspace.packed_source(self.model, self.config.trainable_blocks)
        for task in tasks:
            if task.faces is not None:
                self.faces[task.data] = task.faces
            if task.cache is not None:
                plain, flipped = (torch.from_numpy(a if a.flags.writeable else a.copy()) for a in task.cache)  # Ray hands read-only arrays
                self.caches[task.data] = PrefixCache(plain, flipped, self.config.trainable_blocks or 0)
            # with cached activations train_local only counts the photos
            photos = self.faces.get(task.data, np.empty((task.n_faces, 0), np.uint8))
            update = train_local(self.model, task.embedding, photos, self.config, seed=task.seed, cache=self.caches.get(task.data), workspace=self.workspace,
                                 template_length=task.template_length)
            # Against this round's `weights` exactly (copied in above), packed: one array crosses the pipe, not one per entry.
            moved = update.delta(entries, packed_base, "fp32")
            yield DeviceResult(task.index, moved, update.embedding.numpy(), update.n_samples, update.loss_before, update.loss_after)

    def train_all(self, weights: Mapping[str, np.ndarray], tasks: Sequence[DeviceTask]) -> list[DeviceResult]:
        return list(self.train(weights, tasks))


def _serve(conn: Connection, backbone_path: str, local: dict[str, Any], threads: int) -> None:
    exit_with_parent("fedface device worker")  # a killed simulator would otherwise leave it training its share
    worker = DeviceWorker(load_backbone(backbone_path), local, threads)
    while (message := conn.recv()) is not None:
        for result in worker.train(*message):
            conn.send(result)


def contiguous(weights: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    plain = {}
    for key, value in weights.items():
        value = np.asarray(value)
        plain[key] = value if value.flags.c_contiguous else np.ascontiguousarray(value)  # 0-d stays 0-d
    return plain


class Assignment:
    """Devices pinned to workers by index; a set of photos or activations goes to each worker that needs it once."""

    def __init__(self, workers: int) -> None:
        self.workers = workers
        self._known: list[set[int]] = [set() for _ in range(workers)]

    def split(self, tasks: Sequence[DeviceTask]) -> list[list[DeviceTask]]:
        shares: list[list[DeviceTask]] = [[] for _ in range(self.workers)]
        for task in tasks:
            w = task.index % self.workers
            if task.data in self._known[w]:
                task = dataclasses.replace(task, faces=None, cache=None)
            self._known[w].add(task.data)
            shares[w].append(task)
        return shares


class DevicePool:
    def __init__(self, workers: int, model: torch.nn.Module, local: LocalTrainingConfig, threads_per_worker: int = 1) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        self._scratch = tempfile.TemporaryDirectory(prefix="fedface-workers-")
        path = save_backbone(model, Path(self._scratch.name) / "model.pt")
        context = mp.get_context("spawn")  # fork after torch has started its thread pools can hang
        self._conns: list[Connection] = []
        self._processes = []
        for _ in range(workers):
            ours, theirs = context.Pipe()
            process = context.Process(target=_serve, args=(theirs, str(path), dataclasses.asdict(local), threads_per_worker), daemon=True)
            process.start()
            theirs.close()
            self._conns.append(ours)
            self._processes.append(process)
        self._assignment = Assignment(workers)
        self._busy = False  # a round's shares are out and not all answered

    def train(self, weights: Mapping[str, np.ndarray], tasks: Sequence[DeviceTask]) -> Iterator[DeviceResult]:
        """Results in the order of `tasks`. Faces and caches are dropped from a task whose data its worker has."""
        n = len(self._conns)
        plain = contiguous(weights)
        self._busy = True
        for conn, share in zip(self._conns, self._assignment.split(tasks)):
            if share:
                conn.send((plain, share))
        for task in tasks:
            try:
                result: DeviceResult = self._conns[task.index % n].recv()
            except EOFError:
                raise RuntimeError(f"device worker {task.index % n} exited; its traceback is above") from None
            if result.index != task.index:
                raise RuntimeError(f"worker answered for device {result.index}, expected {task.index}")
            yield result
        self._busy = False

    def close(self) -> None:
        if self._busy:  # closed mid-round (an error, Ctrl-C, a stop signal): nobody wants what they are training
            for process in self._processes:
                process.kill()
        for conn in self._conns:
            try:
                conn.send(None)
            except (BrokenPipeError, OSError):
                pass
        for process in self._processes:
            process.join(timeout=10)
            if process.is_alive():
                process.kill()
        self._scratch.cleanup()
