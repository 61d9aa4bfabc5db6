"""One unit of work on the store: its connection, its ORM session, its commit, and who hears of it.

`Transaction` (in `vipu.store.store`) is this base with one repository per kind of entity mixed
in (`configuration`, `partitions`, `requests`, `users`, `clustertests`), so that a use case reads
and writes every entity it needs through one object and everything commits together or not at
all. Rows never leave the store: a transaction speaks in `vipu.model` entities.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sqlalchemy.engine import Connection, Engine
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from vipu.model.errors import ConcurrentUpdate

if TYPE_CHECKING:
    from vipu.model.entities import Agent
    from vipu.store.configuration import Configuration, ConfigurationCache

log = logging.getLogger(__name__)

# What a committed write changed, besides partitions and waiting requests (whose owners publish
# them), as `Store.on_commit` is told.
CONFIGURATION_CHANGED, USERS_CHANGED, TESTS_CHANGED = "configuration", "users", "tests"


class TransactionBase:
    """It opens its database connection only when a statement needs one, and an ORM session on
    that connection only for the entities written through the ORM: the partitions and requests,
    the hot path, are plain statements on the driver's own connection, and a unit of work that
    the configuration cache serves touches no database at all."""

    def __init__(self, engine: Engine | None, cache: ConfigurationCache, is_sqlite: bool,
                 on_commit: Callable[[frozenset[str]], None] | None = None, driver: Any = None):
        """On `engine`, through SQLAlchemy; or, given `driver` (the group commit's), on the
        driver's connection alone, in a transaction its caller begins and ends."""
        self._engine = engine
        self._cache = cache
        self.is_sqlite = is_sqlite
        self._on_commit = on_commit
        self._connection: Connection | None = None
        self._session: Session | None = None
        self._driver: Any = driver
        self._seen: Configuration | None = None
        self._read_generation: int | None = None  # of the cached configuration this transaction read
        self._changed_configuration = False
        self._rewritten_agents: dict[str, Agent] | None = {}  # its changes, while they are agents' rows rewritten
        self._changed: set[str] = set()  # what Store.on_commit is told of

    @property
    def connection(self) -> Connection:
        if self._engine is None:
            raise RuntimeError("this transaction speaks to the database's driver only (the group commit's): use `driver`")
        if self._connection is None:
            connection = self._engine.connect()
            try:
                connection.begin()
            except BaseException:
                connection.close()
                raise
            self._connection = connection
        return self._connection

    @property
    def session(self) -> Session:
        if self._session is None:
            self._session = Session(bind=self.connection, expire_on_commit=False)
        return self._session

    @property
    def driver(self) -> Any:
        """The database driver's own connection (sqlite3's or psycopg's) under this transaction's,
        for the statements of the hot path: run directly, they cost a tenth of SQLAlchemy's."""
        if self._driver is None:
            self._driver = self.connection.connection.driver_connection
        elif self._session is not None:
            self._session.flush()  # what the ORM has pending goes first
        return self._driver

    def flush(self, conflict_message: str) -> None:
        """Send the session's changes now, so that a refused constraint is the caller's ConcurrentUpdate."""
        try:
            self.session.flush()
        except IntegrityError as error:
            raise ConcurrentUpdate(conflict_message) from error

    def commit(self) -> None:
        try:
            if self._session is not None:
                self._session.flush()
            if self._connection is not None:
                self._connection.commit()
            elif self._engine is None:
                self._driver.commit()
        except BaseException:
            if self._changed_configuration:
                self._cache.changed()  # it may have committed: what was cached is read again
            raise
        if self._changed_configuration:
            self._cache.changed(self._rewritten_agents, self._read_generation)

    def tell_committed(self) -> None:
        """Tell `Store.on_commit` what this transaction, now committed, changed. The write stands
        whatever the hook does, so its failure is logged, never raised in the writer."""
        if self._changed and self._on_commit is not None:
            try:
                self._on_commit(frozenset(self._changed))
            except Exception:
                log.exception("telling of a committed change failed")

    def close(self) -> None:
        """Release the session and the connection; what was not committed is rolled back."""
        if self._session is not None:
            self._session.close()
        if self._connection is not None:
            self._connection.close()
