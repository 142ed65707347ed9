"""FaceDevice against a hostile round server: a real HTTP server on loopback (http.server in a thread)
that answers the device's requests with what the audit of issue 36 found the device accepted: a crop
of 10^6 pixels, an embedding size of 10^9, an endless download, NaN or int8 weights. Each is refused
with one BadServerResponse line naming the field and the limit, before it costs memory or time."""
from __future__ import annotations

import hashlib
import io
import json
import re
import resource
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import numpy as np
import pytest
import torch

from device_sdk.device import FaceDevice
from device_sdk.errors import BadServerResponse, ServerRefused
from device_sdk.server_limits import MAX_MODEL_BYTES
from device_sdk.state import KEY_ENV
from facecore.align.geometry import ARCFACE_112
from facecore.models.registry import get_backbone

VERSION = "ab" * 32
OTHER_VERSION = "cd" * 32
DEVICE_ID = "0d" * 16
ENDLESS = object()  # a body that goes on (up to 4x the cap, so that a device without one still ends)
ENDLESS_LIMIT = 4 * MAX_MODEL_BYTES
CHUNK = b"\0" * 2**20


def _description(version: str = VERSION, **changes: Any) -> dict[str, Any]:
    """A `/v1/models/current` body (server_api.schemas.ModelVersionPublic)."""
    return {"version": version, "backbone": "mobilefacenet_s", "embedding_dim": 128, "face_geometry": ARCFACE_112.to_json(),
            "round_id": None, "created_at": "2026-01-01T00:00:00Z", "backbone_url": f"/v1/models/{version}/backbone",
            "onnx_url": f"/v1/models/{version}/onnx", "verify_threshold": 0.5, "verify_far": 0.001} | changes


def _checkin(version: str) -> dict[str, Any]:
    return {"round_id": 1, "status": "selected", "deadline_at": "2030-01-01T00:00:00Z", "base_version": version,
            "backbone_url": f"/v1/models/{version}/backbone", "onnx_url": None,
            "embedding_url": f"/v1/devices/{DEVICE_ID}/embedding", "upload_url": "/v1/rounds/1/updates", "local": {}}


def _backbone_file(embedding_dim: int | None = None, poison: Any = None) -> bytes:
    """A backbone file as the server writes it (fp16), its header's embedding_dim or one weight changed."""
    torch.manual_seed(0)
    model = get_backbone("mobilefacenet_s")
    state = {k: v.half() if v.is_floating_point() else v for k, v in model.state_dict().items()}
    if poison is not None:
        name = next(k for k, v in state.items() if v.is_floating_point() and k.endswith("weight"))
        state[name] = poison(state[name])
    payload = {"format": "fedface-backbone/1", "backbone": "mobilefacenet_s",
               "embedding_dim": embedding_dim or model.embedding_dim, "state_dict": state, "meta": {}}
    buffer = io.BytesIO()
    torch.save(payload, buffer)
    return buffer.getvalue()


class HostileServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        self.reset()

    def reset(self) -> None:
        self.description: dict[str, Any] = _description()
        self.checkin: dict[str, Any] = _checkin(VERSION)
        self.files: dict[str, Any] = {}  # path -> bytes or ENDLESS
        self.sent: dict[str, int] = {}  # path -> bytes of an endless body written so far
        self.hung_up: dict[str, threading.Event] = {}  # path -> set once its endless body stopped
        self.asked: list[str] = []


