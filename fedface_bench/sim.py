"""`fedface bench sim`: seconds of one simulated FedFace round against the compute floor.

*Ours* is :meth:`CrossDeviceSimulation.run_round` with every device participating: the SDK's
`train_local` per device, deltas streamed into the server's FedFace strategy, spreadout on W.
The *floor* does the same images and optimizer steps as one centralised stream: one model,
one optimizer, each device's batches in turn against its own row of W, and nothing else (no
per-device weights, deltas or aggregation). ``floor_ratio = floor / ours``: 1.0 means the
federated bookkeeping is free.

Both run the frozen-prefix option by default (``--trainable-blocks``), with prefix activations
cached before timing, because a full-backbone round of 1,000 devices takes about 20 minutes
here. More devices than the split's real identities reuse them cyclically: a speed figure needs
the real photo counts, not new people.

Memory: ``peak_rss_mb`` is the peak summed RSS of this process and everything it started (device
workers, a local Ray) while a device count is prepared and timed; ``peak_rss_mb_main`` is this process's
own. `fedface bench sim` runs each device count in a process of its own (:func:`bench_sim_each`), so each
count's peak is its own and ``rss_ratio`` (the largest count's peak over the peak at 1,000 devices) says
whether memory grows with the number of devices.
"""
from __future__ import annotations

import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from device_sdk.training import LocalTrainingConfig, PrefixCache, split_backbone
from facecore.losses import positive_loss
from facecore.models.checkpoint import save_backbone
from facecore.models.registry import embedding_dim_of
from fedface_bench.goals import Goal, at_least, at_most, verdict, with_goals
from fedface_bench.processes import tree_peak
from fedface_bench.progress import QUIET, Progress
from simulator.cross_device.config import CrossDeviceConfig
from simulator.cross_device.engine import CrossDeviceSimulation, SimulationState
from simulator.cross_device.population import Population, SimDevice

REPO = Path(__file__).resolve().parents[1]
# Stated for 1,000 devices and more (issue 40): a row of fewer devices is not judged.
GOAL_DEVICES = 1000
FLOOR_RATIO_GOAL = 0.95
FLOWER_RATIO_GOAL = 3.0
RSS_RATIO_GOAL = 1.10  # the largest count's peak over the peak at GOAL_DEVICES, judged from 10x as many devices


def tile_population(population: Population, devices: int) -> Population:
    real = population.devices
    tiled = tuple(SimDevice(i, real[i % len(real)].identity, real[i % len(real)].faces) for i in range(devices))
    return Population(tiled, devices, population.excluded_photos)


def _simulation(
    population: Population, model: torch.nn.Module, local: LocalTrainingConfig, out: Path, workers: int = 1,
    caches: dict[int, PrefixCache] | None = None, backend: str = "process",
) -> tuple[CrossDeviceSimulation, SimulationState]:
    n = len(population.devices)
    config = CrossDeviceConfig(devices=n, per_round=n, rounds=1, method="fedface", eval_every=1, local=local, workers=workers, backend=backend)
    simulation = CrossDeviceSimulation(config, population, model, out)
    if caches is not None:
        simulation.caches = caches
    simulation.prepare_caches()
    W = np.random.default_rng(0).standard_normal((n, embedding_dim_of(model))).astype(np.float32)
    state = SimulationState(0, model.state_dict(), W / np.linalg.norm(W, axis=1, keepdims=True))
    return simulation, state


