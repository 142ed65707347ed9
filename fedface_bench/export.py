"""`fedface bench export`: batch-1, single-thread latency of torch eager, ONNX fp32 and ONNX int8, side by side,
for one model or several (each at its own crop size), all engines interleaved in one run."""
from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from export.onnx_model import INPUT_NAME, ort_session
from export.profile import op_profile
from facecore.align.geometry import geometry_of
from fedface_bench.progress import QUIET, Progress


def _latencies(call: Callable[[], object], runs: int, warmup: int) -> list[float]:
    for _ in range(warmup):
        call()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        call()
        times.append(1000 * (time.perf_counter() - start))
    return times


ENGINES = (("torch_eager", None), ("onnx_fp32", "model.onnx"), ("onnx_int8", "model.int8.onnx"))


def bench_exports(exports: dict[str, tuple[torch.nn.Module, Path]], runs: int = 600, warmup: int = 10, rounds: int = 20,
                  progress: Progress = QUIET) -> dict[str, Any]:
    """Every engine of every model (label -> (torch backbone, export folder)), interleaved: each of
    `rounds` rounds runs each engine `runs // rounds` times, the engines' order rotating by one per
    round, so machine drift hits all of them alike. Each model gets an input of its own crop size."""
    torch.set_num_threads(1)
    engines: dict[tuple[str, str], Callable[[], object]] = {}
    inputs: dict[str, np.ndarray] = {}
    for label, (model, export_dir) in exports.items():
        model = model.float().eval()
        size = geometry_of(model).size
        inputs[label] = x = np.random.default_rng(0).standard_normal((1, 3, size, size)).astype(np.float32)
        tensor = torch.from_numpy(x)

        def torch_eager(model: torch.nn.Module = model, tensor: torch.Tensor = tensor) -> object:
            with torch.inference_mode():
                return model(tensor)

        engines[label, "torch_eager"] = torch_eager
        for name, file in ENGINES[1:]:
            if (export_dir / file).is_file():
                session = ort_session(export_dir / file, threads=1)

                def onnx_run(s: Any = session, x: np.ndarray = x) -> object:
                    return s.run(None, {INPUT_NAME: x})

                engines[label, name] = onnx_run
    order = list(engines)
    samples: dict[tuple[str, str], list[float]] = {key: [] for key in order}
    per_round = max(1, runs // rounds)
    progress(f"timing {len(order)} engines ({', '.join(f'{label} {name}' for label, name in order)}): "
             f"{per_round} runs each in each of {rounds} interleaved rounds")
    for round_index in progress.bar(range(rounds), "interleaved rounds", unit="round"):
        shift = round_index % len(order)
        for key in order[shift:] + order[:shift]:
            samples[key] += _latencies(engines[key], per_round, warmup)
    models: dict[str, Any] = {}
    progress("profiling the ONNX engines' kernels")
    for label, (model, export_dir) in exports.items():
        result: dict[str, Any] = {
            name: {"p50_ms": float(np.percentile(t, 50)), "p95_ms": float(np.percentile(t, 95)), "runs": len(t)}
            for (owner, name), t in samples.items() if owner == label
        }
        geometry = geometry_of(model)
        result["backbone"] = model.name
        result["input"] = [1, 3, geometry.size, geometry.size]
        result["params"] = sum(p.numel() for p in model.parameters())
        result["bytes"] = {f: (export_dir / f).stat().st_size for f in ("model.onnx", "model.int8.onnx", "backbone.pt") if (export_dir / f).is_file()}
        result["fp32_speedup_vs_torch"] = result["torch_eager"]["p50_ms"] / result["onnx_fp32"]["p50_ms"]
        if "onnx_int8" in result:
            result["int8_speedup_vs_fp32"] = result["onnx_fp32"]["p50_ms"] / result["onnx_int8"]["p50_ms"]
            result["int8_over_fp32_ms"] = result["onnx_int8"]["p50_ms"] / result["onnx_fp32"]["p50_ms"]
            result["int8_over_fp32_bytes"] = result["bytes"]["model.int8.onnx"] / result["bytes"]["model.onnx"]
        result["profile"] = {name: op_profile(export_dir / file, inputs[label]) for name, file in ENGINES[1:] if (export_dir / file).is_file()}
        models[label] = result
    return {"models": models, "threads": 1, "batch": 1, "rounds": rounds, "warmup_per_round": warmup}
