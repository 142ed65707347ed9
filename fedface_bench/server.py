"""`fedface bench server`: N devices through one round against a real `fedface server --dev`.

Each measured run gets a fresh server (SQLite in a temporary directory, or with ``--db`` a fresh
schema in that PostgreSQL database, dropped afterwards; ``--model random``)
so the two peaks compare like with like: a 10-participant round first, then the N-participant
round, and ``rss_growth_mb`` is the difference of the two peaks. The load comes from
:mod:`fedface_bench.server_load` in a separate process; this process only starts and stops the
server and samples its RSS, so sampling never steals the client's or the server's GIL. The client
ends with this process, however it ends (a lifeline, as the server's: facecore.lifetime).
"""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from facecore.errors import FaceCoreError
from facecore.federation.status import RoundStatus
from facecore.lifetime import Lifeline
from fedface_bench.goals import at_least, at_most, verdict, with_goals
from fedface_bench.processes import PeakRss, Process, cpu_ticks, group_pids, ticks_spent
from fedface_bench.progress import QUIET, Progress
from server_api.errors import LaunchFailed
from server_api.launcher import MANY_DEVICES_ON_LOOPBACK, LocalServer, scratch_database, share_dev_secrets

REPO = Path(__file__).resolve().parents[1]
BASELINE_DEVICES = 10
INGEST_GOAL_S = 8.0  # 1,000 updates into one process on SQLite: the scaling goal
RSS_GROWTH_GOAL_MB = 300.0
GOAL_DEVICES = 1000
REPLICA_RATE_GOAL = 2.5
SAMPLE_INTERVAL_S = 0.05


class BenchRoundFailed(FaceCoreError):
    """The benchmark's server never became ready, or its client failed: the message holds where the server's log
    is and its errors, so the command reports it in its error line rather than as a traceback."""


class RssSampler(PeakRss):
    """Peak summed VmRSS of the server's process group, sampled every SAMPLE_INTERVAL_S, with the CPU ticks of
    each process of that group and of PostgreSQL's at each sample, so that one ending mid-window (a backend whose
    connection closed, an autovacuum worker) neither takes its earlier ticks with it nor is counted twice."""

    def __init__(self, pgid: int) -> None:
        super().__init__(lambda running: group_pids(pgid, running), pgid, SAMPLE_INTERVAL_S)
        self.cpu: list[tuple[float, dict[int, int], dict[int, int]]] = []  # (wall time, server ticks, PostgreSQL ticks) by pid

    def scanned(self, running: list[Process]) -> None:
        group = set(self.members(running))
        server = {pid: cpu_ticks(fields) for pid, _, fields in running if pid in group}
        postgres = {pid: cpu_ticks(fields) for pid, name, fields in running if name == "postgres"}
        self.cpu.append((time.time(), server, postgres))

    def cpu_seconds(self, start: float, end: float) -> tuple[float, float]:
        """(server, PostgreSQL) CPU seconds between two wall times, over the samples from the one nearest
        `start` to the one nearest `end`."""
        if not self.cpu:
            return float("nan"), float("nan")
        times = [sample[0] for sample in self.cpu]
        first = min(range(len(times)), key=lambda i: abs(times[i] - start))
        last = min(range(len(times)), key=lambda i: abs(times[i] - end))
        window = self.cpu[first : last + 1]
        tick = os.sysconf("SC_CLK_TCK")
        return ticks_spent([s[1] for s in window]) / tick, ticks_spent([s[2] for s in window]) / tick


def bench_server(data_dir: Path, backbone: str, workers: int = 1, db_url: str | None = None, blob_store: str = "local",
                 aggregation_processes: int = 0, shared_shards: bool = False) -> LocalServer:
    """`fedface server --dev` with the real backbone size, not yet started; the operator's FEDFACE_* settings
    stay out. No ONNX export, so aggregate_seconds times FedAvg + spreadout, not the exporter."""
    settings = {"FEDFACE_RANDOM_BACKBONE": backbone, "FEDFACE_EXPORT_ONNX": "false", "FEDFACE_LOG_LEVEL": "INFO",
                "FEDFACE_BLOB_STORE": blob_store, "FEDFACE_AGGREGATION_PROCESSES": str(aggregation_processes), "OMP_NUM_THREADS": "1",
                "FEDFACE_AGGREGATION_SHARED_SHARDS": str(shared_shards).lower(), **MANY_DEVICES_ON_LOOPBACK}
    return LocalServer(data_dir, model="random", workers=workers, db_url=db_url, env=settings, inherit_settings=False,
                       log=data_dir.parent / f"{data_dir.name}.log", ready_timeout_s=300)


