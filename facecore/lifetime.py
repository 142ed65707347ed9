"""Processes and scratch folders that end with the command that made them.

Invariants:
- Inside `stopped_by_signals()`, SIGINT, SIGTERM and SIGHUP raise :class:`Stopped` (a KeyboardInterrupt, so
  whatever handles Ctrl-C handles all three) in the main thread: they unwind `with` and `finally` blocks, so
  servers stop, worker pools close, scratch folders go. Only the first one raises; later ones are ignored until
  the block ends, so a second signal cannot cut that cleanup short (SIGKILL still can, and the lifeline below
  then ends the children). A signal ignored on entry (`nohup`, a script's background job) stays ignored; off the
  main thread nothing is installed; the previous handlers are back on exit. Once the cleanup is done,
  `die_of(signum)` runs the exit handlers (atexit, weakref finalizers: temporary folders) and ends the process
  by the signal's default action, as it would have ended without a handler: its caller sees the signal (a shell
  shows 128 + its number), and nothing of the interpreter's teardown holds up the end: neither joining threads
  still busy with work nobody wants (a demo device's local training) nor seconds of garbage collection with
  torch loaded on a busy machine.
- A child started with a :class:`Lifeline` that calls `exit_with_parent()` ends once its starter is gone,
  whatever ended the starter, SIGKILL included. The starter holds the write end of a pipe nobody writes to; the
  child watches the read end, which reads EOF once every holder of the write end has exited, and also checks
  that its parent is still the starter, since a bare fork() in the starter copies the write end and would keep
  the pipe open. A multiprocessing child (spawn, forkserver, fork) needs no lifeline: it watches the sentinel
  multiprocessing gives it for its parent.
- On its starter's end, a child that leads its process group SIGKILLs the whole group (a server's uvicorn
  workers, its validation forkserver and their children); any other child SIGKILLs only itself, since its
  group is its starter's. Nothing is left for anyone to save: the starter that wanted the result is gone.
- Not PR_SET_PDEATHSIG: it fires when the *thread* that forked the child ends, and servers are started from
  whichever thread needs one (test fixtures, benchmark helpers); it is Linux-only too.
- `scratch_folder` removes its folder however its block ends, :class:`Stopped` included, unless asked to keep it.
- `exit_now(code)` ends the process as `sys.exit(code)` would, less the interpreter's teardown (freeing every
  module and collecting their cycles: ~50 ms of a cold `fedface device verify`): non-daemon threads are waited
  for, the exit handlers run (atexit, weakref finalizers) and the standard streams are flushed, as at a normal
  exit, and only then does the process end. It is for a command whose objects hold nothing that only their
  freeing would write out (an unclosed buffered file kept alive, an object whose `__del__` saves something).
- Standard library only: the launcher and `fedface --help` import this module.
"""
from __future__ import annotations

import atexit
import os
import select
import shutil
import signal
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any, NoReturn

LIFELINE_ENV = "FEDFACE_LIFELINE"  # "<read fd>:<starter pid>", set for one child by Lifeline.env()
PARENT_POLL_S = 1.0  # how often a child also checks that its parent is still the process that started it
STOP_SIGNALS = tuple(getattr(signal, name) for name in ("SIGINT", "SIGTERM", "SIGHUP") if hasattr(signal, name))


class Stopped(KeyboardInterrupt):
    """SIGINT, SIGTERM or SIGHUP, raised where the main thread was, as Python raises KeyboardInterrupt for SIGINT."""

    def __init__(self, signum: int) -> None:
        self.signum = signum
        self.name = signal.Signals(signum).name
        super().__init__(self.name)


@contextmanager
def stopped_by_signals(enabled: bool = True) -> Iterator[None]:
    """SIGINT, SIGTERM and SIGHUP raise :class:`Stopped` inside the block (see the module's invariants)."""
    if not enabled or threading.current_thread() is not threading.main_thread():
        yield
        return
    previous: dict[int, Any] = {}

    def stop(signum: int, _: FrameType | None) -> None:
        for number in previous:
            signal.signal(number, signal.SIG_IGN)
        raise Stopped(signum)

    for number in STOP_SIGNALS:
        if signal.getsignal(number) != signal.SIG_IGN:
            previous[number] = signal.signal(number, stop)
    try:
        yield
    finally:
        for number, handler in previous.items():
            # None: a handler not installed from Python, which cannot be put back; the default is closest.
            signal.signal(number, signal.SIG_DFL if handler is None else handler)


