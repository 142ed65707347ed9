"""The in-process cross-silo loop: trainers, the server's strategy and FV in one process.

Parties are objects here, but the boundaries are the real ones: a trainer hands the
server its backbone weights only, a validator receives aggregate weights and answers a
score, and the server never touches faces. :mod:`.distributed` runs the same pieces as
separate processes.
"""
from __future__ import annotations

import copy
import dataclasses
import threading
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import numpy as np
import torch

from facecore.federation.strategies.base import ClientUpdate, Weights
from facecore.federation.strategies.fedval import FederatedValidation
from facecore.federation.strategies.pfm import PFM, PFMResult, WeightedFedAvg
from facecore.models.registry import embedding_dim_of
from simulator.cross_silo.config import CrossSiloConfig
from simulator.cross_silo.models import build_backbone, build_head, input_size, place
from simulator.cross_silo.trainer import BatchStream, CentralTrainer, LocalResult, SiloData, SiloTrainer
from simulator.cross_silo.validator import PairSet, Validator, verify

Scorer = Callable[[Weights], np.ndarray]


class FVServer:
    """FV beside training: the latest local backbones, the weighting, and the search loop.

    ``sync``: the caller runs :meth:`search_once` every few rounds (deterministic, for tests).
    ``thread``: a daemon thread searches whenever newer backbones have been published, so
    validation overlaps training and a round never waits for it (Alg. 2's asynchrony).
    """

    def __init__(self, fv: FederatedValidation, score: Scorer) -> None:
        self.fv, self.score = fv, score
        self.history: list[dict[str, Any]] = []
        self._lock = threading.Condition()
        self._latest: list[Weights] | None = None
        self._round = 0  # the round whose backbones _latest holds
        self._generation = 0
        self._stop = False
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def publish(self, backbones: Sequence[Weights], server_round: int) -> None:
        with self._lock:
            self._latest, self._round = list(backbones), server_round
            self._generation += 1
            self._lock.notify_all()

    def weighting(self) -> np.ndarray:
        with self._lock:
            return self.fv.weighting.copy()

    def search_once(self) -> None:
        with self._lock:
            snapshot, seen_round = self._latest, self._round
        if snapshot is None:
            return
        started = time.perf_counter()
        step = self.fv.search(snapshot, self.score)
        with self._lock:
            self.history.append({
                "after_round": seen_round, "chosen": step.chosen, "scores": step.scores.round(6).tolist(),
                "candidates": step.candidates.round(6).tolist(), "weighting": step.weighting.round(6).tolist(),
                "seconds": time.perf_counter() - started,
            })

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="federated-validation", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        searched = 0
        try:
            while True:
                with self._lock:
                    self._lock.wait_for(partial(self._woken, searched))
                    if self._stop:
                        return
                    searched = self._generation
                self.search_once()
        except BaseException as error:  # surfaced by stop(): a dead FV thread must not pass silently
            self.error = error

    def _woken(self, searched: int) -> bool:
        """Stopped, or backbones newer than generation ``searched`` published (call with the lock held)."""
        return self._stop or self._generation > searched

    def stop(self) -> None:
        with self._lock:
            self._stop = True
            self._lock.notify_all()
        if self._thread is not None:
            self._thread.join()
        if self.error is not None:
            raise RuntimeError("federated validation failed") from self.error


def _ema(values: Sequence[float], factor: float = 0.9) -> float:
    smoothed = values[0]
    for v in values[1:]:
        smoothed = factor * smoothed + (1 - factor) * v
    return float(smoothed)


def make_trainer(config: CrossSiloConfig, silo: SiloData, index: int, template: torch.nn.Module) -> SiloTrainer:
    """Trainer ``index``: the shared initial backbone, its own seeded head and batch order (same in every mode)."""
    backbone = place(copy.deepcopy(template), config.device)
    head = place(build_head(config.loss, embedding_dim_of(backbone), silo.classes, config.seed + 1 + index), config.device)
    stream = BatchStream(silo, config.batch, seed=config.seed * 1_000_003 + index, flip=config.flip, device=config.device)
    return SiloTrainer(silo.name, backbone, head, stream, beta=config.beta, use_pfm=config.uses_pfm, device=config.device)


