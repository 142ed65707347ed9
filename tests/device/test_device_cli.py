"""`fedface device ...` against a real server process and real faces: state you cannot break,
defaults, and one precise line for each failure."""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from conftest import open_round, round_status
from device_sdk.device import FaceDevice
from device_sdk.errors import DeviceError
from fedface.cli import build_parser, main
from fedface.commands import device as device_command
from server_process import ServerProcess

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _no_device_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("FEDFACE_DEVICE_KEY", "FEDFACE_SERVER", "FEDFACE_ENROLLMENT_TOKEN"):
        monkeypatch.delenv(name, raising=False)


def fedface(capsys: pytest.CaptureFixture[str], *argv: str | Path) -> tuple[int, str, str]:
    code = main([str(a) for a in argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def one_line_error(code: int, err: str) -> str:
    assert code != 0 and err.count("\n") == 1 and "Traceback" not in err, err
    return err


@pytest.fixture(scope="module")
def device_dir(server: ServerProcess, owners: list[list[Path]], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A device registered and enrolled through the CLI."""
    state = tmp_path_factory.mktemp("cli") / "device"
    assert main(["device", "register", "--server", server.url, "--state", str(state)]) == 0
    photos = [str(p) for p in owners[0][:4]]
    assert main(["device", "enroll", "--server", server.url, "--state", str(state), "--photos", *photos]) == 0
    return state


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (choices,) = [a.choices for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(choices)


def test_every_option_has_help_its_default_and_an_upper_case_metavar() -> None:
    # Prepare
    parser = argparse.ArgumentParser(prog="fedface device")
    device_command.add_arguments(parser)
    # Execute
    actions = _subparsers(parser)
    # Assert
    assert {"register", "enroll", "train", "verify", "personalize", "unenroll", "status", "reset"} <= set(actions)
    for name, sub in actions.items():
        text = " ".join(sub.format_help().split())
        for action in sub._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            assert action.help, f"{name} {action.dest} has no help"
            metavar = action.metavar or ""
            assert metavar == metavar.upper(), f"{name} {action.dest}: metavar {metavar}"
            if action.default not in (None, False):
                assert f"(default: {action.default})" in text, f"{name} {action.dest}: default not shown"


def test_defaults_come_from_fedface_server_and_a_per_user_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Prepare
    monkeypatch.setenv("FEDFACE_SERVER", "http://fedface.example:9000")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path))
    # Execute
    plain = build_parser().parse_args(["device", "train"])
    until_round_ends = build_parser().parse_args(["device", "train", "--wait"])
    seconds = build_parser().parse_args(["device", "train", "--wait", "5"])
    # Assert
    assert plain.server == "http://fedface.example:9000"
    assert Path(plain.state) == tmp_path / "fedface" / "device"
    assert (plain.wait, until_round_ends.wait, seconds.wait) == (0.0, None, 5.0)
    monkeypatch.delenv("FEDFACE_SERVER")
    assert build_parser().parse_args(["device", "status"]).server == "http://127.0.0.1:8000"


@pytest.mark.parametrize("action", [
    ["status"], ["train"], ["unenroll"], ["personalize"], ["enroll", "--photos", "me.jpg"], ["verify", "me.jpg"],
])
def test_a_mistyped_state_folder_is_refused_in_one_line_and_not_created(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, action: list[str], monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Prepare
    Image.fromarray(np.full((200, 200, 3), 90, np.uint8)).save(tmp_path / "me.jpg")
    monkeypatch.chdir(tmp_path)
    # Execute
    code, _, err = fedface(capsys, "device", action[0], "--server", "http://127.0.0.1:9", "--state", tmp_path / "typo",
                           *action[1:])
    # Assert
    assert "no device state at" in one_line_error(code, err) and "fedface device register" in err
    assert not (tmp_path / "typo").exists()


def test_a_secure_member_floor_below_two_is_a_usage_error(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # Execute
    with pytest.raises(SystemExit, match="^2$") as usage:
        main(["device", "train", "--state", str(tmp_path / "device"), "--min-secure-members", "1"])
    # Assert: named, and nothing created
    assert usage.value.code == 2 and "--min-secure-members: must be at least 2, got 1" in capsys.readouterr().err
    assert not (tmp_path / "device").exists()


def test_a_state_that_is_a_file_or_corrupt_is_one_line_naming_the_file(
    capsys: pytest.CaptureFixture[str], tmp_path: Path,
) -> None:
    # Prepare
    (tmp_path / "notes.txt").write_text("not a folder")
    state = tmp_path / "device"
    device = FaceDevice("http://127.0.0.1:9", state)
    device.state.signing_key(create=True)
    device.state.update_info(device_id="0" * 32)
    # Execute / Assert: a file
    code, _, err = fedface(capsys, "device", "status", "--state", tmp_path / "notes.txt")
    assert "notes.txt is a file, not a device state folder" in one_line_error(code, err)
    # Execute / Assert: a corrupt device.json
    (state / "device.json").write_text("{")
    code, _, err = fedface(capsys, "device", "status", "--state", state)
    assert f"{state / 'device.json'} cannot be read" in one_line_error(code, err) and "fedface device reset" in err
    # Execute / Assert: a truncated key
    (state / "device.json").write_text(json.dumps({"device_id": "0" * 32}))
    (state / "device.key").write_bytes((state / "device.key").read_bytes()[:16])
    code, _, err = fedface(capsys, "device", "status", "--state", state)
    assert f"{state / 'device.key'} holds 16 bytes" in one_line_error(code, err) and "fedface device reset" in err


def test_register_is_idempotent_and_a_lost_key_is_reported_never_replaced(
    server: ServerProcess, capsys: pytest.CaptureFixture[str], tmp_path: Path,
) -> None:
    # Prepare
    state = tmp_path / "device"
    code, out, _ = fedface(capsys, "device", "register", "--server", server.url, "--state", state)
    assert code == 0 and out.startswith("registered as ")
    key = (state / "device.key").read_bytes()
    # Execute / Assert: registering again changes nothing
    code, out, _ = fedface(capsys, "device", "register", "--server", server.url, "--state", state)
    assert code == 0 and "already registered as" in out and "nothing changed" in out
    assert (state / "device.key").read_bytes() == key
    # Execute / Assert: with device.key deleted, no command writes a new key or claims success
    (state / "device.key").unlink()
    for action in ("unenroll", "register", "train"):
        code, _, err = fedface(capsys, "device", action, "--server", server.url, "--state", state)
        assert "device.key is missing, so identity.enc cannot be decrypted" in one_line_error(code, err)
        assert f"fedface device reset --state {state} --yes" in err
    assert not (state / "device.key").exists()
    # Execute / Assert: reset says what it could not do on the server, and clears the folder
    code, _, err = fedface(capsys, "device", "reset", "--server", server.url, "--state", state)
    assert "pass --yes to confirm" in one_line_error(code, err)
    code, out, _ = fedface(capsys, "device", "reset", "--server", server.url, "--state", state, "--yes")
    assert code == 0 and "could not sign a request" in out and not state.exists()


def test_enroll_names_each_unusable_photo_and_why(
    server: ServerProcess, owners: list[list[Path]], capsys: pytest.CaptureFixture[str], tmp_path: Path,
) -> None:
    # Prepare: a text file, a truncated JPEG and a blank wall next to two real faces
    (tmp_path / "notes.jpg").write_text("not a photo")
    (tmp_path / "truncated.jpg").write_bytes(owners[1][5].read_bytes()[:2000])
    Image.fromarray(np.full((200, 200, 3), 90, np.uint8)).save(tmp_path / "wall.jpg")
    bad = [tmp_path / name for name in ("notes.jpg", "truncated.jpg", "wall.jpg")]
    state = tmp_path / "device"
    assert fedface(capsys, "device", "register", "--server", server.url, "--state", state)[0] == 0
    # Execute
    code, _, err = fedface(capsys, "device", "enroll", "--server", server.url, "--state", state,
                           "--photos", *owners[1][:2], *bad)
    # Assert
    one_line_error(code, err)
    assert "2 usable of 3 needed" in err
    assert f"{bad[0]} (not an image)" in err and f"{bad[1]} (not an image)" in err
    assert f"{bad[2]} (no face found)" in err
    # Execute / Assert: with a third face it enrolls, and still lists what it skipped
    code, out, _ = fedface(capsys, "device", "enroll", "--server", server.url, "--state", state,
                           "--photos", *owners[1][:3], *bad)
    assert code == 0 and "enrolled 3 faces" in out and "skipped 3 photo(s)" in out
    assert f"{bad[2]} (no face found)" in out


def test_status_reports_registration_enrollment_and_model(
    server: ServerProcess, device_dir: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    # Execute
    code, out, _ = fedface(capsys, "device", "status", "--server", server.url, "--state", device_dir, "--json")
    status = json.loads(out)
    # Assert
    assert code == 0 and len(status["device_id"]) == 32 and status["enrolled"] is True
    assert len(status["enrolled_model"]) == 64 and status["server_model"] == status["enrolled_model"]
    assert status["pending_upload_round"] is None
    code, out, _ = fedface(capsys, "device", "status", "--server", server.url, "--state", device_dir)
    assert code == 0 and f"enrolled  yes, with model {status['enrolled_model'][:12]}" in out


def test_verify_says_why_a_photo_has_no_score(
    server: ServerProcess, device_dir: Path, owners: list[list[Path]], capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    # Prepare
    (tmp_path / "notes.jpg").write_text("not a photo")
    (tmp_path / "truncated.jpg").write_bytes(owners[0][-1].read_bytes()[:2000])
    Image.fromarray(np.full((200, 200, 3), 90, np.uint8)).save(tmp_path / "wall.jpg")
    photos = [tmp_path / "notes.jpg", tmp_path / "truncated.jpg", tmp_path / "wall.jpg", owners[0][-1]]
    # Execute
    code, out, _ = fedface(capsys, "device", "verify", "--server", server.url, "--state", device_dir, *photos)
    # Assert: one line per photo, the real face scored, the others with their reason
    lines = out.splitlines()
    assert code == 1
    assert lines[0] == f"{photos[0]}: not an image" and lines[1] == f"{photos[1]}: not an image"
    assert lines[2] == f"{photos[2]}: no face found" and lines[3].startswith(f"{photos[3]}: ") and "score" in lines[3]


def test_train_without_an_open_round_says_no_round_is_open(
    server: ServerProcess, device_dir: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    # Execute
    code, _, err = fedface(capsys, "device", "train", "--server", server.url, "--state", device_dir)
    # Assert
    assert "no round is open" in one_line_error(code, err) and "None" not in err


def test_a_corrupt_cached_onnx_is_downloaded_again(
    server: ServerProcess, device_dir: Path, owners: list[list[Path]],
) -> None:
    # Prepare: flip bytes in the cached ONNX file
    (onnx,) = (device_dir / "models").glob("*.onnx")
    good = hashlib.sha256(onnx.read_bytes()).hexdigest()
    onnx.write_bytes(b"\0" * 64 + onnx.read_bytes()[64:])
    device = FaceDevice(server.url, device_dir)
    # Execute
    result = device.verify(owners[0][-1])
    # Assert: it verified with a fresh, whole copy, the one whose sha256 the server names
    assert -1.0 <= result.score <= 1.0
    assert hashlib.sha256(onnx.read_bytes()).hexdigest() == good
    served = device._request("GET", f"/v1/models/{onnx.name.removesuffix('.onnx')}/onnx")
    assert served.headers["X-Content-SHA256"] == hashlib.sha256(served.content).hexdigest() == good


def _start_train(server: ServerProcess, state: Path, log: Path, *wait: str) -> subprocess.Popen[str]:
    """`fedface device train --wait 180` (or `wait`'s arguments) in its own process: stdout piped, stderr to `log`."""
    env = {k: v for k, v in os.environ.items() if k not in ("FEDFACE_DEVICE_KEY", "FEDFACE_SERVER")}
    env |= {"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    command = [sys.executable, "-u", "-m", "fedface", "device", "train", "--server", server.url, "--state", str(state),
               *(wait or ("--wait", "180"))]
    with log.open("w") as stderr:
        return subprocess.Popen(command, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=stderr, text=True)


def _read_until(process: subprocess.Popen[str], prefix: str, log: Path) -> str:
    assert process.stdout is not None
    for line in process.stdout:
        if line.startswith(prefix):
            return line
    raise AssertionError(f"`fedface device train` ended before {prefix!r}:\n{log.read_text()[-2000:]}")


def _train_in_a_round(
    server: ServerProcess, state: Path, log: Path, paused: list[subprocess.Popen[str]], deadline: float,
) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    """A train that checked in, then a one-device round opened for it: returned once it trains locally."""
    process = _start_train(server, state, log)
    paused.append(process)
    _read_until(process, "checking in", log)
    opened = open_round(server, target=1, minimum=1, deadline=deadline, window=0.5)
    _read_until(process, "training locally", log)
    return process, opened


def _wait_for_status(
    server: ServerProcess, round_id: int, statuses: set[str], timeout: float = 120,
) -> dict[str, object]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        current = round_status(server, round_id)
        if current["status"] in statuses:
            return current
        time.sleep(0.3)
    raise AssertionError(f"round {round_id} stayed {current['status']}")


@pytest.fixture()
def paused(server: ServerProcess) -> Iterator[list[subprocess.Popen[str]]]:
    """Device processes a test stops with SIGSTOP: always resumed and ended, and the server left running."""
    processes: list[subprocess.Popen[str]] = []
    yield processes
    for process in processes:
        if process.poll() is None:
            os.kill(process.pid, signal.SIGCONT)
            process.kill()
            process.wait()
    if server.process.poll() is not None:
        server.start()


def test_a_server_down_after_training_keeps_the_update_and_the_next_train_sends_it(
    server: ServerProcess, device_dir: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path,
    paused: list[subprocess.Popen[str]],
) -> None:
    # Prepare: the device waits for a round; once it trains, it is held while the server goes down
    log = tmp_path / "train.log"
    process, opened = _train_in_a_round(server, device_dir, log, paused, deadline=300)
    os.kill(process.pid, signal.SIGSTOP)
    server.stop()
    # Execute
    os.kill(process.pid, signal.SIGCONT)
    code = process.wait(timeout=300)
    # Assert: one line saying the update is kept, and it is kept sealed
    err = log.read_text()
    assert code != 0 and "Traceback" not in err, err
    assert f"the update for round {opened['id']} is saved in {device_dir} and will be resent by the next train" in err
    assert (device_dir / "pending_upload.enc").exists() and not (device_dir / "pending_upload.bin").exists()
    # Execute: the server is back; the next train sends the saved update
    server.start()
    code, out, _ = fedface(capsys, "device", "train", "--server", server.url, "--state", device_dir)
    # Assert
    assert code == 0 and f"round {opened['id']}: sent the update saved by an earlier train" in out
    assert _wait_for_status(server, opened["id"], {"completed", "failed"})["status"] == "completed"
    assert not (device_dir / "pending_upload.json").exists()


def test_a_late_upload_says_the_deadline_passed(
    server: ServerProcess, device_dir: Path, tmp_path: Path, paused: list[subprocess.Popen[str]],
) -> None:
    # Prepare: the device is held mid-training until its round's deadline has passed
    log = tmp_path / "train.log"
    process, opened = _train_in_a_round(server, device_dir, log, paused, deadline=15)
    os.kill(process.pid, signal.SIGSTOP)
    _wait_for_status(server, opened["id"], {"failed", "completed"})
    # Execute
    os.kill(process.pid, signal.SIGCONT)
    code = process.wait(timeout=300)
    # Assert
    err = log.read_text()
    assert code != 0 and "Traceback" not in err, err
    assert f"round {opened['id']}'s upload deadline" in err and "passed before this device's update arrived" in err
    assert not (device_dir / "pending_upload.json").exists()


def test_a_refused_or_failed_registration_names_the_token_option_and_leaves_no_state(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Prepare: a server that registers devices only with an enrollment token, as production does; an empty
    # folder the user made for the device, and one that does not exist yet
    token_server = ServerProcess(tmp_path / "data", FEDFACE_REQUIRE_ENROLLMENT_TOKEN="true").start()
    made, fresh = tmp_path / "made", tmp_path / "fresh"
    made.mkdir()
    try:
        token = token_server.admin("POST", "/v1/admin/enrollment-tokens", json={"count": 1})["tokens"][0]
        # Execute / Assert: no token, a bad token, a server that is down: one line each, and no state written
        for state in (made, fresh):
            code, _, err = fedface(capsys, "device", "register", "--server", token_server.url, "--state", state)
            assert "--enrollment-token TOKEN" in one_line_error(code, err) and "FEDFACE_ENROLLMENT_TOKEN" in err
            assert f"nothing was saved in {state}" in err
        for bad in ("not-a-token", "unknown-token-0123456789"):
            code, _, err = fedface(capsys, "device", "register", "--server", token_server.url, "--state", fresh,
                                   "--enrollment-token", bad)
            assert "check the enrollment token" in one_line_error(code, err) and "fedface admin token issue" in err
        code, _, err = fedface(capsys, "device", "register", "--server", "http://127.0.0.1:9", "--state", fresh)
        assert "cannot reach the server" in one_line_error(code, err) and f"nothing was saved in {fresh}" in err
        assert list(made.iterdir()) == [] and not fresh.exists()
        # Execute / Assert: the SDK's refusal names its own argument, and writes nothing either
        with pytest.raises(DeviceError, match=r"register\(enrollment_token=\.\.\.\)"):
            FaceDevice(token_server.url, fresh).register()
        assert not fresh.exists()
        # Execute / Assert: enroll on the folder that was never registered refuses before it detects anything
        code, out, err = fedface(capsys, "device", "enroll", "--server", token_server.url, "--state", fresh,
                                 "--photos", tmp_path)
        assert "no device state at" in one_line_error(code, err) and out == ""
        # Execute / Assert: with the token from FEDFACE_ENROLLMENT_TOKEN it registers; a later refusal keeps that device
        monkeypatch.setenv("FEDFACE_ENROLLMENT_TOKEN", token)
        code, out, _ = fedface(capsys, "device", "register", "--server", token_server.url, "--state", fresh)
        assert code == 0 and out.startswith("registered as ")
        kept = {path.name: path.read_bytes() for path in fresh.iterdir()}
        code, out, _ = fedface(capsys, "device", "register", "--server", token_server.url, "--state", fresh,
                               "--enrollment-token", "not-a-token")
        assert code == 0 and "nothing changed" in out
        assert {path.name: path.read_bytes() for path in fresh.iterdir()} == kept
    finally:
        token_server.stop()


def test_enroll_refuses_an_enrolled_device_before_detecting_any_face(
    server: ServerProcess, device_dir: Path, owners: list[list[Path]], capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
) -> None:
    # Prepare: a copy of the enrolled device whose own record forgot the enrollment (the server still holds it)
    forgot = tmp_path / "forgot"
    shutil.copytree(device_dir, forgot, ignore=shutil.ignore_patterns("models"))
    FaceDevice(server.url, forgot).state.update_info(enrolled=False)
    for state, why in ((device_dir, "this device is already enrolled"), (forgot, "the server already holds an enrollment")):
        # Execute
        code, out, err = fedface(capsys, "device", "enroll", "--server", server.url, "--state", state,
                                 "--photos", *owners[0][4:8])
        # Assert: refused in one line, and no photo was detected first
        assert why in one_line_error(code, err) and "run unenroll first" in err
        assert "detecting" not in out


def test_verify_of_folders_without_a_photo_is_an_error(
    server: ServerProcess, device_dir: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path,
) -> None:
    # Prepare: an empty folder, and one that holds only a text file
    empty, notes = tmp_path / "empty", tmp_path / "notes"
    empty.mkdir()
    notes.mkdir()
    (notes / "readme.txt").write_text("no photos here")
    for folder in (empty, notes):
        # Execute
        code, out, err = fedface(capsys, "device", "verify", "--server", server.url, "--state", device_dir, folder)
        # Assert: one line and exit 1, not a threshold line and exit 0
        assert f"no photos to verify in {folder}" in one_line_error(code, err) and out == ""


def test_a_second_train_on_one_state_is_refused_and_a_dead_trains_lock_does_not_block(
    server: ServerProcess, device_dir: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path,
    paused: list[subprocess.Popen[str]],
) -> None:
    # Prepare: a train that waits for a round (none is open), holding the state's lock
    log = tmp_path / "first.log"
    first = _start_train(server, device_dir, log)
    paused.append(first)
    _read_until(first, "checking in", log)
    # Execute
    code, _, err = fedface(capsys, "device", "train", "--server", server.url, "--state", device_dir)
    # Assert: refused at once in one line naming the running train's pid
    assert f"another train is running on {device_dir} (pid {first.pid})" in one_line_error(code, err)
    # Execute: the first train is killed, its lock file left behind
    first.kill()
    first.wait(timeout=60)
    assert (device_dir / "train.lock").exists()
    code, _, err = fedface(capsys, "device", "train", "--server", server.url, "--state", device_dir)
    # Assert: the next train is not blocked (it gets as far as checking in)
    assert "no round is open" in one_line_error(code, err)
    # Execute: a train stopped by Ctrl-C while it waits to be selected
    log = tmp_path / "second.log"
    second = _start_train(server, device_dir, log)
    paused.append(second)
    _read_until(second, "checking in", log)
    second.send_signal(signal.SIGINT)
    code = second.wait(timeout=60)
    # Assert: it says that nothing was saved, then that it was interrupted
    assert code == -signal.SIGINT and log.read_text().splitlines()[-2:] == [
        "no update was saved: nothing will be resent, and the next train checks in and trains afresh",
        "fedface device: interrupted",
    ]


def test_ctrl_c_during_an_upload_says_the_update_is_saved_and_the_next_train_sends_it(
    server: ServerProcess, device_dir: Path, capsys: pytest.CaptureFixture[str], tmp_path: Path,
    paused: list[subprocess.Popen[str]],
) -> None:
    # Prepare: the device trains; the server is frozen (SIGSTOP) so that the upload hangs
    log = tmp_path / "train.log"
    process, opened = _train_in_a_round(server, device_dir, log, paused, deadline=300)
    os.killpg(server.pid, signal.SIGSTOP)
    try:
        _read_until(process, "uploading the update", log)
        time.sleep(1.0)
        # Execute
        process.send_signal(signal.SIGINT)
        code = process.wait(timeout=60)
    finally:
        os.killpg(server.pid, signal.SIGCONT)
    # Assert: it says the update is saved and will be resent, and it is
    lines = log.read_text().splitlines()
    assert code == -signal.SIGINT and lines[-1] == "fedface device: interrupted", lines
    assert lines[-2].startswith(f"the update for round {opened['id']} is saved in {device_dir} and will be resent "
                                "by the next train")
    assert (device_dir / "pending_upload.json").exists()
    # Execute / Assert: the next train sends it, and the round completes with it
    code, out, _ = fedface(capsys, "device", "train", "--server", server.url, "--state", device_dir)
    assert code == 0 and f"round {opened['id']}: sent the update saved by an earlier train" in out
    assert _wait_for_status(server, opened["id"], {"completed", "failed"})["status"] == "completed"


def test_train_wait_names_the_model_its_round_made_and_status_shows_the_current_one(
    server: ServerProcess, owners: list[list[Path]], capsys: pytest.CaptureFixture[str], tmp_path: Path,
    paused: list[subprocess.Popen[str]],
) -> None:
    # Prepare: a new enrolled device that waits, with `--wait` alone, for a round
    state = tmp_path / "device"
    assert fedface(capsys, "device", "register", "--server", server.url, "--state", state)[0] == 0
    assert fedface(capsys, "device", "enroll", "--server", server.url, "--state", state, "--photos", *owners[2][:3])[0] == 0
    enrolled_model = json.loads((state / "device.json").read_text())["model_version"]
    log = tmp_path / "train.log"
    process = _start_train(server, state, log, "--wait")
    paused.append(process)
    _read_until(process, "checking in", log)
    # Execute
    opened = open_round(server, target=1, minimum=1, deadline=300, window=0.5)
    ended = _read_until(process, f"round {opened['id']} ended", log)
    code = process.wait(timeout=60)
    # Assert: the device says that its round ended, and names the model the round made
    made = round_status(server, opened["id"])["result_version"]
    assert code == 0 and made != enrolled_model
    assert ended.strip() == f"round {opened['id']} ended: the server's model is now {made[:12]}"
    # Execute / Assert: status asks the server, and shows that model as the current one
    code, out, _ = fedface(capsys, "device", "status", "--server", server.url, "--state", state)
    assert code == 0 and f"model     {made[:12]} (the server's current model)" in out
    code, out, _ = fedface(capsys, "device", "status", "--server", server.url, "--state", state, "--json")
    shown = json.loads(out)
    assert (shown["server_model"], shown["server_model_current"], shown["server_error"]) == (made, True, None)
    # Execute / Assert: with the server out of reach, it says the model shown is the last one seen
    code, out, _ = fedface(capsys, "device", "status", "--server", "http://127.0.0.1:9", "--state", state)
    assert code == 0 and (f"model     {enrolled_model[:12]} (the last one seen: the server at http://127.0.0.1:9 "
                          "cannot be reached now)") in out


def test_reset_unenrolls_on_the_server_and_deletes_the_state(
    server: ServerProcess, device_dir: Path, capsys: pytest.CaptureFixture[str],
) -> None:
    # Prepare
    device_id = json.loads((device_dir / "device.json").read_text())["device_id"]
    # Execute
    code, out, _ = fedface(capsys, "device", "reset", "--server", server.url, "--state", device_dir, "--yes")
    # Assert
    assert code == 0 and f"unenrolled device {device_id} on the server" in out and not device_dir.exists()
    code, _, err = fedface(capsys, "device", "status", "--state", device_dir)
    assert "no device state at" in one_line_error(code, err)


def test_add_photos_grows_what_the_device_trains_on_and_keeps_the_template(
    server: ServerProcess, owners: list[list[Path]], capsys: pytest.CaptureFixture[str], tmp_path: Path,
) -> None:
    # Prepare: a device enrolled from 3 photos; 2 more of the owner and a blank wall from "its camera"
    state = tmp_path / "device"
    assert fedface(capsys, "device", "register", "--server", server.url, "--state", state)[0] == 0
    assert fedface(capsys, "device", "enroll", "--server", server.url, "--state", state, "--photos", *owners[2][:3])[0] == 0
    device = FaceDevice(server.url, state)
    template = device.state.template()
    Image.fromarray(np.full((200, 200, 3), 90, np.uint8)).save(tmp_path / "wall.jpg")
    # Execute
    code, out, _ = fedface(capsys, "device", "add-photos", "--server", server.url, "--state", state,
                           "--photos", *owners[2][3:5], tmp_path / "wall.jpg")
    # Assert: the faces grew by two, the template did not move, the wall is named
    assert code == 0 and "added 2 faces" in out and f"{tmp_path / 'wall.jpg'} (no face found)" in out
    faces = device.state.faces()
    assert faces is not None and len(faces) == 5
    np.testing.assert_array_equal(device.state.template(), template)
    # Execute / Assert: crops of another shape are refused in one line, and nothing changes
    with pytest.raises(DeviceError, match="like the enrolled ones"):
        device.add_faces(np.zeros((2, 112, 112, 3), np.uint8))
    assert len(device.state.faces()) == 5  # type: ignore[arg-type]
    code, _, err = fedface(capsys, "device", "add-photos", "--server", server.url, "--state", state, "--photos", tmp_path / "wall.jpg")
    assert "no face found" in one_line_error(code, err)


def test_add_photos_needs_an_enrolled_owner(server: ServerProcess, owners: list[list[Path]], capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    # Prepare
    state = tmp_path / "device"
    assert fedface(capsys, "device", "register", "--server", server.url, "--state", state)[0] == 0
    # Execute
    code, _, err = fedface(capsys, "device", "add-photos", "--server", server.url, "--state", state, "--photos", *owners[2][:2])
    # Assert
    assert "run enroll first" in one_line_error(code, err)
