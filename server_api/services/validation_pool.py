"""Update validation in worker processes, off the server process's GIL.

Parsing and checking a 2 MB update is ~2 ms of CPU, but inside a busy server it took ~10 ms
of wall time per upload and slowed every other request: it holds the GIL in Python loops and
gives it up at every file read and torch call, and each time it wants it back it waits behind
the event loop and the thread that holds the one SQLite connection. In a worker process it
competes with nobody's GIL (`fedface bench server`, 1,000 uploads: see server_api/README.md).

Each worker is a process with a pipe; the request's own thread borrows an idle worker, sends
(path, size, spec), and blocks on the answer. A ProcessPoolExecutor measured slower here: its
manager and feeder threads add four GIL handoffs per request. Workers come from a forkserver
that has already imported the validation code, so none is forked from the threaded server and
a new one starts in milliseconds. ``processes=0`` validates in the calling thread.
"""
from __future__ import annotations

import multiprocessing
import queue
import threading
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any

from server_api.core.logging import get_logger
from server_api.errors import ServerError, Unavailable
from server_api.services.validation import ParsedUpdate, parse_masked_update, parse_update

_PRELOAD = ["server_api.services.validation"]
STOP_TIMEOUT_S = 5.0
log = get_logger("validation")


@dataclass(frozen=True)
class UpdateSpec:
    """What an upload is checked against: the round's base model, and the delta norm bound
    (None for a secure-aggregation upload, whose masked values have no meaningful norm)."""

    spec: dict[str, Any]
    embedding_dim: int
    base_version: str
    max_delta_norm: float | None
    trainable_blocks: int | None = None  # the round's frozen prefix: its entries may be left out

    @property
    def key(self) -> tuple[str, float | None, int | None]:
        """What a worker caches this spec under."""
        return self.base_version, self.max_delta_norm, self.trainable_blocks


def check_update_file(path: str, size: int, expected: UpdateSpec) -> ParsedUpdate:
    """Parse and check one spooled upload; raises InvalidInput / Conflict."""
    with open(path, "rb") as handle:
        if expected.max_delta_norm is None:
            return parse_masked_update(handle, size, expected.spec, expected.embedding_dim, expected.base_version)
        return parse_update(handle, size, expected.spec, expected.embedding_dim, expected.base_version, expected.max_delta_norm, expected.trainable_blocks)


def _serve(connection: Connection) -> None:
    """A worker: answer (path, size, key, spec or None) with (ok, ParsedUpdate or error) until
    the server closes its end. Specs are sent once per worker and model version, then named."""
    specs: dict[tuple[str, float | None, int | None], UpdateSpec] = {}
    while True:
        try:
            path, size, key, expected = connection.recv()
        except EOFError:
            return  # the server stopped (or was killed)
        expected = specs.setdefault(key, expected) if expected is not None else specs[key]
        try:
            answer: tuple[bool, Any] = (True, check_update_file(path, size, expected))
        except ServerError as error:
            answer = (False, error)
        except Exception as error:  # noqa: BLE001 -- a bug, not bad input: the worker must still answer (the server returns 500)
            answer = (False, RuntimeError(f"update validation failed: {error!r}"))
        connection.send(answer)


@dataclass
class _Worker:
    process: BaseProcess
    connection: Connection
    known: set[tuple[str, float | None, int | None]] = field(default_factory=set)


class ValidationPool:
    """`check()` runs :func:`check_update_file` in one of `processes` workers."""

    def __init__(self, processes: int) -> None:
        if processes < 0:
            raise ValueError(f"processes must be >= 0, got {processes}")
        self.processes = processes
        self._idle: queue.SimpleQueue[_Worker] = queue.SimpleQueue()
        self._all: list[_Worker] = []
        self._lock = threading.Lock()
        self._started = False

    def start(self) -> None:
        """Start the workers (at server startup, so the first upload does not wait for them)."""
        with self._lock:
            if self._started:
                return
            self._started = True
            for _ in range(self.processes):
                self._idle.put(self._spawn())

    def check(self, path: Path, size: int, expected: UpdateSpec) -> ParsedUpdate:
        if not self.processes:
            return check_update_file(str(path), size, expected)
        if not self._started:
            self.start()
        worker = self._idle.get()
        if not worker.process.is_alive():
            worker = self._replace(worker)
        key = expected.key
        try:
            worker.connection.send((str(path), size, key, None if key in worker.known else expected))
            worker.known.add(key)
            ok, value = worker.connection.recv()
        except (EOFError, OSError):
            # The worker died mid-request (the OOM killer, an operator's kill): nothing was
            # accepted. A new worker takes its place; this request is answered 503 and retried.
            worker = self._replace(worker)
            raise Unavailable("the update validator restarted; retry") from None
        finally:
            self._idle.put(worker)
        if not ok:
            raise value
        return value

    def pids(self) -> list[int]:
        """The live workers' process ids (operators and tests)."""
        with self._lock:
            return [w.process.pid for w in self._all if w.process.pid is not None and w.process.is_alive()]

    def close(self) -> None:
        with self._lock:
            workers, self._all, self._started = self._all, [], False
        for worker in workers:
            worker.connection.close()  # the worker reads EOF and returns
        for worker in workers:
            worker.process.join(STOP_TIMEOUT_S)
            if worker.process.is_alive():
                worker.process.kill()
                worker.process.join()
        self._idle = queue.SimpleQueue()

    def _spawn(self) -> _Worker:
        context = multiprocessing.get_context("forkserver")
        context.set_forkserver_preload(_PRELOAD)
        ours, theirs = context.Pipe()
        process = context.Process(target=_serve, args=(theirs,), name="fedface-validate", daemon=True)
        process.start()
        theirs.close()
        worker = _Worker(process, ours)
        self._all.append(worker)
        return worker

    def _replace(self, dead: _Worker) -> _Worker:
        log.warning("a validation worker died; starting a new one", extra={"fields": {"exitcode": dead.process.exitcode}})
        dead.connection.close()
        dead.process.join(STOP_TIMEOUT_S)
        with self._lock:
            if dead in self._all:
                self._all.remove(dead)
            return self._spawn()
