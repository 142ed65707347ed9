"""The shared local-server launcher against a real `fedface server --dev` process."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from server_api.errors import LaunchFailed
from server_api.launcher import CODE_ROOT, MANY_DEVICES_ON_LOOPBACK, LocalServer, group_running

FAST = {"FEDFACE_RANDOM_BACKBONE": "mobilefacenet_s", "FEDFACE_EXPORT_ONNX": "false", "OMP_NUM_THREADS": "1"}


def test_a_group_runs_while_a_member_outlives_its_leader_and_not_after() -> None:
    # Prepare: a leader whose child ignores the leader's exit
    script = "import subprocess,sys; subprocess.Popen([sys.executable,'-c','import time; time.sleep(60)']); print(flush=True)"
    leader = subprocess.Popen([sys.executable, "-c", script], start_new_session=True, stdout=subprocess.PIPE)
    assert leader.stdout is not None and leader.stdout.readline()
    leader.wait(timeout=30)
    # Execute
    running_after_leader = group_running(leader.pid)
    os.killpg(leader.pid, 9)
    for _ in range(200):
        if not group_running(leader.pid):
            break
        time.sleep(0.05)
    # Assert
    assert running_after_leader and not group_running(leader.pid)


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
    assert not group_running(server.pid) and server.log.is_file()


def test_a_server_that_cannot_start_is_one_line_naming_its_log(tmp_path: Path) -> None:
    # Prepare
    server = LocalServer(tmp_path / "data", model=str(tmp_path / "missing.pt"), env=FAST, inherit_settings=False)
    # Execute
    with pytest.raises(LaunchFailed, match="^the local server exited with 1 before it was ready; its log: ") as raised:
        server.start()
    # Assert
    message = str(raised.value)
    assert "\n" not in message and "exited with 1" in message and str(server.log) in message
    assert "missing.pt" in raised.value.log_tail
    assert not group_running(server.pid)


HOLDER = """
import json, sys, time
from pathlib import Path
from server_api.launcher import LocalServer
server = LocalServer(Path(sys.argv[1]), env=json.loads(sys.argv[2]), inherit_settings=False).start()
print(server.pid, server.port, flush=True)
time.sleep(600)
"""


def test_a_server_ends_with_its_whole_group_when_the_process_that_started_it_is_killed(tmp_path: Path) -> None:
    # Prepare: a process holding a ready server, as a test run, a benchmark or the demo would
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, str(tmp_path / "data"), json.dumps(FAST)], cwd=CODE_ROOT, stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None
    pid, port = map(int, holder.stdout.readline().split())
    running_before = group_running(pid)
    # Execute
    holder.kill()
    holder.wait()
    # Assert: within seconds, nothing of the server's group runs and nothing listens on its port
    deadline = time.monotonic() + 5
    while group_running(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert running_before and not group_running(pid)
    with pytest.raises(httpx.ConnectError, match="Connection refused"):  # nothing listens
        httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=5)
    assert "the process that started it" in (tmp_path / f"server-{port}.log").read_text()
