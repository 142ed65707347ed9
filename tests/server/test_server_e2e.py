"""End to end: a real uvicorn server, 20 signing httpx clients, two rounds, the admin CLI."""
from __future__ import annotations

import argparse
import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
import torch

from facecore.losses import spreadout_optimize
from fedface.commands import admin as admin_cli
from server_process import ServerProcess
from server_testkit import Device, load_backbone_bytes, make_delta, unit_vector, update_file

N_DEVICES, TARGET = 20, 10
UPLOAD_CAP = 4 << 20


def admin(capsys: pytest.CaptureFixture[str], server: ServerProcess, *argv: str) -> dict:
    parser = argparse.ArgumentParser()
    admin_cli.add_arguments(parser)
    capsys.readouterr()
    assert admin_cli.run(parser.parse_args([*argv, "--server", server.url, "--data-dir", str(server.data_dir), "--json"])) == 0
    return json.loads(capsys.readouterr().out)


def wait_for(capsys: pytest.CaptureFixture[str], server: ServerProcess, status: str, timeout: float = 90) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        current = admin(capsys, server, "round", "status")
        if current["status"] == status:
            return current
        time.sleep(0.3)
    raise AssertionError(f"round still {current['status']} after {timeout} s")


def run_round(capsys, server: ServerProcess, devices: list[Device], rng: np.random.Generator):  # type: ignore[no-untyped-def]
    # The window must hold all 20 check-ins even on a loaded 2-core CI machine.
    round_ = admin(capsys, server, "round", "open", "--settings", "paper", "--target", str(TARGET), "--min", "8", "--deadline", "120",
                   "--selection-window", "5")
    waits = [device.checkin().json() for device in devices]
    assert all(w["status"] == "waiting" for w in waits), waits  # everyone checked in inside the selection window
    time.sleep(max(w["retry_after_s"] for w in waits) + 0.5)
    answers = {device.id: device.checkin().json()["status"] for device in devices}
    selected = [device for device in devices if answers[device.id] == "selected"]
    base = load_backbone_bytes(selected[0].backbone(round_["base_version"]).content)
    sent: dict[str, tuple] = {}

    def train_and_upload(index_device: tuple[int, Device]) -> int:
        index, device = index_device
        dtype = "fp16" if index % 2 else "fp32"  # the half-precision download must parse too
        assert load_backbone_bytes(device.backbone(round_["base_version"], dtype=dtype).content).keys() == base.keys()
        own = np.asarray(device.embedding().json()["embedding"], dtype=np.float32)
        delta, n = make_delta(base, np.random.default_rng(index)), 5 + index
        new_embedding = own / np.linalg.norm(own) * 0.5 + unit_vector(np.random.default_rng(100 + index)) * 0.5
        sent[device.id] = (delta, n, new_embedding)
        return device.upload(round_["id"], update_file(delta, new_embedding, round_["base_version"], n)).status_code

    with ThreadPoolExecutor(4) as pool:
        codes = list(pool.map(train_and_upload, enumerate(selected)))
    return round_, answers, base, sent, codes


def test_twenty_devices_two_rounds(tmp_path: Path, db_url: str, capsys: pytest.CaptureFixture[str]) -> None:
    # Prepare: PostgreSQL runs with two workers (all state in the database), SQLite with one.
    workers = 1 if db_url.startswith("sqlite") else 2
    server = ServerProcess(tmp_path / "data", db_url, workers=workers, FEDFACE_MAX_UPLOAD_BYTES=str(UPLOAD_CAP)).start()
    rng = np.random.default_rng(7)
    try:
        with httpx.Client(base_url=server.url, timeout=60) as http:
            devices = [Device(http) for _ in range(N_DEVICES)]
            enrolled = {}
            for device in devices:
                assert device.register().status_code == 201
                enrolled[device.id] = unit_vector(rng)
                assert device.enroll(enrolled[device.id]).status_code == 201
            # Execute: round 1
            round1, answers1, base1, sent1, codes1 = run_round(capsys, server, devices, rng)
            done1 = wait_for(capsys, server, "completed")
            # Assert: selection, FedAvg, spreadout over all 20 identities
            assert sorted(answers1.values()).count("selected") == TARGET and codes1 == [201] * TARGET
            new1 = load_backbone_bytes(devices[0].backbone(done1["result_version"]).content)
            total = sum(n for _, n, _ in sent1.values())
            for key, value in base1.items():
                if value.dtype.kind == "f":
                    expected = value + sum(d[key] * n for d, n, _ in sent1.values()) / total
                    np.testing.assert_allclose(new1[key], expected, atol=1e-6, err_msg=key)
            rows = {i: sent1[i][2] if i in sent1 else enrolled[i] for i in sorted(enrolled)}
            W_new = spreadout_optimize(torch.from_numpy(np.stack(list(rows.values()))), steps=10, lr=0.01, momentum=0.9, nu=0.3).numpy()
            for index, device_id in enumerate(rows):
                device = next(d for d in devices if d.id == device_id)
                got = device.embedding().json()
                assert got["round_id"] == round1["id"]
                np.testing.assert_allclose(got["embedding"], W_new[index], atol=1e-5)

            # Execute: round 2 rotates to the devices round 1 left out
            round2, answers2, _, sent2, codes2 = run_round(capsys, server, devices, rng)
            done2 = wait_for(capsys, server, "completed")
            # Assert
            chosen1 = {i for i, s in answers1.items() if s == "selected"}
            chosen2 = {i for i, s in answers2.items() if s == "selected"}
            assert chosen1.isdisjoint(chosen2) and len(chosen2) == TARGET and codes2 == [201] * TARGET
            assert round2["base_version"] == done1["result_version"] and done2["summary"]["n_updates"] == TARGET
            metrics = http.get("/metrics").text
            assert 'fedface_rounds{status="completed"} 2.0' in metrics
            # A chunked upload past the cap (413 from the real server): test_server_limits.py, since an
            # upload to a finished round is now refused before its body is read.
    finally:
        code = server.stop()
    # uvicorn re-raises the SIGTERM it handled after a graceful shutdown, hence -15.
    assert code in (0, -15) and "Traceback" not in server.log.read_text(), server.log.read_text()[-2000:]
