"""App-level helpers shared by the server tests (fixtures live in conftest.py)."""
from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
from fastapi.testclient import TestClient

from server_api.core.config import Settings
from server_testkit import Device, unit_vector


def make_settings(data_dir: Path, db_url: str | None = None, **overrides: Any) -> Settings:
    values: dict[str, Any] = dict(
        data_dir=data_dir, dev=True, model="random", random_backbone="mobilefacenet_s", export_onnx=False, database_url=db_url,
    )
    return Settings(**(values | overrides))


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
    from server_api.tables import Round, utcnow

    with client.app.state.ctx.sessions() as session:
        round_ = session.get(Round, round_id)
        for name, seconds_ago in fields.items():
            setattr(round_, name, utcnow() - timedelta(seconds=seconds_ago))
        session.commit()


def tick(client: TestClient) -> str | None:
    from server_api.services import scheduler

    return scheduler.tick(client.app.state.ctx)
