"""Fuzzing past authentication: every request is signed as a registered, enrolled, selected
device, so the parsing behind the signature check is what gets fuzzed, on a real server process.

- every device operation of the server's own OpenAPI document (schemathesis), half the time with
  the path naming the signing device, the open round and the current model, and an
  Idempotency-Key on uploads;
- upload bodies (hypothesis): random bytes, and valid update files with a mutated header,
  flipped bytes, a wrong header length or a cut tail;
- the secure-aggregation steps' bodies (hypothesis) in a secure round: any JSON, hostile JSON, and
  adverts, shares and unmasking answers of the wrong size, encoding or kind.

No answer may be a 5xx and the server may log no error. The run is bounded by the example counts
below (the test asserts how many requests it made).
"""
from __future__ import annotations

import base64
import json
import secrets
import struct
from collections.abc import Iterator
from typing import Any

import httpx
import numpy as np
import pytest
import requests
import schemathesis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from server_process import ServerProcess
from server_testkit import Device, load_backbone_bytes, make_delta, sign, unit_vector, update_file

N_DEVICES = 12
EXAMPLES_PER_OPERATION = 20
UPLOAD_EXAMPLES = 400
NO_LIMITS = {"FEDFACE_DEVICE_RATE_PER_S": "0", "FEDFACE_ADDRESS_RATE_PER_S": "0", "FEDFACE_LOG_LEVEL": "WARNING"}
_FUZZ = settings(deadline=None, suppress_health_check=list(HealthCheck), database=None)
_HOSTILE_JSON = [
    b"[" * 100_000, b"9" * 5000, b"-" + b"7" * 4400, b"1e999", b"NaN", b'"\\ud800"', b"{" * 50_000, b"0" * 3000 + b".5",
]
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70) | st.floats() | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)


class Fleet:
    """Selected devices in an open round; a device whose upload is accepted is retired, since a
    second upload of the same round stops at 409 before its body is parsed, and one the fuzzer
    unenrolled enrolls again."""

    def __init__(self, server: ServerProcess) -> None:
        self.server, self.http = server, httpx.Client(base_url=server.url, timeout=30)
        self.devices = [Device(self.http) for _ in range(N_DEVICES)]
        for index, device in enumerate(self.devices):
            assert device.register().status_code == 201
            assert device.enroll(unit_vector(np.random.default_rng(index))).status_code == 201
        admin = {"Authorization": f"Bearer {server.admin_token()}"}
        config = {"target_participants": 100, "min_participants": 1, "deadline_s": 900, "selection_window_s": 0}
        opened = self.http.post("/v1/admin/rounds", json=config, headers=admin).json()
        self.round_id, self.version = opened["id"], opened["base_version"]
        assert {d.checkin().json()["status"] for d in self.devices} == {"selected"}
        base = load_backbone_bytes(self.devices[0].backbone(self.version).content)
        rng = np.random.default_rng(0)
        self.valid = update_file(make_delta(base, rng), unit_vector(rng), self.version, 5)
        self.statuses: list[int] = []

    @property
    def device(self) -> Device:
        assert self.devices, "every device got an upload accepted: raise N_DEVICES"
        return self.devices[len(self.statuses) % len(self.devices)]

    def record(self, device: Device, response: Any, what: str) -> None:
        self.statuses.append(response.status_code)
        assert response.status_code < 500, f"{what}: {response.status_code} {response.text[:300]}"
        if response.status_code == 201 and "/updates" in what and device in self.devices:
            self.devices.remove(device)
        if response.status_code == 204 and what.startswith("DELETE"):  # unenrolled: enroll again, still selected
            assert device.enroll(unit_vector(np.random.default_rng(len(self.statuses)))).status_code == 201


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    server = ServerProcess(tmp_path_factory.mktemp("fuzz") / "data", **NO_LIMITS).start()
    try:
        yield Fleet(server)
    finally:
        server.stop()
    assert "ERROR" not in server.log.read_text(errors="replace")


def _send_signed(device: Device, prepared: requests.PreparedRequest, session: requests.Session) -> requests.Response:
    body = prepared.body.encode() if isinstance(prepared.body, str) else (prepared.body or b"")
    prepared.body = body
    if body:
        prepared.headers["Content-Length"] = str(len(body))
    registering = prepared.path_url.split("?")[0] == "/v1/devices" and prepared.method == "POST"
    subject = "register" if registering else device.id
    prepared.headers.update(sign(device.key, subject or "register", prepared.method or "GET", prepared.path_url, body))
    if subject != "register":
        prepared.headers["X-Device-Id"] = device.id or ""
    return session.send(prepared, timeout=30)


