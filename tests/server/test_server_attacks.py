"""Attacks on the running server process (real uvicorn, real sockets), not the in-process client."""
from __future__ import annotations

import time
from pathlib import Path

import httpx
import numpy as np

from server_process import ServerProcess
from server_testkit import Device, sign, unit_vector


def test_replay_skew_foreign_template_and_oversized_bodies_are_refused(tmp_path: Path, db_url: str) -> None:
    # Prepare: two enrolled devices on a real server with a 64 KiB request cap
    server = ServerProcess(tmp_path / "data", db_url, FEDFACE_MAX_REQUEST_BYTES="65536").start()
    rng = np.random.default_rng(3)
    try:
        with httpx.Client(base_url=server.url, timeout=30) as http:
            alice, bob = Device(http), Device(http)
            for device in (alice, bob):
                assert device.register().status_code == 201
                assert device.enroll(unit_vector(rng)).status_code == 201
            path = f"/v1/devices/{alice.id}/embedding"
            signed = {"X-Device-Id": alice.id, **sign(alice.key, alice.id, "GET", path, b"")}
            # Execute
            first, replayed = http.get(path, headers=signed), http.get(path, headers=signed)
            skewed = alice.request("GET", path, timestamp=int(time.time()) - 301)
            foreign = bob.embedding(alice.id)
            big = [0.0] * 20_000  # ~100 KB of JSON, past the 64 KiB cap
            oversized = alice.request("PUT", path, {"embedding": big})

            def stream():  # type: ignore[no-untyped-def]
                for _ in range(3):
                    yield b"[" + b"0," * 20_000

            headers = {"X-Device-Id": alice.id, "Content-Type": "application/json", **sign(alice.key, alice.id, "PUT", path, b"")}
            chunked = http.put(path, content=stream(), headers=headers)
            # Assert
            assert first.status_code == 200
            assert replayed.status_code == 401 and "nonce" in replayed.json()["detail"]
            assert skewed.status_code == 401 and "X-Timestamp" in skewed.json()["detail"]
            assert foreign.status_code == 403
            assert oversized.status_code == 413 and chunked.status_code == 413
            assert alice.embedding().status_code == 200  # the server is fine afterwards
    finally:
        server.stop()
    assert "Traceback" not in server.log.read_text()
