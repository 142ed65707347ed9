"""`fedface bench server` end to end at toy scale: real server subprocesses, a real client process.

Asserts what the benchmark is for (every upload accepted, the round aggregated, the JSON
contract), never timings: those depend on the machine and are the benchmark's output.
"""
from __future__ import annotations

import argparse
import json
import os

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


def test_bench_server_sends_what_a_frozen_prefix_round_in_4_bits_asks_for(capsys: pytest.CaptureFixture[str]) -> None:
    # Prepare
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    # Execute
    code = bench.run(parser.parse_args(["server", "--devices", str(DEVICES), "--trainable-blocks", "2", "--upload-bits", "4", "--json"]))
    result = json.loads(capsys.readouterr().out)
    # Assert: the server took every such update and aggregated them; 30% of mobilefacenet's ~1M weights in 4 bits
    assert code == 0 and result["local"] == {"trainable_blocks": 2, "upload_bits": 4}
    assert result["accepted"] == DEVICES and result["round_status"] == "completed" and result["all_accepted"]
    assert 100_000 < result["update_bytes"] < 400_000


def test_bench_server_secure_round_with_a_dropout(capsys: pytest.CaptureFixture[str]) -> None:
    # Prepare
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    # Execute: 5 devices, one of which drops after sharing its keys
    code = bench.run(parser.parse_args(["server", "--secure", "--devices", "5", "--drop", "0.2", "--concurrency", "4", "--json"]))
    result = json.loads(capsys.readouterr().out)
    # Assert: the survivors' masked updates were unmasked into the new model, none lost
    secure = result["secure"]
    assert code == 0 and secure["round_status"] == "completed" and secure["lost"] == 0 and result["plain"]["round_status"] == "completed"
    assert secure["round_summary"]["secure_aggregation"] == {"members": 5, "key_sharers": 5, "answers": 4, "threshold": 4}
    # a masked update is 4 bytes per float parameter against the plain fp16 delta's 2
    assert 1.9 < result["upload_bytes_ratio_vs_fp16"] < 2.2
    assert set(secure["steps_s"]) == {"checkin_s", "advertise_s", "share_keys_s", "receive_shares_s", "upload_s", "unmask_answers_s"}


@pytest.mark.skipif(not os.environ.get("FEDFACE_TEST_POSTGRES_URL"), reason="needs FEDFACE_TEST_POSTGRES_URL (.ci/run sets it)")
def test_bench_server_on_postgresql_leaves_no_schema(capsys: pytest.CaptureFixture[str]) -> None:
    # Prepare
    from sqlalchemy import create_engine, text

    url = os.environ["FEDFACE_TEST_POSTGRES_URL"]
    parser = argparse.ArgumentParser()
    bench.add_arguments(parser)
    # Execute
    code = bench.run(parser.parse_args(["server", "--devices", "4", "--concurrency", "4", "--db", url, "--json"]))
    result = json.loads(capsys.readouterr().out)
    # Assert: the round ran on PostgreSQL, and its scratch schemas were dropped
    assert code == 0 and result["database"] == "postgresql" and result["accepted"] == 4 and result["round_completed"]
    engine = create_engine("postgresql+psycopg://" + url.split("://", 1)[1])
    with engine.connect() as connection:
        left = connection.execute(text("SELECT nspname FROM pg_namespace WHERE nspname LIKE 'bench_%'")).scalars().all()
    engine.dispose()
    assert left == []