def test_the_fuzzer_signs_like_a_device(fleet: Fleet) -> None:
    # Prepare: a plain signed GET through the same path as the fuzzed ones
    device = fleet.devices[-1]
    prepared = requests.Request("GET", f"{fleet.server.url}/v1/devices/{device.id}").prepare()
    # Execute
    response = _send_signed(device, prepared, requests.Session())
    # Assert: without this, every fuzzed request could be stopping at 401
    assert response.status_code == 200 and response.json()["device_id"] == device.id


@pytest.mark.slow
def test_signed_requests_the_schema_allows_never_make_the_server_fail(fleet: Fleet) -> None:
    # Prepare: the published schema's device operations (admin ones are fuzzed with the token elsewhere)
    schema = schemathesis.openapi.from_url(fleet.server.url + "/openapi.json")
    operations = [r.ok() for r in schema.get_all_operations()]
    operations = [op for op in operations if op.path.startswith("/v1/") and not op.path.startswith("/v1/admin")]
    session = requests.Session()
    before = len(fleet.statuses)

    # Execute: every operation, each request signed by the current device
    for operation in operations:
        @settings(_FUZZ, max_examples=EXAMPLES_PER_OPERATION)
        @given(case=operation.as_strategy(), own=st.booleans())
        def call(case, own: bool) -> None:  # type: ignore[no-untyped-def]
            device = fleet.device
            if own:  # past the ownership and round checks, into the parsing
                own_ids = {"device_id": device.id, "round_id": fleet.round_id, "version": fleet.version}
                case.path_parameters = {k: own_ids.get(k, v) for k, v in (case.path_parameters or {}).items()}
            kwargs = case.as_transport_kwargs(base_url=fleet.server.url)
            if own and "/updates" in case.path:
                kwargs["headers"]["Idempotency-Key"] = secrets.token_hex(12)
            prepared = requests.Request(**kwargs).prepare()
            # Assert (in record): below 500
            fleet.record(device, _send_signed(device, prepared, session), f"{case.method} {case.formatted_path}")

        call()

    # Assert: the run was the size this test claims
    assert len(operations) >= 10 and len(fleet.statuses) - before >= 5 * len(operations)


def _mutated_header(valid: bytes, data: st.DataObject) -> bytes:
    (length,) = struct.unpack("<Q", valid[:8])
    header, payload = json.loads(valid[8 : 8 + length]), valid[8 + length :]
    name = data.draw(st.sampled_from(sorted(header)))
    how = data.draw(st.sampled_from(["replace entry", "replace field", "drop field", "add tensor", "metadata"]))
    if how == "replace entry":
        header[name] = data.draw(_JSON)
    elif how == "replace field" and isinstance(header[name], dict):
        header[name][data.draw(st.sampled_from(sorted(header[name])))] = data.draw(_JSON)
    elif how == "drop field" and isinstance(header[name], dict):
        header[name].pop(data.draw(st.sampled_from(sorted(header[name]))))
    elif how == "add tensor":
        header[data.draw(st.text(max_size=20))] = data.draw(_JSON)
    else:
        header["__metadata__"] = {"fedface": data.draw(st.text(max_size=200) | _JSON.map(json.dumps))}
    encoded = json.dumps(header).encode()
    return struct.pack("<Q", len(encoded)) + encoded + payload


def _upload_bodies(valid: bytes) -> st.SearchStrategy[bytes]:
    @st.composite
    def mutated(draw: st.DrawFn) -> bytes:
        body = bytearray(valid)
        kind = draw(st.sampled_from(["header", "hostile", "flip", "length", "truncate"]))
        if kind == "header":
            return _mutated_header(valid, draw(st.data()))
        if kind == "hostile":  # JSON text no Python value serialises to: the audit's two 500s and their kin
            fragment = draw(st.sampled_from(_HOSTILE_JSON))
            header = b'{"x": {"dtype": "F32", "shape": [' + fragment + b'], "data_offsets": [0, 4]}}'
            return struct.pack("<Q", len(header)) + header + b"\0" * 4
        if kind == "flip":
            (length,) = struct.unpack("<Q", valid[:8])
            for _ in range(draw(st.integers(1, 8))):  # mostly the header: data flips mostly still parse
                body[draw(st.integers(0, 8 + length + 64))] ^= draw(st.integers(1, 255))
            return bytes(body)
        if kind == "length":
            return struct.pack("<Q", draw(st.integers(0, 2**64 - 1))) + bytes(body[8:])
        return bytes(body[: draw(st.integers(0, len(body) - 1))])

    return st.binary(max_size=4096) | mutated()


