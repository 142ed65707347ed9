"""Crash safety: kill -9 the real server mid-aggregation and mid-upload, restart, and check
that no accepted update is lost, no half-written model version exists, and rounds finish once."""
from __future__ import annotations

import hashlib
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
from sqlalchemy import create_engine, text

from server_process import ServerProcess
from server_testkit import Device, load_backbone_bytes, make_delta, sign, unit_vector, update_file


def _round(http: httpx.Client, token: str) -> dict:
    return http.get("/v1/admin/rounds/current", headers={"Authorization": f"Bearer {token}"}).json()


def _wait(http: httpx.Client, token: str, status: str, timeout: float = 60) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        current = _round(http, token)
        if current["status"] == status:
            return current
        time.sleep(0.2)
    raise AssertionError(f"round still {current['status']}")


def _db(db_url: str, sql: str) -> list[tuple]:
    engine = create_engine(db_url.replace("postgresql://", "postgresql+psycopg://"))
    try:
        with engine.connect() as connection:
            return [tuple(row) for row in connection.execute(text(sql))]
    finally:
        engine.dispose()


def _blobs_are_whole(data_dir: Path, db_url: str) -> bool:
    """Every blob a model version names is there, and every blob on disk matches its name.

    A round's deltas are deleted just after its completion is visible, so a file listed here
    may be gone by the time it is read: that one is skipped, not a torn blob."""
    objects = data_dir / "blobs" / "objects"
    named = [digest for row in _db(db_url, "SELECT version_hash, fp16_blob, int8_blob, onnx_blob FROM model_versions") for digest in row if digest]
    if not named or not all((objects / digest[:2] / digest).is_file() for digest in named):
        return False
    for path in [p for p in objects.rglob("*") if p.is_file()]:
        try:
            content = path.read_bytes()
        except FileNotFoundError:
            continue
        if hashlib.sha256(content).hexdigest() != path.name:
            return False
    return True


def _open(http: httpx.Client, token: str, target: int) -> dict:
    body = {"target_participants": target, "min_participants": target, "deadline_s": 300, "selection_window_s": 0}
    response = http.post("/v1/admin/rounds", json=body, headers={"Authorization": f"Bearer {token}"})
    assert response.status_code == 201, response.text
    return response.json()


