"""`fedface bench export`: batch-1, single-thread latency of torch eager, ONNX fp32 and ONNX int8, side by side."""
from __future__ import annotations

import json
import tempfile
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from export.onnx_model import INPUT_NAME, ort_session

PRELU_SCOPE = "/PRelu/"  # the exporter names the nodes it writes for a PReLU under its scope


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
    result["profile"] = {name: op_profile(export_dir / file, x) for name, file in (("onnx_fp32", "model.onnx"), ("onnx_int8", "model.int8.onnx"))
                         if (export_dir / file).is_file()}
    return result


def op_profile(path: Path, x: np.ndarray, runs: int = 100) -> dict[str, Any]:
    """Where one batch-1 run's time goes, from onnxruntime's own profiler: ms per operator type,
    and the ms of the nodes written for PReLUs (the share that decides int8's speedup here)."""
    with tempfile.TemporaryDirectory() as scratch:
        session = ort_session(path, threads=1, profile_prefix=str(Path(scratch) / "ort"))
        for _ in range(runs):
            session.run(None, {INPUT_NAME: x})
        events = json.loads(Path(session.end_profiling()).read_text())
    by_op: dict[str, float] = defaultdict(float)
    prelu_us = 0.0
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            by_op[event["args"]["op_name"]] += event["dur"]
            prelu_us += event["dur"] if PRELU_SCOPE in event["name"] else 0.0
    total_us = sum(by_op.values())
    return {
        "ms_per_run": total_us / runs / 1000, "prelu_ms": prelu_us / runs / 1000,
        "prelu_share": prelu_us / total_us if total_us else 0.0,
        "ms_by_op": {op: us / runs / 1000 for op, us in sorted(by_op.items(), key=lambda item: -item[1])},
    }
