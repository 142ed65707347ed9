"""`fedface bench detect`: photos/s for detection plus alignment, per detector, side by side in one run,
and how many LFW photos cut to their face box each detector still finds.

Each timed pass decodes the same LFW photos from disk, detects the best face and warps it to the
default model's crop: what aligning a photo costs a device or an evaluation. Passes alternate between
detectors and batch sizes, round after round, so the machine's drift hits all alike; the figure is
the median over rounds. One onnxruntime thread per detector, as a device runs it.
"""
from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np

from facecore.align.detectors import DEFAULT_DETECTOR, DETECTORS, FaceDetector, load_detector
from facecore.align.photos import load_rgb
from facecore.align.template import warp_to_template
from facecore.data.lfw import LFW
from fedface_bench.goals import Goal, at_least, with_goals
from fedface_bench.progress import QUIET, Progress

PHOTOS_PER_S_GOAL = 120.0
RATIO_GOAL = 3.5
TIGHT_GOAL = 0.99
BATCHES = (1, 16)


def spread(paths: list[Path], count: int) -> list[Path]:
    """`count` paths spread evenly over the sorted list."""
    return [paths[i] for i in np.linspace(0, len(paths) - 1, min(count, len(paths))).astype(int)]


def _align_pass(detector: FaceDetector, photos: list[Path], batch: int, size: int, points: np.ndarray) -> tuple[float, int]:
    """Seconds to decode, detect and warp every photo, in batches; and how many had no face."""
    start, missed = time.perf_counter(), 0
    for first in range(0, len(photos), batch):
        images = [load_rgb(p) for p in photos[first : first + batch]]
        readable = [image for image in images if image is not None]
        for image, found in zip(readable, detector.detect(readable)):
            if found is None:
                missed += 1
            else:
                warp_to_template(image, found.landmarks, size, points)
    return time.perf_counter() - start, missed


def cut_to_face_box(image: np.ndarray, box: np.ndarray) -> np.ndarray:
    x1, y1, x2, y2 = (int(round(v)) for v in box)
    return image[max(y1, 0) : y2, max(x1, 0) : x2].copy()


def tight_crops(photos: list[Path], box_detector: FaceDetector, progress: Progress = QUIET) -> list[np.ndarray]:
    """The photos cut to the box `box_detector` finds (photos where it finds none are left out)."""
    images = [image for image in (load_rgb(p) for p in photos) if image is not None]
    cuts = []
    for first in progress.bar(range(0, len(images), 32), "cutting photos to their face box", unit="batch"):
        chunk = images[first : first + 32]
        cuts += [cut_to_face_box(image, found.box) for image, found in zip(chunk, box_detector.detect(chunk)) if found]
    return cuts


