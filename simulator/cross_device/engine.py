"""The in-process cross-device FedFace loop.

Each round: select devices by the round server's rule, run the SDK's `train_local` on each from the
model as a device receives it, pass each result through the update file's tensors at the wire's
precision, stream the backbone deltas into the strategy the server would build for this round
(`aggregate_train`), store each device's class embedding as sent, then let the strategy process the
full embedding matrix (spreadout for FedFace). Resumable per round.

The selection rule, the wire format, the template noise and the strategy factory all come from
facecore.federation, which the live server and SDK use too, and so does each device's training seed;
`--selection uniform --wire fp32 --seeding per_device` reproduce runs made before the simulator followed them.
"""
from __future__ import annotations

import copy
import dataclasses
import json
import math
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from tqdm import tqdm

from device_sdk.training import PrefixCache, Workspace, prefix_cache, train_local, trainable_keys
from facecore.federation.config import training_seed
from facecore.federation.packed import PackedArrays
from facecore.federation.quantize import quantized_update, received_deltas
from facecore.federation.selection import least_recently_selected
from facecore.federation.strategies import ClientUpdate, ServerMomentum, Strategy, layer_of, strategy_for
from facecore.federation.strategies.dp_fedavg import DPFedAvg, dp_epsilon, noise_for_epsilon
from facecore.federation.strategies.tiers import aggregate_in_shards
from facecore.federation.template_noise import noisy_template
from facecore.federation.wire import Precision, as_received, packed_on_wire
from facecore.models.checkpoint import atomic_torch_save, int8_received
from facecore.models.preprocess import embed_faces
from facecore.models.registry import embedding_dim_of
from facecore.templates import mean_feature_embedding, mean_feature_length
from simulator.cross_device.config import (
    EXECUTION_FIELDS,
    LEGACY_DEFAULTS,
    LEGACY_LOCAL_DEFAULTS,
    LEGACY_SPREADOUT_DEFAULTS,
    CrossDeviceConfig,
)
from simulator.cross_device.negatives import PublicNegatives
from simulator.cross_device.population import Population, SimDevice
from simulator.cross_device.workers import DevicePool, DeviceTask

if TYPE_CHECKING:
    from simulator.cross_device.ray_backend import RayDevicePool

Evaluator = Callable[[torch.nn.Module], dict[str, Any]]


@dataclass
class RoundTally:
    """What a round's updates report as they stream past the strategy: each device's loss after training,
    and the L2 length of its backbone delta as the server reads it (what a secure round's bound must clear)."""

    losses: list[float] = field(default_factory=list)
    update_lengths: list[float] = field(default_factory=list)

    def update_length_summary(self) -> dict[str, float] | None:
        if not self.update_lengths:
            return None
        lengths = np.asarray(self.update_lengths)
        return {"median": float(np.median(lengths)), "p90": float(np.quantile(lengths, 0.9)), "max": float(lengths.max())}


def update_length(deltas: Mapping[str, np.ndarray]) -> float:
    """The L2 length of an update's float deltas (a packed update's buffer at once: its other entries are
    integers). torch sums fp16 and fp32 in fp32 without a widened copy, an order of magnitude faster than
    numpy's float64 square, which would cost each device more than its bookkeeping; float64 adds the rows'
    squares, which keeps a long buffer's sum as exact as short entries' are."""
    floating = [deltas.flat] if isinstance(deltas, PackedArrays) else [d for d in deltas.values() if d.dtype.kind == "f"]
    return math.sqrt(sum(_squared_length(torch.from_numpy(np.require(d, requirements="W")).reshape(-1)) for d in floating))


_ROW = 1024


def _squared_length(values: torch.Tensor) -> float:
    if len(values) <= _ROW:
        return float(torch.linalg.vector_norm(values, dtype=torch.float32).item() ** 2)
    whole = len(values) - len(values) % _ROW
    rows = torch.linalg.vector_norm(values[:whole].view(-1, _ROW), dim=1, dtype=torch.float32).double()
    return torch.dot(rows, rows).item() + torch.linalg.vector_norm(values[whole:], dtype=torch.float32).item() ** 2


