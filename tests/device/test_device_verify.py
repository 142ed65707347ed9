"""`fedface device verify` end to end: a real server process, a device enrolled with real faces, and
the verify command in its own process, which must never import torch."""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from device_sdk.device import FaceDevice
from device_sdk.errors import NotRegistered, ServerUnavailable
from device_sdk.personal import PersonalConfig
from device_sdk.training import LocalTrainingConfig
from export.detectors import export_detectors
from facecore.align.detectors import DETECTOR_ENV
from fedface.commands import device_verify
from server_process import ServerProcess, free_port

REPO = Path(__file__).resolve().parents[2]
# The command's own add_arguments/run under a parser with the options `fedface device` adds; at the
# end it reports whether torch was ever imported.
LAUNCHER = (
    "import argparse, sys\n"
    "from fedface.commands import device_verify\n"
    "parser = argparse.ArgumentParser()\n"
    "for option in ('--server', '--state', '--cacert'):\n"
    "    parser.add_argument(option)\n"
    "device_verify.add_arguments(parser)\n"
    "code = device_verify.run(parser.parse_args())\n"
    "print('torch imported' if 'torch' in sys.modules else 'torch never imported', file=sys.stderr)\n"
    "sys.exit(code)\n"
)


@pytest.fixture(scope="module")
def owner_device(server: ServerProcess, owners: list[list[Path]],
                 tmp_path_factory: pytest.TempPathFactory) -> FaceDevice:
    export_detectors()  # `fedface models fetch` makes these; a no-op when they verify
    device = FaceDevice(server.url, tmp_path_factory.mktemp("device"), retries=2)
    device.register()
    device.enroll(owners[0][:-2])  # the last two photos stay held out
    return device


def _verify(device: FaceDevice, server_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, "-c", LAUNCHER, "--server", server_url, "--state", str(device.state.dir), *args]
    # A bare environment: nothing from this test process (FEDFACE_* included) changes what the command does, but the
    # detector's choice, so that the command crops faces as this process's FaceDevice does.
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)} | {k: v for k, v in os.environ.items() if k == DETECTOR_ENV}
    return subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=300, env=env)


@pytest.mark.slow
def test_verify_scores_every_photo_in_one_process_without_torch(server: ServerProcess, owner_device: FaceDevice,
                                                                owners: list[list[Path]]) -> None:
    # Prepare: the owner's two held-out photos and two photos of another identity
    probes = [*owners[0][-2:], *owners[1][-2:]]
    # Execute
    result = _verify(owner_device, server.url, *map(str, probes), "--json")
    # Assert
    assert result.returncode == 0, result.stderr
    assert "torch never imported" in result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["photo"] for r in rows] == [str(p) for p in probes]
    assert [r["match"] for r in rows] == [True, True, False, False]
    model = owner_device.state.current_model()  # what the server published, as the command saw it
    assert model is not None and model["verify_far"] == 0.001
    published = (model["verify_threshold"], 0.001, "server")
    assert {(r["threshold"], r["far"], r["threshold_source"]) for r in rows} == {published}
    assert {r["model_version"] for r in rows} == {model["version"]}


@pytest.mark.slow
def test_verify_matches_the_torch_path_and_prints_far_and_version(server: ServerProcess, owner_device: FaceDevice,
                                                                  owners: list[list[Path]]) -> None:
    # Prepare: the SDK's own verify (FaceDevice.verify, in this process) on the same photos, as the reference
    probes = [owners[0][-1], owners[2][-1]]
    expected = [owner_device.verify(p).score for p in probes]
    # Execute
    result = _verify(owner_device, server.url, *map(str, probes))
    # Assert
    lines = result.stdout.splitlines()
    assert result.returncode == 0, result.stderr
    scores = [float(line.rsplit("score ", 1)[1]) for line in lines[:2]]
    np.testing.assert_allclose(scores, expected, atol=1.5e-3)  # printed to 3 decimals
    assert lines[2].startswith("threshold ") and "(the server's, FAR 0.001)" in lines[2]
    assert owner_device.state.info()["model"]["version"][:12] in lines[2]