class Handler(BaseHTTPRequestHandler):
    server: HostileServer

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002  # http.server's signature
        pass

    def _json(self, status: int, body: object) -> None:
        data = json.dumps(body).encode()  # NaN stays NaN, as Python's json writes it
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _answer(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        path = urlsplit(self.path).path
        self.server.asked.append(f"{self.command} {path}")
        if (self.command, path) == ("POST", "/v1/devices"):
            return self._json(201, {"device_id": DEVICE_ID})
        if (self.command, path) == ("GET", "/v1/models/current"):
            return self._json(200, self.server.description)
        if (self.command, path) == ("POST", "/v1/rounds/current/checkin"):
            return self._json(200, self.server.checkin)
        body = self.server.files.get(path)
        if self.command != "GET" or body is None:
            return self._json(404, {"detail": "not found"})
        self.send_response(200)
        self.send_header("Content-Type", "application/octet-stream")
        if body is ENDLESS:  # no Content-Length: the body ends when the connection does
            self.end_headers()
            return self._stream(path)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-Content-SHA256", hashlib.sha256(body).hexdigest())  # the hostile server vouches for its own bytes
        self.end_headers()
        self.wfile.write(body)
        return None

    def _stream(self, path: str) -> None:
        sent, stopped = 0, self.server.hung_up.setdefault(path, threading.Event())
        try:
            while sent < ENDLESS_LIMIT:
                self.wfile.write(CHUNK)
                sent += len(CHUNK)
                self.server.sent[path] = sent
        except (BrokenPipeError, ConnectionResetError):
            pass  # the device hung up
        finally:
            stopped.set()

    do_GET = do_POST = do_PUT = do_DELETE = _answer


@pytest.fixture(scope="module")
def hostile() -> Iterator[HostileServer]:
    server = HostileServer()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join(timeout=10)


@pytest.fixture
def device(hostile: HostileServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> FaceDevice:
    """A registered device of this server, with an enrolled owner (faces and template held locally)."""
    monkeypatch.delenv(KEY_ENV, raising=False)
    hostile.reset()
    device = FaceDevice(hostile.url, tmp_path / "device", retries=0, timeout=30)
    device.register()
    device.state.save_faces(np.zeros((3, *ARCFACE_112.row_shape), np.uint8))
    device.state.save_template(np.ones(128, np.float32))
    device.state.update_info(enrolled=True)
    return device


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # Linux: KiB


@pytest.mark.parametrize(("geometry", "refusal"), [
    (ARCFACE_112.to_json() | {"size": 10**6}, "face_geometry size 1000000 is not an integer in 16..256 pixels"),
    (ARCFACE_112.to_json() | {"template": [[float("nan"), 40.0], *ARCFACE_112.to_json()["template"][1:]]},
     "face_geometry template point 0 (nan, 40) is not inside the 112px crop"),
])
@pytest.mark.parametrize("command", ["enroll", "verify"])
def test_a_crop_geometry_out_of_range_is_refused_before_any_photo_is_cropped(
    hostile: HostileServer, device: FaceDevice, geometry: dict[str, Any], refusal: str, command: str, tmp_path: Path,
) -> None:
    # Prepare: the audit's crop of 10^6 px (99 s and 5 GB for one photo), and a template point that is NaN
    hostile.description = _description(face_geometry=geometry)
    photo = tmp_path / "never-read.jpg"
    started = time.perf_counter()
    # Execute / Assert
    with pytest.raises(BadServerResponse, match=f"^the server's model {VERSION[:12]} is refused: {re.escape(refusal)}$"):
        device.enroll([photo]) if command == "enroll" else device.verify(photo)
    assert time.perf_counter() - started < 10
    assert device.state.current_model() is None  # not remembered for a later command
    assert hostile.asked == ["POST /v1/devices", "GET /v1/models/current"]  # nothing downloaded, nothing sent


def test_an_embedding_dim_of_a_billion_in_the_model_description_is_refused(hostile: HostileServer, device: FaceDevice) -> None:
    # Prepare
    hostile.description = _description(embedding_dim=10**9)
    # Execute / Assert
    with pytest.raises(BadServerResponse, match=f"^the server's model {VERSION[:12]} is refused: embedding_dim 1000000000 is "
                                                "not an integer in 16..4096$"):
        device.enroll([])
    assert device.state.current_model() is None


def test_an_embedding_dim_of_a_billion_in_the_backbone_file_is_refused_before_a_model_is_built(
    hostile: HostileServer, device: FaceDevice,
) -> None:
    # Prepare: a round whose backbone file claims 10^9 outputs (building it: ~2 TB of weights)
    hostile.files[f"/v1/models/{VERSION}/backbone"] = _backbone_file(embedding_dim=10**9)
    peak = _peak_rss()
    # Execute / Assert
    with pytest.raises(BadServerResponse, match=f"^the server's fp16.pt file of model {VERSION[:12]} is refused: embedding_dim "
                                                "1000000000 is not an integer in 16..4096$"):
        device.train_round(wait=0)
    assert _peak_rss() - peak < 2**30
    assert device.state.cached_model(VERSION, "fp16.pt") is None  # dropped: not used by the next round either


def test_nan_or_int8_weights_are_refused_and_a_clean_file_is_used(hostile: HostileServer, device: FaceDevice) -> None:
    # Prepare: the same backbone three times, under three versions: clean, one NaN, one weight quantised to int8
    def nan(weight: torch.Tensor) -> torch.Tensor:
        weight = weight.clone()
        weight.view(-1)[0] = float("nan")
        return weight

    third = "ef" * 32
    hostile.files |= {f"/v1/models/{VERSION}/backbone": _backbone_file(),
                      f"/v1/models/{OTHER_VERSION}/backbone": _backbone_file(poison=nan),
                      f"/v1/models/{third}/backbone": _backbone_file(poison=lambda w: w.to(torch.int8))}
    # Execute / Assert: the clean file loads, and the round goes on to ask for this device's template (404 here)
    with pytest.raises(ServerRefused, match="404"):
        device.train_round(wait=0)
    assert hostile.asked[-1] == f"GET /v1/devices/{DEVICE_ID}/embedding"
    # Execute / Assert: the poisoned files are refused, naming the tensor
    hostile.checkin = _checkin(OTHER_VERSION)
    with pytest.raises(BadServerResponse, match=rf"^the server's fp16.pt file of model {OTHER_VERSION[:12]} is refused: "
                                                r"state_dict\['stem.0.0.weight'\] holds NaN or infinite values; weights must be finite$"):
        device.train_round(wait=0)
    hostile.checkin = _checkin(third)
    with pytest.raises(BadServerResponse, match=rf"^the server's fp16.pt file of model {third[:12]} is refused: "
                                                r"state_dict\['stem.0.0.weight'\] is int8; backbone 'mobilefacenet_s' has "
                                                r"floats there \(float16 or float32\)$"):
        device.train_round(wait=0)
    assert device.state.cached_model(VERSION, "fp16.pt") is not None
    assert device.state.cached_model(OTHER_VERSION, "fp16.pt") is None and device.state.cached_model(third, "fp16.pt") is None


@pytest.mark.parametrize("kind", ["onnx", "backbone"])
def test_an_endless_download_stops_at_the_cap(hostile: HostileServer, device: FaceDevice, kind: str) -> None:
    # Prepare: the ONNX file verify needs, or the backbone file a round needs, never ends
    path = f"/v1/models/{VERSION}/{kind}"
    hostile.files[path] = ENDLESS
    peak = _peak_rss()
    # Execute / Assert
    with pytest.raises(BadServerResponse, match=rf"^the server's response to GET {path} is refused: it passed the "
                                                rf"{MAX_MODEL_BYTES}-byte limit \(an endless or oversized body\); stopped reading$"):
        device.verify("never-read.jpg") if kind == "onnx" else device.train_round(wait=0)
    # Assert: the server got to send the cap and what the sockets buffer, no more (`sent` counts whole chunks: the one
    # that crossed the cap was cut short by the device hanging up); the device held about the cap
    assert hostile.hung_up[path].wait(timeout=30)
    assert MAX_MODEL_BYTES <= hostile.sent[path] < MAX_MODEL_BYTES + 64 * 2**20
    assert _peak_rss() - peak < 2 * MAX_MODEL_BYTES
    assert not list(device.state.models_dir().iterdir())
