"""Stop signals unwind a command once; a child on a lifeline, or a multiprocessing child, ends with its starter."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from facecore.lifetime import process_table, scratch_folder, stopped_by_signals

CODE_ROOT = Path(__file__).resolve().parents[1]
GONE_WITHIN_S = 5.0


def _python(script: str, *args: str, new_session: bool = False) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", script, *args], cwd=CODE_ROOT, stdout=subprocess.PIPE, text=True,
                            start_new_session=new_session)


def _running_in_group(pgid: int) -> list[int]:
    """Members of process group `pgid` that are not zombies (an orphan waits for init to reap it)."""
    return [row.pid for row in process_table() if row.group == pgid and row.state != "Z"]


def _gone_within(pgid: int, seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while (left := _running_in_group(pgid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


UNWINDING = """
import atexit, signal, sys, time
from facecore.lifetime import Stopped, die_of, stopped_by_signals
atexit.register(print, "exit handlers ran", flush=True)
try:
    with stopped_by_signals():
        try:
            print("ready", flush=True)
            time.sleep(60)
        finally:
            print("cleaning", flush=True)
            time.sleep(1)
            print("cleaned", flush=True)
except Stopped as stopped:
    print("stopped by", stopped.name, flush=True)
    die_of(stopped.signum)
"""


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM, signal.SIGHUP], ids=["SIGINT", "SIGTERM", "SIGHUP"])
def test_a_stop_signal_unwinds_the_block_a_second_one_waits_for_the_cleanup_then_the_signal_ends_it(signum: signal.Signals) -> None:
    # Prepare
    process = _python(UNWINDING)
    assert process.stdout is not None and process.stdout.readline() == "ready\n"
    # Execute: the signal, then the same again while the block cleans up
    process.send_signal(signum)
    assert process.stdout.readline() == "cleaning\n"
    process.send_signal(signum)
    rest = process.stdout.read()
    # Assert: the cleanup and the exit handlers ran, then the process died of the signal
    assert process.wait(timeout=30) == -signum
    assert rest == f"cleaned\nstopped by {signum.name}\nexit handlers ran\n"


def test_an_ignored_signal_stays_ignored_and_the_handlers_come_back_after_the_block() -> None:
    # Prepare: nohup's SIGHUP
    numbers = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    before = {number: signal.getsignal(number) for number in numbers}
    signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        # Execute
        with stopped_by_signals():
            inside = {number: signal.getsignal(number) for number in numbers}
        after = {number: signal.getsignal(number) for number in numbers}
    finally:
        for number, handler in before.items():
            signal.signal(number, handler)
    # Assert
    assert inside[signal.SIGHUP] == signal.SIG_IGN and callable(inside[signal.SIGTERM]) and inside[signal.SIGINT] != before[signal.SIGINT]
    assert after == {signal.SIGINT: before[signal.SIGINT], signal.SIGTERM: before[signal.SIGTERM], signal.SIGHUP: signal.SIG_IGN}


STARTER = """
import subprocess, sys, time
from facecore.lifetime import Lifeline
CHILD = '''
import subprocess, sys, time
from facecore.lifetime import exit_with_parent
exit_with_parent("child")
subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])  # a grandchild, as a server's workers
time.sleep(60)
'''
lifeline = Lifeline()
child = subprocess.Popen([sys.executable, "-c", CHILD], env={**__import__("os").environ, **lifeline.env()}, pass_fds=lifeline.fds,
                         start_new_session=True)
lifeline.handed_over()
print(child.pid, flush=True)
time.sleep(60)
"""


def test_a_child_on_a_lifeline_takes_its_group_along_when_its_starter_is_killed() -> None:
    # Prepare: a starter, its child in a session of its own, and the child's child
    starter = _python(STARTER)
    assert starter.stdout is not None
    child = int(starter.stdout.readline())
    deadline = time.monotonic() + 30
    while len(_running_in_group(child)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    running_before = len(_running_in_group(child))
    # Execute
    starter.kill()
    starter.wait()
    # Assert
    assert running_before == 2 and _gone_within(child, GONE_WITHIN_S) == []


def test_a_child_on_a_lifeline_lives_while_its_starter_does() -> None:
    # Prepare
    starter = _python(STARTER, new_session=True)
    assert starter.stdout is not None
    child = int(starter.stdout.readline())
    try:
        # Execute
        time.sleep(1.5)  # longer than a child's check of its parent
        # Assert
        assert _running_in_group(child)
    finally:
        starter.kill()
        starter.wait()
        _gone_within(child, GONE_WITHIN_S)


POOL = """
import multiprocessing, sys, time

def serve():
    from facecore.lifetime import exit_with_parent
    exit_with_parent("worker")
    time.sleep(60)

if __name__ == "__main__":
    worker = multiprocessing.get_context(sys.argv[1]).Process(target=serve, daemon=True)
    worker.start()
    print(worker.pid, flush=True)
    time.sleep(60)
"""


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_a_multiprocessing_child_ends_when_its_parent_is_killed(tmp_path: Path, method: str) -> None:
    # Prepare: a parent in a session of its own, so its group holds only it and its workers
    script = tmp_path / "pool.py"
    script.write_text(POOL)
    parent = subprocess.Popen([sys.executable, str(script), method], cwd=CODE_ROOT, stdout=subprocess.PIPE, text=True,
                              start_new_session=True, env={**os.environ, "PYTHONPATH": str(CODE_ROOT)})
    assert parent.stdout is not None
    worker = int(parent.stdout.readline())
    time.sleep(1.5)  # the worker is watching by now
    alive_before = Path(f"/proc/{worker}").exists()
    # Execute
    parent.kill()
    parent.wait()
    # Assert
    assert alive_before and _gone_within(parent.pid, GONE_WITHIN_S) == []


@pytest.mark.parametrize("keep", [False, True])
def test_a_scratch_folder_goes_however_its_block_ends_unless_kept(keep: bool, capsys: pytest.CaptureFixture[str]) -> None:
    # Execute: the block ends on Ctrl-C, which must come out unchanged (a named one, so the match can tell)
    with pytest.raises(KeyboardInterrupt, match="^ctrl-c in the block$"), scratch_folder("fedface-test-", keep) as folder:
        (folder / "file").write_text("x")
        raise KeyboardInterrupt("ctrl-c in the block")
    # Assert
    assert folder.is_dir() == keep
    assert (f"kept the scratch folder {folder}" in capsys.readouterr().err) == keep
    if keep:
        (folder / "file").unlink()
        folder.rmdir()


ENDING_NOW = """
import atexit, sys, threading, time
from facecore.lifetime import exit_now

class Freed:
    def __del__(self):
        print("freed in the teardown", file=sys.stderr, flush=True)

kept = Freed()  # a module global: only the interpreter's teardown frees it
atexit.register(print, "exit handlers ran")
threading.Thread(target=lambda: (time.sleep(0.3), print("thread finished"))).start()
print("buffered output", end="")  # no newline, no flush: the exit must flush it
exit_now(int(sys.argv[1]))
"""


def test_exit_now_waits_for_threads_runs_exit_handlers_flushes_and_skips_the_teardown() -> None:
    # Execute
    ended = subprocess.run([sys.executable, "-c", ENDING_NOW, "3"], cwd=CODE_ROOT, capture_output=True, text=True,
                           timeout=60)
    # Assert: the status given, everything a normal exit does, in its order, and nothing freed
    assert ended.returncode == 3
    assert ended.stdout == "buffered outputthread finished\nexit handlers ran\n"
    assert "freed in the teardown" not in ended.stderr
