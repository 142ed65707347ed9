"""Device SDK tests run against a real `fedface server` process with the bundled model."""
from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "server"))
from facecore.data.split import SplitConfig, build_split  # noqa: E402
from server_process import ServerProcess  # noqa: E402


def default_server(data_dir: Path) -> ServerProcess:
    """A started `fedface server` on the default model, exporting ONNX for the devices' inference."""
    return ServerProcess(data_dir, model="default", FEDFACE_EXPORT_ONNX="true").start()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    process = default_server(tmp_path_factory.mktemp("server") / "data")
    yield process
    process.stop()


@pytest.fixture(scope="module")
def owners(real_data: Path) -> list[list[Path]]:
    """Photos of three CelebA device identities (in-the-wild photos that need detection)."""
    split = build_split(real_data, SplitConfig(seed=0))
    celeba = [paths for identity, paths in sorted(split.sets["devices"].items()) if identity.startswith("celeba:") and len(paths) >= 16]
    return [[real_data / p for p in paths] for paths in celeba[:3]]


def open_round(server: ServerProcess, target: int, minimum: int, deadline: float = 120, window: float = 1.0, **config: object) -> dict:  # type: ignore[type-arg]
    token = (server.data_dir / "admin_token").read_text().strip()
    body = {"target_participants": target, "min_participants": minimum, "deadline_s": deadline, "selection_window_s": window} | config
    response = httpx.post(server.url + "/v1/admin/rounds", json=body, headers={"Authorization": f"Bearer {token}"}, timeout=30)
    assert response.status_code == 201, response.text
    return response.json()


def round_status(server: ServerProcess, round_id: int) -> dict:  # type: ignore[type-arg]
    token = (server.data_dir / "admin_token").read_text().strip()
    return httpx.get(f"{server.url}/v1/admin/rounds/{round_id}", headers={"Authorization": f"Bearer {token}"}, timeout=30).json()
