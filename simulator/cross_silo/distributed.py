"""One process per party over torch.distributed: rank 0 the server, then trainers, then validators.

Each process loads only its own data (a trainer its silo, a validator its pairs, the server
the report folds) and the only tensors that cross process boundaries are backbone weights,
the global momentum, per-step losses and validation scores. Two process groups keep the
protocols apart: ``train`` (server + trainers, one exchange per round) and ``validate``
(server + validators, FV's searches); with ``fv_mode="thread"`` the server runs FV's
searches on a thread beside the rounds, so validation never blocks training.

The transport is gloo, on CPU tensors, also when trainers compute on CUDA: one exchange per
K steps is not worth NCCL here, and NCCL refuses two ranks on one GPU, which is the only
layout a one-GPU machine has. Rounds and results are the in-process loop's own
(:func:`engine.federated_loop`), so a sync-FV run reproduces the in-process one exactly.
"""
from __future__ import annotations

import json
import os
import socket
import tempfile
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from facecore.federation.strategies.base import Weights
from facecore.federation.strategies.fedval import FederatedValidation
from simulator.cross_silo.config import FEDERATED, CrossSiloConfig
from simulator.cross_silo.data import DataSpec
from simulator.cross_silo.engine import FVServer, federated_loop, make_trainer
from simulator.cross_silo.models import build_backbone, configure_cpu_threads, place
from simulator.cross_silo.trainer import LocalResult
from simulator.cross_silo.validator import Validator, verify

STOP, GO = 0.0, 1.0


class Flat:
    """A weights dict as one float64 vector (exact for float32 weights and integer buffers)."""

    def __init__(self, template: Mapping[str, np.ndarray], keys: Sequence[str] | None = None) -> None:
        self.keys = list(keys if keys is not None else template)
        self.like = {k: np.asarray(template[k]) for k in self.keys}
        self.sizes = [self.like[k].size for k in self.keys]
        self.size = int(sum(self.sizes))

    def pack(self, weights: Mapping[str, np.ndarray]) -> torch.Tensor:
        return torch.from_numpy(np.concatenate([np.asarray(weights[k], dtype=np.float64).ravel() for k in self.keys]))

    def unpack(self, flat: torch.Tensor) -> Weights:
        parts = np.split(flat.numpy(), np.cumsum(self.sizes)[:-1])
        return {k: p.reshape(self.like[k].shape).astype(self.like[k].dtype) for k, p in zip(self.keys, parts)}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_distributed(config: CrossSiloConfig, spec: DataSpec, weights_out: Path | None = None) -> dict[str, Any]:
    """Spawn ``1 + parties + validators`` processes on this machine and return the server's report.

    ``weights_out``: where the server saves the final global backbone (``.npz``).
    """
    if config.method not in FEDERATED:
        raise ValueError(f"{config.method} is not federated: run it in-process")
    validators = config.validators if config.uses_fv else 0
    world = 1 + config.n_parties + validators
    with tempfile.TemporaryDirectory() as folder:
        result = Path(folder) / "report.json"
        weights = str(weights_out) if weights_out is not None else ""
        mp.spawn(_entry, args=(world, _free_port(), config, spec, str(result), weights), nprocs=world, join=True)
        return json.loads(result.read_text())


