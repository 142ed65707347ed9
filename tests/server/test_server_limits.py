"""Abuse limits of a real `fedface server` process, measured over loopback sockets: uploads are
refused before their body, per-device and per-address rate limits (429), the cap on uploads in
flight (503), the body read timeout (408), the abandoned-upload log line, and 0700/0600 data.

Every limit is set small through FEDFACE_* variables so each test stays within seconds. A test
that needs its own client address sends X-Forwarded-For, which the server believes from 127.0.0.1
only because FEDFACE_FORWARDED_ALLOW_IPS lists it (test_server_forwarded.py: none by default).
"""
from __future__ import annotations

import secrets
import socket
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from server_process import ServerProcess
from server_testkit import Device, load_backbone_bytes, make_delta, sign, unit_vector, update_file

DEVICE_BURST, ADDRESS_BURST, UPLOAD_SLOTS, BODY_TIMEOUT_S, UPLOAD_CAP = 8, 10, 2, 4.0, 4 << 20
LIMITS = {
    "FEDFACE_DEVICE_RATE_PER_S": "1", "FEDFACE_DEVICE_BURST": str(DEVICE_BURST),
    "FEDFACE_ADDRESS_RATE_PER_S": "0.5", "FEDFACE_ADDRESS_BURST": str(ADDRESS_BURST),
    "FEDFACE_MAX_CONCURRENT_UPLOADS": str(UPLOAD_SLOTS), "FEDFACE_UPLOAD_BODY_TIMEOUT_S": str(BODY_TIMEOUT_S),
    "FEDFACE_MAX_UPLOAD_BYTES": str(UPLOAD_CAP), "FEDFACE_LOG_LEVEL": "INFO",
    "FEDFACE_FORWARDED_ALLOW_IPS": "127.0.0.1",  # the tests' loopback client plays the reverse proxy
}


class Round:
    """The module's open round (target far above what the tests upload, so it stays open)."""

    def __init__(self, server: ServerProcess) -> None:
        self.server = server
        admin = {"Authorization": f"Bearer {server.admin_token()}"}
        config = {"target_participants": 50, "min_participants": 1, "deadline_s": 900, "selection_window_s": 0}
        opened = httpx.post(server.url + "/v1/admin/rounds", json=config, headers=admin, timeout=30)
        assert opened.status_code == 201, opened.text
        self.id, self.version = opened.json()["id"], opened.json()["base_version"]
        loader = self.device("10.0.0.1", checkin=False)
        self.base = load_backbone_bytes(loader.backbone(self.version).content)

    def device(self, address: str, checkin: bool = True) -> Device:
        """A registered, enrolled device calling from ``address``, selected unless ``checkin`` is False."""
        device = Device(httpx.Client(base_url=self.server.url, timeout=30, headers={"X-Forwarded-For": address}))
        assert device.register().status_code == 201
        assert device.enroll(unit_vector(np.random.default_rng(len(address)))).status_code == 201
        if checkin:
            assert device.checkin().json()["status"] == "selected"
        return device

    def update(self, seed: int) -> bytes:
        rng = np.random.default_rng(seed)
        return update_file(make_delta(self.base, rng), unit_vector(rng), self.version, 5)


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    process = ServerProcess(tmp_path_factory.mktemp("limits") / "data", **LIMITS).start()
    try:
        yield process
    finally:
        process.stop()


@pytest.fixture(scope="module")
def round_(server: ServerProcess) -> Round:
    return Round(server)


class RawUpload:
    """An upload over a bare socket, so a test controls when (and whether) each body byte goes out."""

    def __init__(self, server: ServerProcess, device: Device, path: str, body: bytes, address: str) -> None:
        headers = {
            "Host": f"127.0.0.1:{server.port}", "Content-Type": "application/octet-stream",
            "Content-Length": str(len(body)),
            "Idempotency-Key": secrets.token_hex(12), "X-Forwarded-For": address, "X-Device-Id": device.id or "",
            **sign(device.key, device.id or "register", "POST", path, body),
        }
        self.body = body
        self.sock = socket.create_connection(("127.0.0.1", server.port), timeout=30)
        lines = [f"POST {path} HTTP/1.1", *(f"{k}: {v}" for k, v in headers.items()), "", ""]
        self.sock.sendall("\r\n".join(lines).encode())

    def send(self, part: slice) -> None:
        self.sock.sendall(self.body[part])

    def response(self, timeout: float = 30) -> tuple[int, dict[str, str]]:
        """Status and headers of the server's answer (read without sending anything more)."""
        self.sock.settimeout(timeout)
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = self.sock.recv(65536)
            if not chunk:
                break
            data += chunk
        head = data.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
        fields = dict(line.split(": ", 1) for line in head[1:] if ": " in line)
        return int(head[0].split()[1]), {k.lower(): v for k, v in fields.items()}

    def close(self) -> None:
        self.sock.close()


