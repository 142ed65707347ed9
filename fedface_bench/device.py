"""`fedface bench device`: enroll, one local round and verify on this CPU, against a live server.

Each figure is the median of several repetitions in one run; the first call of each kind is a
warm-up (model download, ONNX session, MTCNN weights) and is reported separately. The verify
section (`bench_verify`) runs `fedface device verify` as a user does, a fresh process each time,
next to the SDK's in-process `FaceDevice.verify` started the same way, and reads each process's
own peak RSS from wait4. The commands section (`bench_commands`) runs `fedface device register`, `enroll`
(10 photos of a person no run has seen, with a private FEDFACE_CACHE) and `verify` (one photo) as a user
does, each a fresh process, and says for each whether its goal (COMMAND_GOALS) is met.
"""
from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

from device_sdk.device import FaceDevice
from fedface_bench.goals import Goal, at_least, at_most
from fedface_bench.progress import QUIET, Progress


def _timed(call: Callable[[], Any]) -> tuple[float, Any]:
    start = time.perf_counter()
    result = call()
    return time.perf_counter() - start, result


DEVICE_GOALS = {"enroll_20_photos_s": 10.0, "round_s": 5.0, "verify_s": 0.3}


def bench_device(
    server_url: str, state_dir: Path, enroll_photos: list[Path], probe: Path, open_round: Callable[[], None], repeats: int = 3,
    progress: Progress = QUIET,
) -> dict[str, Any]:
    from facecore.align.pipeline import FaceAligner

    aligner = FaceAligner()  # an app keeps its detector loaded, as each FaceDevice here shares it
    enrolled = []
    progress(f"SDK: register and enroll {len(enroll_photos)} photos on {repeats + 1} new devices (the first one warms up)")
    for k in progress.bar(range(repeats + 1), "enroll", unit="device"):  # the server enrolls a device once, so each repeat is a new device
        device = FaceDevice(server_url, state_dir / f"device{k}", aligner=aligner)
        device.register()
        enrolled.append(_timed(partial(device.enroll, enroll_photos))[0])
    warm_enroll, enroll = enrolled[0], enrolled[1:]
    rounds = []
    progress(f"SDK: {repeats + 1} local training rounds (the first one downloads the backbone)")
    for _ in progress.bar(range(repeats + 1), "rounds", unit="round"):
        open_round()
        rounds.append(device.train_round(wait=60))
    progress(f"SDK: {repeats * 3 + 1} verifies of one photo")
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
        "goals": dict(DEVICE_GOALS),
        "repeats": repeats,
    }


def device_goals(result: Mapping[str, Any]) -> dict[str, Goal]:
    """`bench_device`'s goals, judged: medians of enroll (20 photos), one local round and one verify."""
    measured = {"enroll_20_photos_s": result["enroll_seconds_median"], "round_s": result["round_seconds_median"],
                "verify_s": result["verify_seconds_median"]}
    return {name: at_most(target, measured[name]) for name, target in DEVICE_GOALS.items()}


VERIFY_GOALS = {"cold_cli_verify_s": 1.5, "cold_cli_verify_peak_rss_mb": 400, "warm_photos_per_s": 10}
# The SDK's in-process verify, started cold like the CLI, as the reference the CLI is measured against.
SDK_VERIFY = ("import sys; from device_sdk.device import FaceDevice; "
              "FaceDevice(sys.argv[1], sys.argv[2]).verify(sys.argv[3])")


# Runs the command and reports its wall seconds, its own peak RSS (KB) and exit status. A fresh, small
# interpreter starts it: ru_maxrss keeps the high-water mark of the process image before exec, so a
# child forked straight from this (torch-laden) process would report this process's size.
MEASURE = (
    "import os, subprocess, sys, time\n"
    "started = time.perf_counter()\n"
    "child = subprocess.Popen(sys.argv[1:], stdout=subprocess.DEVNULL)\n"
    "_, status, usage = os.wait4(child.pid, 0)\n"
    "cpu = usage.ru_utime + usage.ru_stime\n"
    "print(time.perf_counter() - started, cpu, usage.ru_maxrss, os.waitstatus_to_exitcode(status))\n"
)


def run_measured(command: Sequence[str], env: Mapping[str, str] | None = None) -> tuple[float, float, float]:
    """(wall seconds, CPU seconds, peak RSS in MB) of one run of `command`, which must succeed. CPU
    seconds (user + system) are what a shared machine's load does not inflate. `env`: the command's
    environment (default: this process's)."""
    done = subprocess.run([sys.executable, "-c", MEASURE, *command], capture_output=True, text=True, check=True,
                          env=None if env is None else dict(env))
    seconds, cpu, rss_kb, status = done.stdout.split()
    if int(status) != 0:
        raise RuntimeError(f"{' '.join(command[:6])} ... exited {status}: {done.stderr[-500:]}")
    return float(seconds), float(cpu), int(rss_kb) / 1024


