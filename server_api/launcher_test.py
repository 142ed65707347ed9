"""The shared local-server launcher against a real `fedface server --dev` process."""
from __future__ import annotations

import os
from pathlib import Path

import httpx
import pytest

from server_api.errors import LaunchFailed
from server_api.launcher import CODE_ROOT, MANY_DEVICES_ON_LOOPBACK, LocalServer

FAST = {"FEDFACE_RANDOM_BACKBONE": "mobilefacenet_s", "FEDFACE_EXPORT_ONNX": "false", "OMP_NUM_THREADS": "1"}


def _group_alive(pgid: int) -> bool:
    """Whether a process of group `pgid` still runs; zombies (exited, waiting for init to reap them) do not count."""
    for entry in Path("/proc").iterdir():
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split() if entry.name.isdigit() else []
        except OSError:
            continue  # ended while we looked
        if fields and int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False


def test_the_child_gets_the_callers_code_and_only_the_settings_asked_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Prepare
    monkeypatch.setenv("FEDFACE_MAX_UPLOAD_BYTES", "1")
    monkeypatch.setenv("FEDFACE_TEST_SWITCH", "on")
    monkeypatch.setenv("PYTHONPATH", "/elsewhere")
    # Execute
    isolated = LocalServer(tmp_path / "data", env=MANY_DEVICES_ON_LOOPBACK, inherit_settings=False).child_env()
    inherited = LocalServer(tmp_path / "data").child_env()
    # Assert
    assert "FEDFACE_MAX_UPLOAD_BYTES" not in isolated and isolated["FEDFACE_TEST_SWITCH"] == "on"
    assert isolated["FEDFACE_ADDRESS_RATE_PER_S"] == "0"
    assert inherited["FEDFACE_MAX_UPLOAD_BYTES"] == "1"
    assert isolated["PYTHONPATH"].split(os.pathsep) == [str(CODE_ROOT), "/elsewhere"]


def test_a_server_is_ready_on_entry_answers_the_admin_and_is_gone_after_exit(tmp_path: Path) -> None:
    # Execute
    with LocalServer(tmp_path / "data", env=FAST, inherit_settings=False) as server:
        ready = httpx.get(server.url + "/readyz", timeout=10).status_code
        rounds = server.admin("GET", "/v1/admin/rounds")
    # Assert: SIGTERM ended the whole process group cleanly
    assert ready == 200 and rounds == []
    assert server.process is not None and server.process.returncode in (0, -15)
    assert not _group_alive(server.pid) and server.log.is_file()


def test_a_server_that_cannot_start_is_one_line_naming_its_log(tmp_path: Path) -> None:
    # Prepare
    server = LocalServer(tmp_path / "data", model=str(tmp_path / "missing.pt"), env=FAST, inherit_settings=False)
    # Execute
    with pytest.raises(LaunchFailed) as raised:
        server.start()
    # Assert
    message = str(raised.value)
    assert "\n" not in message and "exited with 1" in message and str(server.log) in message
    assert "missing.pt" in raised.value.log_tail
    assert not _group_alive(server.pid)