def until_refused(call: Callable[[], httpx.Response], most: int = 40) -> tuple[list[httpx.Response], float]:
    """Call until the first 429 (or ``most`` calls): the answers and the seconds they took."""
    started, answers = time.perf_counter(), [call()]
    while answers[-1].status_code != 429 and len(answers) < most:
        answers.append(call())
    return answers, time.perf_counter() - started


def test_uploads_are_refused_before_their_body_is_read(server: ServerProcess, round_: Round) -> None:
    # Prepare: an upload just under the cap announced by an unknown key, and one by a registered device that was
    # never selected
    stranger = Device(httpx.Client(base_url=server.url))
    stranger.id = "0" * 32
    unselected = round_.device("10.1.0.1", checkin=False)
    path, body = f"/v1/rounds/{round_.id}/updates", b"\0" * (UPLOAD_CAP - 1)
    # Execute: only the headers go out; the answer must come without a single body byte
    started = time.perf_counter()
    answers = []
    for device in (stranger, unselected):
        upload = RawUpload(server, device, path, body, "10.1.0.2")
        answers.append(upload.response(timeout=10)[0])
        upload.close()
    elapsed = time.perf_counter() - started
    # Assert
    assert answers == [401, 403]
    assert elapsed < 10, f"refusals took {elapsed:.2f} s"


def test_a_device_past_its_burst_gets_429_with_retry_after(server: ServerProcess, round_: Round) -> None:
    # Prepare: a fresh device (registration and enrollment spent 1 of its tokens)
    device = round_.device("10.2.0.1", checkin=False)
    # Execute
    answers, elapsed = until_refused(lambda: device.request("GET", f"/v1/devices/{device.id}"))
    refused = answers[-1]
    time.sleep(int(refused.headers["retry-after"]))
    after_wait = device.request("GET", f"/v1/devices/{device.id}")
    # Assert: the burst minus enrollment's token (and what 1/s refilled meanwhile) passes, then a retry time that works
    codes = [r.status_code for r in answers]
    assert codes[: DEVICE_BURST - 1] == [200] * (DEVICE_BURST - 1) and codes[-1] == 429, codes
    assert codes.count(200) <= DEVICE_BURST + elapsed, codes
    assert 1 <= int(refused.headers["retry-after"]) <= 2 and "device" in refused.json()["detail"]
    assert after_wait.status_code == 200


def test_an_address_past_its_burst_gets_429_for_registrations_and_failed_signatures(server: ServerProcess) -> None:
    # Prepare: anonymous registrations from one address, unsigned calls from another
    def register(address: str) -> httpx.Response:
        return Device(httpx.Client(base_url=server.url, headers={"X-Forwarded-For": address})).register()

    unsigned = httpx.Client(base_url=server.url, headers={"X-Forwarded-For": "10.3.0.2"})

    # Execute
    registrations, registering_s = until_refused(lambda: register("10.3.0.1"))
    forged, _ = until_refused(lambda: unsigned.get(f"/v1/devices/{'0' * 32}"))
    other_address = register("10.3.0.3").status_code
    # Assert: the burst (and what the rate refilled meanwhile) is served, then a 429 that says when to retry
    codes = [r.status_code for r in registrations]
    assert codes[:ADDRESS_BURST] == [201] * ADDRESS_BURST and codes[-1] == 429, codes
    assert codes.count(201) <= ADDRESS_BURST + registering_s * 0.5 + 1, codes
    assert int(registrations[-1].headers["retry-after"]) in (1, 2) and "address" in registrations[-1].json()["detail"]
    assert [r.status_code for r in forged][:ADDRESS_BURST] == [401] * ADDRESS_BURST and forged[-1].status_code == 429
    assert other_address == 201