def test_a_folder_with_a_photo_without_a_face_exits_1_and_names_it(server: ServerProcess, owner_device: FaceDevice,
                                                                   owners: list[list[Path]], tmp_path: Path) -> None:
    # Prepare: a folder with one real photo and one blank image
    (tmp_path / "a_owner.jpg").write_bytes(owners[0][-1].read_bytes())
    Image.new("RGB", (160, 160), (90, 90, 90)).save(tmp_path / "b_wall.png")
    # Execute
    result = _verify(owner_device, server.url, str(tmp_path))
    # Assert
    lines = result.stdout.splitlines()
    assert result.returncode == 1, result.stderr
    assert lines[0].startswith(f"{tmp_path / 'a_owner.jpg'}: match, score ")
    assert lines[1] == f"{tmp_path / 'b_wall.png'}: no face found"


def test_an_unreachable_server_falls_back_to_the_model_last_seen(owner_device: FaceDevice,
                                                                 owners: list[list[Path]]) -> None:
    # Prepare: the device has seen and cached the server's model; now --server points at a closed port
    closed = f"http://127.0.0.1:{free_port()}"
    # Execute
    result = _verify(owner_device, closed, str(owners[0][-1]))
    # Assert
    assert result.returncode == 0, result.stderr
    assert "server unreachable: using model" in result.stderr
    assert result.stdout.splitlines()[0].startswith(f"{owners[0][-1]}: match, score ")


def test_the_sdk_verifies_with_the_model_last_seen_when_the_server_is_down(owner_device: FaceDevice,
                                                                         owners: list[list[Path]], tmp_path: Path) -> None:
    # Prepare: the device verified once online (its model remembered, the ONNX file cached); then the same state
    # folder behind a closed port, and a copy of it without the cached model files
    probe = owners[0][-1]
    online = owner_device.verify(probe)
    closed = f"http://127.0.0.1:{free_port()}"
    without_files = shutil.copytree(owner_device.state.dir, tmp_path / "device")
    shutil.rmtree(without_files / "models")
    # Execute
    offline = FaceDevice(closed, owner_device.state.dir, retries=0, timeout=5).verify(probe)
    # Assert: the same model and threshold score the photo the same; without the file the outage stands
    assert offline.offline and not online.offline
    assert offline.model_version == online.model_version == owner_device.state.current_model()["version"]  # type: ignore[index]
    assert offline.threshold == online.threshold and offline.match == online.match is True
    assert abs(offline.score - online.score) < 1e-6
    with pytest.raises(ServerUnavailable, match="127.0.0.1"):
        FaceDevice(closed, without_files, retries=0, timeout=5).verify(probe)


def test_an_unregistered_state_folder_is_refused_before_any_photo(server: ServerProcess, tmp_path: Path) -> None:
    # Prepare
    parser = argparse.ArgumentParser()
    for option in ("--server", "--state", "--cacert"):
        parser.add_argument(option)
    device_verify.add_arguments(parser)
    args = parser.parse_args(["--server", server.url, "--state", str(tmp_path / "nowhere"), str(tmp_path)])
    # Execute / Assert
    with pytest.raises(NotRegistered, match="register"):
        device_verify.run(args)


@pytest.mark.slow
def test_personal_verify_judges_at_the_verifiers_own_threshold(server: ServerProcess, owner_device: FaceDevice,
                                                               owners: list[list[Path]]) -> None:
    # Prepare: personalize (the SDK, torch) at a margin the dlib features train against; the file it saves is
    # calibrated on 200 public split faces at a FAR of 1e-2 (the product default: 1,000 at 1e-3)
    config = PersonalConfig(training=LocalTrainingConfig(epochs=20, trainable_blocks=2, margin=0.995),
                            calibration_far=1e-2, calibration_impostors=200)
    owner_device.personalize(config)
    probes = [*owners[0][-2:], *owners[1][-2:]]
    # Execute
    result = _verify(owner_device, server.url, "--personal", "--json", *map(str, probes))
    # Assert: its own threshold and measured FAR, the other identity rejected, still without torch
    assert result.returncode == 0, result.stderr
    assert "torch never imported" in result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    server_threshold = owner_device.state.current_model()["verify_threshold"]  # type: ignore[index]
    assert all(r["personal"] and r["threshold_source"] == "personal" for r in rows)
    assert len({r["threshold"] for r in rows}) == 1 and rows[0]["threshold"] != server_threshold
    assert all(0 <= r["far"] <= 1e-2 for r in rows)
    assert [r["match"] for r in rows[2:]] == [False, False]
    assert min(r["score"] for r in rows[:2]) > max(r["score"] for r in rows[2:])
