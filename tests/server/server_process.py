"""A real `fedface server` process on a free loopback port, for end-to-end and crash tests."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

# Same code path as `fedface server` (fedface.commands.server), independent of the CLI's command table.
LAUNCHER = (
    "import argparse, sys; from fedface.commands import server; "
    "p = argparse.ArgumentParser(); server.add_arguments(p); sys.exit(server.run(p.parse_args()))"
)
REPO = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class ServerProcess:
    def __init__(self, data_dir: Path, db_url: str | None = None, workers: int = 1, model: str = "random", **env: str) -> None:
        self.data_dir = data_dir
        self.db_url = db_url
        self.workers = workers
        self.model = model
        self.env = {
            "FEDFACE_RANDOM_BACKBONE": "mobilefacenet_s", "FEDFACE_SCHEDULER_INTERVAL_S": "0.2",
            "FEDFACE_EXPORT_ONNX": "false", "FEDFACE_LOG_LEVEL": "WARNING", **env,
        }
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None
        self.log = data_dir.parent / f"server-{self.port}.log"

    def start(self, timeout: float = 120) -> ServerProcess:
        args = ["--dev", "--data-dir", str(self.data_dir), "--model", self.model, "--port", str(self.port), "--workers", str(self.workers)]
        if self.db_url:
            args += ["--db", self.db_url]
        env = {k: v for k, v in os.environ.items() if not k.startswith("FEDFACE_") or k.startswith("FEDFACE_TEST")}
        env |= self.env | {"PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
        with self.log.open("ab") as log:
            # Own session: with --workers N, stop/kill reaches the worker processes too.
            self.process = subprocess.Popen([sys.executable, "-c", LAUNCHER, *args], cwd=REPO, env=env, stdout=log, stderr=log, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited with {self.process.returncode}:\n{self.log.read_text()[-3000:]}")
            try:
                if httpx.get(self.url + "/readyz", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.kill9()
        raise RuntimeError(f"server not ready after {timeout} s:\n{self.log.read_text()[-3000:]}")

    def kill9(self) -> None:
        assert self.process is not None
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait(timeout=30)

    def stop(self) -> int:
        assert self.process is not None
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.kill9()
        return self.process.returncode

    def admin_token(self) -> str:
        return (self.data_dir / "admin_token").read_text().strip()