@pytest.mark.slow
def test_random_and_mutated_update_files_never_make_the_server_fail(fleet: Fleet) -> None:
    # Prepare
    path = f"/v1/rounds/{fleet.round_id}/updates"
    before = len(fleet.statuses)

    # Execute: each body uploaded, signed, by a selected device
    @settings(_FUZZ, max_examples=UPLOAD_EXAMPLES)
    @given(body=_upload_bodies(fleet.valid))
    def upload(body: bytes) -> None:
        device = fleet.device
        # Assert (in record): below 500
        fleet.record(device, device.upload(fleet.round_id, body), f"POST {path} ({len(body)} bytes)")

    upload()
    # Assert: the run was the size this test claims, and the parser refused nearly all of it with 422
    statuses = fleet.statuses[before:]
    assert len(statuses) >= UPLOAD_EXAMPLES - 10
    assert statuses.count(422) >= 0.8 * len(statuses), {code: statuses.count(code) for code in set(statuses)}


SECAGG_EXAMPLES = 300


@pytest.fixture(scope="module")
def secure_round(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServerProcess, list[Device], int]]:
    """A server whose open round runs secure aggregation, held at its advertise step, with selected devices."""
    server = ServerProcess(tmp_path_factory.mktemp("fuzz_secagg") / "data", **NO_LIMITS).start()
    try:
        http = httpx.Client(base_url=server.url, timeout=30)
        devices = [Device(http) for _ in range(N_DEVICES)]
        for index, device in enumerate(devices):
            assert device.register().status_code == 201
            assert device.enroll(unit_vector(np.random.default_rng(index))).status_code == 201
        config = {"target_participants": N_DEVICES, "min_participants": 2, "deadline_s": 1800, "selection_window_s": 0,
                  "secure_aggregation": {"enabled": True, "key_phase_s": 600, "unmask_phase_s": 600}}
        opened = http.post("/v1/admin/rounds", json=config, headers={"Authorization": f"Bearer {server.admin_token()}"}).json()
        assert {d.checkin().json()["status"] for d in devices} == {"selected"}
        yield server, devices, opened["id"]
    finally:
        server.stop()
    assert "ERROR" not in server.log.read_text(errors="replace")


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def _secagg_bodies() -> st.SearchStrategy[bytes]:
    """Bodies for the three secure-aggregation steps: any JSON, JSON no Python value serialises to, and
    well-formed messages with keys, shares or answers of the wrong size, encoding or kind."""
    key = st.binary(max_size=40).map(_b64) | st.text(max_size=50) | _JSON
    index = st.integers(-(2**70), 2**70).map(str) | st.text(max_size=10)
    advert = st.fixed_dictionaries({"c_public": key, "s_public": key})
    shares = st.fixed_dictionaries({"shares": st.dictionaries(index, key, max_size=6) | _JSON})
    answer = st.dictionaries(index, st.integers(-(2**600), 2**600).map(str) | st.text(max_size=20), max_size=6)
    unmask = st.fixed_dictionaries({"s": answer | _JSON, "b": answer | _JSON})
    messages = (advert | shares | unmask | _JSON).map(lambda value: json.dumps(value).encode())
    return messages | st.sampled_from(_HOSTILE_JSON) | st.binary(max_size=512)


@pytest.mark.slow
def test_mutated_secure_aggregation_bodies_never_make_the_server_fail(secure_round: tuple[ServerProcess, list[Device], int]) -> None:
    # Prepare
    _, devices, round_id = secure_round
    statuses: list[int] = []

    # Execute: each body posted, signed by a selected member-to-be, to one of the three steps
    @settings(_FUZZ, max_examples=SECAGG_EXAMPLES)
    @given(body=_secagg_bodies(), step=st.sampled_from(["advert", "shares", "unmask"]), who=st.integers(0, N_DEVICES - 1))
    def post(body: bytes, step: str, who: int) -> None:
        response = devices[who].request("POST", f"/v1/rounds/{round_id}/secagg/{step}", body, headers={"Content-Type": "application/json"})
        statuses.append(response.status_code)
        # Assert: below 500
        assert response.status_code < 500, f"{step}: {response.status_code} {response.text[:300]}"

    post()
    # Assert: the run was the size this test claims; every answer a refusal of the input or of the step, but for
    # at most one accepted advert per device
    counts = {code: statuses.count(code) for code in set(statuses)}
    assert len(statuses) >= SECAGG_EXAMPLES - 10
    assert set(counts) <= {201, 400, 403, 409, 422} and counts.get(201, 0) <= N_DEVICES, counts
    assert counts.get(422, 0) >= 0.8 * len(statuses), counts
