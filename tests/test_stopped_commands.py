"""Issue #41: a stopped `fedface demo` (`make run`) or `fedface sim cross-device --http` leaves no process or port.

Each command runs as a real subprocess in a session of its own, on the smallest run there is (2 devices, the
random model, LFW folds 6-7 cut to 8 photos), and gets one signal once its server is up: while the devices
enroll, or once the first round's training has begun (the issue's demo was stopped in its third round). Its
processes are those of its own session and of its server's (the launcher gives the server a session of its own),
read from /proc; once signalled, none of them may still run after STOP_WITHIN_S, and nothing may listen on the
server's port. Every signal but SIGKILL also removes the scratch folder; after SIGKILL nothing is left to run that
could remove it, and it stays under the test's own temporary directory.
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from facecore.lifetime import process_table
from facecore.paths import PACKAGES_ENV, packages_root

REPO = Path(__file__).resolve().parents[1]
STOP_WITHIN_S = 10.0
UP_WITHIN_S = 600.0  # a first run aligns the evaluation photos, on a machine that may be busy
SMALLEST_RUN = ["--rounds", "3", "--model", "mobile", "--folds", "6,7", "--eval-photos", "8"]
SERVER_UP = re.compile(r"server up at http://127\.0\.0\.1:(\d+)")
ENROLLING = re.compile(r"register \+ enroll")
ROUND_1 = re.compile(r"round 1:\s+\d+%")  # its progress bar: the devices train
# Each signal once, at one of the two moments, so that each moment meets two signals.
STOPS = [(signal.SIGINT, ENROLLING), (signal.SIGTERM, ROUND_1), (signal.SIGHUP, ENROLLING), (signal.SIGKILL, ROUND_1)]
# Death by the signal, once the command has cleaned up (a shell shows 128 + the number)
EXIT_STATUS = {s: -s for s in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGKILL)}
SAYS = {signal.SIGINT: "interrupted", signal.SIGTERM: "stopped by SIGTERM", signal.SIGHUP: "stopped by SIGHUP"}


@pytest.fixture(scope="module")
def command_env(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The commands' environment: one private aligned-face cache for this module's runs (the first run aligns,
    the others read it), the published weights where `make` fetched them, output unbuffered to read it live."""
    cache = tmp_path_factory.mktemp("stopped_commands_cache")
    return {**os.environ, "FEDFACE_CACHE": str(cache), PACKAGES_ENV: str(packages_root()), "PYTHONUNBUFFERED": "1"}