TrainAll = Callable[[Weights, "Weights | None", float], list[LocalResult]]


def federated_loop(
    config: CrossSiloConfig, names: Sequence[str], global_w: Weights, param_keys: Sequence[str], train_all: TrainAll, fv: FVServer | None,
) -> dict[str, Any]:
    """The server's rounds (Alg. 1 lines 2-18) over any transport: ``train_all`` runs every trainer's K steps."""
    c = config
    strategy: WeightedFedAvg = PFM(c.lr_at, c.beta, momentum_keys=param_keys) if c.uses_pfm else WeightedFedAvg()
    momentum = strategy.initial_momentum(global_w) if isinstance(strategy, PFM) else None
    if fv is not None and c.fv_mode == "thread":
        fv.start()
    losses: list[list[float]] = [[] for _ in names]
    rounds, train_seconds = [], 0.0
    try:
        for r in range(1, c.rounds + 1):
            lr = c.lr_at(r)
            tick = time.perf_counter()
            local = train_all(global_w, momentum, lr)
            train_seconds += time.perf_counter() - tick
            w = fv.weighting() if fv is not None else np.full(len(names), 1.0 / len(names))
            strategy.set_weighting(dict(zip(names, w)))
            updates = [ClientUpdate(res.weights, res.n_samples, {"loss": float(np.mean(res.losses))}, name, kind="full") for res, name in zip(local, names)]
            result = strategy.aggregate_train(r, global_w, updates)
            global_w = result.weights
            if isinstance(result, PFMResult):
                momentum = result.momentum
            for sink, res in zip(losses, local):
                sink.extend(res.losses)
            rounds.append({"round": r, "lr": lr, "loss": result.metrics.get("loss"), "weighting": np.round(w, 6).tolist(),
                           "momentum_norm": result.metrics.get("momentum_norm"), "seconds": time.perf_counter() - tick})
            if fv is not None:
                fv.publish([res.weights for res in local], r)
                if c.fv_mode == "sync" and r % c.fv_every == 0:
                    fv.search_once()
    finally:
        if fv is not None and c.fv_mode == "thread":
            fv.stop()
    return {
        "parties": list(names), "loss_ema": {n: _ema(v) for n, v in zip(names, losses)}, "losses": dict(zip(names, losses)),
        "seconds_per_local_step": train_seconds / (c.rounds * c.K * len(names)), "rounds": rounds,
        "fv": fv.history if fv else [], "weighting": fv.weighting().tolist() if fv else None, "global_weights": global_w,
    }


