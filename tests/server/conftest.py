"""Fixtures for the round-server tests.

``db_url`` is parametrised: SQLite always, PostgreSQL when FEDFACE_TEST_POSTGRES_URL
is set (each test then gets its own schema, dropped afterwards). Apps use a seeded
untrained mobilefacenet_s without ONNX export, so a test costs well under a second.
"""
from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from server_api.core.config import Settings
from server_api.launcher import scratch_database

warnings.filterwarnings("ignore", message=".*httpx.*starlette.testclient.*")
from fastapi.testclient import TestClient  # noqa: E402

from server_api.main import create_app  # noqa: E402
from server_helpers import make_settings  # noqa: E402

POSTGRES_URL = os.environ.get("FEDFACE_TEST_POSTGRES_URL")
BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.skipif(not POSTGRES_URL, reason="FEDFACE_TEST_POSTGRES_URL not set"))]


@pytest.fixture(autouse=True)
def _no_server_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Settings read FEDFACE_* variables; a developer's own must not leak into tests."""
    for name in Settings.model_fields:
        monkeypatch.delenv(f"FEDFACE_{name.upper()}", raising=False)


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'fedface.db'}"
        return
    assert POSTGRES_URL
    with scratch_database(POSTGRES_URL, prefix="t_") as url:
        assert url is not None
        yield url


@pytest.fixture()
def settings(tmp_path: Path, db_url: str) -> Settings:
    return make_settings(tmp_path / "data", db_url)


@pytest.fixture()
def client(settings: Settings) -> Iterator[TestClient]:
    # No background scheduler: tests call scheduler.tick() themselves, so nothing races them.
    with TestClient(create_app(settings, run_scheduler=False)) as test_client:
        yield test_client


@pytest.fixture()
def admin(client: TestClient) -> dict[str, str]:
    return {"Authorization": f"Bearer {client.app.state.ctx.admin_token}"}


@pytest.fixture()
def rng() -> np.random.Generator:
    return np.random.default_rng(0)
