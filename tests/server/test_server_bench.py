"""`fedface bench server` end to end at toy scale: real server subprocesses, a real client process.

Asserts what the benchmark is for (every upload accepted, the round aggregated, the JSON
contract), never timings: those depend on the machine and are the benchmark's output.
"""
from __future__ import annotations

import argparse
import json

import pytest

from fedface.commands import bench

DEVICES = 12
REQUIRED_KEYS = {"ingest_seconds", "uploads_per_s", "p99_upload_ms", "aggregate_seconds", "rss_growth_mb"}


def test_bench_server_small_round(capsys: pytest.CaptureFixture[str]) -> None:
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    code = bench.run(parser.parse_args(["server", "--devices", str(DEVICES), "--concurrency", "8", "--json"]))
    out = capsys.readouterr().out
    result = json.loads(out)  # stdout is exactly one JSON object: progress went to stderr

    assert code == 0
    assert REQUIRED_KEYS <= result.keys()
    assert result["devices"] == DEVICES
    # Every device's upload was accepted (201) and the round was aggregated from all of them.
    assert result["accepted"] == DEVICES and result["status_codes"] == {"201": DEVICES} and result["errors"] == []
    assert result["round_status"] == "completed" and result["all_accepted"] and result["round_completed"]
    assert result["baseline_10"]["accepted"] == 10 and result["baseline_10"]["round_status"] == "completed"
    # Real update files of the real backbone: the fp16 delta of ~1M parameters is about 2 MB.
    assert 1_500_000 < result["update_bytes"] < 3_000_000
    assert result["ingest_seconds"] > 0 and result["uploads_per_s"] > 0
    assert 0 < result["p50_upload_ms"] <= result["p99_upload_ms"]
    assert result["aggregate_seconds"] > 0
    assert result["peak_rss_mb_10"] > 0 and result["peak_rss_mb_n"] > 0
    assert result["rss_growth_mb"] == pytest.approx(result["peak_rss_mb_n"] - result["peak_rss_mb_10"], abs=0.2)
    # Goals are only judged at 1,000 devices.
    assert result["ingest_goal_met"] is None and result["rss_goal_met"] is None
