"""The tests' real `fedface server` process: the shared launcher (server_api.launcher) with test settings.

A small untrained backbone without ONNX export and a fast scheduler keep start-up and rounds quick; the
caller's own FEDFACE_* settings never reach the server. Keyword arguments add or override FEDFACE_* variables.
"""
from __future__ import annotations

from pathlib import Path

from server_api.errors import LaunchFailed
from server_api.launcher import LocalServer, free_port

__all__ = ["REPO", "ServerProcess", "free_port"]

REPO = Path(__file__).resolve().parents[2]
TEST_SETTINGS = {
    "FEDFACE_RANDOM_BACKBONE": "mobilefacenet_s", "FEDFACE_SCHEDULER_INTERVAL_S": "0.2",
    "FEDFACE_EXPORT_ONNX": "false", "FEDFACE_LOG_LEVEL": "WARNING",
}


class ServerProcess(LocalServer):
    def __init__(self, data_dir: Path, db_url: str | None = None, workers: int = 1, model: str = "random", **env: str) -> None:
        super().__init__(
            data_dir, model=model, workers=workers, db_url=db_url, env=TEST_SETTINGS | env | {"OMP_NUM_THREADS": "1"},
            inherit_settings=False, ready_timeout_s=120,
        )

    def start(self) -> ServerProcess:
        try:
            super().start()
        except LaunchFailed as error:  # a failing test shows why the server did not come up
            raise RuntimeError(f"{error}\n{error.log_tail}") from None
        return self

    def kill9(self) -> None:
        self.kill()
