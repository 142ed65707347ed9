"""What the device reads from a server: bodies as the protocol defines them, paths on that server only."""
from __future__ import annotations

from pathlib import Path

import pytest

from device_sdk.device import FaceDevice
from device_sdk.errors import BadServerResponse, DeviceError
from device_sdk.link import server_body, server_path
from facecore.federation.messages import CheckinPublic
from facecore.federation.status import ParticipationStatus

CHECKIN = {
    "round_id": 7, "status": "selected", "deadline_at": "2026-12-01T20:00:00Z", "base_version": "a" * 64,
    "backbone_url": "/v1/models/x/backbone", "onnx_url": None, "embedding_url": "/v1/devices/d/embedding",
    "upload_url": "/v1/rounds/7/updates", "local": {"lr": 0.01},
}


def test_a_checkin_is_read_typed_and_a_field_a_newer_server_adds_is_ignored() -> None:
    # Execute
    checkin = server_body(CheckinPublic, {**CHECKIN, "something_new": 1})
    # Assert
    assert checkin.round_id == 7 and checkin.status == ParticipationStatus.SELECTED and checkin.secagg_url is None
    assert checkin.deadline_at.isoformat() == "2026-12-01T20:00:00+00:00"


@pytest.mark.parametrize(("body", "where"), [
    ({**CHECKIN, "status": "maybe"}, "status"), ({k: v for k, v in CHECKIN.items() if k != "round_id"}, "round_id"), ([], "the body"),
])
def test_a_malformed_body_is_one_clear_error_naming_the_field(body: object, where: str) -> None:
    # Execute / Assert
    with pytest.raises(BadServerResponse, match=f"CheckinPublic is malformed at {where}"):
        server_body(CheckinPublic, body)


def test_only_paths_on_the_same_server_are_followed() -> None:
    # Execute / Assert
    assert server_path("/v1/devices/d/embedding") == "/v1/devices/d/embedding"
    for url in ("https://elsewhere.example/v1/x", "/v1/../admin", None):
        with pytest.raises(BadServerResponse, match="not a path on it"):
            server_path(url)


def test_a_secure_member_floor_below_two_is_refused(tmp_path: Path) -> None:
    # Execute / Assert: refused at construction, before any round; nothing created
    with pytest.raises(DeviceError, match="min_secure_members must be at least 2"):
        FaceDevice("http://127.0.0.1:9", tmp_path / "device", min_secure_members=1)
    assert FaceDevice("http://127.0.0.1:9", tmp_path / "device", min_secure_members=5).min_secure_members == 5
    assert not (tmp_path / "device").exists()
