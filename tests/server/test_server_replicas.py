"""Three real `fedface server` processes behind one address: one PostgreSQL, blobs in the database,
rate limits shared. Uploads land on any replica; one is killed with kill -9 mid-round; nothing it
accepted is lost, and the round aggregates once."""
from __future__ import annotations

import os
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest

from server_api.launcher import scratch_database, share_dev_secrets
from server_process import ServerProcess
from server_testkit import Device, load_backbone_bytes, make_delta, unit_vector, update_file
from test_server_crash import _db, _open, _wait

POSTGRES_URL = os.environ.get("FEDFACE_TEST_POSTGRES_URL")
pytestmark = pytest.mark.skipif(not POSTGRES_URL, reason="several server processes share one PostgreSQL")
DEVICES = 300
REPLICA_SETTINGS = {
    "FEDFACE_ADDRESS_RATE_PER_S": "0",  # 300 registrations from one test address
    "FEDFACE_DEVICE_RATE_PER_S": "0.2", "FEDFACE_DEVICE_BURST": "12", "FEDFACE_AGGREGATION_LEASE_S": "2",
}


class Replica(ServerProcess):
    """A server process that keeps its blobs in the database (`--blob-store database`)."""

    def command(self) -> list[str]:
        return [*super().command(), "--blob-store", "database"]


@contextmanager
def _replicas(tmp_path: Path, settings: list[dict[str, str]]) -> Iterator[list[Replica]]:
    """One replica per entry of `settings`, with data folders of their own (nothing shared on disk) and one set of
    secrets, on a fresh PostgreSQL schema."""
    assert POSTGRES_URL
    with scratch_database(POSTGRES_URL, prefix="t_") as db_url:
        first = Replica(tmp_path / "r0", db_url, **settings[0]).start()
        started = [first]
        try:
            for index, extra in enumerate(settings[1:], 1):
                folder = tmp_path / f"r{index}"
                share_dev_secrets(first.data_dir, folder)
                started.append(Replica(folder, db_url, **extra).start())
            yield started
        finally:
            for replica in started:
                replica.stop()


@pytest.fixture
def replicas(tmp_path: Path) -> Iterator[list[Replica]]:
    with _replicas(tmp_path, [REPLICA_SETTINGS] * 3) as started:
        yield started


def _in_parallel(job: Callable[[int], object], count: int) -> None:
    with ThreadPoolExecutor(max_workers=8) as pool:
        list(pool.map(job, range(count)))


def _a_round_uploaded_last_to_replica_0(
    started: list[Replica], count: int, seed: int,
) -> tuple[str, str, list[httpx.Client], list[Device], dict[str, Any], dict[str, np.ndarray]]:
    """`count` devices spread over the replicas, enrolled, all of them in a round, each update in with photo counts
    2, 3, ...; the last upload reaches replica 0, which claims the round at once (the others only on their next
    scheduler tick). Returns the database URL, admin token, clients, devices, round and base backbone."""
    db_url = started[0].db_url
    assert db_url is not None
    token, rng = started[0].admin_token(), np.random.default_rng(seed)
    clients = [httpx.Client(base_url=replica.url, timeout=60) for replica in started]
    devices = [Device(clients[index % 3]) for index in range(count)]
    for device in devices:
        assert device.register().status_code == 201 and device.enroll(unit_vector(rng)).status_code == 201
    round_ = _open(clients[1], token, target=len(devices))
    for device in devices:
        device.checkin().raise_for_status()
    base = load_backbone_bytes(devices[0].backbone(round_["base_version"]).content)
    for index, device in enumerate(devices[1:] + devices[:1]):
        body = update_file(make_delta(base, rng), unit_vector(rng), round_["base_version"], 2 + index)
        assert device.upload(round_["id"], body).status_code == 201
    return db_url, token, clients, devices, round_, base


def _assert_completed_once_from_every_update(db_url: str, done: dict[str, Any], devices: list[Device], round_: dict[str, Any],
                                             base: dict[str, np.ndarray]) -> None:
    """The round of :func:`_a_round_uploaded_last_to_replica_0` completed once, from every update, and its new
    version is served (by replica 1, alive)."""
    assert done["summary"]["n_updates"] == len(devices) and done["summary"]["n_samples"] == sum(range(2, 2 + len(devices)))
    assert _db(db_url, f"SELECT count(*) FROM model_versions WHERE round_id = {round_['id']}") == [(1,)]
    assert _db(db_url, "SELECT count(*) FROM audit_events WHERE action = 'round.completed'") == [(1,)]
    new = devices[1].backbone(done["result_version"])
    assert new.status_code == 200 and load_backbone_bytes(new.content).keys() == base.keys()