def run_detect_bench(root: Path, photos: int = 320, rounds: int = 5, tight: int = 1000,
                     detectors: tuple[str, ...] = DETECTORS, progress: Progress = QUIET) -> dict[str, Any]:
    from facecore.models.dlib_resnet import DLIB_GEOMETRY

    lfw_photos = sorted(image.path for image in LFW(root / "lfw").all_images())
    timed = spread(lfw_photos, photos)
    progress(f"loading the detectors ({', '.join(detectors)}) and warming them up")
    loaded = {name: load_detector(name) for name in detectors}
    size, points = DLIB_GEOMETRY.size, DLIB_GEOMETRY.points
    for detector in loaded.values():  # sessions warm, files in the page cache
        _align_pass(detector, timed[:16], 16, size, points)
    samples: dict[tuple[str, int], list[float]] = {(name, batch): [] for name in loaded for batch in BATCHES}
    misses: dict[str, int] = {}
    keys = list(samples)
    progress(f"timing detection + alignment of {len(timed)} LFW photos: {rounds} rounds of {len(keys)} detector x batch passes")
    for round_index in progress.bar(range(rounds), "timing detection + alignment", unit="round"):
        shift = round_index % len(keys)
        for name, batch in keys[shift:] + keys[:shift]:
            seconds, missed = _align_pass(loaded[name], timed, batch, size, points)
            samples[name, batch].append(len(timed) / seconds)
            misses[name] = missed
    if tight:
        progress(f"tight crops: {tight} LFW photos cut to MTCNN's face box, then detected by each detector")
    cuts = tight_crops(spread(lfw_photos, tight), loaded.get("mtcnn") or load_detector("mtcnn"), progress) if tight else []
    report: dict[str, Any] = {"default_detector": DEFAULT_DETECTOR, "photos": len(timed), "rounds": rounds,
                              "tight_crops": len(cuts), "detectors": {}}
    for name, detector in loaded.items():
        per_batch = {batch: statistics.median(samples[name, batch]) for batch in BATCHES}
        found = sum(f is not None for first in range(0, len(cuts), 32) for f in detector.detect(cuts[first : first + 32]))
        report["detectors"][name] = {
            "version": detector.version, "photos_per_s": max(per_batch.values()),
            **{f"photos_per_s_batch{batch}": value for batch, value in per_batch.items()},
            "no_face_in_timed_photos": misses[name], "tight_found": found,
            "tight_found_fraction": found / len(cuts) if cuts else None,
        }
    report["goals"] = goals(report)
    return with_goals(report, goals_met(report))


def goals_met(report: dict[str, Any]) -> dict[str, Goal]:
    """Each goal of the fast-detection issue, judged, by name, in the shape every bench reports (fedface_bench.goals)."""
    detectors = report["detectors"]
    default = detectors[report["default_detector"]]
    out = {"photos_per_s": at_least(PHOTOS_PER_S_GOAL, default["photos_per_s"])}
    if "mtcnn" in detectors and report["default_detector"] != "mtcnn":
        out["over_mtcnn"] = at_least(RATIO_GOAL, default["photos_per_s"] / detectors["mtcnn"]["photos_per_s"])
    if default["tight_found_fraction"] is not None:
        out["tight_found_fraction"] = at_least(TIGHT_GOAL, default["tight_found_fraction"])
    return out


# How `goals` words each goal of `goals_met`, and the digits it rounds the measured value to.
GOAL_WORDING = {
    "photos_per_s": ("{default} detect + align >= {target:g} photos/s", 1),
    "over_mtcnn": ("{default} / mtcnn photos/s >= {target:g} (same run)", 2),
    "tight_found_fraction": ("LFW photos cut to their face box found >= {target:.0%}", 4),
}


def goals(report: dict[str, Any]) -> list[dict[str, Any]]:
    """`goals_met`'s goals as the list this bench printed first: each in words, its rounded value and whether it is met."""
    out = []
    for name, goal in goals_met(report).items():
        words, digits = GOAL_WORDING[name]
        out.append({"goal": words.format(default=report["default_detector"], target=goal["target"]),
                    "value": round(goal["measured"], digits), "met": goal["met"]})
    return out


def describe(report: dict[str, Any]) -> str:
    lines = [f"detection + alignment of {report['photos']} LFW photos, median of {report['rounds']} rounds "
             f"(one onnxruntime thread); tight crops: {report['tight_crops']} LFW photos cut to MTCNN's face box"]
    lines.append(f"{'detector':<10} {'batch 1':>10} {'batch 16':>10} {'no face':>8} {'tight found':>12}")
    for name, row in report["detectors"].items():
        tight = "-" if row["tight_found_fraction"] is None else f"{row['tight_found_fraction']:.1%}"
        lines.append(f"{name:<10} {row['photos_per_s_batch1']:>8.1f}/s {row['photos_per_s_batch16']:>8.1f}/s "
                     f"{row['no_face_in_timed_photos']:>8} {tight:>12}")
    lines += [f"{'met' if g['met'] else 'MISSED':>6}  {g['goal']}: {g['value']}" for g in report["goals"]]
    return "\n".join(lines)