def test_kill9_mid_aggregation_and_mid_upload(tmp_path: Path, db_url: str) -> None:
    # Prepare: a server that pauses between writing a version's blobs and committing it.
    data, rng = tmp_path / "data", np.random.default_rng(3)
    server = ServerProcess(data, db_url, FEDFACE_AGGREGATION_PAUSE_S="60", FEDFACE_AGGREGATION_LEASE_S="1").start()
    token = server.admin_token()
    http = httpx.Client(base_url=server.url, timeout=30)
    devices = [Device(http) for _ in range(3)]
    for device in devices:
        device.register(), device.enroll(unit_vector(rng))
    round1 = _open(http, token, target=3)
    for device in devices:
        device.checkin()
    base = load_backbone_bytes(devices[0].backbone(round1["base_version"]).content)
    samples = [4, 5, 6]
    codes = [
        d.upload(round1["id"], update_file(make_delta(base, rng), unit_vector(rng), round1["base_version"], n)).status_code
        for d, n in zip(devices, samples, strict=True)
    ]
    # Execute: kill -9 while the round is aggregating.
    _wait(http, token, "aggregating")
    time.sleep(1.0)
    server.kill9()
    # Assert: nothing of the new version is committed; every accepted update is.
    assert codes == [201, 201, 201]
    assert _db(db_url, "SELECT status FROM rounds") == [("aggregating",)]
    assert _db(db_url, "SELECT count(*) FROM model_versions") == [(1,)]
    assert _db(db_url, "SELECT count(*) FROM updates WHERE round_id = 1") == [(3,)]

    # Execute: restart without the pause; the expired lease lets the scheduler retake the round.
    server = ServerProcess(data, db_url, FEDFACE_AGGREGATION_LEASE_S="1").start()
    http = httpx.Client(base_url=server.url, timeout=30)
    for device in devices:
        device.http = http
    done = _wait(http, token, "completed")
    # Assert: completed exactly once, from all three updates, with whole blobs.
    assert done["summary"]["n_updates"] == 3 and done["summary"]["n_samples"] == sum(samples)
    assert _db(db_url, "SELECT count(*) FROM model_versions WHERE round_id = 1") == [(1,)]
    assert _db(db_url, "SELECT count(*) FROM audit_events WHERE action = 'round.completed'") == [(1,)]
    assert _blobs_are_whole(data, db_url)
    new = load_backbone_bytes(devices[0].backbone(done["result_version"]).content)
    assert new.keys() == base.keys()

    # Prepare: round 2; one update accepted, a second one is streaming slowly.
    round2 = _open(http, token, target=2)
    fast, slow = devices[0], devices[1]
    fast.checkin(), slow.checkin()
    base2 = load_backbone_bytes(fast.backbone(round2["base_version"]).content)
    fast_body = update_file(make_delta(base2, rng), unit_vector(rng), round2["base_version"], 7)
    slow_body = update_file(make_delta(base2, rng), unit_vector(rng), round2["base_version"], 8)
    first = fast.upload(round2["id"], fast_body, key="fast-upload-1")
    path = f"/v1/rounds/{round2['id']}/updates"

    def trickle() -> Iterator[bytes]:
        for start in range(0, len(slow_body), 32768):
            time.sleep(0.05)
            yield slow_body[start : start + 32768]

    def slow_upload() -> None:
        headers = {"X-Device-Id": slow.id, "Idempotency-Key": "slow-upload-1", **sign(slow.key, slow.id, "POST", path, slow_body)}
        try:
            http.post(path, content=trickle(), headers=headers)
        except httpx.HTTPError:
            pass  # the server died under it: expected

    # Execute: kill -9 mid-upload, restart, retry both with their Idempotency-Keys.
    uploader = threading.Thread(target=slow_upload)
    uploader.start()
    time.sleep(0.4)
    server.kill9()
    uploader.join(timeout=30)
    killed_with = _db(db_url, f"SELECT count(*) FROM updates WHERE round_id = {round2['id']}")
    server = ServerProcess(data, db_url).start()
    http = httpx.Client(base_url=server.url, timeout=30)
    fast.http = slow.http = http
    fast_again = fast.upload(round2["id"], fast_body, key="fast-upload-1")
    slow_again = slow.upload(round2["id"], slow_body, key="slow-upload-1")
    done2 = _wait(http, token, "completed")
    server.stop()
    # Assert
    assert killed_with == [(1,)]  # the slow upload really was cut off
    assert first.status_code == 201 and fast_again.status_code == 201 and fast_again.json() == first.json()
    assert slow_again.status_code == 201
    assert done2["summary"]["n_updates"] == 2 and done2["summary"]["n_samples"] == 15
    assert _db(db_url, f"SELECT count(*) FROM updates WHERE round_id = {round2['id']}") == [(2,)]
    assert _blobs_are_whole(data, db_url)


def test_an_aggregation_longer_than_its_lease_is_not_retaken_while_its_process_lives(tmp_path: Path, db_url: str) -> None:
    # Prepare: a 1 s lease and an aggregation that takes 3 s (it pauses before committing).
    from fastapi.testclient import TestClient

    from server_api.main import create_app
    from server_helpers import enrolled_devices, make_settings, open_round, tick

    settings = make_settings(tmp_path / "data", db_url, aggregation_lease_s=1.0, aggregation_pause_s=3.0)
    rng = np.random.default_rng(5)
    with TestClient(create_app(settings, run_scheduler=False)) as client:
        admin = {"Authorization": f"Bearer {client.app.state.ctx.admin_token}"}
        first, second = enrolled_devices(client, 2, rng)
        round_ = open_round(client, admin, target_participants=2, min_participants=2)
        for device in (first, second):
            device.checkin()
        base = load_backbone_bytes(first.backbone(round_["base_version"]).content)
        assert first.upload(round_["id"], update_file(make_delta(base, rng), unit_vector(rng), round_["base_version"], 3)).status_code == 201
        last = threading.Thread(  # its background task claims the round and aggregates for 3 s
            target=second.upload, args=(round_["id"], update_file(make_delta(base, rng), unit_vector(rng), round_["base_version"], 4)),
        )
        # Execute: past the first lease, the scheduler looks at the round.
        last.start()
        _wait(client, client.app.state.ctx.admin_token, "aggregating")
        time.sleep(1.6)
        outcome = tick(client)
        last.join(timeout=30)
        done = _round(client, client.app.state.ctx.admin_token)
        with client.app.state.ctx.sessions() as session:
            actions = [row[0] for row in session.execute(text("SELECT action FROM audit_events WHERE action LIKE 'round.%'"))]
    # Assert: the lease was renewed while the aggregation ran, so nothing retook it; it completed once.
    assert outcome == "busy"
    assert done["status"] == "completed" and done["summary"]["n_updates"] == 2
    assert actions.count("round.aggregation_resumed") == 0 and actions.count("round.completed") == 1