def die_of(signum: int) -> NoReturn:
    """End this process by `signum` (see the module's invariants); call it once the cleanup is done."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass  # a closed or broken stream has nothing left to say
    atexit._run_exitfuncs()
    signal.signal(signum, signal.SIG_DFL)
    os.kill(os.getpid(), signum)
    os._exit(128 + signum)  # not reached: a signal sent to oneself, not blocked, is delivered before kill() returns


def exit_now(code: int) -> NoReturn:
    """End this process with status `code` (see the module's invariants); a standard stream that cannot be
    flushed makes it 120, as at the interpreter's own exit."""
    threading._shutdown()  # type: ignore[attr-defined]  # what the interpreter's exit runs first: joins non-daemon threads
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        if stream is None or stream.closed:
            continue
        try:
            stream.flush()
        except OSError:
            code = 120
    os._exit(code)


class Lifeline:
    """The starter's end of one child's lifeline: pass `env()` and `fds` to Popen, call `handed_over()` once
    the child runs, and `cut()` once it is gone (or to end it at once: the child then SIGKILLs itself)."""

    def __init__(self) -> None:
        self._read: int | None
        self._write: int | None
        self._read, self._write = os.pipe()  # both close-on-exec: no other child inherits them

    @property
    def fds(self) -> tuple[int, ...]:
        return () if self._read is None else (self._read,)

    def env(self) -> dict[str, str]:
        return {} if self._read is None else {LIFELINE_ENV: f"{self._read}:{os.getpid()}"}

    def handed_over(self) -> None:
        """Close this process's copy of the read end (the child has its own)."""
        if self._read is not None:
            os.close(self._read)
            self._read = None

    def cut(self) -> None:
        self.handed_over()
        if self._write is not None:
            os.close(self._write)
            self._write = None


def exit_with_parent(name: str = "fedface") -> bool:
    """In a child: end (SIGKILL, see the module's invariants) once the process that started it is gone, saying
    so in one line on stderr that starts with `name`. Watches the lifeline in the environment, which is removed so
    this process's own children do not inherit it, else a multiprocessing parent's sentinel. Returns whether there
    was a parent to watch."""
    handed = os.environ.pop(LIFELINE_ENV, None)
    if handed is not None:
        fd_text, _, pid_text = handed.partition(":")
        fd, parent, started_me = int(fd_text), int(pid_text), True
        os.set_inheritable(fd, False)
    else:
        import multiprocessing  # here: `fedface --help` imports this module

        mp_parent = multiprocessing.parent_process()
        if mp_parent is None or mp_parent.pid is None:
            return False
        # A forkserver child's parent process is the forkserver, not the multiprocessing parent it serves.
        fd, parent, started_me = mp_parent.sentinel, mp_parent.pid, False
    threading.Thread(target=_watch, args=(fd, parent, started_me, name), name="exit-with-parent", daemon=True).start()
    return True


@contextmanager
def scratch_folder(prefix: str, keep: bool = False) -> Iterator[Path]:
    """A new folder under the temporary directory, removed when the block ends however it ends, or with
    `keep` left in place and named on stderr."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield folder
    finally:
        if keep:
            print(f"kept the scratch folder {folder}", file=sys.stderr)
        else:
            shutil.rmtree(folder, ignore_errors=True)


def _watch(fd: int, parent: int, started_me: bool, name: str) -> None:
    while not started_me or os.getppid() == parent:
        readable, _, _ = select.select([fd], [], [], PARENT_POLL_S)
        if readable:  # nobody writes to either: readable is EOF, the parent and every copy of its end are gone
            break
    print(f"{name}: the process that started it ({parent}) is gone; exiting", file=sys.stderr, flush=True)
    if os.getpgrp() == os.getpid():
        os.killpg(os.getpid(), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


__all__ = ["LIFELINE_ENV", "Lifeline", "Stopped", "die_of", "exit_now", "exit_with_parent", "scratch_folder",
           "stopped_by_signals"]


@dataclass(frozen=True)
class ProcessRow:
    pid: int
    parent: int
    group: int
    session: int
    state: str  # "R", "S", ... "Z" for a zombie
    folder: Path  # /proc/PID


def process_table() -> list[ProcessRow]:
    """Every process /proc lists now (none without /proc); one that ends while we read is left out."""
    rows = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        rows.append(ProcessRow(int(entry.name), int(fields[1]), int(fields[2]), int(fields[3]), fields[0], entry))
    return rows
