"""A `fedface server --dev` child process on a free loopback port: the one launcher behind the tests'
server fixtures, `fedface bench`, `fedface sim cross-device --http` and `fedface demo`.

Invariants:
- The child runs `python -m fedface server` in its own session, so `stop()` reaches uvicorn's worker
  processes too: SIGTERM to the whole group, then SIGKILL if it has not exited within `STOP_TIMEOUT_S`.
  `stop()` and `kill()` return only once no process of the group runs, not just the leader: a worker or
  a validation-pool child can outlive the leader by a moment, and a caller may reuse its port or files.
- The child ends itself, and its whole group, once the process that launched it is gone for any reason,
  SIGKILL included (a :class:`facecore.lifetime.Lifeline`: `fedface server` watches it from its first line).
  `stop()` cuts that lifeline only once the group is gone, so it never cuts a graceful stop short; an
  interrupted `stop()` cuts it anyway, and the server then SIGKILLs its group. A `start()` that does not
  return (not ready, an error, Ctrl-C or a stop signal while waiting) kills what it launched.
- The child imports the same code as this process: run from a source checkout, the checkout leads its
  PYTHONPATH (an installed package is found where it is installed).
- `start()` returns only once `/readyz` answers 200. A child that exits first, or is not ready in time,
  is killed and :class:`~server_api.errors.LaunchFailed` names its log (one line; the log's end rides along).
- This module imports nothing else from `server_api` but its errors, nor from `facecore` but its lifetime
  module (no FastAPI, SQLAlchemy or torch), so a caller that only starts a server stays light; tests,
  benchmarks and the simulator import it, never the reverse.
"""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from facecore.lifetime import Lifeline, process_table
from server_api.errors import ConfigError, LaunchFailed

CODE_ROOT = Path(__file__).resolve().parents[1]
# Every simulated device registers from the one loopback address, so the per-address limit is off.
MANY_DEVICES_ON_LOOPBACK = {"FEDFACE_ADDRESS_RATE_PER_S": "0"}
STOP_TIMEOUT_S = 30.0
POLL_INTERVAL_S = 0.2
PROBE_TIMEOUT_S = 5.0  # one /readyz request; generous, since a benchmark may load the machine


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def group_running(pgid: int) -> bool:
    """Whether a process of group `pgid` still runs. Zombies (exited, waiting for init to reap them) do not
    count, unless a thread of theirs is still ending: /proc shows a process's first thread, which can be a
    zombie while the others still hold its sockets. Without /proc (not Linux), any member the kernel still
    knows counts."""
    if not Path("/proc").is_dir():
        try:
            os.killpg(pgid, 0)
        except (ProcessLookupError, PermissionError):
            return False
        return True
    return any(row.group == pgid and (row.state != "Z" or _threads_running(row.folder)) for row in process_table())


def _threads_running(process: Path) -> bool:
    for task in process.glob("task/*"):
        try:
            if (task / "stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X"):
                return True
        except (OSError, IndexError):
            continue  # ended while we looked
    return False


