"""Update uploads: validation of untrusted files, idempotency, selection checks."""
from __future__ import annotations

import json
import struct

import numpy as np
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import func, select, update

from facecore import tensorfile
from server_api.errors import Conflict
from server_api.services import uploads
from server_api.tables import IdempotencyRecord, Update, utcnow
from server_helpers import enrolled_devices, open_round
from server_testkit import load_backbone_bytes, make_delta, sign, unit_vector, update_file


def _setup(client: TestClient, admin: dict, rng: np.random.Generator):  # type: ignore[no-untyped-def]
    devices = enrolled_devices(client, 3, rng)
    round_ = open_round(client, admin, target_participants=2, min_participants=2)
    answers = [device.checkin().json()["status"] for device in devices]
    base = load_backbone_bytes(devices[0].backbone(round_["base_version"]).content)
    return devices, round_, answers, base


def test_invalid_update_files_are_rejected(client: TestClient, admin: dict, rng: np.random.Generator) -> None:
    # Prepare
    (device, _, _), round_, _, base = _setup(client, admin, rng)
    version, rid = round_["base_version"], round_["id"]
    good = make_delta(base, rng)
    first_float = next(k for k, v in good.items() if v.dtype.kind == "f")
    nan_delta = good | {first_float: np.full_like(good[first_float], np.nan)}
    missing = {k: v for k, v in good.items() if k != first_float}
    reshaped = good | {first_float: good[first_float].reshape(-1)[:-1]}
    huge = {k: v * 1e7 if v.dtype.kind == "f" else v for k, v in good.items()}
    inf_embedding = unit_vector(rng)
    inf_embedding[3] = np.inf
    cases = {
        "nan delta": update_file(nan_delta, unit_vector(rng), version, 5),
        "missing tensor": update_file(missing, unit_vector(rng), version, 5),
        "wrong shape": update_file(reshaped, unit_vector(rng), version, 5),
        "norm bound": update_file(huge, unit_vector(rng), version, 5),
        "inf embedding": update_file(good, inf_embedding, version, 5),
        "unknown meta field": update_file(good, unit_vector(rng), version, 5, client_label="alice"),
        "zero samples": update_file(good, unit_vector(rng), version, 0),
        "not a tensor file": b"\x80\x04garbage pickle",
        "header beyond file": struct.pack("<Q", 10**9) + b"{}",
        "pickle dtype": struct.pack("<Q", 60) + json.dumps({"x": {"dtype": "O", "shape": [1], "data_offsets": [0, 8]}}).encode().ljust(60) + b"\0" * 8,
    }
    # Execute
    answers = {name: device.upload(rid, body) for name, body in cases.items()}
    wrong_base = device.upload(rid, update_file(good, unit_vector(rng), "0" * 64, 5))
    no_key = device.request("POST", f"/v1/rounds/{rid}/updates", update_file(good, unit_vector(rng), version, 5))
    # Assert
    assert {name: r.status_code for name, r in answers.items()} == {name: 422 for name in cases}
    assert "NaN" in answers["nan delta"].json()["detail"] and "norm" in answers["norm bound"].json()["detail"]
    assert wrong_base.status_code == 409
    assert no_key.status_code == 422 and "Idempotency-Key" in no_key.json()["detail"]
    with client.app.state.ctx.sessions() as session:
        assert session.execute(select(func.count()).select_from(Update)).scalar_one() == 0


def test_duplicate_idempotency_key_returns_same_response_and_one_row(client: TestClient, admin: dict, rng: np.random.Generator) -> None:
    # Prepare
    (device, _, _), round_, _, base = _setup(client, admin, rng)
    body = update_file(make_delta(base, rng), unit_vector(rng), round_["base_version"], 7)
    # Execute
    first = device.upload(round_["id"], body, key="upload-key-0001")
    repeat = device.upload(round_["id"], body, key="upload-key-0001")
    other_body = device.upload(round_["id"], update_file(make_delta(base, rng), unit_vector(rng), round_["base_version"], 7), key="upload-key-0001")
    second_key = device.upload(round_["id"], body, key="upload-key-0002")
    # Assert
    assert first.status_code == 201 and repeat.status_code == 201 and repeat.json() == first.json()
    assert other_body.status_code == 422
    assert second_key.status_code == 409 and "already uploaded" in second_key.json()["detail"]
    with client.app.state.ctx.sessions() as session:
        assert session.execute(select(func.count()).select_from(Update)).scalar_one() == 1
        assert session.execute(select(func.count()).select_from(IdempotencyRecord)).scalar_one() == 1


