"""Device endpoints: registration, signatures, enrollment, template privacy, body limits."""
from __future__ import annotations

import time

import numpy as np
from fastapi.testclient import TestClient
from sqlalchemy import select

from facecore.federation.protocol import ErrorCode
from server_api.tables import AuditEvent, Enrollment
from server_helpers import enrolled_devices
from server_testkit import EMBEDDING_DIM, Device, sign, unit_vector


def test_register_is_idempotent_per_key_and_needs_proof_of_possession(client: TestClient) -> None:
    # Prepare
    device, impostor = Device(client), Device(client)
    # Execute
    first, again = device.register(), device.register()
    body = b'{"public_key": "%s"}' % device.public_key.encode()
    forged = client.post(
        "/v1/devices", content=body, headers={"Content-Type": "application/json", **sign(impostor.key, "register", "POST", "/v1/devices", body)}
    )
    # Assert
    assert first.status_code == 201 and again.status_code == 200
    assert first.json()["device_id"] == again.json()["device_id"]
    assert forged.status_code == 401


def test_bad_signature_skew_replay_and_missing_headers_are_401(client: TestClient, rng: np.random.Generator) -> None:
    # Prepare
    (device,) = enrolled_devices(client, 1, rng)
    path = f"/v1/devices/{device.id}"
    good = {**sign(device.key, device.id, "GET", path, b""), "X-Device-Id": device.id}
    other_key = Device(client).key
    # Execute
    ok = client.get(path, headers=good)
    replay = client.get(path, headers=good)
    wrong_key = client.get(path, headers={**sign(other_key, device.id, "GET", path, b""), "X-Device-Id": device.id})
    skewed = device.request("GET", path, timestamp=int(time.time()) - 301)
    tampered_path = client.get(path + "/embedding", headers={**sign(device.key, device.id, "GET", path, b""), "X-Device-Id": device.id})
    missing = client.get(path, headers={"X-Device-Id": device.id})
    unknown = client.get(path, headers={**sign(device.key, "0" * 32, "GET", path, b""), "X-Device-Id": "0" * 32})
    # Assert
    assert ok.status_code == 200
    assert replay.status_code == 401 and "nonce" in replay.json()["detail"]
    assert wrong_key.status_code == 401
    assert skewed.status_code == 401 and "X-Timestamp" in skewed.json()["detail"]
    assert tampered_path.status_code == 401
    assert missing.status_code == 401 and unknown.status_code == 401


def test_enrollment_validation(client: TestClient, rng: np.random.Generator) -> None:
    # Prepare
    device = Device(client)
    device.register()
    path = f"/v1/devices/{device.id}/embedding"
    nan_body = ('{"embedding": [NaN' + ", 0.0" * (EMBEDDING_DIM - 1) + "]}").encode()
    # Execute
    unknown_field = device.request("PUT", path, {"embedding": [float(x) for x in unit_vector(rng)], "label": "alice"})
    nan = device.request("PUT", path, nan_body, headers={"Content-Type": "application/json"})
    wrong_dim = device.enroll(unit_vector(rng, EMBEDDING_DIM - 1))
    not_unit = device.enroll(unit_vector(rng) * 2)
    ok = device.enroll(unit_vector(rng))
    twice = device.enroll(unit_vector(rng))
    # Assert
    assert [unknown_field.status_code, nan.status_code, wrong_dim.status_code, not_unit.status_code] == [422] * 4
    assert ok.status_code == 201 and ok.json()["enrolled"] is True
    assert twice.status_code == 409


def test_embedding_is_private_and_encrypted_at_rest(client: TestClient, rng: np.random.Generator) -> None:
    # Prepare
    alice, bob = Device(client), Device(client)
    alice.register(), bob.register()
    vector = unit_vector(rng)
    alice.enroll(vector)
    # Execute
    own = alice.embedding()
    others = bob.embedding(alice.id)
    with client.app.state.ctx.sessions() as session:
        stored = session.execute(select(Enrollment.ciphertext)).scalar_one()
        audit_text = " ".join(str(e.details) for e in session.execute(select(AuditEvent)).scalars())
    # Assert
    assert own.status_code == 200
    np.testing.assert_array_equal(np.asarray(own.json()["embedding"], dtype=np.float32), vector)
    assert others.status_code == 403
    assert vector.tobytes() not in stored and vector[:4].tobytes() not in stored
    assert str(float(vector[0]))[:8] not in audit_text


def test_unenroll_only_by_owner_and_removes_template(client: TestClient, rng: np.random.Generator) -> None:
    # Prepare
    alice, bob = enrolled_devices(client, 2, rng)
    # Execute
    by_other = bob.request("DELETE", f"/v1/devices/{alice.id}")
    by_owner = alice.request("DELETE", f"/v1/devices/{alice.id}")
    after = alice.embedding()
    me = alice.request("GET", f"/v1/devices/{alice.id}")
    with client.app.state.ctx.sessions() as session:
        templates_left = {alice.id: session.get(Enrollment, alice.id) is not None, bob.id: session.get(Enrollment, bob.id) is not None}
    re_enrolled = alice.enroll(unit_vector(rng))
    # Assert
    assert by_other.status_code == 403 and by_owner.status_code == 204
    assert after.status_code == 404
    assert me.json() == {"device_id": alice.id, "status": "unenrolled", "enrolled": False}
    assert templates_left == {alice.id: False, bob.id: True}
    assert re_enrolled.status_code == 201 and re_enrolled.json()["status"] == "active"


def test_oversized_and_chunked_bodies_are_413(client: TestClient, rng: np.random.Generator) -> None:
    # Prepare
    (device,) = enrolled_devices(client, 1, rng)
    limit = client.app.state.ctx.settings.max_request_bytes

    def chunks(total: int):  # no Content-Length: sent chunked
        for _ in range(total // 65536 + 1):
            yield b"x" * 65536

    # Execute
    declared = client.post("/v1/devices", content=b"{" + b" " * limit + b"}", headers={"Content-Type": "application/json"})
    chunked_json = client.post("/v1/devices", content=chunks(limit), headers={"Content-Type": "application/json"})
    # A selected device's chunked upload: test_server_uploads.py (an upload is refused before its body otherwise).
    # Assert
    assert declared.status_code == 413
    assert chunked_json.status_code == 413
    # refused by the middleware before the app, and while the app read the body: both name the code
    assert declared.json()["code"] == chunked_json.json()["code"] == ErrorCode.PAYLOAD_TOO_LARGE
