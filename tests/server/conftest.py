"""Fixtures for the round-server tests.

``db_url`` is parametrised: SQLite always, PostgreSQL when FEDFACE_TEST_POSTGRES_URL
is set (each test then gets its own schema, dropped afterwards). Apps use a seeded
untrained mobilefacenet_s without ONNX export, so a test costs well under a second.
"""
from __future__ import annotations

import os
import secrets
import warnings
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sqlalchemy import create_engine, text

from server_api.core.config import Settings

warnings.filterwarnings("ignore", message=".*httpx.*starlette.testclient.*")
from fastapi.testclient import TestClient  # noqa: E402

from server_api.main import create_app  # noqa: E402
from server_testkit import Device, unit_vector  # noqa: E402

POSTGRES_URL = os.environ.get("FEDFACE_TEST_POSTGRES_URL")
BACKENDS = ["sqlite", pytest.param("postgres", marks=pytest.mark.skipif(not POSTGRES_URL, reason="FEDFACE_TEST_POSTGRES_URL not set"))]


def _psycopg_url(url: str) -> str:
    return "postgresql+psycopg://" + url.split("://", 1)[1]


@pytest.fixture(params=BACKENDS)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'fedface.db'}"
        return
    assert POSTGRES_URL
    schema = "t_" + secrets.token_hex(6)
    admin = create_engine(_psycopg_url(POSTGRES_URL), isolation_level="AUTOCOMMIT")
    with admin.connect() as connection:
        connection.execute(text(f'CREATE SCHEMA "{schema}"'))
    separator = "&" if "?" in POSTGRES_URL else "?"
    yield f"{_psycopg_url(POSTGRES_URL)}{separator}options=-csearch_path%3D{schema}"
    with admin.connect() as connection:
        connection.execute(text(f'DROP SCHEMA "{schema}" CASCADE'))
    admin.dispose()


def make_settings(data_dir: Path, db_url: str | None = None, **overrides: Any) -> Settings:
    values: dict[str, Any] = dict(
        data_dir=data_dir, dev=True, model="random", random_backbone="mobilefacenet_s", export_onnx=False, database_url=db_url,
    )
    return Settings(**(values | overrides))


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


def enrolled_devices(client: TestClient, n: int, rng: np.random.Generator) -> list[Device]:
    devices = []
    for _ in range(n):
        device = Device(client)
        assert device.register().status_code == 201
        assert device.enroll(unit_vector(rng)).status_code == 201
        devices.append(device)
    return devices


def open_round(client: TestClient, admin: dict[str, str], **config: Any) -> dict[str, Any]:
    body = {"target_participants": 2, "min_participants": 1, "deadline_s": 600, "selection_window_s": 0} | config
    response = client.post("/v1/admin/rounds", json=body, headers=admin)
    assert response.status_code == 201, response.text
    return response.json()


def shift_round(client: TestClient, round_id: int, **fields: float) -> None:
    """Move a round's selection/deadline times into the past instead of sleeping."""
    from server_api.models import Round, utcnow

    with client.app.state.ctx.sessions() as session:
        round_ = session.get(Round, round_id)
        for name, seconds_ago in fields.items():
            setattr(round_, name, utcnow() - timedelta(seconds=seconds_ago))
        session.commit()


def tick(client: TestClient) -> str | None:
    from server_api.services import scheduler

    return scheduler.tick(client.app.state.ctx)