def test_recording_the_same_request_twice_replays_its_response(client: TestClient, admin: dict, rng: np.random.Generator) -> None:
    # Prepare: the race the early checks cannot see, two copies of one request both validated
    (device, _, _), round_, _, _ = _setup(client, admin, rng)
    fields = {
        "round_id": round_["id"], "device_id": device.id, "blob_sha256": "0" * 64, "size_bytes": 10, "n_samples": 3, "metrics": {},
        "embedding_ciphertext": b"x", "idempotency_key": "same-key-123", "request_sha256": "a" * 64, "now": utcnow(),
    }
    # Execute
    with client.app.state.ctx.sessions() as session:
        first = uploads.record_update(session, **fields)
        second = uploads.record_update(session, **fields | {"now": utcnow()})
        other = fields | {"idempotency_key": "other-key-456", "request_sha256": "b" * 64}
        with pytest.raises(Conflict, match="already uploaded"):
            uploads.record_update(session, **other)
        rows = session.execute(select(func.count()).select_from(Update)).scalar_one()
    # Assert: the second gets the first's values, its time included, read back from what was stored
    assert first.created and first.status_code == 201 and first.accepted.accepted_at == fields["now"]
    assert not second.created and second.accepted == first.accepted and not second.due
    assert rows == 1


def test_a_replay_answers_the_bytes_of_the_first_response_also_from_a_record_stored_before_the_plain_values(
    client: TestClient, admin: dict, rng: np.random.Generator,
) -> None:
    # Prepare: an accepted upload
    (device, _, _), round_, _, base = _setup(client, admin, rng)
    body = update_file(make_delta(base, rng), unit_vector(rng), round_["base_version"], 7)
    first = device.upload(round_["id"], body, key="upload-key-0001")
    # Execute: a replay, then another after the record is rewritten as records were stored before (the 201's body itself)
    replay = device.upload(round_["id"], body, key="upload-key-0001")
    with client.app.state.ctx.sessions() as session, session.begin():
        stored = session.execute(select(IdempotencyRecord.response)).scalar_one()
        session.execute(update(IdempotencyRecord).values(response=first.json()))
    old_replay = device.upload(round_["id"], body, key="upload-key-0001")
    # Assert: the record holds the plain values, and both replays are the first response's bytes
    assert set(stored) == set(first.json()) and stored["update_id"] == first.json()["update_id"]
    assert first.status_code == replay.status_code == old_replay.status_code == 201
    assert replay.content == first.content and old_replay.content == first.content


def test_a_refused_upload_still_uses_up_its_nonce(client: TestClient, admin: dict, rng: np.random.Generator) -> None:
    # Prepare: a signed upload to a round that does not exist
    (device, _, _), _, _, _ = _setup(client, admin, rng)
    path, body = "/v1/rounds/999/updates", b"not even parsed"
    headers = {"X-Device-Id": device.id, "Idempotency-Key": "refused-0001", **sign(device.key, device.id, "POST", path, body)}
    # Execute
    first, replayed = client.post(path, content=body, headers=headers), client.post(path, content=body, headers=headers)
    # Assert
    assert first.status_code == 404
    assert replayed.status_code == 401 and "nonce" in replayed.json()["detail"]


def test_only_selected_devices_may_upload(client: TestClient, admin: dict, rng: np.random.Generator) -> None:
    # Prepare: target 2, three check in with no window: the third is not selected.
    devices, round_, answers, base = _setup(client, admin, rng)
    body = update_file(make_delta(base, rng), unit_vector(rng), round_["base_version"], 5)
    # Execute
    response = devices[2].upload(round_["id"], body)
    unknown_round = devices[0].upload(999, body)
    # Assert
    assert answers == ["selected", "selected", "not_selected"]
    assert response.status_code == 403
    assert unknown_round.status_code == 404


def test_half_precision_deltas_are_accepted(client: TestClient, admin: dict, rng: np.random.Generator) -> None:
    # Prepare
    (device, _, _), round_, _, base = _setup(client, admin, rng)
    delta = {k: v.astype(np.float16) if v.dtype.kind == "f" else v for k, v in make_delta(base, rng).items()}
    body = tensorfile.dumps(
        {f"backbone.{k}": v for k, v in delta.items()} | {"class_embedding": unit_vector(rng).astype(np.float16)},
        {"fedface": json.dumps({"base_version": round_["base_version"], "n_samples": 3})},
    )
    # Execute
    response = device.upload(round_["id"], body)
    # Assert
    assert response.status_code == 201, response.text


