"""The in-process cross-device FedFace loop.

Each round: sample devices, run the SDK's `train_local` on each, stream their backbone deltas into
the server's strategy (`aggregate_train`), store each device's trained class embedding, then let
the strategy process the full embedding matrix (spreadout for FedFace). Resumable per round.
"""
from __future__ import annotations

import copy
import json
import math
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from tqdm import tqdm

from device_sdk.template_noise import noisy_template
from device_sdk.training import PrefixCache, Workspace, mean_feature_embedding, prefix_cache, train_local, trainable_keys
from facecore.models.checkpoint import atomic_torch_save
from facecore.models.preprocess import embed_faces
from facecore.models.registry import embedding_dim_of
from server_api.strategies import ClientUpdate, FedAvg, FedFace, Strategy
from server_api.strategies.dp_fedavg import DPFedAvg, dp_epsilon, noise_for_epsilon
from simulator.cross_device.config import EXECUTION_FIELDS, CrossDeviceConfig
from simulator.cross_device.population import Population
from simulator.cross_device.workers import DevicePool, DeviceTask

if TYPE_CHECKING:
    from simulator.cross_device.ray_backend import RayDevicePool

Evaluator = Callable[[torch.nn.Module], dict[str, Any]]


def mean_pairwise_cosine(W: np.ndarray) -> float:
    """Spread of the class embeddings: 1.0 means every identity collapsed onto one direction."""
    unit = W / np.linalg.norm(W, axis=1, keepdims=True)
    gram = unit @ unit.T
    n = len(W)
    return float((gram.sum() - np.trace(gram)) / (n * (n - 1)))


