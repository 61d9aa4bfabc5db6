"""The databases a store opens: URLs, engines with their deadlines, and how their refusals read.

SQLite (the default, one file) and PostgreSQL (several controllers, `--ha`). Every statement,
lock waits included, is bounded by STATEMENT_DEADLINE_SECONDS on both, so no writer waits without
a deadline. On SQLite, write transactions start with BEGIN IMMEDIATE, so a read-check-write
sequence cannot interleave with another writer; reads use an engine of their own and never block
writers (WAL). Used by the controller's store and, for their own databases, by the site
orchestrator's (`vipu.vpod.store`) and the tenants' databases (`databases`).
"""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

from sqlalchemy import create_engine, event
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, IntegrityError, OperationalError

from vipu.model.errors import ConcurrentUpdate, InvalidArgument, Unavailable, VipuError

# The longest a statement may wait or run, on either database: it bounds how long a write holds
# the write turn, so no writer waits without a deadline.
STATEMENT_DEADLINE_SECONDS = 30


def first_line(error: DBAPIError | Exception) -> str:
    """What the database said, without SQLAlchemy's statement and background link."""
    original = getattr(error, "orig", None) or error
    return (str(original).splitlines() or ["no reason given"])[0]


def set_wal_mode(cursor, deadline_seconds: float = 30.0) -> None:
    """Put a SQLite database in WAL mode. Replicas opening a new database at once can find it
    locked: SQLite answers a change of journal mode at once rather than through the busy handler,
    so it is tried again until the deadline."""
    deadline = time.monotonic() + deadline_seconds
    while True:
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as error:
            if "locked" not in str(error) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def normalise_url(url: str) -> str:
    """Accept `postgresql://...` as operators write it; use the psycopg 3 driver for it."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix):]
    if "://" not in url:  # a bare path means a SQLite file
        return f"sqlite:///{Path(url).expanduser().resolve()}"
    return url


def checked_url(url: str) -> tuple[str, bool]:
    """A store URL as SQLAlchemy takes it, and whether it names SQLite, whose file's directory is
    made; InvalidArgument for a URL that names no store vipu supports."""
    url = normalise_url(url)
    try:
        parsed = make_url(url)
    except ArgumentError as error:
        raise InvalidArgument(f"cannot understand the store URL {url!r}") from error
    if parsed.get_backend_name() not in ("sqlite", "postgresql"):
        raise InvalidArgument(f"unsupported store {parsed.get_backend_name()!r}: use sqlite:///PATH or postgresql://...")
    is_sqlite = parsed.get_backend_name() == "sqlite"
    if is_sqlite and parsed.database not in (None, "", ":memory:"):
        try:
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise Unavailable(f"cannot create the directory of the store {parsed.database}: {error.strerror}") from error
    return url, is_sqlite


def make_engine(url: str, is_sqlite: bool, immediate: bool, deadline_seconds: float = STATEMENT_DEADLINE_SECONDS,
                idle_seconds: float | None = None) -> Engine:
    """An engine whose statements keep the deadline; on SQLite, in WAL mode with foreign keys
    enforced, its transactions begun IMMEDIATE (writers) or deferred (readers)."""
    if not is_sqlite:
        # No statement, lock wait included, outlasts the deadline: a wedged database makes a
        # write fail as Unavailable instead of holding the write turn, and every writer behind it.
        # And no transaction waits on this process longer than `idle_seconds` (the deadline by
        # default): the server ends one whose process was cut off from it, letting go of its locks.
        idle = round((idle_seconds or deadline_seconds) * 1000)
        return create_engine(url, pool_pre_ping=True, pool_size=10, max_overflow=20, connect_args={
            "options": f"-c statement_timeout={round(deadline_seconds * 1000)} -c idle_in_transaction_session_timeout={idle}"})
    engine = create_engine(url, connect_args={"check_same_thread": False, "timeout": deadline_seconds})

    @event.listens_for(engine, "connect")
    def _configure(dbapi_connection, _record):
        dbapi_connection.isolation_level = None  # let SQLAlchemy's begin event issue BEGIN
        cursor = dbapi_connection.cursor()
        set_wal_mode(cursor)
        cursor.execute("PRAGMA synchronous=NORMAL")
        cursor.execute("PRAGMA foreign_keys=ON")
        cursor.execute(f"PRAGMA busy_timeout={round(deadline_seconds * 1000)}")
        cursor.close()

    begin = "BEGIN IMMEDIATE" if immediate else "BEGIN"

    @event.listens_for(engine, "begin")
    def _begin(connection):
        connection.connection.driver_connection.execute(begin)  # on the driver itself: SQLAlchemy's statement path costs ten times

    return engine


def describe(url: str) -> str:
    """The URL as messages show it: without its password."""
    return make_url(url).render_as_string(hide_password=True)


def refusal(error: Exception, where: str) -> VipuError:
    """What the caller of a write the database refused is told: a lost race (a unique index, a
    foreign key) is ConcurrentUpdate; a full disk or a database gone away is Unavailable."""
    if isinstance(error, IntegrityError) or is_integrity_error(error):
        return ConcurrentUpdate("a concurrent change conflicted with this one; try again")
    return Unavailable(f"the store at {where} could not record the change: {first_line(error)}")


def is_integrity_error(error: BaseException) -> bool:
    """Whether a driver's own error (raised by a statement run on the driver's connection) is a
    refused constraint, on either database."""
    return any(kind.__name__ == "IntegrityError" for kind in type(error).__mro__)


def is_database_error(error: BaseException) -> bool:
    """Whether an error came from the database or its driver (as opposed to vipu's own code)."""
    if isinstance(error, DBAPIError | OperationalError):
        return True
    module = type(error).__module__
    return module.startswith(("sqlite3", "psycopg"))