def test_replicas_share_a_round_and_a_killed_replica_loses_nothing(replicas: list[Replica]) -> None:
    # Prepare: 300 devices, each talking to one replica (as a load balancer would spread them).
    db_url = replicas[0].db_url
    assert db_url is not None
    token, rng = replicas[0].admin_token(), np.random.default_rng(7)
    clients = [httpx.Client(base_url=replica.url, timeout=60) for replica in replicas]
    devices = [Device(clients[index % 3]) for index in range(DEVICES)]
    vectors = [unit_vector(rng) for _ in range(DEVICES)]

    def enroll(index: int) -> None:
        device = devices[index]
        assert device.register().status_code == 201 and device.enroll(vectors[index]).status_code == 201

    _in_parallel(enroll, DEVICES)
    round_ = _open(clients[1], token, target=DEVICES)
    _in_parallel(lambda index: devices[index].checkin().raise_for_status(), DEVICES)
    base = load_backbone_bytes(devices[0].backbone(round_["base_version"]).content)
    bodies = [update_file(make_delta(base, rng), vectors[index], round_["base_version"], 1 + index % 5) for index in range(DEVICES)]
    answers: dict[int, httpx.Response] = {}
    accepted_by: Counter[int] = Counter()
    resent: list[int] = []
    lock, killed = threading.Lock(), threading.Event()

    def upload(index: int) -> None:
        # A device whose replica died resends under the same Idempotency-Key to the next one.
        device, key = devices[index], f"upload-{index}"
        replica = index % 3
        for _ in range(3):
            try:
                response = device.upload(round_["id"], bodies[index], key=key)
            except httpx.TransportError:
                resent.append(index)
                replica = (replica + 1) % 3
                device.http = clients[replica]
                continue
            with lock:
                answers[index] = response
                accepted_by[replica] += response.status_code == 201
            return

    # Execute: the uploads, with replica 2 killed (kill -9) once half of them are in.
    def upload_then_kill(index: int) -> None:
        upload(index)
        if len(answers) >= DEVICES // 2 and not killed.is_set():
            killed.set()
            replicas[2].kill9()

    _in_parallel(upload_then_kill, DEVICES)
    done = _wait(clients[0], token, "completed", timeout=120)

    # Assert: every device's update was accepted once, by the replica it reached, and counted once.
    assert killed.is_set() and resent and len(answers) == DEVICES  # some devices found replica 2 gone
    assert Counter(response.status_code for response in answers.values()) == {201: DEVICES}
    assert len({response.json()["update_id"] for response in answers.values()}) == DEVICES
    assert all(accepted_by[replica] > 0 for replica in range(3)), accepted_by
    assert _db(db_url, f"SELECT count(*) FROM updates WHERE round_id = {round_['id']}") == [(DEVICES,)]
    assert done["summary"]["n_updates"] == DEVICES
    assert done["summary"]["n_samples"] == sum(1 + index % 5 for index in range(DEVICES))
    assert _db(db_url, f"SELECT count(*) FROM model_versions WHERE round_id = {round_['id']}") == [(1,)]
    assert _db(db_url, "SELECT count(*) FROM audit_events WHERE action = 'round.completed'") == [(1,)]
    # The new version's blobs are in the database, and every live replica serves the same bytes.
    named = _db(db_url, "SELECT version_hash, fp16_blob FROM model_versions")
    stored = {row[0] for row in _db(db_url, "SELECT digest FROM blobs")}
    assert {digest for row in named for digest in row if digest} <= stored
    answers_live = [devices[index].backbone(done["result_version"]) for index in (0, 1)]  # on replicas 0 and 1
    downloads = {response.content for response in answers_live}
    assert [response.status_code for response in answers_live] == [200, 200] and len(downloads) == 1
    assert load_backbone_bytes(downloads.pop()).keys() == base.keys()
    assert not any((replica.data_dir / "blobs" / "objects").exists() for replica in replicas)


