"""Alembic environment. The server passes its own connection in
``config.attributes["connection"]`` (see server_api.core.db.run_migrations); the
`alembic` command line falls back to FEDFACE_DATABASE_URL."""
from __future__ import annotations

import os

from alembic import context
from sqlalchemy import create_engine

from server_api.tables import Base

target_metadata = Base.metadata


def _run(connection) -> None:  # type: ignore[no-untyped-def]
    # render_as_batch: SQLite cannot ALTER most things; batch mode copies the table instead.
    context.configure(connection=connection, target_metadata=target_metadata, render_as_batch=True, compare_type=True)
    with context.begin_transaction():
        context.run_migrations()


connection = context.config.attributes.get("connection")
if connection is not None:
    _run(connection)
else:
    url = os.environ.get("FEDFACE_DATABASE_URL") or context.config.get_main_option("sqlalchemy.url")
    if not url:
        raise SystemExit("set FEDFACE_DATABASE_URL to run alembic by hand")
    with create_engine(url).begin() as conn:
        _run(conn)