def start_replicas(scratch: Path, backbone: str, workers: int, db_url: str | None, replicas: int, blob_store: str,
                   aggregation_processes: int = 0, shared_shards: bool = False) -> list[LocalServer]:
    """The first server launched (not yet ready), then, for ``replicas`` > 1, the others: each with a data folder
    of its own holding the first one's secrets, as replicas on several hosts would, and ready."""
    first = bench_server(scratch / "data", backbone, workers, db_url, blob_store, aggregation_processes, shared_shards).launch()
    servers = [first]
    if replicas > 1:
        try:
            first.wait_ready()
        except LaunchFailed as error:
            raise BenchRoundFailed(f"{error}\n{failure_report(first)}") from None
        for index in range(1, replicas):
            folder = scratch / f"data{index}"
            share_dev_secrets(first.data_dir, folder)
            servers.append(bench_server(folder, backbone, workers, db_url, blob_store, aggregation_processes, shared_shards).start())
    return servers


def failure_report(server: LocalServer) -> str:
    """Where the failure is: the server's ERROR records (a 500's traceback) if any, else the log's
    end; the whole log is copied out of the temporary directory, which is about to be removed."""
    text = server.log.read_text(errors="replace")
    kept = Path(tempfile.gettempdir()) / f"fedface-bench-server-{server.port}.log"
    kept.write_text(text)
    errors = [line for line in text.splitlines() if '"level": "ERROR"' in line]
    return f"(full log: {kept})\n" + ("\n".join(errors[-3:]) if errors else text)[-6000:]


def bench_round(
    devices: int, concurrency: int, backbone: str, workers: int = 1, drop_fraction: float = 0.0, secure: bool = False,
    db_url: str | None = None, progress: Progress = QUIET, local: Mapping[str, Any] | None = None, replicas: int = 1,
    blob_store: str = "local", aggregation_processes: int = 0, shared_shards: bool = False,
) -> dict[str, Any]:
    """One fresh server (or `replicas` of them on one database, summing the round's shards together when
    `shared_shards`), one round with `devices` participants; the client's JSON plus the first server's peak RSS."""
    with tempfile.TemporaryDirectory(prefix="fedface-bench-") as scratch, scratch_database(db_url) as database:
        servers = start_replicas(Path(scratch), backbone, workers, database, replicas, blob_store, aggregation_processes, shared_shards)
        server = servers[0]
        client: subprocess.Popen[str] | None = None
        lifeline = Lifeline()
        sampler = RssSampler(server.pid)
        sampler.start()
        try:
            progress(f"{'secure ' if secure else ''}round of {devices} devices: starting a server and a client process "
                     "(the client's bars follow)")
            # Started together: the client's imports overlap the server's startup; it waits for /readyz itself.
            load = [sys.executable, "-m", "fedface_bench.server_load", *(arg for each in servers for arg in ("--url", each.url)),
                    "--data-dir", str(server.data_dir), "--devices", str(devices), "--concurrency", str(concurrency),
                    "--drop-fraction", str(drop_fraction)] + (["--secure"] if secure else []) + (["--local", json.dumps(local)] if local else [])
            client = subprocess.Popen(load, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO), **lifeline.env()}, stdout=subprocess.PIPE,
                                      text=True, pass_fds=lifeline.fds)
            lifeline.handed_over()
            try:
                server.wait_ready()
            except LaunchFailed as error:
                raise BenchRoundFailed(f"{error}\n{failure_report(server)}") from None
            stdout, _ = client.communicate()
            peak_mb, _ = sampler.stop()
            progress(f"round of {devices} devices: client done, stopping the server")
            if client.returncode != 0:
                raise BenchRoundFailed(f"bench client failed ({client.returncode}); server log:\n{failure_report(server)}")
            result: dict[str, Any] = json.loads(stdout.strip().splitlines()[-1])
            result |= _round_costs(result, sampler, database or f"sqlite:///{server.data_dir / 'fedface.db'}", replicas)
            logs = [line for each in servers for line in each.log.read_text(errors="replace").splitlines()]
            result["server_errors"] = [line for line in logs if '"level": "ERROR"' in line][:5]
        finally:
            if client is not None and client.poll() is None:
                client.kill()  # only on an error path: the server died or was never ready
                client.wait()
            lifeline.cut()
            sampler.stopped.set()
            for each in servers:
                each.stop()
    result["peak_rss_mb"] = round(peak_mb, 1)
    return result