def without_server_settings(environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` minus the caller's own FEDFACE_* settings, so a developer's or operator's server
    configuration cannot change a test or a measurement; FEDFACE_TEST_* switches of the test harness stay."""
    return {k: v for k, v in environ.items() if not k.startswith("FEDFACE_") or k.startswith("FEDFACE_TEST")}


class LocalServer:
    """One `fedface server --dev` process; usable as a context manager (start on entry, stop on exit).

    `env` adds or overrides variables of the child; with `inherit_settings=False` the caller's FEDFACE_*
    settings are dropped first. `log` collects the child's stdout and stderr (default: beside `data_dir`).
    """

    def __init__(
        self, data_dir: Path, *, model: str = "random", workers: int = 1, db_url: str | None = None,
        env: Mapping[str, str] | None = None, inherit_settings: bool = True, log: Path | None = None,
        ready_timeout_s: float = 180.0,
    ) -> None:
        self.data_dir, self.model, self.workers, self.db_url = data_dir, model, workers, db_url
        self.env = dict(env or {})
        self.inherit_settings, self.ready_timeout_s = inherit_settings, ready_timeout_s
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log if log is not None else data_dir.parent / f"server-{self.port}.log"
        self.process: subprocess.Popen[bytes] | None = None
        self._lifeline: Lifeline | None = None

    def command(self) -> list[str]:
        args = ["--dev", "--data-dir", str(self.data_dir), "--model", self.model, "--port", str(self.port)]
        args += ["--workers", str(self.workers)] + (["--db", self.db_url] if self.db_url else [])
        return [sys.executable, "-m", "fedface", "server", *args]

    def child_env(self) -> dict[str, str]:
        env = dict(os.environ) if self.inherit_settings else without_server_settings(os.environ)
        env |= self.env
        if (CODE_ROOT / "pyproject.toml").is_file():  # a checkout; never put site-packages ahead of the stdlib
            env["PYTHONPATH"] = os.pathsep.join([str(CODE_ROOT), *filter(None, [env.get("PYTHONPATH")])])
        return env

    def launch(self) -> LocalServer:
        """Start the process and return at once; `wait_ready()` waits for it. Lets a caller overlap
        its own start-up (a benchmark's client) with the server's."""
        self.data_dir.parent.mkdir(parents=True, exist_ok=True)
        self.log.parent.mkdir(parents=True, exist_ok=True)
        self._cut_lifeline()  # a handle launched again lets its earlier process go
        self._lifeline = lifeline = Lifeline()
        try:
            with self.log.open("ab") as log:
                self.process = subprocess.Popen(
                    self.command(), env=self.child_env() | lifeline.env(), stdout=log, stderr=log, start_new_session=True,
                    pass_fds=lifeline.fds,
                )
        except BaseException:
            lifeline.cut()
            raise
        lifeline.handed_over()
        return self

    def wait_ready(self, timeout_s: float | None = None) -> LocalServer:
        process = self._started()
        timeout_s = self.ready_timeout_s if timeout_s is None else timeout_s
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if process.poll() is not None:
                self.kill()  # its workers, if any are left
                raise LaunchFailed(f"the local server exited with {process.returncode} before it was ready", self.log)
            try:
                if httpx.get(self.url + "/readyz", timeout=PROBE_TIMEOUT_S).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(POLL_INTERVAL_S)
        self.kill()
        raise LaunchFailed(f"the local server was not ready after {timeout_s:g} s", self.log)

    def start(self) -> LocalServer:
        self.launch()
        try:
            return self.wait_ready()
        except BaseException:
            self.kill()  # `with` calls no __exit__ when __enter__ raises
            raise

    def stop(self) -> int | None:
        """SIGTERM, then SIGKILL after STOP_TIMEOUT_S; the exit status (None if never launched)."""
        if self.process is None:
            return None
        try:
            if self.process.poll() is None:
                self._signal(signal.SIGTERM)
                deadline = time.monotonic() + STOP_TIMEOUT_S
                try:
                    self.process.wait(timeout=STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    self.kill()
                    return self.process.returncode
                if not self._group_gone_by(deadline):
                    self.kill()
            elif group_running(self.process.pid):
                self.kill()  # the leader exited on its own; its children must not outlive the handle
        finally:
            self._cut_lifeline()
        return self.process.returncode

    def kill(self) -> None:
        """SIGKILL the whole process group at once (a crash, as far as the server can tell)."""
        process = self._started()
        try:
            self._signal(signal.SIGKILL)
            process.wait(timeout=STOP_TIMEOUT_S)
            self._group_gone_by(time.monotonic() + STOP_TIMEOUT_S)
        finally:
            self._cut_lifeline()

    def _group_gone_by(self, deadline: float) -> bool:
        while group_running(self._started().pid):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.05)
        return True

    @property
    def pid(self) -> int:
        """The server process's id, which is also its process group's (its own session)."""
        return self._started().pid

    def __enter__(self) -> LocalServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def admin_token(self) -> str:
        return (self.data_dir / "admin_token").read_text().strip()

    def admin(self, method: str, path: str, **kwargs: Any) -> Any:
        """An admin API call's decoded JSON; an error status raises httpx.HTTPStatusError."""
        headers = {"Authorization": f"Bearer {self.admin_token()}"}
        response = httpx.request(method, self.url + path, headers=headers, timeout=60, **kwargs)
        response.raise_for_status()
        return response.json()

    def _started(self) -> subprocess.Popen[bytes]:
        if self.process is None:
            raise LaunchFailed("the local server was never launched", self.log)
        return self.process

    def _cut_lifeline(self) -> None:
        if self._lifeline is not None:
            self._lifeline.cut()
            self._lifeline = None

    def _signal(self, number: signal.Signals) -> None:
        try:
            os.killpg(self._started().pid, number)
        except ProcessLookupError:
            pass  # the whole group has exited already


def share_dev_secrets(source: Path, target: Path) -> None:
    """Give a `--dev` data folder the admin token and template key of another, so two local servers act as replicas
    of one deployment (as production replicas share FEDFACE_ADMIN_TOKEN and FEDFACE_TEMPLATE_KEY)."""
    from server_api.core.config import ADMIN_TOKEN_FILE, TEMPLATE_KEY_FILE

    target.mkdir(parents=True, exist_ok=True, mode=0o700)
    for secret in (ADMIN_TOKEN_FILE, TEMPLATE_KEY_FILE):
        shutil.copy2(source / secret, target / secret)


@contextmanager
def scratch_database(db_url: str | None, prefix: str = "bench_") -> Iterator[str | None]:
    """A PostgreSQL URL whose search_path is a new, empty schema named `prefix` + random, dropped on exit,
    for servers or tests that must not see each other's tables; None stays None (SQLite)."""
    if db_url is None:
        yield None
        return
    import secrets

    from sqlalchemy import create_engine, text

    if not db_url.startswith("postgresql"):
        raise ConfigError(f"a scratch database needs a postgresql:// URL, got {db_url.split(':', 1)[0]}")
    url = "postgresql+psycopg://" + db_url.split("://", 1)[1]
    schema = prefix + secrets.token_hex(6)
    admin = create_engine(url, isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'CREATE SCHEMA "{schema}"'))
    try:
        yield f"{url}{'&' if '?' in url else '?'}options=-csearch_path%3D{schema}"
    finally:
        with admin.connect() as connection:
            connection.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
        admin.dispose()
