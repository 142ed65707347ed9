"""FaceDevice against a real server process, with real faces through the real detector."""
from __future__ import annotations

import re
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from conftest import open_round, round_status
from device_sdk.device import FaceDevice
from device_sdk.errors import AuthError, NoFaceFound, NotEnrolled, RoundClosed, ServerUnavailable
from device_sdk.personal import PersonalConfig
from device_sdk.training import LocalTrainingConfig


def _wait_for(server, round_id: int, status: str, timeout: float = 120) -> dict:  # type: ignore[no-untyped-def,type-arg]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        current = round_status(server, round_id)
        if current["status"] == status:
            return current
        time.sleep(0.5)
    raise AssertionError(f"round {round_id} stayed {current['status']}")


@pytest.fixture(scope="module")
def fleet(server, owners: list[list[Path]], tmp_path_factory: pytest.TempPathFactory) -> list[FaceDevice]:  # type: ignore[no-untyped-def]
    devices = []
    for photos in owners:
        device = FaceDevice(server.url, tmp_path_factory.mktemp("device"), retries=2)
        device.register()
        device.enroll(photos[:-2])  # the last two photos stay held out for verify
        devices.append(device)
    return devices


def test_enrolment_keeps_how_tightly_the_owners_photos_agree(fleet: list[FaceDevice]) -> None:
    # Execute
    lengths = [device.state.info()["template_length"] for device in fleet]
    # Assert: the mean of several photos' unit features is shorter than one, and a strong model's photos of one person agree
    assert all(0.8 < length < 1 for length in lengths)


def test_verify_accepts_the_owner_and_rejects_another_identity(fleet: list[FaceDevice], owners: list[list[Path]]) -> None:
    # Execute: before the rounds below move the model away from the threshold it was published with
    own = [fleet[0].verify(photo) for photo in owners[0][-2:]]
    other = [fleet[0].verify(photo) for photo in owners[1][-2:]]
    # Assert
    assert max(r.score for r in own) > max(r.score for r in other)
    assert any(r.match for r in own)
    assert not any(r.match for r in other)
    assert all(r.match == (r.score >= r.threshold) for r in own + other)


def test_register_enroll_and_three_rounds(server, fleet: list[FaceDevice]) -> None:  # type: ignore[no-untyped-def]
    bytes_up = []
    # The second round trains the last 2 blocks and the head: its updates leave the frozen prefix out; the third
    # sends them in 4 bits, and each device keeps what the codes missed.
    frozen = {"margin": 0.995, "trainable_blocks": 2}
    for local in ({"margin": 0.995}, frozen, {**frozen, "upload_bits": 4}):
        # Prepare: the dlib ResNet's owner faces sit at cosine 0.96-0.99 to their template, so the
        # protocol's default margin (0.9) leaves nothing to train; 0.995 gives every face a loss.
        opened = open_round(server, target=len(fleet), minimum=len(fleet), local=local)
        # Execute
        summaries = [device.train_round(wait=30) for device in fleet]
        # Assert
        assert {s.round_id for s in summaries} == {opened["id"]}
        assert all(s.loss_after < s.loss_before for s in summaries)
        assert all(s.bytes_up > 0 for s in summaries)
        done = _wait_for(server, opened["id"], "completed")
        assert done["result_version"] != opened["base_version"]
        bytes_up.append(max(s.bytes_up for s in summaries))
    assert bytes_up[1] < 0.5 * bytes_up[0]  # 2 of the dlib ResNet's 14 blocks and its head: 43% of its parameters
    assert bytes_up[2] < 0.3 * bytes_up[1]  # 4 bits and a scale a row, against 16 bits
    residual = fleet[0].state.residual()
    assert residual is not None and any(v.any() for v in residual.values())
    # each round downloaded a new model version: a new ONNX/backbone, not a cached one
    assert len(list(fleet[0].state.models_dir().glob("*.fp16.pt"))) == 3


def test_a_secure_aggregation_round_completes_with_devices_training_in_parallel(server, fleet: list[FaceDevice]) -> None:  # type: ignore[no-untyped-def]
    # Prepare: the devices must run side by side, since each key step waits for the others
    opened = open_round(server, target=len(fleet), minimum=2, deadline=240, window=2.0,
                        secure_aggregation={"enabled": True, "key_phase_s": 30, "unmask_phase_s": 60})
    # Execute
    with ThreadPoolExecutor(len(fleet)) as pool:
        summaries = list(pool.map(lambda device: device.train_round(wait=30, poll=0.5), fleet))
    # Assert: every masked update was unmasked into the new version
    assert {s.round_id for s in summaries} == {opened["id"]}
    assert all("secure aggregation: 3 members, threshold 3" in s.notices for s in summaries)  # what each device agreed to
    done = _wait_for(server, opened["id"], "completed")
    assert done["summary"]["n_updates"] == len(fleet) and done["result_version"] != opened["base_version"]
    assert done["summary"]["secure_aggregation"] == {"members": 3, "key_sharers": 3, "answers": 3, "threshold": 3}


