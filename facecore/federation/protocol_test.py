"""The wire protocol is pinned: the signed message layout byte for byte, one signature scheme that the
device SDK signs and the server verifies, and one error code per server domain error."""
from __future__ import annotations

import inspect
from types import SimpleNamespace

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat
from starlette.datastructures import Headers

from device_sdk.transport import signature_headers
from facecore.federation import protocol
from facecore.federation.protocol import ErrorCode, signing_message
from server_api import errors as server_errors
from server_api.errors import AuthenticationFailed, ServerError
from server_api.services import auth

EMPTY_SHA256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


def _server_sees(monkeypatch: pytest.MonkeyPatch, key: Ed25519PrivateKey, device_id: str) -> list[str]:
    """The server's device lookup and nonce store, without a database; returns the nonces it used up."""
    public = key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    used: list[str] = []
    known = SimpleNamespace(id=device_id, public_key=public)
    monkeypatch.setattr(auth.device_crud, "get_device", lambda session, wanted: known if wanted == device_id else None)
    monkeypatch.setattr(auth.device_crud, "consume_nonce", lambda session, subject, nonce, commit=True: used.append(nonce))
    return used


def test_the_signed_message_layout_is_fixed() -> None:
    # Execute
    message = signing_message("0123abcd", "post", "/v1/rounds/7/updates?dtype=fp16", "1700000000", "nonce-nonce-nonce-1", EMPTY_SHA256)
    # Assert: a change here breaks every deployed device
    assert message == (
        b"FEDFACE-V1\n0123abcd\nPOST\n/v1/rounds/7/updates?dtype=fp16\n1700000000\nnonce-nonce-nonce-1\n"
        b"e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    )
    assert protocol.body_sha256(b"") == EMPTY_SHA256


def test_a_request_the_sdk_signs_passes_the_servers_check(monkeypatch: pytest.MonkeyPatch) -> None:
    # Prepare
    key, device_id, path, body = Ed25519PrivateKey.generate(), "d" * 32, "/v1/models/abc/backbone?dtype=fp16", b'{"x": 1}'
    used = _server_sees(monkeypatch, key, device_id)
    headers = Headers(signature_headers(key, device_id, "GET", path, body))
    # Execute
    device = auth.authenticate_device(None, auth.SignedRequest(headers, "GET", path, protocol.body_sha256(body)), window_s=300)  # type: ignore[arg-type]
    # Assert
    assert device.id == device_id and used == [headers[protocol.NONCE_HEADER]]
    assert headers[protocol.CONTENT_SHA256_HEADER] == protocol.body_sha256(body)


def test_the_server_refuses_a_signature_over_another_path_or_body(monkeypatch: pytest.MonkeyPatch) -> None:
    # Prepare
    key, device_id = Ed25519PrivateKey.generate(), "e" * 32
    used = _server_sees(monkeypatch, key, device_id)
    headers = Headers(signature_headers(key, device_id, "POST", "/v1/rounds/1/updates", b"body"))
    # Execute
    other_path = auth.SignedRequest(headers, "POST", "/v1/rounds/2/updates", protocol.body_sha256(b"body"))
    other_body = auth.SignedRequest(headers, "POST", "/v1/rounds/1/updates", protocol.body_sha256(b"other"))
    # Assert: and a forged request burns no nonce
    for request in (other_path, other_body):
        with pytest.raises(AuthenticationFailed, match="bad request signature"):
            auth.authenticate_device(None, request, window_s=300)  # type: ignore[arg-type]
    assert used == []


def test_registration_is_signed_for_the_register_subject_without_a_device_id(monkeypatch: pytest.MonkeyPatch) -> None:
    # Prepare
    key = Ed25519PrivateKey.generate()
    public = key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
    monkeypatch.setattr(auth.device_crud, "consume_nonce", lambda session, subject, nonce, commit=True: None)
    body = b'{"public_key": "..."}'
    # Execute
    headers = signature_headers(key, None, "POST", "/v1/devices", body)
    # Assert
    assert protocol.DEVICE_ID_HEADER not in headers
    auth.verify_registration(None, public, Headers(headers), "POST", "/v1/devices", protocol.body_sha256(body), 300)  # type: ignore[arg-type]


def test_error_codes_are_unique_and_every_server_error_class_has_its_own() -> None:
    # Prepare
    classes = [c for _, c in inspect.getmembers(server_errors, inspect.isclass) if issubclass(c, ServerError)]
    # Execute
    codes = {c: c.__dict__.get("code") for c in classes}
    # Assert
    assert len({code.value for code in ErrorCode}) == len(ErrorCode)
    assert all(isinstance(code, ErrorCode) for code in codes.values()), {c.__name__: code for c, code in codes.items()}
    assert len(set(codes.values())) == len(classes), "two domain errors share a code: clients could not tell them apart"