class CrossSiloSimulation:
    def __init__(self, config: CrossSiloConfig, silos: Sequence[SiloData], validators: Sequence[PairSet] = (), evaluation: PairSet | None = None) -> None:
        self.config, self.silos, self.validators, self.evaluation = config, list(silos), list(validators), evaluation
        self.final_weights: Weights | None = None
        self.template = build_backbone(config.backbone, config.embedding_dim, config.seed)
        size = input_size(self.template)
        parts: list[SiloData | PairSet] = [*self.silos, *self.validators, *([evaluation] if evaluation else [])]
        for part in parts:
            if part.faces.shape[1] != size:
                raise ValueError(f"{part.name}: faces are {part.faces.shape[1]}px, {config.backbone} wants {size}px")
        if len(self.silos) != config.n_parties or (config.uses_fv and len(self.validators) != config.validators):
            raise ValueError(f"the config asks for {config.n_parties} trainers and {config.validators} validators, "
                             f"got {len(self.silos)} and {len(self.validators)}")

    # ---- parties -----------------------------------------------------------------------
    def _model(self, weights: Weights) -> torch.nn.Module:
        model = place(copy.deepcopy(self.template), self.config.device)
        model.load_state_dict({k: torch.as_tensor(np.asarray(v)) for k, v in weights.items()})
        return model

    def _evaluate(self, weights: Weights) -> dict[str, float]:
        if self.evaluation is None:
            return {}
        return verify(self._model(weights), self.evaluation, self.config.device)

    def _finish(self, weights: Weights) -> dict[str, float]:
        self.final_weights = weights  # the global backbone, for callers that save it
        return self._evaluate(weights)

    # ---- methods -----------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        started = time.perf_counter()
        method = self.config.method
        body = self._central() if method == "central" else self._solo() if method == "solo" else self._federated()
        if self.final_weights is not None and self.validators:
            body["validation"] = self._validate(self.final_weights)
        return {"method": method, "config": self.config.to_dict(), "wall_seconds": time.perf_counter() - started, **body}

    def _validate(self, weights: Weights) -> dict[str, float]:
        """The validators' pair accuracy: what chooses a setting (the lr, say), since ``eval`` is the test folds."""
        model = self._model(weights)
        return {pairs.name: verify(model, pairs, self.config.device)["accuracy"] for pairs in self.validators}

    def _federated(self) -> dict[str, Any]:
        c = self.config
        trainers = [make_trainer(c, silo, i, self.template) for i, silo in enumerate(self.silos)]
        start = trainers[0].weights()
        initial = self._evaluate(start)
        fv = self._fv_server(len(trainers)) if c.uses_fv else None
        body = federated_loop(c, [t.name for t in trainers], start, list(trainers[0].params),
                              lambda w, m, lr: [t.train_round(w, m, lr, c.K) for t in trainers], fv)
        final = body.pop("global_weights")
        return {**body, "initial_eval": initial, "eval": self._finish(final)}

    def _fv_server(self, n_trainers: int) -> FVServer:
        c = self.config
        validators = [Validator(p, place(copy.deepcopy(self.template), c.device), c.device) for p in self.validators]
        fv = FederatedValidation(n_trainers, c.fv, seed=c.seed)
        return FVServer(fv, lambda weights: np.array([v.score(weights) for v in validators]))

    def _central(self) -> dict[str, Any]:
        c = self.config
        backbone = place(copy.deepcopy(self.template), c.device)
        offsets = np.cumsum([0] + [s.classes for s in self.silos])[:-1].tolist()
        head = place(build_head(c.loss, embedding_dim_of(backbone), sum(s.classes for s in self.silos), c.seed + 1), c.device)
        streams = [BatchStream(s, c.batch, seed=c.seed * 1_000_003 + i, flip=c.flip, device=c.device) for i, s in enumerate(self.silos)]
        central = CentralTrainer(backbone, head, streams, offsets, beta=c.beta, device=c.device)
        names = [s.name for s in self.silos]
        initial = self._evaluate({k: v.detach().cpu().numpy() for k, v in backbone.state_dict().items()})
        tick = time.perf_counter()
        per_step = [central.step(c.lr_at(1 + s // c.K)) for s in range(c.total_steps)]
        seconds = time.perf_counter() - tick
        losses = torch.stack(per_step).float().cpu().numpy().T.tolist()
        weights = {k: v.detach().cpu().numpy() for k, v in backbone.state_dict().items()}
        return {"parties": names, "loss_ema": {n: _ema(v) for n, v in zip(names, losses)}, "losses": dict(zip(names, losses)),
                "seconds_per_step": seconds / c.total_steps, "initial_eval": initial, "eval": self._finish(weights)}

    def _solo(self) -> dict[str, Any]:
        c = self.config
        out: dict[str, Any] = {"parties": [s.name for s in self.silos], "loss_ema": {}, "losses": {}, "eval": {}}
        for i, silo in enumerate(self.silos):
            trainer = make_trainer(dataclasses.replace(c, method="fedavg"), silo, i, self.template)
            losses: list[float] = []
            for r in range(1, c.rounds + 1):
                losses.extend(trainer.train_round(None, None, c.lr_at(r), c.K).losses)
            out["loss_ema"][silo.name], out["losses"][silo.name] = _ema(losses), losses
            out["eval"][silo.name] = self._evaluate(trainer.weights())
        return out