def to_numpy(state: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    return {k: v.detach().cpu().numpy() for k, v in state.items()}


@dataclass
class SimulationState:
    round: int
    model_state: dict[str, torch.Tensor]
    W: np.ndarray
    history: list[dict[str, Any]] = field(default_factory=list)


class CrossDeviceSimulation:
    def __init__(self, config: CrossDeviceConfig, population: Population, model: torch.nn.Module, out_dir: Path, evaluate: Evaluator | None = None) -> None:
        self.config = config
        self.population = population
        self.model = copy.deepcopy(model).eval()  # the caller's model stays the starting point
        self.out = out_dir
        self.evaluate = evaluate
        self.dp = self._dp_aggregator()
        self.strategy: Strategy = FedFace(config.server_spreadout, backbone=self.dp) if config.uses_spreadout else (self.dp or FedAvg())
        self.caches: dict[int, PrefixCache] = {}  # frozen-prefix activations per device, valid for the whole run
        self.workspace = Workspace(copy.deepcopy(self.model))  # every device trains in this one copy: no per-device deep copy
        # Only what local training can change crosses to the strategy (the suffix, with a frozen prefix).
        self.trained_keys = trainable_keys(self.model, config.local.trainable_blocks)
        self.pool: DevicePool | RayDevicePool | None = None  # started on the first round when config.workers > 1 or on Ray

    def _dp_aggregator(self) -> DPFedAvg | None:
        """The server's own DP-FedAvg, its noise calibrated so that the whole run spends dp_epsilon."""
        if self.config.dp_epsilon is None:
            return None
        noise = 0.0 if math.isinf(self.config.dp_epsilon) else noise_for_epsilon(
            self.config.dp_epsilon, self.sample_rate, max(self.config.rounds, 1), self.config.dp_delta)
        expected = min(self.config.per_round, len(self.population.devices))
        return DPFedAvg(self.config.dp_clip, noise, expected_clients=expected, seed=self.config.seed)

    @property
    def sample_rate(self) -> float:
        return min(self.config.per_round, len(self.population.devices)) / len(self.population.devices)

    def _chosen(self, rng: np.random.Generator) -> list[int]:
        """The round's devices: per_round of them at random, or under DP-FedAvg an independent
        (Poisson) draw of each device at rate q, which is what the accountant assumes."""
        n = len(self.population.devices)
        if self.dp is not None:
            return np.flatnonzero(rng.random(n) < self.sample_rate).tolist()
        return sorted(rng.choice(n, min(self.config.per_round, n), replace=False).tolist())

    # ---- state ---------------------------------------------------------------------------
    def initial_embeddings(self) -> np.ndarray:
        if self.config.init == "random":
            rng = np.random.default_rng(self.config.seed)
            W = rng.standard_normal((len(self.population.devices), embedding_dim_of(self.model))).astype(np.float32)
            return W / np.linalg.norm(W, axis=1, keepdims=True)
        # FedFace's init: each device enrolls with the mean feature of its own photos
        return np.stack([self._shared(mean_feature_embedding(embed_faces(self.model, d.faces)), 0, d.index) for d in self.population.devices])

    def _shared(self, embedding: np.ndarray, round_number: int, index: int) -> np.ndarray:
        """The template the server receives from a device (blurred under template noise)."""
        if self.config.template_noise_cos is None:
            return embedding
        return noisy_template(embedding, self.config.template_noise_cos, np.random.default_rng([self.config.seed, round_number, index, 7]))

    def prepare_caches(self) -> None:
        """Compute every device's frozen-prefix activations now instead of on first selection."""
        blocks = self.config.local.trainable_blocks
        if blocks is None:
            return
        by_faces: dict[int, PrefixCache] = {}  # a benchmark's tiled devices share one photo array per identity
        for device in tqdm(self.population.devices, desc="prefix caches", unit="device", leave=False):
            if device.index not in self.caches:
                if id(device.faces) not in by_faces:
                    by_faces[id(device.faces)] = prefix_cache(self.model, device.faces, blocks)
                self.caches[device.index] = by_faces[id(device.faces)]

    @property
    def checkpoint_path(self) -> Path:
        return self.out / "checkpoint.pt"

    def save(self, state: SimulationState) -> None:
        atomic_torch_save({"round": state.round, "model_state": state.model_state, "W": torch.from_numpy(state.W),
                           "history": state.history, "config": self.config.to_dict()}, self.checkpoint_path)

    def load(self) -> SimulationState | None:
        if not self.checkpoint_path.is_file():
            return None
        saved = torch.load(self.checkpoint_path, weights_only=True)
        # a run may be extended (more rounds, other eval cadence); anything else changes its meaning
        def key(c: dict[str, Any]) -> dict[str, Any]:
            # DP noise is calibrated to the number of rounds, so a DP run cannot be extended
            free = ("eval_every", "target_accuracy", *EXECUTION_FIELDS, *(("rounds",) if c.get("dp_epsilon") is None else ()))
            return {k: v for k, v in c.items() if k not in free}

        if key(saved["config"]) != key(self.config.to_dict()):
            from facecore.errors import CheckpointError

            raise CheckpointError(f"{self.checkpoint_path} belongs to a run with another configuration: use another --out")
        return SimulationState(saved["round"], saved["model_state"], saved["W"].numpy(), saved["history"])

    # ---- one round -----------------------------------------------------------------------
    def _seed(self, round_number: int, index: int) -> int:
        return self.config.seed * 1_000_003 + round_number * 10_007 + index

    def _updates(self, round_number: int, chosen: list[int], state: SimulationState, losses: list[float]) -> Iterator[ClientUpdate]:
        if self.config.workers > 1 or self.config.backend == "ray":
            yield from self._pooled_updates(round_number, chosen, state, losses)
            return
        base = self.model.state_dict()
        for index in tqdm(chosen, desc=f"round {round_number}", unit="device", leave=False):
            device = self.population.devices[index]
            cache = None
            if self.config.local.trainable_blocks is not None:
                cache = self.caches.get(index) or self.caches.setdefault(index, prefix_cache(self.model, device.faces, self.config.local.trainable_blocks))
            update = train_local(self.model, state.W[index], device.faces, self.config.local, seed=self._seed(round_number, index), cache=cache,
                                 workspace=self.workspace)
            keys = list(update.state_dict)
            delta = dict(zip(keys, (d.numpy() for d in torch._foreach_sub(list(update.state_dict.values()), [base[k] for k in keys])), strict=True))
            yield self._received(round_number, index, delta, update.embedding.numpy(), update.n_samples, update.loss_before, update.loss_after, state, losses)

    def _pooled_updates(self, round_number: int, chosen: list[int], state: SimulationState, losses: list[float]) -> Iterator[ClientUpdate]:
        if self.pool is None:
            if self.config.backend == "ray":
                from simulator.cross_device.ray_backend import RayDevicePool

                self.pool = RayDevicePool(self.config.workers, self.model, self.config.local, self.config.ray_address)
            else:
                self.pool = DevicePool(self.config.workers, self.model, self.config.local)
        blocks = self.config.local.trainable_blocks
        if blocks is not None:
            self.prepare_caches()
        tasks = []
        for index in chosen:
            device = self.population.devices[index]
            cache = (self.caches[index].plain.numpy(), self.caches[index].flipped.numpy()) if blocks is not None else None
            tasks.append(DeviceTask(index, state.W[index].copy(), self._seed(round_number, index), len(device.faces),
                                    faces=device.faces if blocks is None else None, cache=cache))
        current = self.model.state_dict()
        weights = {k: current[k].numpy() for k in self.trained_keys}
        for r in tqdm(self.pool.train(weights, tasks), total=len(tasks), desc=f"round {round_number}", unit="device", leave=False):
            yield self._received(round_number, r.index, r.delta, r.embedding, r.n_samples, r.loss_before, r.loss_after, state, losses)

    def _received(
        self, round_number: int, index: int, delta: dict[str, np.ndarray], embedding: np.ndarray, n_samples: int, loss_before: float,
        loss_after: float, state: SimulationState, losses: list[float],
    ) -> ClientUpdate:
        state.W[index] = self._shared(embedding, round_number, index)
        losses.append(loss_after)
        device = self.population.devices[index]
        return ClientUpdate(delta, n_samples, {"loss_before": loss_before, "loss_after": loss_after}, device.identity, kind="delta")

    def close(self) -> None:
        """Stop the worker processes, if any."""
        if self.pool is not None:
            self.pool.close()
            self.pool = None

    def run_round(self, round_number: int, state: SimulationState) -> dict[str, Any]:
        started = time.perf_counter()
        rng = np.random.default_rng([self.config.seed, round_number])
        chosen = self._chosen(rng)
        losses: list[float] = []
        current = self.model.state_dict()
        base = to_numpy({k: current[k] for k in self.trained_keys})
        result = self.strategy.aggregate_train(round_number, base, self._updates(round_number, chosen, state, losses))
        self.model.load_state_dict({**current, **{k: torch.from_numpy(np.asarray(v)) for k, v in result.weights.items()}})
        if self.config.uses_spreadout:
            state.W = self.strategy.aggregate_embeddings(state.W, self.config.server_spreadout).astype(np.float32)
        state.round = round_number
        state.model_state = {k: v.clone() for k, v in self.model.state_dict().items()}
        record = {
            "round": round_number, "participants": len(chosen), "train_loss": float(np.mean(losses)) if losses else None,
            "loss_before": result.metrics.get("loss_before"), "embedding_mean_cos": mean_pairwise_cosine(state.W),
            "seconds": time.perf_counter() - started,
        }
        if self.dp is not None:
            epsilon = dp_epsilon(self.dp.noise_multiplier, self.sample_rate, round_number, self.config.dp_delta)
            record |= {"dp_epsilon": None if math.isinf(epsilon) else epsilon, "dp_noise_multiplier": self.dp.noise_multiplier,
                       "dp_clipped_fraction": result.metrics["dp_clipped_fraction"]}
        return record

    # ---- the whole run -------------------------------------------------------------------
    def run(self, resume: bool = True) -> SimulationState:
        self.out.mkdir(parents=True, exist_ok=True)
        state = self.load() if resume else None
        if state is None:
            state = SimulationState(0, {k: v.clone() for k, v in self.model.state_dict().items()}, self.initial_embeddings())
            state.history.append(self._evaluated({"round": 0, "embedding_mean_cos": mean_pairwise_cosine(state.W)}))
            self._log(state, state.history[-1])
        else:
            self.model.load_state_dict(state.model_state)
        rounds = 0 if self.config.method == "pretrained" else self.config.rounds
        try:
            for round_number in range(state.round + 1, rounds + 1):
                record = self.run_round(round_number, state)
                if round_number % self.config.eval_every == 0 or round_number == rounds:
                    record = self._evaluated(record)
                state.history.append(record)
                self._log(state, record)
        finally:
            self.close()
        return state

    def _evaluated(self, record: dict[str, Any]) -> dict[str, Any]:
        if self.evaluate is None:
            return record
        return {**record, **self.evaluate(self.model)}

    def _log(self, state: SimulationState, record: dict[str, Any]) -> None:
        self.save(state)
        with open(self.out / "rounds.jsonl", "a") as log:
            log.write(json.dumps(record) + "\n")
        shown = {k: round(v, 4) if isinstance(v, float) else v for k, v in record.items() if not isinstance(v, dict | list)}
        tqdm.write(" ".join(f"{k}={v}" for k, v in shown.items()))