def bench_verify(server_url: str, state_dir: Path, enroll_photos: list[Path], probe: Path, folder: Path,
                 repeats: int = 5, progress: Progress = QUIET) -> dict[str, Any]:
    """A device enrolled on `enroll_photos`; then cold one-photo verifies of `probe` (CLI and SDK,
    interleaved), the CLI over `folder`, and the warm rate of one verifier already open."""
    from device_sdk.link import ServerLink
    from device_sdk.state import DeviceState
    from device_sdk.transport import Transport
    from device_sdk.verify import owner_verifier
    from facecore.data.folders import list_photos

    progress("verify: register and enroll a device to verify against")
    device = FaceDevice(server_url, state_dir)
    device.register()
    device.enroll(enroll_photos)
    cli = [sys.executable, "-m", "fedface", "device", "verify", "--server", server_url, "--state", str(state_dir)]
    sdk = [sys.executable, "-c", SDK_VERIFY, server_url, str(state_dir), str(probe)]
    progress(f"verify: {repeats} cold `fedface device verify` and SDK processes each, interleaved, after one warm-up")
    run_measured([*cli, str(probe)])  # warm-up: the model download and the OS file cache
    cold, reference = [], []
    for _ in progress.bar(range(repeats), "cold verify", unit="pair"):
        cold.append(run_measured([*cli, str(probe)]))
        reference.append(run_measured(sdk))
    photos = list_photos([folder])
    progress(f"verify: `fedface device verify` over a folder of {len(photos)} photos, {max(1, repeats // 2)} time(s)")
    whole_folder = [run_measured([*cli, str(folder)])[0] for _ in range(max(1, repeats // 2))]
    progress(f"verify: {repeats} warm passes over the folder, one verifier open")
    verifier = owner_verifier(ServerLink(DeviceState(state_dir), Transport(server_url)))
    verifier.verify(photos[:2])
    warm = []
    for _ in range(repeats):
        started = time.perf_counter()
        verifier.verify(photos)
        warm.append(len(photos) / (time.perf_counter() - started))
    median = statistics.median
    return {
        "cold_cli_verify_s": median(c[0] for c in cold), "cold_cli_verify_cpu_s": median(c[1] for c in cold),
        "cold_cli_verify_peak_rss_mb": median(c[2] for c in cold),
        "cold_sdk_verify_s": median(r[0] for r in reference), "cold_sdk_verify_cpu_s": median(r[1] for r in reference),
        "cold_sdk_verify_peak_rss_mb": median(r[2] for r in reference),
        "cold_sdk_over_cli": median(r[0] for r in reference) / median(c[0] for c in cold),
        "folder_photos": len(photos), "cli_folder_s": median(whole_folder),
        "cli_folder_photos_per_s": len(photos) / median(whole_folder), "warm_photos_per_s": median(warm),
        "cold_cli_verify_s_all": [round(c[0], 3) for c in cold], "warm_photos_per_s_all": [round(w, 1) for w in warm],
        "goals": VERIFY_GOALS, "repeats": repeats, "cpus": os.cpu_count(), "load_average": os.getloadavg(),
    }


def verify_goals(result: Mapping[str, Any]) -> dict[str, Goal]:
    """`bench_verify`'s goals, judged: the cold CLI's seconds and peak RSS, the warm photos/s."""
    return {
        "cold_cli_verify_s": at_most(VERIFY_GOALS["cold_cli_verify_s"], result["cold_cli_verify_s"]),
        "cold_cli_verify_peak_rss_mb": at_most(VERIFY_GOALS["cold_cli_verify_peak_rss_mb"], result["cold_cli_verify_peak_rss_mb"]),
        "warm_photos_per_s": at_least(VERIFY_GOALS["warm_photos_per_s"], result["warm_photos_per_s"]),
    }


# The cold CLI commands' goals on an idle 2-core machine: wall seconds and peak RSS (MB) of one fresh process.
COMMAND_GOALS: dict[str, dict[str, float]] = {
    "register": {"wall_s": 1.0, "peak_rss_mb": 200},
    "enroll": {"wall_s": 2.0, "peak_rss_mb": 300},  # 10 photos no cache has seen
    "verify": {"wall_s": 0.4, "peak_rss_mb": 200},  # one photo
}
COMMAND_PHOTOS = 10


def bench_commands(server_url: str, scratch: Path, people: Sequence[Sequence[Path]], repeats: int = 3,
                   progress: Progress = QUIET) -> dict[str, Any]:
    """`fedface device register`, `enroll` and `verify`, each a fresh process, as a user runs them: per repeat a
    new device enrolls COMMAND_PHOTOS photos of a person of its own (`people[k]`: at least COMMAND_PHOTOS + 1
    photos, the last one the probe to verify) and verifies one more, then unenrolls (measured, without a goal).

    Each repeat has its own FEDFACE_CACHE, so no aligned-face cache can help, while FEDFACE_PACKAGES keeps
    naming the packages folder that holds the detector's and the models' files. Enroll includes what a first
    enroll on a new device does: downloading the server's ONNX model into the new state folder. One more
    person first runs the same commands unmeasured, to warm the OS file cache as a second launch of an app
    would find it. Medians over `repeats`."""
    from facecore.paths import CACHE_ENV, PACKAGES_ENV, packages_root

    if len(people) < repeats + 1 or any(len(photos) < COMMAND_PHOTOS + 1 for photos in people):
        raise ValueError(f"need {repeats + 1} people with at least {COMMAND_PHOTOS + 1} photos each")
    packages = str(packages_root())
    # This process's settings of the device's own CLI (a server, a key) must not change what is measured.
    base = {k: v for k, v in os.environ.items() if k not in ("FEDFACE_SERVER", "FEDFACE_DEVICE_KEY")}
    runs: dict[str, list[tuple[float, float, float]]] = {name: [] for name in (*COMMAND_GOALS, "unenroll")}
    progress(f"commands: register, enroll, verify and unenroll as fresh processes for {repeats + 1} new people (the first one warms up)")
    for k, photos in enumerate(progress.bar(people[: repeats + 1], "cold commands", unit="person")):
        env = base | {CACHE_ENV: str(scratch / f"cache{k}"), PACKAGES_ENV: packages}
        device = [sys.executable, "-m", "fedface", "device"]
        where = ["--server", server_url, "--state", str(scratch / f"device{k}")]
        commands = {
            "register": [*device, "register", *where],
            "enroll": [*device, "enroll", *where, "--photos", *map(str, photos[:COMMAND_PHOTOS])],
            "verify": [*device, "verify", *where, str(photos[COMMAND_PHOTOS])],
            "unenroll": [*device, "unenroll", *where],
        }
        for name, command in commands.items():
            measured = run_measured(command, env)
            if k > 0:  # the first person warms the file cache
                runs[name].append(measured)
    median = statistics.median
    result: dict[str, Any] = {"photos": COMMAND_PHOTOS, "repeats": repeats, "cpus": os.cpu_count()}
    for name, rows in runs.items():
        row: dict[str, Any] = {
            "wall_s": median(r[0] for r in rows), "cpu_s": median(r[1] for r in rows),
            "peak_rss_mb": median(r[2] for r in rows), "wall_s_all": [round(r[0], 3) for r in rows],
            "peak_rss_mb_all": [round(r[2], 1) for r in rows],
        }
        goal = COMMAND_GOALS.get(name)
        if goal is not None:
            row |= {"goal": goal, "met": row["wall_s"] <= goal["wall_s"] and row["peak_rss_mb"] <= goal["peak_rss_mb"]}
        result[name] = row
    result["met"] = all(result[name]["met"] for name in COMMAND_GOALS)
    result["load_average"] = os.getloadavg()
    return result


def command_goals(result: Mapping[str, Any]) -> dict[str, Goal]:
    """`bench_commands`' goals, judged one by one: each command's median wall seconds and peak RSS."""
    goals: dict[str, Goal] = {}
    for name, goal in COMMAND_GOALS.items():
        goals[f"{name}_wall_s"] = at_most(goal["wall_s"], result[name]["wall_s"])
        goals[f"{name}_peak_rss_mb"] = at_most(goal["peak_rss_mb"], result[name]["peak_rss_mb"])
    return goals


def describe_commands(result: Mapping[str, Any]) -> str:
    """One line per command: median wall seconds (CPU seconds), median peak RSS, its goal and whether it is met."""
    lines = [f"cold CLI commands, medians of {result['repeats']} fresh processes each ({result['cpus']} CPUs, load "
             f"average {result['load_average'][0]:.1f} at the end): wall seconds (CPU seconds), peak RSS"]
    labels = {"register": "register", "enroll": f"enroll, {result['photos']} new photos", "verify": "verify, 1 photo",
              "unenroll": "unenroll"}
    for name, label in labels.items():
        row = result[name]
        line = f"  fedface device {label + ':':<24} {row['wall_s']:.2f} s ({row['cpu_s']:.2f}), {row['peak_rss_mb']:.0f} MB"
        if "goal" in row:
            goal = row["goal"]
            line += f" (goals {goal['wall_s']:g} s, {goal['peak_rss_mb']:.0f} MB): {'met' if row['met'] else 'NOT met'}"
        lines.append(line)
    return "\n".join(lines)
