"""Device training on a Ray cluster, for simulations that outgrow one machine (optional extra).

The same :class:`~simulator.cross_device.workers.DeviceWorker` as the process pool, as one Ray
actor per worker (one CPU each), so devices train with the SDK's own `train_local` wherever the
actors land. Devices are pinned to actors by index, as in the process pool: a set of photos or
prefix activations travels to an actor once per run, and each round only the trainable weights (one object in
the store, shared by all actors) and the embeddings and seeds. Results come back in the round's
device order, so the strategy sees the same sequence as in process.

Install with ``pip install 'fedface[ray]'``; ``address`` is passed to ``ray.init`` (None: a local
Ray started for this run, or the cluster named by RAY_ADDRESS).
"""
from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from device_sdk.training import LocalTrainingConfig
from facecore.errors import FaceCoreError
from simulator.cross_device.workers import Assignment, DeviceResult, DeviceTask, DeviceWorker, contiguous

CHUNK = 32  # devices per call to an actor
AHEAD = 2  # calls out per actor: one training while the other's answer is read


class RayUnavailable(FaceCoreError):
    """--backend ray without Ray installed."""


def _ray() -> Any:
    try:
        import ray
    except ImportError:
        raise RayUnavailable("the Ray backend needs Ray: pip install 'fedface[ray]' (or use --workers for local processes)") from None
    return ray


class RayDevicePool:
    def __init__(self, workers: int, model: torch.nn.Module, local: LocalTrainingConfig, address: str | None = None,
                 threads_per_worker: int = 1) -> None:
        if workers < 1:
            raise ValueError(f"workers must be >= 1, got {workers}")
        ray = self._ray = _ray()
        self._started = not ray.is_initialized()
        if self._started:
            # The workers import simulator/, device_sdk/ and facecore/ from this checkout.
            ray.init(address=address, include_dashboard=False, log_to_driver=True, runtime_env=_runtime_env())
        actor = ray.remote(num_cpus=1)(DeviceWorker)
        model_ref = ray.put(model)
        self._actors = [actor.remote(model_ref, dataclasses.asdict(local), threads_per_worker) for _ in range(workers)]
        self._assignment = Assignment(workers)

    def train(self, weights: Mapping[str, np.ndarray], tasks: Sequence[DeviceTask]) -> Iterator[DeviceResult]:
        """Results in the order of `tasks`; an actor that failed raises its error here. Each actor gets its share
        CHUNK devices per call, with AHEAD calls out at a time: a whole share's deltas in one answer would hold
        the round's updates in memory at once (10,000 devices of a small suffix: 12 GB)."""
        weights_ref = self._ray.put(contiguous(weights))
        chunks = [deque(share[i : i + CHUNK] for i in range(0, len(share), CHUNK)) for share in self._assignment.split(tasks)]
        out: list[deque[Any]] = [deque() for _ in self._actors]

        def submit(w: int) -> None:
            if chunks[w]:
                out[w].append(self._actors[w].train_all.remote(weights_ref, chunks[w].popleft()))

        for w in range(len(self._actors)):
            for _ in range(AHEAD):
                submit(w)
        answers: list[Iterator[DeviceResult]] = [iter(()) for _ in self._actors]
        for task in tasks:
            w = task.index % len(self._actors)
            result = next(answers[w], None)
            if result is None:
                answers[w] = iter(self._ray.get(out[w].popleft()))
                submit(w)
                result = next(answers[w])
            if result.index != task.index:
                raise RuntimeError(f"Ray worker answered for device {result.index}, expected {task.index}")
            yield result

    def close(self) -> None:
        for actor in self._actors:
            self._ray.kill(actor)
        self._actors = []
        if self._started:
            self._ray.shutdown()


def _runtime_env() -> dict[str, Any]:
    repo = Path(__file__).resolve().parents[2]
    return {"env_vars": {"PYTHONPATH": str(repo), "OMP_NUM_THREADS": "1"}}