class Command:
    """`fedface ARGS...` in a session of its own, its output in a file, its temporary files under `tmp`."""

    def __init__(self, args: list[str], folder: Path, env: dict[str, str]) -> None:
        # Short, not under pytest's deep folder: the server's process pool puts a Unix socket in it, and
        # a socket's path is limited to 107 bytes.
        self.tmp = Path(tempfile.mkdtemp(prefix="fs-", dir="/tmp"))
        self.output = folder / "output.log"
        with self.output.open("wb") as output:
            self.process = subprocess.Popen([sys.executable, "-m", "fedface", *args], cwd=REPO, env=env | {"TMPDIR": str(self.tmp)},
                                            stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
        self.sessions = {self.process.pid}

    def text(self) -> str:
        return self.output.read_text(errors="replace")

    def wait_for(self, pattern: re.Pattern[str]) -> re.Match[str]:
        deadline = time.monotonic() + UP_WITHIN_S
        while not (found := pattern.search(self.text())):
            if self.process.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"no {pattern.pattern!r} (exit status {self.process.poll()}):\n{self.text()[-3000:]}")
            time.sleep(0.1)
        return found

    def wait_for_server(self) -> int:
        """The server's port, once the command says the server is up; its session joins `sessions`."""
        port = int(self.wait_for(SERVER_UP).group(1))
        self.sessions |= {pid for pid, ppid, session, _ in _processes() if ppid == self.process.pid and session == pid}
        assert len(self.sessions) == 2, f"no server process in a session of its own: {self.sessions}"
        return port

    def stop(self, signum: signal.Signals, port: int) -> tuple[list[str], bool, float]:
        """Send `signum` to the command alone, as `kill` would. After STOP_WITHIN_S at most: what of it still runs, whether
        something still listens on `port`, and how long it took until neither."""
        sent = time.monotonic()
        self.process.send_signal(signum)
        while ((left := self.running()) or (listened := _listened_on(port))) and time.monotonic() - sent < STOP_WITHIN_S:
            time.sleep(0.1)
        return left, bool(left) or listened, time.monotonic() - sent

    def running(self) -> list[str]:
        return [f"{pid} {_command_line(pid)}" for pid, _, session, state in _processes() if session in self.sessions and _alive(pid, state)]

    def clean_up(self) -> None:
        """After a failed test: SIGKILL whatever is left (each session holds one process group, led by its session leader)."""
        if self.running():
            for leader in self.sessions:
                try:
                    os.killpg(leader, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        self.process.wait(timeout=60)


def _processes() -> list[tuple[int, int, int, str]]:
    """(pid, parent pid, session id, state) of every process."""
    return [(row.pid, row.parent, row.session, row.state) for row in process_table()]


def _alive(pid: int, state: str) -> bool:
    """A zombie's threads may still be ending, holding its files and sockets: /proc shows its first thread's state."""
    if state != "Z":
        return True
    for task in Path(f"/proc/{pid}/task").glob("*"):
        try:
            if (task / "stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X"):
                return True
        except (OSError, IndexError):
            continue
    return False


def _command_line(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:200]
    except OSError:
        return "(gone)"


def _listened_on(port: int) -> bool:
    """Whether something listens on 127.0.0.1:`port`: a server binding as uvicorn does (SO_REUSEADDR) would fail."""
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def _stopped_and_checked(command: Command, signum: signal.Signals, moment: re.Pattern[str]) -> None:
    """Stop a command with `signum` once its server is up and its output shows `moment`, then assert that it is
    gone with everything it started."""
    if signal.getsignal(signum) == signal.SIG_IGN:
        pytest.skip(f"{signum.name} is ignored here, and so, rightly, by the commands this test starts (nohup, a background job)")
    try:
        port = command.wait_for_server()
        command.wait_for(moment)
        # Execute
        left, listened, seconds = command.stop(signum, port)
        status = command.process.wait(timeout=STOP_WITHIN_S)
    finally:
        command.clean_up()
    # Assert: nothing runs, nothing listens, and the command said why it ended
    assert left == [], f"still running {seconds:.1f} s after {signum.name}: {left}\n{command.text()[-3000:]}"
    assert not listened, f"port {port} still taken {seconds:.1f} s after {signum.name}"
    assert status == EXIT_STATUS[signum], command.text()[-3000:]
    if signum != signal.SIGKILL:
        assert SAYS[signum] in command.text() and "Traceback" not in command.text(), command.text()[-3000:]
        assert list(command.tmp.glob("fedface-demo-*")) == []
    shutil.rmtree(command.tmp, ignore_errors=True)  # kill -9 leaves the scratch folder by design


@pytest.mark.slow
@pytest.mark.parametrize(("signum", "moment"), STOPS, ids=[f"{s.name}-{'enrolling' if m is ENROLLING else 'round-1'}" for s, m in STOPS])
def test_a_demo_stopped_by_any_signal_leaves_no_process_port_or_scratch_folder(
    signum: signal.Signals, moment: re.Pattern[str], real_data: Path, tmp_path: Path, command_env: dict[str, str],
) -> None:
    # Prepare: `make run`'s command on the smallest run
    demo = Command(["demo", "--devices", "2", *SMALLEST_RUN, "--data", str(real_data), "--out", str(tmp_path / "out")], tmp_path, command_env)
    # Execute, Assert
    _stopped_and_checked(demo, signum, moment)


@pytest.mark.slow
def test_a_stopped_sim_over_http_leaves_no_process_port_or_scratch_folder(real_data: Path, tmp_path: Path, command_env: dict[str, str]) -> None:
    # Prepare: the simulator's end-to-end mode, which runs the demo's server and devices from its own command
    sim = Command(["sim", "cross-device", "--http", "2", *SMALLEST_RUN, "--data", str(real_data), "--out", str(tmp_path / "out")], tmp_path,
                  command_env)
    # Execute, Assert
    _stopped_and_checked(sim, signal.SIGTERM, ROUND_1)