def _round_costs(result: Mapping[str, Any], sampler: RssSampler, database_url: str, replicas: int) -> dict[str, Any]:
    """What one accepted update cost while the uploads came in: CPU milliseconds of the server (one process's
    group; None with replicas) and of PostgreSQL (None on SQLite), and the rows each table holds after the round."""
    from sqlalchemy import create_engine, func, inspect, select, table

    costs: dict[str, Any] = {"ingest_cpu_ms_per_update": None}
    window, accepted = result.get("ingest_window"), result.get("accepted") or 0
    if window and accepted:
        server_s, postgres_s = sampler.cpu_seconds(*window)
        costs["ingest_cpu_ms_per_update"] = {
            "server": round(1000 * server_s / accepted, 2) if replicas == 1 else None,
            "postgresql": round(1000 * postgres_s / accepted, 2) if database_url.startswith("postgresql") else None,
        }
    engine = create_engine(database_url)
    try:
        with engine.connect() as connection:
            names = [name for name in inspect(connection).get_table_names() if name != "alembic_version"]
            costs["table_rows"] = {name: connection.scalar(select(func.count()).select_from(table(name))) for name in sorted(names)}
    finally:
        engine.dispose()
    return costs


def run_server_bench(
    devices: int = GOAL_DEVICES, concurrency: int = 16, backbone: str = "mobilefacenet", workers: int = 1, db_url: str | None = None,
    progress: Progress = QUIET, local: Mapping[str, Any] | None = None, aggregation_processes: int = 0,
) -> dict[str, Any]:
    """The 10-participant baseline, then the `devices` round; flat JSON-ready results. `local`: the rounds'
    local settings (trainable_blocks, upload_bits), which shape what each device sends."""
    progress(f"1 of 2: the {BASELINE_DEVICES}-device baseline round")
    base = bench_round(BASELINE_DEVICES, concurrency, backbone, workers, db_url=db_url, progress=progress, local=local,
                       aggregation_processes=aggregation_processes)
    progress(f"2 of 2: the measured round of {devices} devices")
    full = bench_round(devices, concurrency, backbone, workers, db_url=db_url, progress=progress, local=local,
                       aggregation_processes=aggregation_processes)
    keys = ("ingest_seconds", "uploads_per_s", "p50_upload_ms", "p99_upload_ms", "aggregate_seconds", "completed_after_last_upload_s",
            "setup_seconds", "checkin_seconds", "accepted", "status_codes", "errors", "transport_retries", "round_status", "update_bytes",
            "concurrency", "ingest_cpu_ms_per_update", "table_rows")
    growth = full["peak_rss_mb"] - base["peak_rss_mb"]
    database = "postgresql" if db_url else "sqlite"
    result: dict[str, Any] = {"devices": devices, "backbone": backbone, "local": dict(local or {}), "workers": workers, "database": database,
                              "aggregation_processes": aggregation_processes,
                              **{k: full[k] for k in keys}}
    result |= {
        "rss_growth_mb": round(growth, 1), "peak_rss_mb_10": base["peak_rss_mb"], "peak_rss_mb_n": full["peak_rss_mb"],
        "baseline_10": {k: base[k] for k in ("ingest_seconds", "p99_upload_ms", "aggregate_seconds", "accepted", "round_status")},
        "all_accepted": full["accepted"] == devices and base["accepted"] == BASELINE_DEVICES,
        "round_completed": full["round_status"] == base["round_status"] == RoundStatus.COMPLETED,
        # Goals are stated for 1,000 devices; a smaller run says nothing about them.
        "ingest_goal_met": (full["ingest_seconds"] or float("inf")) <= INGEST_GOAL_S if devices >= GOAL_DEVICES else None,
        "rss_goal_met": growth <= RSS_GROWTH_GOAL_MB if devices >= GOAL_DEVICES else None,
    }
    judged = devices >= GOAL_DEVICES
    return with_goals(result, {"ingest_s": at_most(INGEST_GOAL_S, full["ingest_seconds"], judged),
                               "rss_growth_mb": at_most(RSS_GROWTH_GOAL_MB, result["rss_growth_mb"], judged)})