def test_uploads_past_the_concurrency_cap_get_503_and_succeed_later(server: ServerProcess, round_: Round) -> None:
    # Prepare: UPLOAD_SLOTS selected devices start uploading and stall mid-body; one more device is ready
    stalled = [round_.device(f"10.4.0.{i}") for i in range(UPLOAD_SLOTS)]
    late = round_.device("10.4.1.1")
    path = f"/v1/rounds/{round_.id}/updates"
    uploads = [RawUpload(server, device, path, round_.update(i), f"10.4.0.{i}") for i, device in enumerate(stalled)]
    for upload in uploads:
        upload.send(slice(0, 1000))
    time.sleep(1.5)  # both are past their checks and holding a slot
    body = round_.update(99)
    # Execute
    refused = late.upload(round_.id, body, key="late-upload-01")
    for upload in uploads:
        upload.send(slice(1000, None))
    finished = [upload.response()[0] for upload in uploads]
    retried = late.upload(round_.id, body, key="late-upload-01")
    # Assert
    assert refused.status_code == 503 and int(refused.headers["retry-after"]) >= 1, refused.text
    assert finished == [201] * UPLOAD_SLOTS
    assert retried.status_code == 201, retried.text


def test_a_selected_devices_chunked_upload_past_the_cap_gets_413(server: ServerProcess, round_: Round) -> None:
    # Prepare: no Content-Length, so only counting the stream can stop it
    device = round_.device("10.7.0.1")
    path = f"/v1/rounds/{round_.id}/updates"

    def chunks() -> Iterator[bytes]:
        for _ in range(UPLOAD_CAP // 65536):
            yield b"\0" * 65536
        yield b"\0"

    signed = sign(device.key, device.id or "", "POST", path, b"")
    headers = {"X-Device-Id": device.id or "", "Idempotency-Key": "chunked-0001", **signed}
    # Execute
    response = device.http.post(path, content=chunks(), headers=headers)
    # Assert
    assert response.status_code == 413


def test_a_body_slower_than_the_timeout_gets_408_and_a_closed_connection(server: ServerProcess, round_: Round) -> None:
    # Prepare: a selected device sends half its body, then nothing
    device = round_.device("10.5.0.1")
    upload = RawUpload(server, device, f"/v1/rounds/{round_.id}/updates", round_.update(5), "10.5.0.1")
    upload.send(slice(0, len(upload.body) // 2))
    started = time.perf_counter()
    # Execute
    status, headers = upload.response(timeout=BODY_TIMEOUT_S + 10)
    waited = time.perf_counter() - started
    upload.close()
    # Assert: answered at the timeout, not before and not much after
    assert status == 408 and headers.get("connection") == "close"
    assert BODY_TIMEOUT_S - 1 < waited < BODY_TIMEOUT_S + 5, f"408 after {waited:.2f} s"


def test_an_abandoned_upload_is_logged_by_the_server(server: ServerProcess, round_: Round) -> None:
    # Prepare
    device = round_.device("10.6.0.1")
    upload = RawUpload(server, device, f"/v1/rounds/{round_.id}/updates", round_.update(6), "10.6.0.1")
    upload.send(slice(0, 5000))
    time.sleep(0.5)
    # Execute: the phone loses its network
    upload.close()
    deadline, logged = time.monotonic() + 10, False
    while not logged and time.monotonic() < deadline:
        time.sleep(0.2)
        logged = device.id in _lines_with(server.log, "upload abandoned mid-body")
    # Assert
    assert logged


def _lines_with(log: Path, text: str) -> str:
    return "\n".join(line for line in log.read_text(errors="replace").splitlines() if text in line)


def test_server_data_is_private_to_its_user(server: ServerProcess, round_: Round) -> None:
    # Prepare: the round above stored model blobs and uploads; the database has its WAL
    data = server.data_dir
    # Execute
    folders = [data, *(p for p in data.rglob("*") if p.is_dir())]
    files = [p for p in data.rglob("*") if p.is_file()]
    # Assert: nothing readable, writable or searchable by group or others
    assert (data / "fedface.db") in files and any(p.parent.parent.name == "objects" for p in files)
    modes = {p: stat.S_IMODE(p.stat().st_mode) for p in folders + files}
    assert {str(p): oct(modes[p]) for p in folders if modes[p] != 0o700} == {}
    assert {str(p): oct(modes[p]) for p in files if modes[p] & 0o077} == {}
