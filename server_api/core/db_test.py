"""core.db.transaction: one commit when the work is done, nothing kept when it raises."""
from __future__ import annotations

from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from server_api.core.db import make_engine, make_session_factory, transaction
from server_api.errors import Conflict


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
    with pytest.raises(Conflict), transaction(session):
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
    with pytest.raises(IntegrityError), transaction(session):
        session.execute(text("INSERT INTO notes VALUES ('second')"))
        session.execute(text("INSERT INTO notes VALUES ('first')"))
    # Assert
    assert _notes(session) == ["first"]
    session.close()
