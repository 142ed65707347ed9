"""A `fedface server --dev` child process on a free loopback port, for the demo and benchmarks."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import torch


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class LocalServer:
    def __init__(self, data_dir: Path, model: str) -> None:
        self.data_dir, self.model = data_dir, model
        self.url = f"http://127.0.0.1:{_free_port()}"
        self.log = data_dir / "server.log"
        self.process: subprocess.Popen[bytes] | None = None

    def __enter__(self) -> LocalServer:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        port = self.url.rsplit(":", 1)[1]
        command = [sys.executable, "-m", "fedface", "server", "--dev", "--data-dir", str(self.data_dir), "--model", self.model, "--port", port]
        # Every simulated device registers from this one loopback address: no per-address limit.
        env = os.environ | {"FEDFACE_ADDRESS_RATE_PER_S": "0"}
        with self.log.open("ab") as log:
            self.process = subprocess.Popen(command, stdout=log, stderr=log, start_new_session=True, env=env)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"the server exited early; see {self.log}")
            try:
                if httpx.get(self.url + "/readyz", timeout=2).status_code == 200:
                    return self
            except httpx.HTTPError:
                time.sleep(0.3)
        raise RuntimeError(f"the server did not become ready in 180 s; see {self.log}")

    def __exit__(self, *exc: object) -> None:
        if self.process and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)

    def admin(self, method: str, path: str, **kwargs: Any) -> dict[str, Any]:
        token = (self.data_dir / "admin_token").read_text().strip()
        response = httpx.request(method, self.url + path, headers={"Authorization": f"Bearer {token}"}, timeout=60, **kwargs)
        response.raise_for_status()
        return response.json()

    def current_model(self, device: Any) -> torch.nn.Module:
        """The current global backbone, fetched the way a device fetches it."""
        info = device._model()
        return device._load_backbone(info["backbone_url"], info["version"])
