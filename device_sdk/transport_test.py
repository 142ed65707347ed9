"""A server refusal becomes the SDK exception its `code` names, whatever its `detail` says; without a
known code, only the HTTP status types it. A response body is read only up to its cap."""
from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from device_sdk.errors import BadServerResponse, DeviceError, NotEnrolled, RoundClosed, ServerRefused
from device_sdk.server_limits import MAX_MODEL_BYTES
from device_sdk.transport import Transport
from facecore.federation.protocol import ErrorCode

# Says the opposite of the codes below: a mapping that read the text would get these wrong.
MISLEADING = "round 3 is not accepting this request; device is not enrolled"


def _refused(body: dict[str, str]) -> ServerRefused:
    transport = Transport("http://fedface.invalid", retries=0)
    transport.http = httpx.Client(base_url="http://fedface.invalid",
                                  transport=httpx.MockTransport(lambda request: httpx.Response(409, json=body)))
    with pytest.raises(ServerRefused, match=r"^server refused the request \(409(, [a-z_]+)?\): " + re.escape(MISLEADING) + "$") as refused:
        transport.request("POST", "/v1/rounds/current/checkin", Ed25519PrivateKey.generate(), "d" * 32)
    return refused.value


@pytest.mark.parametrize(("code", "kind", "other"), [
    (ErrorCode.NOT_ENROLLED, NotEnrolled, RoundClosed),
    (ErrorCode.STALE_ROUND, RoundClosed, NotEnrolled),
])
def test_a_refusal_is_typed_by_its_code_not_its_text(code: ErrorCode, kind: type[Exception], other: type[Exception]) -> None:
    # Execute
    refused = _refused({"detail": MISLEADING, "code": code})
    # Assert
    assert isinstance(refused, kind) and not isinstance(refused, other)
    assert refused.status == 409 and refused.code == code and refused.detail == MISLEADING


@pytest.mark.parametrize("body", [{"detail": MISLEADING}, {"detail": MISLEADING, "code": "a_code_from_a_newer_server"}])
def test_without_a_known_code_only_the_status_types_a_refusal(body: dict[str, str]) -> None:
    # Execute
    refused = _refused(body)
    # Assert
    assert type(refused) is ServerRefused and refused.status == 409


class Endless(httpx.SyncByteStream):
    """A body that never ends, counting what the device pulled from it."""

    def __init__(self, chunk: int = 64 * 1024) -> None:
        self.chunk, self.pulled = b"\0" * chunk, 0

    def __iter__(self) -> Iterator[bytes]:
        while True:
            self.pulled += len(self.chunk)
            yield self.chunk


def _serving(response: Callable[[], httpx.Response], retries: int = 2) -> tuple[Transport, list[int]]:
    calls: list[int] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(1)
        return response()

    transport = Transport("http://fedface.invalid", retries=retries, backoff=0.0)
    transport.http = httpx.Client(base_url="http://fedface.invalid", transport=httpx.MockTransport(handler))
    return transport, calls


def test_an_endless_body_is_refused_once_it_passes_the_cap_and_not_asked_for_again() -> None:
    # Prepare: a 1 MiB cap, a server streaming zeros forever
    body = Endless()
    transport, calls = _serving(lambda: httpx.Response(200, stream=body))
    # Execute / Assert
    with pytest.raises(BadServerResponse, match=r"^the server's response to GET /v1/models/x/onnx is refused: it passed the "
                                                r"1048576-byte limit \(an endless or oversized body\); stopped reading$"):
        transport.request("GET", "/v1/models/x/onnx?dtype=fp16", Ed25519PrivateKey.generate(), "d" * 32, max_bytes=2**20)
    assert 2**20 < body.pulled <= 2**20 + len(body.chunk)
    assert len(calls) == 1  # a refusal is not retried


def test_a_body_that_declares_more_than_the_cap_is_refused_before_it_is_read() -> None:
    # Prepare
    body = Endless()
    transport, _ = _serving(lambda: httpx.Response(200, headers={"Content-Length": str(10 * 2**30)}, stream=body))
    # Execute / Assert
    with pytest.raises(BadServerResponse, match=f"its Content-Length {10 * 2**30} is over the {MAX_MODEL_BYTES}-byte limit$"):
        transport.request("GET", "/v1/models/x/backbone", Ed25519PrivateKey.generate(), "d" * 32)
    assert body.pulled == 0


def test_a_body_within_the_cap_is_read_whole_with_its_headers() -> None:
    # Prepare
    transport, _ = _serving(lambda: httpx.Response(200, headers={"X-Content-SHA256": "ab" * 32}, content=b"m" * 1000))
    # Execute
    response = transport.request("GET", "/v1/models/x/onnx", Ed25519PrivateKey.generate(), "d" * 32, max_bytes=1000)
    # Assert
    assert response.content == b"m" * 1000 and response.headers["X-Content-SHA256"] == "ab" * 32
    assert transport.bytes_down == 1000


def test_a_server_url_or_ca_file_that_cannot_be_used_is_one_error_naming_it(tmp_path: Path) -> None:
    # Prepare: a CA file that holds no certificate
    (tmp_path / "not-a-cert.pem").write_text("nope\n")
    # Execute / Assert: each named, before any request
    with pytest.raises(DeviceError, match=r"the server URL 'http://\[::1' is not a valid URL"):
        Transport("http://[::1")
    with pytest.raises(DeviceError, match=f"the CA certificate file {tmp_path}/missing.pem cannot be used: No such file"):
        Transport("https://127.0.0.1:9", verify=str(tmp_path / "missing.pem"))
    with pytest.raises(DeviceError, match="not-a-cert.pem cannot be used: .*no certificate"):
        Transport("https://127.0.0.1:9", verify=str(tmp_path / "not-a-cert.pem"))
