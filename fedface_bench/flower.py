"""Flower's simulation engine (flwr + Ray) on the same round as `fedface bench sim`: the reference (b).

Runs in its own interpreter from `.venv-flower` (`make flower-venv`), because flwr pins FastAPI,
Starlette and uvicorn versions other than the server's. `fedface_bench.sim` writes a work folder:
- `model.pt`: the round's backbone (a FedFace backbone file);
- `prefix.npy` and `devices.json`: every device's cached frozen-prefix activations (plain, then
  mirrored) with offsets and face counts, the class embeddings W and the local-training settings.

Each Flower ClientApp call trains one device with the SDK's own `train_local` on those activations,
exactly as our simulator does, and sends back the trainable suffix; Flower's FedAvg aggregates. The
ServerApp runs `repeats + 1` rounds with every device; the first is a warm-up (Ray starting its
actors, torch importing in them) and the median of the others is `flower_seconds`. Ray gets one
actor per core with one torch thread each. One JSON object goes to stdout.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from device_sdk.training import LocalTrainingConfig, PrefixCache, train_local, trainable_keys
from facecore.models.checkpoint import load_backbone


@functools.lru_cache(maxsize=1)
def _workload(folder: str) -> tuple[torch.nn.Module, LocalTrainingConfig, np.ndarray, list[dict[str, Any]], np.ndarray]:
    """Loaded once per Ray actor process and reused for every device it trains (like our workspace)."""
    torch.set_num_threads(1)
    model = load_backbone(Path(folder) / "model.pt")
    meta = json.loads((Path(folder) / "devices.json").read_text())
    config = LocalTrainingConfig(**meta["local"])
    W = np.asarray(meta["W"], np.float32)
    return model, config, np.load(Path(folder) / "prefix.npy", mmap_mode="r"), meta["devices"], W


def _client_app(folder: str) -> Any:
    from flwr.app import ArrayRecord, Context, Message, MetricRecord, RecordDict
    from flwr.clientapp import ClientApp

    app = ClientApp()

    @app.train()
    def train(message: Message, context: Context) -> Message:
        model, config, prefix, devices, W = _workload(folder)
        index = int(context.node_config["partition-id"])
        device = devices[index]
        n = device["faces"]
        block = torch.from_numpy(np.array(prefix[device["offset"] : device["offset"] + 2 * n]))
        cache = PrefixCache(block[:n], block[n:], config.trainable_blocks or 0)
        model.load_state_dict(message.content["arrays"].to_torch_state_dict(), strict=False)
        seed = int(message.content["config"]["seed"]) + index
        update = train_local(model, W[index], np.zeros((n, 1, 1, 3), np.uint8), config, seed=seed, cache=cache)
        metrics = MetricRecord({"num-examples": n, "loss": float(update.loss_after)})
        return Message(RecordDict({"arrays": ArrayRecord(update.state_dict), "metrics": metrics}), reply_to=message)

    return app


def _server_app(folder: str, devices: int, repeats: int, marks: list[float], losses: list[float]) -> Any:
    from flwr.app import ArrayRecord, ConfigRecord, Context
    from flwr.serverapp import Grid, ServerApp
    from flwr.serverapp.strategy import FedAvg

    app = ServerApp()

    @app.main()
    def main(grid: Grid, context: Context) -> None:
        model, config, _, _, _ = _workload(folder)
        state = model.state_dict()
        initial = ArrayRecord({k: state[k] for k in trainable_keys(model, config.trainable_blocks)})
        strategy = FedAvg(fraction_train=1.0, fraction_evaluate=0.0, min_train_nodes=devices, min_available_nodes=devices)

        def stamp(server_round: int, arrays: ArrayRecord) -> None:  # called before round 1 and after each round
            marks.append(time.perf_counter())

        result = strategy.start(grid=grid, initial_arrays=initial, num_rounds=repeats + 1, train_config=ConfigRecord({"seed": 1}), evaluate_fn=stamp)
        losses.extend(float(result.train_metrics_clientapp[r]["loss"]) for r in sorted(result.train_metrics_clientapp))

    return app


def run(folder: str, devices: int, repeats: int, cores: int) -> dict[str, Any]:
    from flwr.simulation import run_simulation

    marks: list[float] = []
    losses: list[float] = []  # the clients' mean training loss per round, as Flower aggregated it
    started = time.perf_counter()
    backend = {"client_resources": {"num_cpus": 1, "num_gpus": 0.0}, "init_args": {"num_cpus": cores, "include_dashboard": False}}
    run_simulation(_server_app(folder, devices, repeats, marks, losses), _client_app(folder), num_supernodes=devices, backend_config=backend)
    total = time.perf_counter() - started
    if len(marks) != repeats + 2:
        raise RuntimeError(f"Flower ran {max(0, len(marks) - 1)} of {repeats + 1} rounds; see its log above")
    if len(losses) != repeats + 1:  # a round whose clients all failed aggregates no metrics
        raise RuntimeError(f"Flower's clients trained in {len(losses)} of {repeats + 1} rounds; see their errors above")
    rounds = [b - a for a, b in zip(marks, marks[1:])]
    return {"flower_seconds": statistics.median(rounds[1:]), "flower_warmup_round_seconds": rounds[0], "flower_total_seconds": total,
            "flower_rounds": rounds, "flower_actors": cores, "flower_train_losses": losses}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--folder", required=True)
    parser.add_argument("--devices", type=int, required=True)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cores", type=int, default=os.cpu_count() or 1)
    args = parser.parse_args(sys.argv[1:] if argv is None else argv)
    result = run(args.folder, args.devices, args.repeats, args.cores)
    print(json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