def test_a_device_rate_is_one_bucket_whichever_replica_answers(replicas: list[Replica]) -> None:
    # Prepare: one device (burst 12, then one request per 5 s), registered on replica 0.
    clients = [httpx.Client(base_url=replica.url, timeout=60) for replica in replicas]
    device = Device(clients[0])
    assert device.register().status_code == 201
    # Execute: 18 signed requests, spread over the three replicas.
    codes = []
    for index in range(18):
        device.http = clients[index % 3]
        codes.append(device.request("GET", "/v1/models/current").status_code)
    # Assert: 12 served in all (held per process, each replica would have served 12: 18 in all).
    assert codes[:12] == [200] * 12 and codes[12:] == [429] * 6, codes


def test_a_replica_killed_mid_aggregation_leaves_the_round_to_another(tmp_path: Path) -> None:
    # Prepare: replica 0 pauses between writing the new version's blobs and committing it. It receives the last
    # upload and claims the round at once; the others look for rounds to take only every 15 s, so they all but
    # never get there first, and retake it once its lease has run out.
    lease = {"FEDFACE_AGGREGATION_LEASE_S": "6", "FEDFACE_ADDRESS_RATE_PER_S": "0"}
    settings = [lease | {"FEDFACE_AGGREGATION_PAUSE_S": "60"}] + [lease | {"FEDFACE_SCHEDULER_INTERVAL_S": "15"}] * 2
    with _replicas(tmp_path, settings) as started:
        db_url, token, clients, devices, round_, base = _a_round_uploaded_last_to_replica_0(started, 6, seed=8)
        # Execute: replica 0 is aggregating (paused); kill it.
        _wait(clients[1], token, "aggregating", timeout=30)
        time.sleep(1.0)
        still_aggregating = _db(db_url, "SELECT status FROM rounds") == [("aggregating",)]
        started[0].kill9()
        done = _wait(clients[1], token, "completed", timeout=90)
        # Assert: another replica retook the round once its lease ran out, from every update, once
        assert still_aggregating
        _assert_completed_once_from_every_update(db_url, done, devices, round_, base)


def test_replicas_sum_a_rounds_shards_together_and_one_killed_loses_none(tmp_path: Path) -> None:
    # Prepare: 12 devices, shards of 2 (6 shards) that every replica claims and sums, pausing 1 s after each so that
    # the work spreads; replica 0 receives the last upload, so it claims the round and publishes its shards.
    shared = {
        "FEDFACE_AGGREGATION_SHARED_SHARDS": "true", "FEDFACE_AGGREGATION_SHARD_UPDATES": "2", "FEDFACE_AGGREGATION_SHARD_PAUSE_S": "1",
        "FEDFACE_AGGREGATION_LEASE_S": "4", "FEDFACE_ADDRESS_RATE_PER_S": "0",
    }
    with _replicas(tmp_path, [shared] * 3) as started:
        db_url, token, clients, devices, round_, base = _a_round_uploaded_last_to_replica_0(started, 12, seed=9)
        # Execute: kill replica 0 once two shards are summed
        deadline = time.monotonic() + 60
        while _db(db_url, "SELECT count(*) FROM aggregation_shards WHERE partial_sha256 IS NOT NULL")[0][0] < 2:
            assert time.monotonic() < deadline, "no shard was summed"
            time.sleep(0.1)
        started[0].kill9()
        done = _wait(clients[1], token, "completed", timeout=90)
        # Assert: the round completed once, from every update, its 6 shards summed by more than one replica
        _assert_completed_once_from_every_update(db_url, done, devices, round_, base)
        assert done["summary"]["shards"]["count"] == 6 and done["summary"]["shards"]["processes"] >= 2, done["summary"]
        # ... and it left no shard row, partial sum or update behind: the blobs left are the versions' own
        assert _db(db_url, "SELECT count(*) FROM aggregation_shards") == [(0,)]
        named = {digest for row in _db(db_url, "SELECT version_hash, fp16_blob, int8_blob, onnx_blob FROM model_versions") for digest in row if digest}
        deadline = time.monotonic() + 30
        while {row[0] for row in _db(db_url, "SELECT digest FROM blobs")} - named:
            assert time.monotonic() < deadline, "partial sums or updates were left in the store"
            time.sleep(0.2)