def _entry(rank: int, world: int, port: int, config: CrossSiloConfig, spec: DataSpec, result: str, weights_out: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    configure_cpu_threads(config.device)
    if config.device == "cuda":  # one GPU per rank when there are enough, else ranks share them
        torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group("gloo", rank=rank, world_size=world)
    parties = config.n_parties
    try:
        # Every rank creates both groups, in the same order, as new_group requires.
        train = dist.new_group(list(range(parties + 1)))
        validate = dist.new_group([0] + list(range(parties + 1, world))) if world > parties + 1 else None
        template = build_backbone(config.backbone, config.embedding_dim, config.seed)
        flat = Flat({k: v.numpy() for k, v in template.state_dict().items()})
        if rank == 0:
            _server(config, spec, template, flat, (train, validate), world - parties - 1, Path(result), weights_out)
        elif rank <= parties:
            _trainer(config, spec, rank - 1, template, flat, train)
        else:
            _validator(config, spec, rank - parties - 1, template, flat, validate)
    finally:
        dist.destroy_process_group()


def _server(
    config: CrossSiloConfig, spec: DataSpec, template: torch.nn.Module, flat: Flat, groups: tuple[Any, Any], n_validators: int, result: Path, weights_out: str,
) -> None:
    (train, validate), parties, K = groups, config.n_parties, config.K
    start = {k: v.numpy().copy() for k, v in template.state_dict().items()}
    param_keys = [n for n, _ in template.named_parameters()]
    momentum_flat = Flat(start, param_keys)

    def train_all(weights: Weights, momentum: Weights | None, lr: float) -> list[LocalResult]:
        dist.broadcast(torch.tensor([GO, lr], dtype=torch.float64), 0, group=train)
        dist.broadcast(flat.pack(weights), 0, group=train)
        if momentum is not None:
            dist.broadcast(momentum_flat.pack(momentum), 0, group=train)
        buffers = [torch.zeros(flat.size + K + 1, dtype=torch.float64) for _ in range(parties + 1)]
        dist.gather(torch.zeros(flat.size + K + 1, dtype=torch.float64), buffers, dst=0, group=train)
        return [LocalResult(flat.unpack(b[: flat.size]), int(b[-1]), tuple(b[flat.size : -1].tolist())) for b in buffers[1:]]

    def score(weights: Weights) -> np.ndarray:
        dist.broadcast(torch.tensor([GO], dtype=torch.float64), 0, group=validate)
        dist.broadcast(flat.pack(weights), 0, group=validate)
        scores = [torch.zeros(1, dtype=torch.float64) for _ in range(n_validators + 1)]
        dist.gather(torch.zeros(1, dtype=torch.float64), scores, dst=0, group=validate)
        return np.array([float(s) for s in scores[1:]])

    names = [spec.trainer_name(i) for i in range(parties)]
    fv = FVServer(FederatedValidation(parties, config.fv, seed=config.seed), score) if config.uses_fv else None
    try:
        body = federated_loop(config, names, start, param_keys, train_all, fv)
    finally:
        dist.broadcast(torch.tensor([STOP, 0.0], dtype=torch.float64), 0, group=train)
        if validate is not None:
            dist.broadcast(torch.tensor([STOP], dtype=torch.float64), 0, group=validate)
    final = body.pop("global_weights")
    evaluation = spec.evaluation()
    report = {"method": config.method, "config": config.to_dict(), "mode": "distributed", "world_size": 1 + parties + n_validators, **body}
    if evaluation is not None:
        model = place(template, config.device)
        model.load_state_dict({k: torch.as_tensor(v) for k, v in final.items()})
        report["eval"] = verify(model, evaluation, config.device)
    result.write_text(json.dumps(report))
    if weights_out:
        np.savez(weights_out, **final)


def _serve(flat: Flat, group: Any, header_size: int, work: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]) -> None:
    """A worker's loop: receive a header (STOP ends it) and the flat weights, send back `work`'s result."""
    header = torch.zeros(header_size, dtype=torch.float64)
    while True:
        dist.broadcast(header, 0, group=group)
        if header[0].item() == STOP:
            return
        weights = torch.zeros(flat.size, dtype=torch.float64)
        dist.broadcast(weights, 0, group=group)
        dist.gather(work(header, weights), None, dst=0, group=group)


def _trainer(config: CrossSiloConfig, spec: DataSpec, index: int, template: torch.nn.Module, flat: Flat, train: Any) -> None:
    trainer = make_trainer(config, spec.trainer(index), index, template)
    momentum_flat = Flat({k: v.numpy() for k, v in template.state_dict().items()}, list(trainer.params))

    def work(header: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        momentum = None
        if config.uses_pfm:
            m = torch.zeros(momentum_flat.size, dtype=torch.float64)
            dist.broadcast(m, 0, group=train)
            momentum = momentum_flat.unpack(m)
        res = trainer.train_round(flat.unpack(weights), momentum, float(header[1]), config.K)
        tail = torch.tensor([*res.losses, res.n_samples], dtype=torch.float64)
        return torch.cat([flat.pack(res.weights), tail])

    _serve(flat, train, 2, work)


def _validator(config: CrossSiloConfig, spec: DataSpec, index: int, template: torch.nn.Module, flat: Flat, validate: Any) -> None:
    validator = Validator(spec.validator(index), place(template, config.device), config.device)
    _serve(flat, validate, 1, lambda header, weights: torch.tensor([validator.score(flat.unpack(weights))], dtype=torch.float64))
