"""Persistent device-training processes: one per core, each with its own copy of the model, its own
reused workspace, and the photos or prefix activations of the devices it trains, kept across rounds.

On 2 cores, one process with 2 torch threads leaves most of each small device step to thread
hand-offs; two single-threaded processes each train whole devices. A device always goes to the
same worker (index mod workers), so its data crosses the pipe once per run. Each round, a worker
gets the weights that train (the suffix, with a frozen prefix) and its devices' embeddings and
seeds, runs the SDK's own `train_local` per device, and streams back deltas in its task order; the
simulator reads them in the round's device order, so the strategy sees the same sequence as in
process. Updates match the in-process ones to float rounding (thread counts change summation order).
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

from device_sdk.training import LocalTrainingConfig, PrefixCache, train_local
from facecore.models.checkpoint import load_backbone, save_backbone


@dataclass(frozen=True)
class DeviceTask:
    index: int
    embedding: np.ndarray
    seed: int
    n_faces: int
    faces: np.ndarray | None = None  # only the first time this worker trains the device (full backbone)
    cache: tuple[np.ndarray, np.ndarray] | None = None  # likewise, prefix activations (plain, mirrored)


@dataclass(frozen=True)
class DeviceResult:
    index: int
    delta: dict[str, np.ndarray]
    embedding: np.ndarray
    n_samples: int
    loss_before: float
    loss_after: float


def _serve(conn: Connection, backbone_path: str, local: dict[str, Any], threads: int) -> None:
    torch.set_num_threads(threads)
    model = load_backbone(backbone_path)
    workspace = copy.deepcopy(model)
    config = LocalTrainingConfig(**local)
    faces: dict[int, np.ndarray] = {}
    caches: dict[int, PrefixCache] = {}
    while (message := conn.recv()) is not None:
        weights, tasks = message
        entries = model.state_dict(keep_vars=True)
        with torch.no_grad():
            for key, value in weights.items():
                entries[key].copy_(torch.from_numpy(value))
        for task in tasks:
            if task.faces is not None:
                faces[task.index] = task.faces
            if task.cache is not None:
                caches[task.index] = PrefixCache(torch.from_numpy(task.cache[0]), torch.from_numpy(task.cache[1]), config.trainable_blocks or 0)
            # with cached activations train_local only counts the photos
            photos = faces.get(task.index, np.empty((task.n_faces, 0), np.uint8))
            update = train_local(model, task.embedding, photos, config, seed=task.seed, cache=caches.get(task.index), workspace=workspace)
            delta = {k: v.numpy() - weights[k] for k, v in update.state_dict.items()}
            conn.send(DeviceResult(task.index, delta, update.embedding.numpy(), update.n_samples, update.loss_before, update.loss_after))


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
        self._known: list[set[int]] = [set() for _ in range(workers)]

    def train(self, weights: Mapping[str, np.ndarray], tasks: Sequence[DeviceTask]) -> Iterator[DeviceResult]:
        """Results in the order of `tasks`. Faces and caches are dropped from a task its worker has seen."""
        n = len(self._conns)
        per_worker: list[list[DeviceTask]] = [[] for _ in range(n)]
        for task in tasks:
            w = task.index % n
            if task.index in self._known[w]:
                task = dataclasses.replace(task, faces=None, cache=None)
            self._known[w].add(task.index)
            per_worker[w].append(task)
        plain = {}
        for key, value in weights.items():
            value = np.asarray(value)
            plain[key] = value if value.flags.c_contiguous else np.ascontiguousarray(value)  # 0-d stays 0-d
        for conn, share in zip(self._conns, per_worker):
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

    def close(self) -> None:
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
