"""Data that a revision moves: 0007 counts each round's accepted updates into ``rounds.n_uploaded``."""
from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import create_engine, text

from server_api.core.db import MIGRATIONS_DIR


def _upgrade(url: str, revision: str) -> None:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    config.set_main_option("sqlalchemy.url", url)
    engine = create_engine(url)
    with engine.begin() as connection:
        config.attributes["connection"] = connection
        command.upgrade(config, revision)
    engine.dispose()


def test_rounds_open_at_the_upgrade_keep_the_count_of_their_uploads(tmp_path: Path) -> None:
    # Prepare: a database at 0006 with two rounds, one with three uploads and a selected device, one with none.
    url = f"sqlite:///{tmp_path / 'fedface.db'}"
    _upgrade(url, "0006")
    engine = create_engine(url)
    with engine.begin() as connection:
        for round_id in (1, 2):
            connection.execute(text(
                "INSERT INTO rounds (id, status, config, strategy, target_participants, min_participants, base_version_id, "
                "created_at, selection_at, selection_done, deadline_at) "
                "VALUES (:id, 'open', '{}', 'fedface', 5, 1, 1, '2026-12-04', '2026-12-04', 1, '2026-12-05')"
            ), {"id": round_id})
        for index, status in enumerate(["uploaded", "uploaded", "selected", "uploaded"]):
            connection.execute(text(
                "INSERT INTO participations (round_id, device_id, status, checked_in_at) VALUES (1, :device, :status, '2026-12-04')"
            ), {"device": f"d{index}", "status": status})
    # Execute
    _upgrade(url, "head")
    with engine.connect() as connection:
        counts: dict[int, int] = dict(connection.execute(text("SELECT id, n_uploaded FROM rounds ORDER BY id")).all())
    engine.dispose()
    # Assert
    assert counts == {1: 3, 2: 0}
