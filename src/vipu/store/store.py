"""The store: every entity of the controller, in SQLite (default) or PostgreSQL.

Use cases open one transaction (`with store.transaction() as tx:`), read and change entities
through it, and everything commits together or not at all; the allocations' owners write each
turn's changes through the group commit (`write`). A `Transaction` is the repositories of every
kind of entity on one connection (`configuration`, `partitions`, `requests`, `users`,
`clustertests`); the engines and their deadlines are in `engines`, the leader's lease and the
fence of its writes in `leases`, the group commit in `groupcommit`.
"""

from __future__ import annotations

import contextlib
import logging
import time
import typing
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from sqlalchemy import text
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from vipu import failpoints
from vipu.model.errors import Unavailable, VipuError
from vipu.store.clustertests import TestRunRepository
from vipu.store.configuration import GENERATION_KEY, Configuration, ConfigurationCache, ConfigurationRepository
from vipu.store.engines import (
    STATEMENT_DEADLINE_SECONDS,
    checked_url,
    describe,
    first_line,
    is_database_error,
    make_engine,
    normalise_url,
    refusal,
)
from vipu.store.groupcommit import CommitLost, GroupCommit, WriteTurn
from vipu.store.leases import HOLDS_LEASE_FUNCTION, INITIALISATION_LOCK, Fence, Lease, Leases, check_fence, check_fence_on_driver
from vipu.store.links import LinkRepository
from vipu.store.machinelogs import MachineLogRepository
from vipu.store.requests import RequestRepository
from vipu.store.reservations import ReservationRepository
from vipu.store.schema import MIGRATIONS, SCHEMA_VERSION, Base, MetaRow
from vipu.store.transactions import CONFIGURATION_CHANGED, TESTS_CHANGED, USERS_CHANGED
from vipu.store.usage import UsageRepository
from vipu.store.users import Credential, UserRepository

__all__ = ["CONFIGURATION_CHANGED", "STATEMENT_DEADLINE_SECONDS", "TESTS_CHANGED", "USERS_CHANGED", "Configuration", "Credential",
           "Lease", "Store", "Transaction", "normalise_url"]

log = logging.getLogger(__name__)
T = typing.TypeVar("T")


class Transaction(ConfigurationRepository, RequestRepository, ReservationRepository, UsageRepository, UserRepository, TestRunRepository,
                  LinkRepository, MachineLogRepository):
    """One unit of work on the store, speaking in domain entities: the repository of each kind of
    entity, on one connection (see `vipu.store.transactions`)."""


class _DriverTransaction:
    """The context of `Store._writing_on_the_driver` (a class: it is entered for every commit)."""

    def __init__(self, store: Store, driver: typing.Any, cache: ConfigurationCache):
        self._store, self._driver = store, driver
        self._tx = Transaction(None, cache, store.is_sqlite, store.on_commit, driver=driver)

    def __enter__(self) -> Transaction:
        store, driver = self._store, self._driver
        try:
            if store.is_sqlite:
                driver.execute("BEGIN IMMEDIATE")
            if store.fenced is not None:
                check_fence_on_driver(driver, store.fenced, store.is_sqlite)
        except BaseException as error:  # noqa: BLE001 - rolled back and raised again
            self._failed(error)
        return self._tx

    def __exit__(self, kind, error, _traceback) -> None:
        if error is None:
            try:
                failpoints.hit("store.commit")
            except BaseException as failure:  # noqa: BLE001 - rolled back and raised again
                self._failed(failure)
            started = time.monotonic()
            try:
                self._tx.commit()
            except BaseException as failure:
                if not self._store.is_sqlite and is_database_error(failure) and getattr(self._driver, "closed", False):
                    self._store.let_go_of_group_connection()  # PostgreSQL may have committed before the connection went
                    raise CommitLost(str(failure)) from failure
                self._failed(failure)  # SQLite commits in this process: its failure is a rollback
            try:
                failpoints.hit("store.commit.answer")  # committed, and the answer lost on the way back
            except Unavailable as lost:
                raise CommitLost(lost.message) from lost
            self._store.timed_commit(time.monotonic() - started)
            self._tx.tell_committed()
            return
        self._failed(error)

    def _failed(self, error: BaseException) -> typing.NoReturn:
        """Roll back and raise what the caller is told."""
        store = self._store
        try:
            self._driver.rollback()
        except Exception:  # noqa: BLE001 - the connection is gone: the next commit takes another
            store.let_go_of_group_connection()
        if is_database_error(error):
            if getattr(self._driver, "closed", False):
                store.let_go_of_group_connection()
            raise refusal(typing.cast(Exception, error), store.describe()) from error
        raise error


