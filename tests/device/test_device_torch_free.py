"""The device's everyday commands without torch: `fedface device register|enroll|add-photos|verify|status|unenroll`,
each in its own process against a real server process, and the SDK's FaceDevice doing the same in one
process; and the enrollment template that the ONNX model computes, against the torch path on real LFW faces."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from device_sdk.device import FaceDevice
from device_sdk.inference import OnnxEmbedder
from facecore.align.cache import AlignedFaceCache
from facecore.align.geometry import geometry_of
from facecore.align.pipeline import FaceAligner
from facecore.models.preprocess import embed_faces
from facecore.templates import mean_feature_embedding
from server_process import ServerProcess

REPO = Path(__file__).resolve().parents[2]
# Modules none of these commands may load: torch (~2 s and ~0.7 GB before anything happens) and the server's FastAPI.
HEAVY = ("torch", "fastapi")
# `fedface ARGS...` as the console script runs it; at the end, on stderr, the HEAVY packages it loaded.
CLI = (
    "import json, sys\n"
    "from fedface.cli import main\n"
    "code = main(sys.argv[1:])\n"
    f"print('LOADED', json.dumps(sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r}))), file=sys.stderr)\n"
    "sys.exit(code)\n"
)
# The SDK in one process: register, enroll, verify, status, unenroll; then what it loaded, on stdout.
SDK = (
    "import json, sys\n"
    "from device_sdk.device import FaceDevice\n"
    "server, state, probe, *photos = sys.argv[1:]\n"
    "device = FaceDevice(server, state)\n"
    "device.register()\n"
    "enrolled = device.enroll(photos)\n"
    "result = device.verify(probe)\n"
    "enrolled_before = device.status()['enrolled']\n"
    "device.unenroll()\n"
    f"loaded = sorted({{m.split('.')[0] for m in sys.modules}} & set({HEAVY!r}))\n"
    "print(json.dumps({'faces': enrolled.faces, 'match': result.match, 'enrolled_before': enrolled_before,\n"
    "                  'enrolled_after': device.status()['enrolled'], 'loaded': loaded}))\n"
)
# What the child keeps from this environment: where the caches and the detector's files are, and which detector.
PASSED_ON = ("HOME", "FEDFACE_CACHE", "FEDFACE_PACKAGES", "FEDFACE_DETECTOR")
COMMANDS = ("register", "enroll", "add-photos", "verify", "status", "unenroll")
COLIN_POWELL = [f"Colin_Powell/Colin_Powell_{n:04d}.jpg" for n in range(1, 7)]


def _child_env() -> dict[str, str]:
    # Otherwise bare: nothing else from this test process (FEDFACE_SERVER, FEDFACE_DEVICE_KEY) reaches the child.
    return {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)} | {k: os.environ[k] for k in PASSED_ON if k in os.environ}


def _loaded(stderr: str) -> list[str]:
    lines = [line for line in stderr.splitlines() if line.startswith("LOADED ")]
    assert lines, f"the command did not finish: {stderr[-2000:]}"
    return list(json.loads(lines[-1].removeprefix("LOADED ")))


@pytest.fixture(scope="module")
def cli_runs(server: ServerProcess, owners: list[list[Path]],
             tmp_path_factory: pytest.TempPathFactory) -> dict[str, subprocess.CompletedProcess[str]]:
    """The six commands, in this order, each a fresh `fedface` process on one new state folder."""
    state = tmp_path_factory.mktemp("cli") / "device"
    common = ["--server", server.url, "--state", str(state)]
    arguments = {
        "register": [], "enroll": ["--photos", *map(str, owners[0][:5])], "add-photos": ["--photos", *map(str, owners[0][5:7])],
        "verify": [str(owners[0][-1])],
        "status": ["--json"], "unenroll": [],
    }
    runs = {}
    for command in COMMANDS:
        argv = [sys.executable, "-c", CLI, "device", command, *common, *arguments[command]]
        runs[command] = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300, env=_child_env())
    return runs


@pytest.mark.parametrize("command", COMMANDS)
def test_each_everyday_command_runs_without_torch(
    cli_runs: dict[str, subprocess.CompletedProcess[str]], command: str,
) -> None:
    # Execute: the fixture ran the command in its own process
    run = cli_runs[command]
    # Assert: it did its work, and never imported torch or FastAPI
    assert run.returncode == 0, run.stderr
    assert _loaded(run.stderr) == []
    expected = {
        "register": "registered as ", "enroll": "enrolled 5 faces with model ", "add-photos": "added 2 faces", "verify": ": match, score ",
        "status": '"enrolled": true', "unenroll": "unenrolled: ",
    }[command]
    assert expected in run.stdout


def test_the_sdk_enrolls_verifies_and_unenrolls_in_one_process_without_torch(
    server: ServerProcess, owners: list[list[Path]], tmp_path: Path,
) -> None:
    # Prepare
    photos, probe = owners[1][:4], owners[1][-1]
    argv = [sys.executable, "-c", SDK, server.url, str(tmp_path / "device"), str(probe), *map(str, photos)]
    # Execute
    run = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=300, env=_child_env())
    # Assert
    assert run.returncode == 0, run.stderr
    done = json.loads(run.stdout.splitlines()[-1])
    assert done == {"faces": 4, "match": True, "enrolled_before": True, "enrolled_after": False, "loaded": []}


@pytest.mark.slow
def test_the_enrollment_template_from_onnx_equals_the_torch_paths(
    server: ServerProcess, real_data: Path, tmp_path: Path,
) -> None:
    # Prepare: the torch path on the same photos, as the simulator takes it: the model the server publishes (fp32
    # torch file), faces aligned through the aligned-face cache (a private one), the normalised mean feature
    photos = [real_data / "lfw" / "lfw-deepfunneled" / name for name in COLIN_POWELL]
    device = FaceDevice(server.url, tmp_path / "device")
    device.register()
    described = device._model()
    backbone = FaceDevice(server.url, tmp_path / "device", upload_fp16=False)._load_backbone(
        described["backbone_url"], described["version"])
    geometry = geometry_of(backbone)
    cache = AlignedFaceCache(tmp_path / "aligned", size=geometry.size)
    aligned = FaceAligner(cache=cache, geometry=geometry).align_paths(photos, progress=False)
    assert len(aligned.faces) == len(photos)
    expected = mean_feature_embedding(embed_faces(backbone, aligned.faces))
    # Execute: the SDK's enrollment (detect, align in memory, embed with the ONNX model)
    enrolled = device.enroll(photos)
    # Assert: the same crops, the same features on them, the same template
    faces, template = device.state.faces(), device.state.template()
    assert enrolled.faces == len(photos) and faces is not None and template is not None
    assert faces.shape == aligned.faces.shape == (len(photos), *geometry.row_shape)
    # one photo at a time here, six at once there: the same landmarks, so at most a grey level of rounding apart
    assert np.abs(faces.astype(np.int16) - aligned.faces).max() <= 1
    onnx = device.state.cached_model(described["version"], "onnx")
    assert onnx is not None
    # (measured with MTCNN on these photos: identical crops, features within 3e-7, templates within 1.1e-7)
    np.testing.assert_allclose(OnnxEmbedder(onnx).embed(faces), embed_faces(backbone, faces), atol=1e-5)
    np.testing.assert_allclose(template, expected, atol=1e-5)
    assert abs(float(np.linalg.norm(template)) - 1) < 1e-6
