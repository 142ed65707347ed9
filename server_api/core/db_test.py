"""core.db.transaction: one commit when the work is done, nothing kept when it raises; core.db.check_database:
a database that cannot be opened is one line naming it."""
from __future__ import annotations

import re
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from server_api.core.db import check_database, make_engine, make_session_factory, transaction
from server_api.errors import ConfigError, Conflict


@pytest.fixture
def engine() -> Iterator[Engine]:
    engine = make_engine("sqlite://")
    with engine.begin() as connection:
        connection.execute(text("CREATE TABLE notes (body TEXT UNIQUE)"))
    yield engine
    engine.dispose()


def _notes(session: Session) -> list[str]:
    return list(session.execute(text("SELECT body FROM notes ORDER BY body")).scalars())


def test_a_transaction_commits_its_writes_once_the_block_ends(engine: Engine) -> None:
    # Prepare
    session = make_session_factory(engine)()
    # Execute
    with transaction(session):
        session.execute(text("INSERT INTO notes VALUES ('kept')"))
    # Assert
    assert not session.in_transaction() and _notes(session) == ["kept"]
    session.close()


def test_a_domain_error_rolls_back_everything_written_before_it(engine: Engine) -> None:
    # Prepare
    session = make_session_factory(engine)()
    # Execute
    with pytest.raises(Conflict, match="^refused after a write$"), transaction(session):
        session.execute(text("INSERT INTO notes VALUES ('half-written')"))
        raise Conflict("refused after a write")
    # Assert
    assert not session.in_transaction() and _notes(session) == []
    session.close()


def test_a_failing_statement_rolls_back_the_whole_transaction_and_leaves_the_session_usable(engine: Engine) -> None:
    # Prepare: the second insert breaks the unique key, as a concurrent request's row would
    session = make_session_factory(engine)()
    with transaction(session):
        session.execute(text("INSERT INTO notes VALUES ('first')"))
    # Execute
    with pytest.raises(IntegrityError, match=r"UNIQUE constraint failed: notes\.body"), transaction(session):
        session.execute(text("INSERT INTO notes VALUES ('second')"))
        session.execute(text("INSERT INTO notes VALUES ('first')"))
    # Assert
    assert _notes(session) == ["first"]
    session.close()


def test_a_database_that_cannot_be_opened_is_one_config_error_naming_it_without_its_password(tmp_path: Path) -> None:
    # Prepare: a PostgreSQL port nothing listens on; a SQLite file in a folder that is not there
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    postgres = make_engine(f"postgresql+psycopg://nobody:hunter2@127.0.0.1:{port}/x")
    sqlite = make_engine(f"sqlite:///{tmp_path}/missing/x.db")
    # Execute
    with pytest.raises(ConfigError, match="^" + re.escape(f"cannot open database postgres://nobody:***@127.0.0.1:{port}/x: ")) as refused:
        check_database(postgres, f"postgres://nobody:***@127.0.0.1:{port}/x")
    missing = f"cannot open database sqlite:///{tmp_path}/missing/x.db: folder {tmp_path}/missing does not exist"
    with pytest.raises(ConfigError, match=f"^{re.escape(missing)}$"):
        check_database(sqlite, f"sqlite:///{tmp_path}/missing/x.db")
    # Assert: one line each (the matches pin the URL as shown, and the cause), and the password never shown
    assert "Connection refused" in str(refused.value) and "hunter2" not in str(refused.value) and "\n" not in str(refused.value)
    postgres.dispose()
    sqlite.dispose()