class Store:
    """Opens the database named by a URL and hands out transactions on it."""

    def __init__(self, url: str, deadline_seconds: float = STATEMENT_DEADLINE_SECONDS, idle_seconds: float | None = None):
        """`deadline_seconds`: the longest a statement, or a wait for the write turn, may take;
        `idle_seconds`: on PostgreSQL, the longest a transaction may wait on this process between
        statements before the server ends it (the deadline by default; a replica's lease)."""
        self.url, self.is_sqlite = checked_url(url)
        self._write_engine = make_engine(self.url, self.is_sqlite, immediate=True, deadline_seconds=deadline_seconds,
                                         idle_seconds=idle_seconds)
        self._read_engine = make_engine(self.url, self.is_sqlite, immediate=False, deadline_seconds=deadline_seconds) \
            if self.is_sqlite else self._write_engine
        # SQLite takes one writer at a time; waiting in-process is fair and fast, where its own
        # busy handler sleeps in steps of up to 100 ms. PostgreSQL takes writers together.
        self._write_turn = WriteTurn(f"the write turn of the store at {self.describe()}", deadline_seconds) if self.is_sqlite else None
        # Grouped writes take turns; on SQLite, with the other writers.
        group_turn = self._write_turn or WriteTurn(f"the group commit of the store at {self.describe()}", deadline_seconds)
        self._group = GroupCommit(group_turn, self._writing_on_the_driver, self._caller_error)
        self._group_connection: typing.Any = None  # the group commit's own connection, taken from the pool once
        self._cache = ConfigurationCache()
        self._fence: Fence | None = None
        self._writes = sessionmaker(self._write_engine, expire_on_commit=False)
        self._reads = sessionmaker(self._read_engine, expire_on_commit=False)
        self._leases = Leases(self.is_sqlite, self._lease_write, self._lease_read)
        # Told, after each write transaction has committed, what it changed besides partitions and
        # requests (their owners publish those): CONFIGURATION_CHANGED, USERS_CHANGED, TESTS_CHANGED.
        self.on_commit: Callable[[frozenset[str]], None] | None = None
        self.on_commit_seconds: Callable[[float], None] | None = None  # told how long each commit of a write took
        self._initialise()

    def _initialise(self) -> None:
        """Create the tables, or bring an older store up to this version; once, when replicas start together."""
        try:
            with self._writes.begin() as session:
                if not self.is_sqlite:  # SQLite's BEGIN IMMEDIATE already keeps other initialisers out
                    session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": INITIALISATION_LOCK})
                Base.metadata.create_all(session.connection())
                if not self.is_sqlite:
                    session.execute(text(HOLDS_LEASE_FUNCTION))
                self._settle_schema(session)
        except OperationalError as error:
            raise Unavailable(f"cannot open the store at {self.describe()}: {first_line(error)}") from error

    def _settle_schema(self, session: Session) -> None:
        if session.get(MetaRow, GENERATION_KEY) is None:
            session.add(MetaRow(key=GENERATION_KEY, value="0"))
        row = session.get(MetaRow, "schema_version")
        if row is None:
            session.add(MetaRow(key="schema_version", value=str(SCHEMA_VERSION)))
        elif int(row.value) > SCHEMA_VERSION:
            raise VipuError(
                f"the store at {self.describe()} has schema version {row.value}, newer than this "
                f"vipu-server's {SCHEMA_VERSION}; upgrade vipu-server"
            )
        elif int(row.value) < SCHEMA_VERSION:
            for version in range(int(row.value) + 1, SCHEMA_VERSION + 1):
                for step in MIGRATIONS.get(version, ()):
                    if isinstance(step, str):
                        session.execute(text(step))
                    else:
                        step(session)
            row.value = str(SCHEMA_VERSION)

    def describe(self) -> str:
        return describe(self.url)

    def _turn(self) -> contextlib.AbstractContextManager[None]:
        return self._write_turn if self._write_turn is not None else contextlib.nullcontext()

    def timed_commit(self, seconds: float) -> None:
        if self.on_commit_seconds is not None:
            self.on_commit_seconds(seconds)

    @contextmanager
    def transaction(self) -> Iterator[Transaction]:
        """A read-write unit of work: commits on success, rolls back on any exception. Once `fence`
        is set, it first checks that the lease is still held (`vipu.store.leases`)."""
        with self._turn(), self._writing() as tx:
            yield tx

    @contextmanager
    def _writing(self) -> Iterator[Transaction]:
        """A fenced write transaction, committed if the block ends normally; the caller holds the turn."""
        tx = Transaction(self._write_engine, self._cache, self.is_sqlite, self.on_commit)
        try:
            if self._fence is not None:
                check_fence(tx.connection, self._fence, self.is_sqlite)
            yield tx
            failpoints.hit("store.commit")
            started = time.monotonic()
            tx.commit()
            self.timed_commit(time.monotonic() - started)
        except (IntegrityError, OperationalError) as error:
            raise refusal(error, self.describe()) from error
        finally:
            tx.close()
        tx.tell_committed()

    def _writing_on_the_driver(self) -> _DriverTransaction:
        """A fenced write transaction on the group commit's own connection, spoken to through its
        driver alone: SQLAlchemy's connection and transaction objects cost more than the few
        statements of a turn. Committed if the block ends normally; the caller holds the turn. A
        connection that fails is let go, and the next commit takes a fresh one."""
        if self._group_connection is None:
            self._group_connection = self._write_engine.raw_connection()
        return _DriverTransaction(self, self._group_connection.driver_connection, self._cache)

    def let_go_of_group_connection(self) -> None:
        """The group commit's connection failed: the next commit takes a fresh one."""
        connection, self._group_connection = self._group_connection, None
        if connection is not None:
            try:
                connection.invalidate()
            except Exception:
                log.debug("the group commit's connection could not be closed cleanly", exc_info=True)

    def _caller_error(self, error: BaseException) -> BaseException:
        """What the caller of a grouped write is told of its error: the database's own, as vipu's."""
        return refusal(typing.cast(Exception, error), self.describe()) if is_database_error(error) else error

    def write(self, work: Callable[[Transaction], T]) -> T:
        """Run `work` in a write transaction shared with the writes that arrive while another
        commits (`vipu.store.groupcommit`); `work` must only use the transaction it is given."""
        return self._group.write(work)

    def own(self, owned: bool = True) -> None:
        """Say whether this process serves, and so is the store's only writer (see ConfigurationCache)."""
        self._cache.own(owned)

    def configuration(self) -> Configuration:
        """Agents, clusters and allocations as committed last: what an owning controller cached, or
        else a fresh reading. Shared by every reader: never change it."""
        cached = self._cache.cached()
        if cached is not None:
            return cached
        with self.reading() as tx:
            return tx.configuration()

    # Leases: one leader among the controllers sharing this store

    def claim_lease(self, name: str, holder: str, address: str, seconds: float, deadline_seconds: float = 0.0) -> Lease | None:
        return self._leases.claim(name, holder, address, seconds, deadline_seconds)

    def read_lease(self, name: str) -> Lease | None:
        return self._leases.read(name)

    def release_lease(self, name: str, holder: str) -> None:
        self._leases.release(name, holder)

    @contextmanager
    def _lease_write(self) -> Iterator[Session]:
        """A write transaction on the lease, unfenced; an unreachable database is `Unavailable`."""
        try:
            with self._turn(), self._writes() as session, session.begin():
                yield session
        except OperationalError as error:
            raise Unavailable(f"cannot reach the store at {self.describe()}: {first_line(error)}") from error

    @contextmanager
    def _lease_read(self) -> Iterator[Session]:
        with self._reads() as session, session.begin():
            yield session

    def fence(self, lease: Lease) -> None:
        """From now on, commit writes only while `lease` is held in its present term."""
        self._fence = Fence(lease.name, lease.holder, lease.term)

    @property
    def fenced(self) -> Fence | None:
        """The lease writes are fenced by, if any."""
        return self._fence

    @contextmanager
    def reading(self) -> Iterator[Transaction]:
        """A read-only unit of work that never blocks writers."""
        tx = Transaction(self._read_engine, self._cache, self.is_sqlite)
        try:
            yield tx
        finally:
            tx.close()

    def close(self) -> None:
        if self._group_connection is not None:
            self._group_connection.close()
            self._group_connection = None
        self._write_engine.dispose()
        if self._read_engine is not self._write_engine:
            self._read_engine.dispose()
