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

Start-up: :func:`check_database` connects once before anything else touches the database, so a URL
that cannot be opened (no server there, a wrong password, an unknown host, a SQLite folder that is
missing or unwritable) is one ConfigError naming the URL, password hidden, and the cause, never a
driver traceback. A PostgreSQL connection attempt gives up after ``CONNECT_TIMEOUT_S`` unless the
URL sets its own ``connect_timeout``, so a host that drops packets fails too, instead of hanging.

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
from sqlalchemy.exc import DBAPIError
from sqlalchemy.orm import Session, sessionmaker
from sqlalchemy.pool import QueuePool

from server_api.errors import ConfigError

MIGRATIONS_DIR = Path(__file__).resolve().parents[1] / "migrations"
SQLITE_POOL_TIMEOUT_S = 60.0  # past this a request fails with 503 (see api.handlers), never hangs
STARTUP_LOCK_KEY = 0x46454446  # "FEDF": advisory lock id for migrations and bootstrap
CONNECT_TIMEOUT_S = 10


def make_engine(url: str) -> Engine:
    if url.startswith("sqlite"):
        return _sqlite_engine(url)
    parsed = make_url(url)
    connect_args = {} if "connect_timeout" in parsed.query else {"connect_timeout": CONNECT_TIMEOUT_S}
    return create_engine(parsed, pool_pre_ping=True, pool_size=5, max_overflow=10, connect_args=connect_args)


def check_database(engine: Engine, shown_url: str) -> None:
    """Connect once and run a statement; anything the driver refuses is a ConfigError, one line that
    names ``shown_url`` (the caller's spelling, password hidden) and the driver's own reason."""
    try:
        with engine.connect() as connection:
            connection.exec_driver_sql("SELECT 1")
    except DBAPIError as error:
        raise ConfigError(f"cannot open database {shown_url}: {_cause(engine, error)}") from None


def check_database_url(url: str, shown_url: str) -> None:
    """:func:`check_database` on an engine of its own, disposed of after."""
    engine = make_engine(url)
    try:
        check_database(engine, shown_url)
    finally:
        engine.dispose()


def _cause(engine: Engine, error: DBAPIError) -> str:
    """The driver's reason in one line, with any password the URL holds blanked out. SQLite's own reason for a
    file it cannot open says nothing about why ("unable to open database file"), so the folder is looked at."""
    if engine.dialect.name == "sqlite":
        problem = _sqlite_folder_problem(engine.url.database)
        if problem:
            return problem
    reason = " ".join(line.strip() for line in str(error.orig).splitlines() if line.strip())
    password = engine.url.password
    return reason.replace(str(password), "***") if password else reason


def _sqlite_folder_problem(database: str | None) -> str | None:
    """Why SQLite cannot create or open ``database`` in its folder, or None when the folder is fine."""
    if not database or database == ":memory:" or database.startswith("file:"):
        return None
    folder = os.path.dirname(os.path.abspath(database))
    if not os.path.exists(folder):
        return f"folder {folder} does not exist"
    if not os.path.isdir(folder):
        return f"{folder} is not a folder"
    if os.path.isdir(database):
        return f"{database} is a folder, not a database file"
    if not os.access(folder, os.W_OK | os.X_OK):
        return f"folder {folder} is not writable (SQLite writes its journal beside the database)"
    return None


def _private_sqlite_file(url: str) -> None:
    database = make_url(url).database
    if not database or database == ":memory:" or database.startswith("file:") or not os.path.isdir(os.path.dirname(database) or "."):
        return  # in memory, a URI, or a folder that is not there (check_database names that problem)
    try:
        os.close(os.open(database, os.O_RDWR | os.O_CREAT, 0o600))
    except OSError as error:  # an unwritable folder, a read-only file system, a folder by that name...
        reason = _sqlite_folder_problem(database) or f"{error.strerror}: {database}"
        raise ConfigError(f"cannot open database {url}: {reason}") from None
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
    from server_api.tables import Round

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
