"""Where one ONNX model's batch-1 run spends its time, from onnxruntime's own profiler: the check that an
export stays in onnxruntime's fast layouts (export tests) and the breakdown `fedface bench export` prints."""
from __future__ import annotations

import json
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np

from export.onnx_model import INPUT_NAME, ort_session

PRELU_SCOPE = "/PRelu/"  # the exporter names the nodes it writes for a PReLU under its scope


def op_profile(path: Path, x: np.ndarray, runs: int = 100) -> dict[str, Any]:
    """Where one batch-1 run's time goes, from onnxruntime's own profiler: ms per operator type,
    the kernels run per operator type (ReorderInput/ReorderOutput are the blocked layout's
    entries and exits, Transpose the uint8 NHWC path's), and the ms of the nodes written for
    PReLUs (the share that decided int8's speedup for MobileFaceNet)."""
    with tempfile.TemporaryDirectory() as scratch:
        session = ort_session(path, threads=1, profile_prefix=str(Path(scratch) / "ort"))
        for _ in range(runs):
            session.run(None, {INPUT_NAME: x})
        events = json.loads(Path(session.end_profiling()).read_text())
    by_op: dict[str, float] = defaultdict(float)
    count: dict[str, int] = defaultdict(int)
    prelu_us = 0.0
    for event in events:
        if event.get("cat") == "Node" and event["name"].endswith("_kernel_time"):
            by_op[event["args"]["op_name"]] += event["dur"]
            count[event["args"]["op_name"]] += 1
            prelu_us += event["dur"] if PRELU_SCOPE in event["name"] else 0.0
    total_us = sum(by_op.values())
    return {
        "ms_per_run": total_us / runs / 1000, "prelu_ms": prelu_us / runs / 1000,
        "prelu_share": prelu_us / total_us if total_us else 0.0,
        "ms_by_op": {op: us / runs / 1000 for op, us in sorted(by_op.items(), key=lambda item: -item[1])},
        "nodes_by_op": {op: n // runs for op, n in sorted(count.items())},
    }