def floor_seconds(simulation: CrossDeviceSimulation, state: SimulationState) -> float:
    """The same batches and steps as `train_local` makes, as one stream (see module doc)."""
    local = simulation.config.local
    _, suffix = split_backbone(simulation.workspace.model, local.trainable_blocks)
    W = torch.from_numpy(state.W.copy())
    # The device's row trains, not all of W: a step over every row would cost the floor work that grows with the devices.
    row = torch.nn.Parameter(W[0].clone())
    optimizer = torch.optim.SGD([*suffix.parameters(), row], lr=local.lr, momentum=local.momentum)
    suffix.train()
    for module in suffix.modules():
        if isinstance(module, torch.nn.modules.batchnorm._BatchNorm):
            module.eval()
    started = time.perf_counter()
    for device in simulation.population.devices:
        cache = simulation.caches[device.index]
        generator = torch.Generator().manual_seed(device.index)
        with torch.no_grad():
            row.copy_(W[device.index])
        for _ in range(local.epochs):
            order = torch.randperm(len(cache.plain), generator=generator)
            for start in range(0, len(order), local.batch):
                index = order[start : start + local.batch]
                mirror = (torch.rand(len(index), generator=generator) < 0.5)[:, None, None, None]
                batch = torch.where(mirror, cache.flipped[index], cache.plain[index])
                loss = positive_loss(suffix(batch), row, local.margin)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
        with torch.no_grad():
            W[device.index] = row
    return time.perf_counter() - started


def export_flower_workload(simulation: CrossDeviceSimulation, state: SimulationState, folder: Path) -> None:
    """What fedface_bench/flower.py reads: the model, every device's cached prefix activations, W."""
    save_backbone(simulation.model, folder / "model.pt")
    blocks, devices, offset = [], [], 0
    for device in simulation.population.devices:
        cache = simulation.caches[device.index]
        blocks += [cache.plain.numpy(), cache.flipped.numpy()]
        devices.append({"offset": offset, "faces": len(cache.plain)})
        offset += 2 * len(cache.plain)
    np.save(folder / "prefix.npy", np.concatenate(blocks))
    local = dataclasses.asdict(simulation.config.local)
    (folder / "devices.json").write_text(json.dumps({"devices": devices, "W": state.W.tolist(), "local": local}))


def flower_python() -> Path | None:
    """The interpreter of the Flower environment (`make flower-venv`), or FEDFACE_FLOWER_PYTHON."""
    explicit = os.environ.get("FEDFACE_FLOWER_PYTHON")
    path = Path(explicit) if explicit else REPO / ".venv-flower" / "bin" / "python"
    return path if path.is_file() else None