def mean_pairwise_cosine(W: np.ndarray) -> float:
    """Spread of the class embeddings: 1.0 means every identity collapsed onto one direction. The sum of all
    pairs' cosines is |sum of the unit rows|² less the n self-pairs, so no (n, n) matrix is built."""
    unit = W.astype(np.float64) / np.linalg.norm(W, axis=1, keepdims=True)
    total = unit.sum(axis=0)
    n = len(W)
    return float((total @ total - (unit * unit).sum()) / (n * (n - 1)))


def to_numpy(state: dict[str, torch.Tensor]) -> dict[str, np.ndarray]:
    return {k: v.detach().cpu().numpy() for k, v in state.items()}


@dataclass
class SimulationState:
    round: int
    model_state: dict[str, torch.Tensor]
    W: np.ndarray
    history: list[dict[str, Any]] = field(default_factory=list)
    last_selected: list[int | None] = field(default_factory=list)  # per device: the round that last selected it
    # per device: its enrolment photos' mean unit feature length under the starting model (train_local's
    # template_length); None: 1 for every device, as runs saved before it was kept
    template_lengths: np.ndarray | None = None
    # per device, with upload_bits: what its quantised updates have not yet delivered (facecore.federation.quantize)
    residuals: dict[int, dict[str, np.ndarray]] = field(default_factory=dict)