def test_unenrolled_device_cannot_upload_a_template(client: TestClient, admin: dict, rng: np.random.Generator) -> None:
    # Prepare: selected, then unenrolled before uploading.
    (device, _, _), round_, _, base = _setup(client, admin, rng)
    assert device.request("DELETE", f"/v1/devices/{device.id}").status_code == 204
    # Execute
    response = device.upload(round_["id"], update_file(make_delta(base, rng), unit_vector(rng), round_["base_version"], 5))
    # Assert
    assert response.status_code == 409 and "not enrolled" in response.json()["detail"]


def _hostile(header: bytes) -> bytes:
    return struct.pack("<Q", len(header)) + header + b"\0" * 8


def test_hostile_tensor_file_headers_are_422_not_500(client: TestClient, admin: dict, rng: np.random.Generator) -> None:
    # Prepare: the two headers that crashed the parser (RecursionError, int conversion limit), and their cousins
    (device, _, _), round_, _, _ = _setup(client, admin, rng)
    cases = {
        "100k nested [": _hostile(b"[" * 100_000),
        "5000-digit integer": _hostile(
            b'{"x": {"dtype": "F32", "shape": [' + b"9" * 5000 + b'], "data_offsets": [0, 8]}}'
        ),
        "list dtype": _hostile(b'{"x": {"dtype": ["F32"], "shape": [2], "data_offsets": [0, 8]}}'),
        "nested metadata": _hostile(b'{"__metadata__": {"fedface": "' + b"[" * 100_000 + b'"}}'),
    }
    # Execute
    answers = {name: device.upload(round_["id"], body) for name, body in cases.items()}
    # Assert: each a 422 with one short line
    assert {name: r.status_code for name, r in answers.items()} == {name: 422 for name in cases}
    assert all(len(r.json()["detail"]) < 300 for r in answers.values())
    assert "nested too deeply" in answers["100k nested ["].json()["detail"]


def test_a_body_other_than_the_signed_one_is_refused(client: TestClient, admin: dict, rng: np.random.Generator) -> None:
    # Prepare: a valid update signed with its hash, then sent with one byte changed; and one without the hash header
    (device, _, _), round_, _, base = _setup(client, admin, rng)
    body = update_file(make_delta(base, rng), unit_vector(rng), round_["base_version"], 5)
    path = f"/v1/rounds/{round_['id']}/updates"
    signed = {"X-Device-Id": device.id, **sign(device.key, device.id, "POST", path, body)}
    unsigned_hash = {k: v for k, v in signed.items() if k != "X-Content-SHA256"}
    # Execute
    tampered = body[:-1] + bytes([body[-1] ^ 1])
    swapped = client.post(path, content=tampered, headers={**signed, "Idempotency-Key": "swapped-0001"})
    no_hash = client.post(path, content=body, headers={**unsigned_hash, "Idempotency-Key": "no-hash-0001"})
    good = device.upload(round_["id"], body)
    # Assert
    assert swapped.status_code == 401 and "X-Content-SHA256" in swapped.json()["detail"]
    assert no_hash.status_code == 401 and "X-Content-SHA256" in no_hash.json()["detail"]
    assert good.status_code == 201


def test_a_selected_devices_chunked_upload_past_the_cap_is_413(
    client: TestClient, admin: dict, rng: np.random.Generator,
) -> None:
    # Prepare: no Content-Length, so only counting the stream can stop it
    (device, _, _), round_, _, _ = _setup(client, admin, rng)
    cap = client.app.state.ctx.settings.max_upload_bytes
    path = f"/v1/rounds/{round_['id']}/updates"

    def chunks():  # type: ignore[no-untyped-def]
        for _ in range(cap // 65536 + 2):
            yield b"x" * 65536

    signed = sign(device.key, device.id, "POST", path, b"x")
    headers = {"X-Device-Id": device.id, "Idempotency-Key": "chunked-0001", **signed}
    # Execute
    response = client.post(path, content=chunks(), headers=headers)
    # Assert
    assert response.status_code == 413
    with client.app.state.ctx.sessions() as session:
        assert session.execute(select(func.count()).select_from(Update)).scalar_one() == 0
