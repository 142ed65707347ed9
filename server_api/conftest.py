"""Fixtures for the tests next to the server's code."""
from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from server_api.core.db import make_engine, run_migrations
from server_api.launcher import scratch_database

POSTGRES_URL = os.environ.get("FEDFACE_TEST_POSTGRES_URL")
NEEDS_POSTGRES = pytest.mark.skipif(not POSTGRES_URL, reason="FEDFACE_TEST_POSTGRES_URL not set")


@pytest.fixture
def postgres_engine() -> Iterator[Engine]:
    """A migrated PostgreSQL schema of its own, dropped afterwards (skipped without FEDFACE_TEST_POSTGRES_URL)."""
    if not POSTGRES_URL:
        pytest.skip("FEDFACE_TEST_POSTGRES_URL not set")
    with scratch_database(POSTGRES_URL, prefix="t_") as url:
        assert url is not None
        engine = make_engine(url)
        run_migrations(engine)
        yield engine
        engine.dispose()


@pytest.fixture
def sqlite_engine(tmp_path: Path) -> Iterator[Engine]:
    """A migrated SQLite file."""
    engine = make_engine(f"sqlite:///{tmp_path / 'fedface.db'}")
    run_migrations(engine)
    yield engine
    engine.dispose()