def run_replica_bench(
    devices: int, replicas: int, db_url: str, concurrency: int = 16, backbone: str = "mobilefacenet", progress: Progress = QUIET,
    local: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    """The same round four ways, one after the other, each on a fresh schema of `db_url`: one server process with
    its blobs on its disk, one with its blobs in the database, and `replicas` processes with their blobs in the
    database and the devices spread over them, first with one of them summing the round, then with all of them
    summing its shards (FEDFACE_AGGREGATION_SHARED_SHARDS). The goal is the replicas' upload rate against one
    process's; the last two ways compare aggregation times."""
    ways = {"one_process_local_blobs": (1, "local", False), "one_process_database_blobs": (1, "database", False),
            f"{replicas}_replicas_database_blobs": (replicas, "database", False),
            f"{replicas}_replicas_shared_shards": (replicas, "database", True)}
    rounds: dict[str, dict[str, Any]] = {}
    for step, (name, (count, blob_store, shared)) in enumerate(ways.items(), 1):
        progress(f"{step} of {len(ways)}: {devices} devices, {count} server process(es), blobs {blob_store}"
                 + (", shards shared" if shared else ""))
        rounds[name] = bench_round(devices, concurrency, backbone, db_url=db_url, progress=progress, local=local,
                                   replicas=count, blob_store=blob_store, shared_shards=shared)
    keys = ("ingest_seconds", "uploads_per_s", "p50_upload_ms", "p99_upload_ms", "aggregate_seconds", "accepted", "lost",
            "round_status", "update_bytes", "server_errors", "ingest_cpu_ms_per_update", "table_rows")
    one, many = rounds["one_process_database_blobs"], rounds[f"{replicas}_replicas_database_blobs"]
    sharing = rounds[f"{replicas}_replicas_shared_shards"]
    ratio = many["uploads_per_s"] / one["uploads_per_s"] if one["uploads_per_s"] else None
    speedup = many["aggregate_seconds"] / sharing["aggregate_seconds"] if sharing["aggregate_seconds"] else None
    result: dict[str, Any] = {
        "devices": devices, "replicas": replicas, "backbone": backbone, "local": dict(local or {}), "concurrency": concurrency,
        "cores": os.cpu_count(), **{name: {k: r.get(k) for k in keys + ("round_summary",)} for name, r in rounds.items()},
        "replica_rate_ratio": None if ratio is None else round(ratio, 2),
        # One replica summing the round against all of them summing its shards (no goal: the cores are shared here).
        "shared_shards_aggregation_speedup": None if speedup is None or math.isnan(speedup) else round(speedup, 2),
        "all_accepted": all(r["accepted"] == devices and not r["lost"] for r in rounds.values()),
        "round_completed": all(r["round_status"] == RoundStatus.COMPLETED for r in rounds.values()),
    }
    return with_goals(result, {"replica_rate_ratio": at_least(REPLICA_RATE_GOAL, result["replica_rate_ratio"])})


def describe_replicas(result: dict[str, Any]) -> str:
    lines = [f"{result['devices']} devices ({result['backbone']}, concurrency {result['concurrency']}, {result['cores']} cores), "
             "PostgreSQL, one round each:"]
    for name, r in result.items():
        if isinstance(r, dict) and "uploads_per_s" in r:
            lines.append(f"  {name.replace('_', ' ')}: {r['accepted']} accepted, ingest {r['ingest_seconds']} s "
                         f"({r['uploads_per_s']} uploads/s), p99 {r['p99_upload_ms']} ms, aggregation {r['aggregate_seconds']} s, "
                         f"round {r['round_status']}")
    goal = result["goals_met"]["replica_rate_ratio"]
    lines.append(f"  {result['replicas']} replicas / one process (database blobs): {result['replica_rate_ratio']}x "
                 f"(goal >= {REPLICA_RATE_GOAL}: {verdict(goal)})")
    lines.append(f"  aggregation, one replica / {result['replicas']} sharing the shards: {result['shared_shards_aggregation_speedup']}x")
    return "\n".join(lines)


def run_secure_bench(devices: int, concurrency: int = 16, backbone: str = "mobilefacenet", drop_fraction: float = 0.1,
                     progress: Progress = QUIET) -> dict[str, Any]:
    """A plain round and a secure-aggregation round of the same devices, one after the other on
    fresh servers, so their times and bytes compare in one run. No speed goal (`goals_met` is empty)."""
    progress(f"1 of 2: a plain round of {devices} devices")
    plain = bench_round(devices, concurrency, backbone, progress=progress)
    progress(f"2 of 2: a secure-aggregation round of {devices} devices, {drop_fraction:.0%} dropping after sharing keys")
    secure = bench_round(devices, concurrency, backbone, drop_fraction=drop_fraction, secure=True, progress=progress)
    plain_round_s = (plain["checkin_seconds"] or 0) + (plain["ingest_seconds"] or 0) + (plain["completed_after_last_upload_s"] or 0)
    plain_up = plain["update_bytes"]
    return with_goals({
        "devices": devices, "backbone": backbone, "drop_after_sharing": drop_fraction, "secure": secure,
        "plain": {k: plain[k] for k in (
            "ingest_seconds", "aggregate_seconds", "completed_after_last_upload_s", "checkin_seconds", "update_bytes", "round_status", "peak_rss_mb",
        )},
        "plain_round_seconds": round(plain_round_s, 3),
        "round_seconds_ratio": round(secure["round_seconds_without_device_masking"] / plain_round_s, 2) if plain_round_s else None,
        "aggregate_seconds_ratio": (
            round(secure["aggregate_seconds"] / plain["aggregate_seconds"], 2) if plain["aggregate_seconds"] and secure["aggregate_seconds"] else None
        ),
        "upload_bytes_ratio_vs_fp16": round(secure["bytes_up_per_device_median"] / plain_up, 3),
    }, {})


def describe_secure(result: dict[str, Any]) -> str:
    s, p = result["secure"], result["plain"]
    steps = ", ".join(f"{k.removesuffix('_s')} {v:.2f} s" for k, v in s["steps_s"].items())
    return "\n".join((
        f"{result['devices']} devices ({result['backbone']}), {s['dropped_after_sharing']} dropping after sharing keys: "
        f"secure round {s['round_status']}, plain round {p['round_status']}; lost {s['lost']}",
        f"  secure steps: {steps}; server aggregation {s['aggregate_seconds']} s (plain {p['aggregate_seconds']} s, "
        f"x{result['aggregate_seconds_ratio']})",
        f"  round wall time {s['round_seconds_without_device_masking']:.1f} s without the devices' masking vs plain {result['plain_round_seconds']:.1f} s "
        f"(x{result['round_seconds_ratio']}); masking {s['device_mask_s_median']:.3f} s per device",
        f"  per device: up {s['bytes_up_per_device_median'] / 1e6:.2f} MB (plain fp16 upload {p['update_bytes'] / 1e6:.2f} MB, "
        f"x{result['upload_bytes_ratio_vs_fp16']}), down {s['bytes_down_per_device_median'] / 1e3:.0f} kB of protocol messages",
    ))


def describe(result: dict[str, Any]) -> str:
    def goal(met: bool | None) -> str:
        return verdict({"met": met})

    def num(key: str, decimals: int = 2) -> str:
        return "n/a" if result.get(key) is None else f"{result[key]:.{decimals}f}"

    return "\n".join((
        f"{result['devices']} devices ({result['backbone']}, {result['update_bytes']:,} B updates, concurrency {result['concurrency']}, "
        f"{result['workers']} server worker(s) on {result['database']}): "
        f"{result['accepted']} accepted, round {result['round_status']}",
        f"  ingest {num('ingest_seconds')} s ({num('uploads_per_s', 1)} uploads/s; goal <= {INGEST_GOAL_S:.0f} s: "
        f"{goal(result['ingest_goal_met'])}), upload p50 {num('p50_upload_ms', 0)} ms, p99 {num('p99_upload_ms', 0)} ms",
        f"  aggregation {num('aggregate_seconds')} s ({result.get('aggregation_processes') or 'no'} worker processes; "
        f"round closed {num('completed_after_last_upload_s')} s after the last upload)",
        f"  peak RSS {result['peak_rss_mb_10']:.0f} MB (10 devices) -> {result['peak_rss_mb_n']:.0f} MB: growth "
        f"{result['rss_growth_mb']:.0f} MB (goal <= {RSS_GROWTH_GOAL_MB:.0f} MB: {goal(result['rss_goal_met'])})",
        f"  per accepted update while uploads came in: {_cpu_line(result.get('ingest_cpu_ms_per_update'))}",
        f"  rows after the round: {', '.join(f'{name} {count:,}' for name, count in (result.get('table_rows') or {}).items() if count)}",
    ))


def _cpu_line(cpu: Mapping[str, float | None] | None) -> str:
    if not cpu:
        return "n/a"
    return ", ".join(f"{who} {'n/a' if ms is None else f'{ms:.1f}'} CPU ms" for who, ms in cpu.items())
