"""`fedface bench export`: batch-1, single-thread latency of torch eager, ONNX fp32 and ONNX int8, side by side."""
from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from export.onnx_model import INPUT_NAME, ort_session


def _latencies(call: Callable[[], object], runs: int, warmup: int) -> list[float]:
    for _ in range(warmup):
        call()
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        call()
        times.append(1000 * (time.perf_counter() - start))
    return times


def bench_export(model: torch.nn.Module, export_dir: Path, runs: int = 200, warmup: int = 20, rounds: int = 3) -> dict[str, Any]:
    """Interleave the three engines over several rounds so machine drift hits all of them alike."""
    torch.set_num_threads(1)
    model = model.float().eval()
    x = np.random.default_rng(0).standard_normal((1, 3, 112, 112)).astype(np.float32)
    tensor = torch.from_numpy(x)
    engines: dict[str, Callable[[], object]] = {}

    def torch_eager() -> object:
        with torch.inference_mode():
            return model(tensor)

    engines["torch_eager"] = torch_eager
    for name, file in (("onnx_fp32", "model.onnx"), ("onnx_int8", "model.int8.onnx")):
        if (export_dir / file).is_file():
            session = ort_session(export_dir / file, threads=1)
            engines[name] = lambda s=session: s.run(None, {INPUT_NAME: x})
    samples: dict[str, list[float]] = {name: [] for name in engines}
    for _ in range(rounds):
        for name, call in engines.items():
            samples[name] += _latencies(call, runs // rounds, warmup)
    result: dict[str, Any] = {
        name: {"p50_ms": float(np.percentile(t, 50)), "p95_ms": float(np.percentile(t, 95)), "runs": len(t)} for name, t in samples.items()
    }
    result["bytes"] = {f: (export_dir / f).stat().st_size for f in ("model.onnx", "model.int8.onnx", "backbone.pt") if (export_dir / f).is_file()}
    if "onnx_int8" in result:
        result["int8_speedup_vs_fp32"] = result["onnx_fp32"]["p50_ms"] / result["onnx_int8"]["p50_ms"]
    result["fp32_speedup_vs_torch"] = result["torch_eager"]["p50_ms"] / result["onnx_fp32"]["p50_ms"]
    result["threads"] = 1
    result["batch"] = 1
    return result