class CrossDeviceSimulation:
    def __init__(
        self, config: CrossDeviceConfig, population: Population, model: torch.nn.Module, out_dir: Path, evaluate: Evaluator | None = None,
        negatives: PublicNegatives | None = None, feature_center: np.ndarray | None = None,
    ) -> None:
        if (negatives is None) != (config.public_negatives == 0):
            raise ValueError("pass the public negatives exactly when config.public_negatives asks for them")
        if (feature_center is None) == config.center_features:
            raise ValueError("pass a feature centre exactly when config.center_features asks for one")
        self.config = config
        self.negatives = negatives
        self.population = population
        self.model = copy.deepcopy(model).eval()  # the caller's model stays the starting point
        self.out = out_dir
        self.evaluate = evaluate
        self.round_config = config.round_config(len(population.devices), self._dp_noise_multiplier())
        self.strategy: Strategy = strategy_for(self.round_config, seed=config.seed)
        self.momentum = layer_of(self.strategy, ServerMomentum)  # its last step is checkpointed
        self.dp = layer_of(self.strategy, DPFedAvg)
        # The model as devices receive it (fp16 on the wire, or int8); devices train from it and send deltas against it.
        self.received = self.model if config.wire == "fp32" and config.download_bits is None else copy.deepcopy(self.model)
        self._receive()
        self.caches: dict[int, PrefixCache] = {}  # frozen-prefix activations per device, valid for the whole run
        self._with_enrolment: dict[int, np.ndarray] = {}  # _training_faces' arrays, one per device for the run
        self.workspace = Workspace(copy.deepcopy(self.model))  # every device trains in this one copy: no per-device deep copy
        # Only what local training can change crosses to the strategy (the suffix, with a frozen prefix).
        self.trained_keys = trainable_keys(self.model, config.local.trainable_blocks)
        self.local = config.local if feature_center is None else dataclasses.replace(config.local, feature_center=tuple(np.asarray(feature_center).tolist()))
        self.pool: DevicePool | RayDevicePool | None = None  # started on the first round when config.workers > 1 or on Ray

    def _dp_noise_multiplier(self) -> float:
        """DP-FedAvg's noise, calibrated so that the whole run spends dp_epsilon (0 without DP or at infinity)."""
        if self.config.dp_epsilon is None or math.isinf(self.config.dp_epsilon):
            return 0.0
        return noise_for_epsilon(self.config.dp_epsilon, self.sample_rate, max(self.config.rounds, 1), self.config.dp_delta)

    def _receive(self) -> None:
        """Bring the devices' copy of the model up to date, at the wire's precision."""
        if self.received is self.model:
            return
        if self.config.download_bits == 8:
            self.received.load_state_dict(int8_received(self.model.state_dict()))
        else:
            sent = as_received(to_numpy(self.model.state_dict()), self.config.wire)
            self.received.load_state_dict({k: torch.from_numpy(v) for k, v in sent.items()})

    @property
    def sample_rate(self) -> float:
        return min(self.config.per_round, len(self.population.devices)) / len(self.population.devices)

    def _chosen(self, rng: np.random.Generator, state: SimulationState) -> list[int]:
        """The round's devices: per_round of them by the server's rule (every device is a candidate), or
        under DP-FedAvg an independent (Poisson) draw of each device at rate q, which is what the
        accountant assumes. "uniform" selection draws per_round at random, as earlier runs did."""
        n = len(self.population.devices)
        if self.dp is not None:
            return np.flatnonzero(rng.random(n) < self.sample_rate).tolist()
        if self.config.selection == "uniform":
            return sorted(rng.choice(n, min(self.config.per_round, n), replace=False).tolist())
        return sorted(least_recently_selected(state.last_selected, self.config.per_round, rng.random))

    # ---- state ---------------------------------------------------------------------------
    def initial_templates(self) -> tuple[np.ndarray, np.ndarray]:
        """Each device's template as the server receives it at enrolment, and its length before
        normalising (facecore.templates.mean_feature_length; 1 under a random init)."""
        if self.config.init == "random":
            rng = np.random.default_rng(self.config.seed)
            W = rng.standard_normal((len(self.population.devices), embedding_dim_of(self.model))).astype(np.float32)
            return W / np.linalg.norm(W, axis=1, keepdims=True), np.ones(len(W))
        # FedFace's init: each device enrolls with the mean feature of its own photos
        def enrolled(d: SimDevice) -> np.ndarray:
            return d.clean if self.config.enrolment == "clean" and d.clean is not None else d.faces

        features = [embed_faces(self.model, enrolled(d)) for d in self.population.devices]
        W = np.stack([self._shared(mean_feature_embedding(f), 0, d.index) for f, d in zip(features, self.population.devices, strict=True)])
        return W, np.array([mean_feature_length(f) for f in features])

    def _training_faces(self, device: SimDevice) -> np.ndarray:
        """The faces a device trains on: its camera's, and with `train_enrolment` its clean enrolment photos first."""
        if not self.config.train_enrolment or device.clean is None:
            return device.faces
        if device.index not in self._with_enrolment:
            self._with_enrolment[device.index] = np.concatenate([device.clean, device.faces])
        return self._with_enrolment[device.index]

    @staticmethod
    def _template_length(state: SimulationState, index: int) -> float:
        return 1.0 if state.template_lengths is None else float(state.template_lengths[index])

    def _shared(self, embedding: np.ndarray, round_number: int, index: int) -> np.ndarray:
        """The template the server receives from a device (blurred under template noise)."""
        if self.config.template_noise_cos is None:
            return embedding
        return noisy_template(embedding, self.config.template_noise_cos, np.random.default_rng([self.config.seed, round_number, index, 7]))

    def prepare_caches(self) -> None:
        """Compute every device's frozen-prefix activations now instead of on first selection."""
        blocks = self.local.trainable_blocks
        if blocks is None:
            return
        by_faces: dict[int, PrefixCache] = {}  # a benchmark's tiled devices share one photo array per identity
        for device in tqdm(self.population.devices, desc="prefix caches", unit="device", leave=False):
            if device.index not in self.caches:
                faces = self._training_faces(device)
                if id(faces) not in by_faces:
                    by_faces[id(faces)] = prefix_cache(self.received, faces, blocks)
                self.caches[device.index] = by_faces[id(faces)]

    @property
    def checkpoint_path(self) -> Path:
        return self.out / "checkpoint.pt"

    def save(self, state: SimulationState) -> None:
        atomic_torch_save({"round": state.round, "model_state": state.model_state, "W": torch.from_numpy(state.W),
                           "history": state.history, "last_selected": state.last_selected, "config": self.config.to_dict(),
                           "server_step": {} if self.momentum is None else {k: torch.from_numpy(v) for k, v in self.momentum.previous.items()},
                           "feature_center": self.local.feature_center,
                           **({} if state.template_lengths is None else {"template_lengths": torch.from_numpy(state.template_lengths)}),
                           "residuals": {str(i): {k: torch.from_numpy(v) for k, v in r.items()} for i, r in state.residuals.items()}},
                          self.checkpoint_path)

    def load(self) -> SimulationState | None:
        if not self.checkpoint_path.is_file():
            return None
        saved = torch.load(self.checkpoint_path, weights_only=True)
        # a run may be extended (more rounds, other eval cadence); anything else changes its meaning
        def key(c: dict[str, Any]) -> dict[str, Any]:
            # DP noise is calibrated to the number of rounds, so a DP run cannot be extended
            free = ("eval_every", "target_accuracy", *EXECUTION_FIELDS, *(("rounds",) if c.get("dp_epsilon") is None else ()))
            c = {**LEGACY_DEFAULTS, **c, "local": {**LEGACY_LOCAL_DEFAULTS, **c["local"]},
                 "server_spreadout": {**LEGACY_SPREADOUT_DEFAULTS, **c["server_spreadout"]}}
            return {k: v for k, v in c.items() if k not in free}

        if key(saved["config"]) != key(self.config.to_dict()):
            from facecore.errors import CheckpointError

            raise CheckpointError(f"{self.checkpoint_path} belongs to a run with another configuration: use another --out")
        if self.momentum is not None:
            self.momentum.previous = {k: v.numpy() for k, v in saved.get("server_step", {}).items()}
        if saved.get("feature_center") != self.local.feature_center:  # the centre of the run's start, not of today's photos
            self.local = dataclasses.replace(self.local, feature_center=saved.get("feature_center"))
        lengths = saved.get("template_lengths")
        residuals = {int(i): {k: v.numpy() for k, v in r.items()} for i, r in saved.get("residuals", {}).items()}
        return SimulationState(saved["round"], saved["model_state"], saved["W"].numpy(), saved["history"], saved.get("last_selected", []),
                               None if lengths is None else lengths.numpy(), residuals)

    # ---- one round -----------------------------------------------------------------------
    def _seed(self, round_number: int, index: int) -> int:
        if self.config.seeding == "live":
            return training_seed(round_number, self.config.seed)
        return self.config.seed * 1_000_003 + round_number * 10_007 + index

    def _updates(self, round_number: int, chosen: list[int], state: SimulationState, tally: RoundTally) -> Iterator[ClientUpdate]:
        if self.config.workers > 1 or self.config.backend == "ray":
            yield from self._pooled_updates(round_number, chosen, state, tally)
            return
        base = self.received.state_dict()
        public = None if self.negatives is None else self.negatives.for_round(
            self.received, self.local.trainable_blocks, self.config.wire, self.config.public_rehearsal)
        packed_base = self.workspace.packed_source(self.received, self.local.trainable_blocks)
        for index in tqdm(chosen, desc=f"round {round_number}", unit="device", leave=False):
            faces = self._training_faces(self.population.devices[index])
            cache = None
            if self.local.trainable_blocks is not None:
                cache = self.caches.get(index) or self.caches.setdefault(index, prefix_cache(self.received, faces, self.local.trainable_blocks))
            update = train_local(self.received, state.W[index], faces, self.local, seed=self._seed(round_number, index), cache=cache,
                                 workspace=self.workspace, public=public, template_length=self._template_length(state, index))
            sent = update.delta(base, packed_base, self._upload_precision)  # one subtraction and one cast for the whole update
            yield self._received(round_number, index, sent, update.embedding.numpy(), update.n_samples, update.loss_before, update.loss_after, state, tally)

    def _pooled_updates(self, round_number: int, chosen: list[int], state: SimulationState, tally: RoundTally) -> Iterator[ClientUpdate]:
        if self.pool is None:
            if self.config.backend == "ray":
                from simulator.cross_device.ray_backend import RayDevicePool

                self.pool = RayDevicePool(self.config.workers, self.model, self.local, self.config.ray_address)
            else:
                self.pool = DevicePool(self.config.workers, self.model, self.local)
        blocks = self.local.trainable_blocks
        if blocks is not None:
            self.prepare_caches()
        tasks = []
        for index in chosen:
            faces = self._training_faces(self.population.devices[index])
            cache = (self.caches[index].plain.numpy(), self.caches[index].flipped.numpy()) if blocks is not None else None
            # id(faces): one array per set of photos for the run (the population's, or _training_faces')
            tasks.append(DeviceTask(index, id(faces), state.W[index].copy(), self._seed(round_number, index), len(faces),
                                    faces=faces if blocks is None else None, cache=cache,
                                    template_length=self._template_length(state, index)))
        received = self.received.state_dict()
        weights = {k: received[k].numpy() for k in self.trained_keys}
        for r in tqdm(self.pool.train(weights, tasks), total=len(tasks), desc=f"round {round_number}", unit="device", leave=False):
            sent = packed_on_wire(r.delta, self._upload_precision)  # workers send fp32
            yield self._received(round_number, r.index, sent, r.embedding, r.n_samples, r.loss_before, r.loss_after, state, tally)

    def _received(
        self, round_number: int, index: int, sent: Mapping[str, np.ndarray], embedding: np.ndarray, n_samples: int, loss_before: float,
        loss_after: float, state: SimulationState, tally: RoundTally,
    ) -> ClientUpdate:
        shared = self._shared(embedding, round_number, index)
        if self.config.upload_bits is None:
            # The update file's backbone tensors are `sent` itself, already at the wire's precision, and the
            # server reads them back as sent (update_tensors and received_deltas pass them through).
            deltas: Mapping[str, np.ndarray] = sent
        else:  # as device_sdk.round_files quantises, and as the server reads it back
            tensors, _, state.residuals[index] = quantized_update(sent, self.config.upload_bits, state.residuals.get(index))
            deltas = received_deltas(tensors, {k: v.shape for k, v in sent.items()})
        state.W[index] = np.asarray(shared, np.float32)
        tally.losses.append(loss_after)
        tally.update_lengths.append(update_length(deltas))
        device = self.population.devices[index]
        return ClientUpdate(deltas, n_samples, {"loss_before": loss_before, "loss_after": loss_after}, device.identity, kind="delta")

    @property
    def _upload_precision(self) -> Precision:
        """Quantised uploads start from the device's fp32 delta; others cross at the wire's precision."""
        return "fp32" if self.config.upload_bits is not None else self.config.wire

    def close(self) -> None:
        """Stop the worker processes, if any."""
        if self.pool is not None:
            self.pool.close()
            self.pool = None

    def run_round(self, round_number: int, state: SimulationState) -> dict[str, Any]:
        started = time.perf_counter()
        rng = np.random.default_rng([self.config.seed, round_number])
        self._receive()
        missing = len(self.population.devices) - len(state.last_selected)
        state.last_selected.extend([None] * missing)  # a new run, an older checkpoint or a hand-built state (a benchmark)
        chosen = self._chosen(rng, state)
        for index in chosen:
            state.last_selected[index] = round_number
        tally = RoundTally()
        current = self.model.state_dict()
        base = to_numpy({k: current[k] for k in self.trained_keys})
        result = aggregate_in_shards(self.strategy, round_number, base, self._updates(round_number, chosen, state, tally))
        self.model.load_state_dict({**current, **{k: torch.from_numpy(np.asarray(v)) for k, v in result.weights.items()}})
        if self.config.uses_spreadout:
            state.W = self.strategy.aggregate_embeddings(state.W, self.config.server_spreadout).astype(np.float32)
        state.round = round_number
        state.model_state = {k: v.clone() for k, v in self.model.state_dict().items()}
        record = {
            "round": round_number, "participants": len(chosen), "train_loss": float(np.mean(tally.losses)) if tally.losses else None,
            "loss_before": result.metrics.get("loss_before"), "update_length": tally.update_length_summary(),
            "embedding_mean_cos": mean_pairwise_cosine(state.W),
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
            W, lengths = self.initial_templates()
            state = SimulationState(0, {k: v.clone() for k, v in self.model.state_dict().items()}, W, template_lengths=lengths)

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
