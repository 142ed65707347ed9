"""`fedface bench device`: enroll, one local round and verify on this CPU, against a live server.

Each figure is the median of several repetitions in one run; the first call of each kind is a
warm-up (model download, ONNX session, MTCNN weights) and is reported separately.
"""
from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from device_sdk.device import FaceDevice


def _timed(call: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    result = call()
    return time.perf_counter() - start, result


def bench_device(
    server_url: str, state_dir: Path, enroll_photos: list[Path], probe: Path, open_round: Callable[[], None], repeats: int = 3,
) -> dict[str, Any]:
    from facecore.align.pipeline import FaceAligner

    aligner = FaceAligner()  # an app keeps its detector loaded, as each FaceDevice here shares it
    enrolled = []
    for k in range(repeats + 1):  # the server enrolls a device once, so each repeat is a new device
        device = FaceDevice(server_url, state_dir / f"device{k}", aligner=aligner)
        device.register()
        enrolled.append(_timed(lambda: device.enroll(enroll_photos))[0])
    warm_enroll, enroll = enrolled[0], enrolled[1:]
    rounds = []
    for _ in range(repeats + 1):
        open_round()
        rounds.append(device.train_round(wait=60))
    warm_verify, _ = _timed(lambda: device.verify(probe))
    verify = [_timed(lambda: device.verify(probe))[0] for _ in range(repeats * 3)]
    timed_rounds = rounds[1:]  # the first round also downloads and caches the backbone
    return {
        "enroll_photos": len(enroll_photos),
        "enroll_seconds_median": statistics.median(enroll), "enroll_seconds_first": warm_enroll,
        "round_faces": len(enroll_photos), "round_seconds_median": statistics.median(r.seconds for r in timed_rounds),
        "round_steps": timed_rounds[0].steps,
        "verify_seconds_median": statistics.median(verify), "verify_seconds_first": warm_verify,
        "bytes_up_per_round": int(statistics.median(r.bytes_up for r in timed_rounds)),
        "bytes_down_first_round": rounds[0].bytes_down,
        "bytes_down_per_round_median": int(statistics.median(r.bytes_down for r in timed_rounds)),
        "goals": {"enroll_20_photos_s": 10.0, "round_s": 5.0, "verify_s": 0.3},
        "repeats": repeats,
    }