def test_the_personal_verifier_separates_the_owner_and_stays_on_the_device(fleet: list[FaceDevice], owners: list[list[Path]]) -> None:
    # Prepare: no personal verifier yet
    device = fleet[0]
    with pytest.raises(NotEnrolled, match="personalize"):
        device.verify(owners[0][-1], personal=True)
    # Execute: at a margin the dlib ResNet's owner faces (cosine 0.96-0.99 to the template) do not already meet;
    # its threshold calibrated on 200 public faces (test_device_verify.py checks the calibration itself)
    training = LocalTrainingConfig(epochs=20, trainable_blocks=2, margin=0.995)
    done = device.personalize(PersonalConfig(training=training, calibration_far=1e-2, calibration_impostors=200))
    own = [device.verify(photo, personal=True) for photo in owners[0][-2:]]
    other = [device.verify(photo, personal=True) for photo in owners[1][-2:]]
    # Assert: it trained, scores owner above others, and is sealed in the device state only
    assert done.loss_after < done.loss_before and 0.0 <= done.fusion_summary["lambda_mean"] <= 1.0
    assert all(r.personal for r in own + other) and done.threshold is not None and done.far == 1e-2
    assert all(r.threshold == done.threshold for r in own + other)  # judged at its own threshold, not the server's
    assert min(r.score for r in own) > max(r.score for r in other)
    assert (device.state.dir / "personal.enc").exists()
    assert b"fused" not in (device.state.dir / "personal.enc").read_bytes()


def test_template_noise_blurs_the_servers_copy_and_keeps_the_clean_one_here(server, owners: list[list[Path]], tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # Prepare
    device = FaceDevice(server.url, tmp_path, retries=2, template_noise_cos=0.8)
    device.register()
    # Execute
    device.enroll(owners[2][:-2])
    on_server = np.asarray(device._request("GET", f"/v1/devices/{device.device_id}/embedding").json()["embedding"])
    # Assert: the server's copy is a different unit vector at roughly the calibrated cosine
    here = device.state.template()
    assert abs(np.linalg.norm(on_server) - 1) < 1e-5
    assert 0.6 < float(on_server @ here) < 0.95


def test_photos_without_faces_raise_no_face_found(server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # Prepare
    blank = []
    for k in range(3):
        blank.append(tmp_path / f"wall{k}.jpg")
        Image.fromarray(np.full((200, 200, 3), 90 + k, np.uint8)).save(blank[-1])
    device = FaceDevice(server.url, tmp_path / "state")
    device.register()
    # Execute / Assert
    with pytest.raises(NoFaceFound, match=r"^0 usable of 3 needed; unusable: .*wall0\.jpg \(no face found\)") as caught:
        device.enroll(blank)
    assert set(caught.value.files) == {str(p) for p in blank}


def test_training_before_enrolling_raises_not_enrolled(server, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    device = FaceDevice(server.url, tmp_path)
    device.register()
    with pytest.raises(NotEnrolled, match="^this device has no enrolled owner: run enroll first$"):
        device.train_round()


def test_no_open_round_raises_round_closed(fleet: list[FaceDevice]) -> None:
    with pytest.raises(RoundClosed, match="^no round is open for check-in right now"):
        fleet[0].train_round(wait=0)


def test_a_foreign_key_gets_auth_error(server, fleet: list[FaceDevice], tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    # Prepare: a device state that claims fleet[0]'s id but holds another key
    impostor = FaceDevice(server.url, tmp_path)
    impostor.state.signing_key(create=True)
    impostor.state.update_info(device_id=fleet[0].device_id, enrolled=True)
    # Execute / Assert
    with pytest.raises(AuthError, match=r"^server refused this device \(401\): bad request signature$"):
        impostor._model()


def test_unreachable_server_raises_server_unavailable(tmp_path: Path) -> None:
    device = FaceDevice("http://127.0.0.1:9", tmp_path, retries=1, timeout=2)
    with pytest.raises(ServerUnavailable, match=r"^cannot reach the server at http://127\.0\.0\.1:9 .*; nothing was saved in "):
        device.register()


def test_server_restarted_mid_round_and_unenroll(server, fleet: list[FaceDevice]) -> None:  # type: ignore[no-untyped-def]
    # Prepare: a round, one device uploads, then the server goes down before the others
    opened = open_round(server, target=2, minimum=2, deadline=300)
    fleet[0].train_round(wait=30)
    server.stop()
    # Execute: a device trying now fails cleanly; after the restart the round still completes
    with pytest.raises(ServerUnavailable, match=f"^cannot reach the server at {re.escape(server.url.rstrip('/'))} "):
        FaceDevice(server.url, fleet[1].state.dir, retries=1, timeout=2).train_round()
    server.start()
    fleet[1].train_round(wait=30)
    # Assert
    done = _wait_for(server, opened["id"], "completed")
    assert done["status"] == "completed"
    fleet[2].unenroll()
    with pytest.raises(NotEnrolled, match="^this device has no enrolled owner: run enroll first$"):
        fleet[2].train_round()