def flower_reference(simulation: CrossDeviceSimulation, state: SimulationState, python: Path, repeats: int, scratch: Path) -> dict[str, Any]:
    """Flower + Ray on the same devices, weights and local training, in its own environment."""
    folder = scratch / "flower"
    folder.mkdir()
    export_flower_workload(simulation, state, folder)
    # Imported, not run as __main__: Ray's actors unpickle the ClientApp's functions by module name.
    command = [str(python), "-c", "import sys; from fedface_bench.flower import main; sys.exit(main())",
               "--folder", str(folder), "--devices", str(len(simulation.population.devices)), "--repeats", str(repeats)]
    done = subprocess.run(command, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO), "RAY_DEDUP_LOGS": "0"},
                          capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"the Flower reference failed ({done.returncode}):\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def bench_sim(
    population: Population, model: torch.nn.Module, device_counts: tuple[int, ...] = (10, 100, 1000), trainable_blocks: int | None = 2,
    repeats: int = 3, flower: bool = False, workers: int | None = None, ray: bool = False, progress: Progress = QUIET,
) -> list[dict[str, Any]]:
    """Median seconds of `repeats` rounds for each device count, alternating: ours as
    `fedface sim cross-device` runs by default (in process: `round_seconds`, which the ratios
    use), ours with `workers` device processes (default: one per core), and the floor. With `flower`,
    Flower's simulation engine on the same round too (needs `make flower-venv`); with `ray`, ours
    on its Ray backend with as many actors as `workers` (needs the ray extra)."""
    workers = workers or os.cpu_count() or 1
    python = flower_python() if flower else None
    if flower and python is None:
        raise FileNotFoundError("the Flower reference needs its own environment: run `make flower-venv` (or set FEDFACE_FLOWER_PYTHON)")
    if trainable_blocks is None:
        raise ValueError("the floor replays cached prefix activations: give trainable_blocks")
    local = LocalTrainingConfig(trainable_blocks=trainable_blocks, exact_losses=False)
    torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)  # untimed: torch's first optimizer imports torch._dynamo (seconds)
    results = []
    for number, count in enumerate(device_counts, 1):
        progress(f"{number} of {len(device_counts)}: {count} devices: caching their prefix activations")
        memory = tree_peak()
        memory.start()
        with tempfile.TemporaryDirectory(prefix="fedface-bench-sim-") as scratch:
            simulation, state = _simulation(tile_population(population, count), model, local, Path(scratch))
            pooled, _ = _simulation(simulation.population, model, local, Path(scratch) / "pooled", workers, simulation.caches)
            rayed = _simulation(simulation.population, model, local, Path(scratch) / "ray", workers, simulation.caches, "ray")[0] if ray else None
            try:
                progress(f"{count} devices: {repeats} timed rounds each of ours in process, in {workers} worker(s)"
                         f"{', on Ray' if rayed is not None else ''} and of the floor, alternating")
                if workers > 1:
                    pooled.run_round(0, state)  # untimed: starts the workers and hands them their devices' activations
                if rayed is not None:
                    rayed.run_round(0, state)  # likewise for the Ray actors
                ours, in_workers, floor, on_ray = [], [], [], []
                for repeat in progress.bar(range(repeats), f"{count} devices", unit="round"):
                    started = time.perf_counter()
                    pooled.run_round(repeat + 1, state)
                    in_workers.append(time.perf_counter() - started)
                    if rayed is not None:
                        started = time.perf_counter()
                        rayed.run_round(repeat + 1, state)
                        on_ray.append(time.perf_counter() - started)
                    started = time.perf_counter()
                    simulation.run_round(repeat + 1, state)
                    ours.append(time.perf_counter() - started)
                    floor.append(floor_seconds(simulation, state))
            finally:
                peak_mb, main_mb = memory.stop()  # with the workers still running
                pooled.close()
                if rayed is not None:
                    rayed.close()
            if python is not None:
                progress(f"{count} devices: Flower's simulation engine on the same round")
            reference = flower_reference(simulation, state, python, repeats, Path(scratch)) if python is not None else {}
        round_s, floor_s = statistics.median(ours), statistics.median(floor)
        results.append({
            "devices": count, "real_identities": len(population.devices), "trainable_blocks": trainable_blocks, "repeats": repeats,
            "round_seconds": round(round_s, 4), "floor_seconds": round(floor_s, 4), "floor_ratio": round(floor_s / round_s, 3),
            "per_device_overhead_ms": round(1000 * (round_s - floor_s) / count, 2),
            "workers": workers, "round_seconds_workers": round(statistics.median(in_workers), 4),
            "round_seconds_ray": round(statistics.median(on_ray), 4) if on_ray else None,
            "flower_seconds": round(reference["flower_seconds"], 4) if reference else None,
            "flower_ratio": round(reference["flower_seconds"] / round_s, 3) if reference else None,
            **({k: reference[k] for k in ("flower_warmup_round_seconds", "flower_actors", "flower_train_losses")} if reference else {}),
            "torch_threads": torch.get_num_threads(), "images_per_round": int(sum(len(d.faces) for d in simulation.population.devices)),
            "peak_rss_mb": round(peak_mb, 1), "peak_rss_mb_main": round(main_mb, 1),
        })
        with_goals(results[-1], sim_goals(results[-1]))
    return results


def count_command(command_line: Sequence[str], count: int) -> list[str]:
    """One device count's process: `fedface` with the parent's own arguments, then `--devices COUNT --json`,
    which win over the parent's (argparse keeps an option's last value), so every other flag reaches the
    child as given. It runs in the parent's folder, so that a relative path means what it meant there."""
    return [sys.executable, "-m", "fedface", *command_line, "--devices", str(count), "--json"]


