"""Engine, sessions, row locks and migrations for SQLite and PostgreSQL.

SQLite: WAL journal, FULL sync (a commit survives kill -9 and power loss) and every
transaction started with ``BEGIN IMMEDIATE``. A deferred SQLite transaction that
reads and then writes fails with "database is locked" when another connection wrote
in between, and busy_timeout does not retry that case; taking the write lock up
front makes transactions queue instead, which is what a small server wants. It
also makes every transaction a lock on the whole database, which is how
:func:`lock_round` works there.

PostgreSQL (psycopg 3): ``SELECT ... FOR UPDATE`` on the round row, and an advisory
lock for startup work (migrations, the bootstrap model) that several workers race to do.

Transactions: crud never commits. A service entry point (a request's use case, one step of a
background job) owns its transaction through :func:`transaction`, which commits once when the
work is done and rolls back when anything raises, so a domain error leaves nothing half-written;
:func:`lock_round` inside it holds the round row until that commit.

The SQLite file is created 0600 before the first connection (its -wal and -shm files take
the database file's mode), and an existing one is made 0600: it holds encrypted templates,
device keys and the audit trail, which no other local user should read.
"""
from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, create_engine, event, make_url, select, text
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import QueuePool

MIGRATIONS_DIR = Path(__file__).resolve().parents[1] / "migrations"
SQLITE_POOL_TIMEOUT_S = 60.0  # past this a request fails with 503 (see api.handlers), never hangs
STARTUP_LOCK_KEY = 0x46454446  # "FEDF": advisory lock id for migrations and bootstrap


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        return _sqlite_engine(url)
    return create_engine(url, pool_pre_ping=True, pool_size=5, max_overflow=10)


def _private_sqlite_file(url: str) -> None:
    database = make_url(url).database
    if not database or database == ":memory:" or database.startswith("file:") or not os.path.isdir(os.path.dirname(database) or "."):
        return  # in memory, a URI, or a folder that is not there (SQLite names that problem itself)
    os.close(os.open(database, os.O_RDWR | os.O_CREAT, 0o600))
    for path in (database, database + "-wal", database + "-shm"):
        if os.path.exists(path):
            os.chmod(path, 0o600)


def _sqlite_engine(url: str) -> Engine:
    _private_sqlite_file(url)
    # One pooled connection: BEGIN IMMEDIATE already makes every transaction hold the whole
    # database, so a second connection adds no parallelism, only contention; and threads that
    # queue on the pool wake in order the moment it is free, while threads that queue inside
    # SQLite sleep in its busy handler's back-off (up to 100 ms a try), which made a busy upload
    # round 3x slower. busy_timeout still covers other processes (--workers, the admin CLI).
    engine = create_engine(
        url, connect_args={"check_same_thread": False, "timeout": 30},
        poolclass=QueuePool, pool_size=1, max_overflow=0, pool_timeout=SQLITE_POOL_TIMEOUT_S,
    )

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection: Any, _record: Any) -> None:
        # Let SQLAlchemy, not the sqlite3 module, decide when transactions begin.
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute("PRAGMA synchronous=FULL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute("PRAGMA busy_timeout=30000")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(connection: Any) -> None:
        connection.exec_driver_sql("BEGIN IMMEDIATE")

    return engine


def make_session_factory(engine: Engine) -> sessionmaker[Session]:
    # expire_on_commit=False: routes read attributes after the service committed.
    return sessionmaker(bind=engine, expire_on_commit=False)


def is_postgres(session_or_engine: Session | Engine) -> bool:
    bind = session_or_engine.get_bind() if isinstance(session_or_engine, Session) else session_or_engine
    return bind.dialect.name == "postgresql"


def lock_round(session: Session, round_id: int) -> Any:
    """The round row, locked for the rest of the transaction (see module doc for SQLite)."""
    from server_api.models import Round

    # populate_existing: an earlier unlocked read in this session must not mask the locked row's values.
    statement = select(Round).where(Round.id == round_id).with_for_update().execution_options(populate_existing=True)
    return session.execute(statement).scalar_one_or_none()


def startup_lock(session: Session) -> None:
    """Serialise one-time startup work across worker processes, until commit."""
    if is_postgres(session):
        session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": STARTUP_LOCK_KEY})


def run_migrations(engine: Engine) -> None:
    """`alembic upgrade head` through alembic's API, safe to call from every worker."""
    from alembic import command
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    with engine.begin() as connection:
        if engine.dialect.name == "postgresql":
            connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": STARTUP_LOCK_KEY})
        config.attributes["connection"] = connection
        command.upgrade(config, "head")


@contextmanager
def transaction(session: Session) -> Iterator[Session]:
    """One unit of work on ``session``: committed once when the block ends, rolled back when it
    raises (a domain error included) or when the commit itself fails. It takes over a transaction
    that earlier reads in the session began, so those reads and the writes share it."""
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise


@contextmanager
def session_scope(factory: sessionmaker[Session]) -> Iterator[Session]:
    """A session for background work. The services it is handed to commit their own
    transactions; this rolls back whatever is left open (a read, an error) and closes."""
    session = factory()
    try:
        yield session
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()
