"""Registration is not open and free: one-time enrollment tokens, an address limit on anonymous
registrations, and pruning of devices that registered but never enrolled."""
from __future__ import annotations

import re
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select, update

from server_api.main import create_app
from server_api.tables import Device as DeviceRow
from server_api.tables import EnrollmentToken, utcnow
from server_helpers import make_settings
from server_testkit import Device, unit_vector


@pytest.fixture()
def token_client(tmp_path: Path, db_url: str) -> Iterator[TestClient]:
    settings = make_settings(tmp_path / "data", db_url, require_enrollment_token=True)
    with TestClient(create_app(settings, run_scheduler=False)) as test_client:
        yield test_client


def _register(client: TestClient, token: str | None, device: Device | None = None) -> tuple[Device, int]:
    device = device or Device(client)
    body = {"public_key": device.public_key} | ({"enrollment_token": token} if token else {})
    response = device.request("POST", "/v1/devices", body, subject="register")
    if response.status_code in (200, 201):
        device.id = response.json()["device_id"]
    return device, response.status_code


def test_issued_tokens_are_hex_so_a_command_line_never_reads_one_as_an_option(token_client: TestClient) -> None:
    # Prepare
    admin = {"Authorization": f"Bearer {token_client.app.state.ctx.admin_token}"}
    # Execute
    issued = token_client.post("/v1/admin/enrollment-tokens", json={"count": 100}, headers=admin)
    # Assert: 192 random bits each, none beginning with "-"
    tokens = issued.json()["tokens"]
    assert issued.status_code == 201 and len(set(tokens)) == 100
    assert all(re.fullmatch("[0-9a-f]{48}", token) for token in tokens), tokens


def test_a_token_server_registers_each_token_once(token_client: TestClient) -> None:
    # Prepare
    admin = {"Authorization": f"Bearer {token_client.app.state.ctx.admin_token}"}
    issued = token_client.post("/v1/admin/enrollment-tokens", json={"count": 2}, headers=admin)
    first, second = issued.json()["tokens"]
    # Execute
    _, without = _register(token_client, None)
    _, forged = _register(token_client, "f" * 32)
    device, with_token = _register(token_client, first)
    _, reused = _register(token_client, first)
    _, known_key_again = _register(token_client, None, device)
    anonymous_admin = token_client.post("/v1/admin/enrollment-tokens", json={"count": 1})
    with token_client.app.state.ctx.sessions() as session:  # the second token's time runs out
        session.execute(update(EnrollmentToken).values(expires_at=utcnow() - timedelta(seconds=1)))
        session.commit()
    _, expired = _register(token_client, second)
    # Assert
    assert issued.status_code == 201 and len(set(issued.json()["tokens"])) == 2
    assert (without, forged, with_token, reused, known_key_again, expired) == (401, 401, 201, 401, 200, 401)
    assert anonymous_admin.status_code == 401
    with token_client.app.state.ctx.sessions() as session:
        assert session.execute(select(func.count()).select_from(DeviceRow)).scalar_one() == 1
        stored = session.execute(select(EnrollmentToken.token_sha256)).scalars().all()
    assert first not in stored and second not in stored  # only hashes are kept


def test_dev_servers_register_without_a_token(client: TestClient) -> None:
    # Execute
    _, status = _register(client, None)
    # Assert
    assert status == 201


def test_anonymous_registrations_from_one_address_stop_at_the_burst(client: TestClient) -> None:
    # Prepare: the audit's attack, 200 registrations from one address, against the default limits
    burst = client.app.state.ctx.settings.address_burst
    # Execute
    started = time.perf_counter()
    statuses = [_register(client, None)[1] for _ in range(200)]
    elapsed = time.perf_counter() - started
    # Assert: what the burst and the 1/s refill allow is kept, the rest is refused
    assert statuses[:burst] == [201] * burst and statuses[-1] == 429
    assert statuses.count(201) <= burst + elapsed * client.app.state.ctx.settings.address_rate_per_s + 1
    with client.app.state.ctx.sessions() as session:
        assert session.execute(select(func.count()).select_from(DeviceRow)).scalar_one() == statuses.count(201)


def test_devices_that_never_enrolled_are_pruned_after_the_age(client: TestClient, rng: np.random.Generator) -> None:
    # Prepare: two old devices that never enrolled, one old enrolled, one old that enrolled then unenrolled, one new
    admin = {"Authorization": f"Bearer {client.app.state.ctx.admin_token}"}
    old_idle = [_register(client, None)[0] for _ in range(2)]
    old_enrolled, old_unenrolled = _register(client, None)[0], _register(client, None)[0]
    assert old_enrolled.enroll(unit_vector(rng)).status_code == 201
    assert old_unenrolled.enroll(unit_vector(rng)).status_code == 201
    assert old_unenrolled.request("DELETE", f"/v1/devices/{old_unenrolled.id}").status_code == 204
    with client.app.state.ctx.sessions() as session:
        session.execute(update(DeviceRow).values(created_at=utcnow() - timedelta(days=2)))
        session.commit()
    new_idle, _ = _register(client, None)
    # Execute
    pruned = client.post("/v1/admin/devices/prune", params={"older_than_s": 86400}, headers=admin)
    again = client.post("/v1/admin/devices/prune", headers=admin)  # the default age, FEDFACE_PRUNE_UNENROLLED_AFTER_S
    # Assert
    assert pruned.status_code == 200 and pruned.json()["pruned"] == 2
    assert again.json()["pruned"] == 0
    with client.app.state.ctx.sessions() as session:
        left = set(session.execute(select(DeviceRow.id)).scalars())
    assert left == {old_enrolled.id, old_unenrolled.id, new_idle.id}
    pruned_device = old_idle[0]
    assert pruned_device.request("GET", f"/v1/devices/{pruned_device.id}").status_code == 401  # it must register again