def bench_sim_each(device_counts: tuple[int, ...], command_line: Sequence[str], progress: Progress = QUIET) -> list[dict[str, Any]]:
    """`fedface bench sim` as `command_line` gave it, in a process of its own for each count (:func:`count_command`),
    so that each count's peak RSS is its own; then the memory goal across the counts (:func:`with_memory_goal`)."""
    results = []
    source = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH")) if p)  # this process's fedface, from any folder
    for number, count in enumerate(device_counts, 1):
        progress(f"{number} of {len(device_counts)}: {count} devices, in a process of their own")
        done = subprocess.run(count_command(command_line, count), env={**os.environ, "PYTHONPATH": source}, stdout=subprocess.PIPE,
                              text=True, check=False)  # progress stays on stderr
        if done.returncode != 0:
            raise RuntimeError(f"the {count}-device run failed ({done.returncode}); its error is above")
        results.append(json.loads(done.stdout.strip().splitlines()[-1]))
    return with_memory_goal(results)


def with_memory_goal(results: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The largest count's row gains ``rss_ratio``, its peak RSS over the peak at GOAL_DEVICES, judged from
    ten times as many devices; rows measured in one process carry earlier counts' memory, so compare only
    rows from :func:`bench_sim_each`."""
    base = next((r for r in results if r["devices"] == GOAL_DEVICES), None)
    largest = max(results, key=lambda r: r["devices"])
    if base is not None and largest is not base:
        largest["rss_ratio"] = round(largest["peak_rss_mb"] / base["peak_rss_mb"], 3)
        with_goals(largest, {"rss_ratio": at_most(RSS_RATIO_GOAL, largest["rss_ratio"], largest["devices"] >= 10 * GOAL_DEVICES)})
    return results


def sim_goals(row: dict[str, Any]) -> dict[str, Goal]:
    """One device count's goals: floor / ours >= 0.95 and, when Flower ran, Flower / ours >= 3; judged at 1,000 devices or more."""
    judged = row["devices"] >= GOAL_DEVICES
    goals = {"floor_ratio": at_least(FLOOR_RATIO_GOAL, row["floor_ratio"], judged)}
    if row["flower_ratio"] is not None:
        goals["flower_ratio"] = at_least(FLOWER_RATIO_GOAL, row["flower_ratio"], judged)
    return goals


def describe(results: list[dict[str, Any]]) -> str:
    lines = [f"{'devices':>8} {'ours s':>8} {'workers s':>9} {'on Ray s':>9} {'floor s':>8} {'floor/ours':>10} {'flower s':>9} "
             f"{'flower/ours':>11} {'peak MB':>8}"]
    for r in results:
        flower = f"{r['flower_seconds']:>9.2f} {r['flower_ratio']:>11.3f}" if r["flower_seconds"] is not None else f"{'-':>9} {'-':>11}"
        on_ray = f"{r['round_seconds_ray']:>9.2f}" if r.get("round_seconds_ray") is not None else f"{'-':>9}"
        lines.append(f"{r['devices']:>8} {r['round_seconds']:>8.2f} {r['round_seconds_workers']:>9.2f} {on_ray} "
                     f"{r['floor_seconds']:>8.2f} {r['floor_ratio']:>10.3f} {flower} {r['peak_rss_mb']:>8.0f}")
    lines.append(f"ours: in process (the default); workers: {results[0]['workers']} device processes; on Ray: as many actors; "
                 "floor: one process, one stream of the same steps; peak MB: RSS of the run's processes")
    for row in results:
        for name, goal in row["goals_met"].items():
            if goal["met"] is not None:
                lines.append(f"goal {name} {goal['compare']} {goal['target']} at {row['devices']} devices: {goal['measured']}, {verdict(goal)}")
    return "\n".join(lines)
