"""Leases and fencing: one leader among the controllers sharing a store, and no write from another.

A lease is a row: who holds it, until when by the database's clock, and in which term (the term
grows each time it changes hands). Once a leader `fence`s the store with its lease, each of its
write transactions first checks that the lease is still held in that term, so a deposed leader
changes nothing, even with a request already under way. On PostgreSQL the check holds an advisory
lock shared until the transaction commits, which a replica taking the lease over must hold
exclusively: a write that passed the check commits before the takeover, and none can pass it
after. (Locking the lease row would do the same, but writes the row and the WAL in every
transaction: it halved throughput.) SQLite runs one write transaction at a time anyway.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass

from sqlalchemy import select, text, update
from sqlalchemy.engine import Connection
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from vipu.model.errors import Unavailable
from vipu.store.schema import LeaseRow

# PostgreSQL advisory locks ("vipu" and a number): held while a store is initialised; held shared
# by every fenced write transaction and exclusively by a replica taking the lease over.
INITIALISATION_LOCK = 0x76697075_00
LEADERSHIP_LOCK = 0x76697075_01
# The fence of a write transaction on PostgreSQL in one round trip. A VOLATILE function reads with
# a fresh snapshot, taken after the lock is granted, so a takeover it waited for is seen.
HOLDS_LEASE_FUNCTION = f"""
CREATE OR REPLACE FUNCTION vipu_holds_lease(lease_name text, lease_holder text, lease_term integer) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared({LEADERSHIP_LOCK});
    RETURN EXISTS (SELECT 1 FROM leases WHERE name = lease_name AND holder = lease_holder AND term = lease_term);
END
$$"""
HOLDS_LEASE = text("SELECT vipu_holds_lease(:name, :holder, :term)")
NO_LONGER_LEADER = "this vipu-server is no longer the leader; another replica has taken over"


@dataclass(frozen=True)
class Lease:
    """A lease as the store holds it; `remaining` is in seconds by the database's clock (negative: expired)."""

    name: str
    holder: str
    address: str
    term: int
    remaining: float


@dataclass(frozen=True)
class Fence:
    """The lease a controller must still hold for its writes to commit."""

    name: str
    holder: str
    term: int


def clock(is_sqlite: bool):
    """The database's clock, in seconds since the epoch, so that controllers on several hosts agree on when a lease ends."""
    return text("SELECT (julianday('now') - 2440587.5) * 86400.0" if is_sqlite else "SELECT extract(epoch from clock_timestamp())::float8")


def check_fence(connection: Connection, fence: Fence, is_sqlite: bool) -> None:
    """Unavailable unless the fence's lease is still held in its term (see the module's docstring)."""
    if is_sqlite:
        current = connection.execute(select(LeaseRow.holder, LeaseRow.term).where(LeaseRow.name == fence.name)).one_or_none()
        held = current is not None and tuple(current) == (fence.holder, fence.term)
    else:
        held = connection.execute(HOLDS_LEASE, {"name": fence.name, "holder": fence.holder, "term": fence.term}).scalar_one()
    if not held:
        raise Unavailable(NO_LONGER_LEADER)


def check_fence_on_driver(driver, fence: Fence, is_sqlite: bool) -> None:
    """`check_fence` on a driver's own connection (the group commit's)."""
    cursor = driver.cursor()
    try:
        if is_sqlite:
            cursor.execute("SELECT holder, term FROM leases WHERE name = ?", (fence.name,))
            current = cursor.fetchone()
            held = current is not None and tuple(current) == (fence.holder, fence.term)
        else:
            cursor.execute("SELECT vipu_holds_lease(%s, %s, %s)", (fence.name, fence.holder, fence.term))
            held = bool(cursor.fetchone()[0])
    finally:
        cursor.close()
    if not held:
        raise Unavailable(NO_LONGER_LEADER)


class Leases:
    """Claims, reads and releases leases, in write transactions of their own, unfenced."""

    def __init__(self, is_sqlite: bool, write: Callable[[], AbstractContextManager[Session]],
                 read: Callable[[], AbstractContextManager[Session]]):
        """`write()`: a write transaction on the lease (Unavailable when the database cannot be
        reached); `read()`: a read-only one."""
        self._is_sqlite = is_sqlite
        self._write = write
        self._read = read
        self._clock = clock(is_sqlite)

    def claim(self, name: str, holder: str, address: str, seconds: float, deadline_seconds: float = 0.0) -> Lease | None:
        """Take the lease if it is free or has expired, or renew it if `holder` has it; the lease as it now stands.

        The row is locked while it is decided, so two claimants never both win; the loser gets
        the winner's lease back. On PostgreSQL, `deadline_seconds` bounds the claim's statements and
        lock waits (a stalled database makes it fail in time to be tried again within the lease).
        """
        try:
            with self._write() as session:
                if deadline_seconds and not self._is_sqlite:
                    milliseconds = max(1, round(deadline_seconds * 1000))
                    session.execute(text(f"SET LOCAL statement_timeout = {milliseconds}"))
                    session.execute(text(f"SET LOCAL lock_timeout = {milliseconds}"))
                    # cut off mid-claim, its row lock is let go as soon as the claim's time is up
                    session.execute(text(f"SET LOCAL idle_in_transaction_session_timeout = {milliseconds}"))
                now = session.execute(self._clock).scalar_one()
                row = session.execute(select(LeaseRow).where(LeaseRow.name == name).with_for_update()).scalar_one_or_none()
                if row is None:
                    row = LeaseRow(name=name, holder=holder, address=address, term=1, expires=now + seconds)
                    session.add(row)
                elif row.holder == holder:
                    row.expires = now + seconds
                elif row.expires <= now:
                    if not self._is_sqlite:  # wait for the writes the last holder has under way (see check_fence)
                        session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": LEADERSHIP_LOCK})
                    row.holder, row.address, row.term, row.expires = holder, address, row.term + 1, now + seconds
                return Lease(row.name, row.holder, row.address, row.term, row.expires - now)
        except IntegrityError:  # another claimant inserted the first row meanwhile
            return self.read(name)

    def read(self, name: str) -> Lease | None:
        with self._read() as session:
            now = session.execute(self._clock).scalar_one()
            row = session.get(LeaseRow, name)
            return None if row is None else Lease(row.name, row.holder, row.address, row.term, row.expires - now)

    def release(self, name: str, holder: str) -> None:
        """End `holder`'s lease now, so another claimant need not wait for it to expire."""
        with self._write() as session:
            now = session.execute(self._clock).scalar_one()
            session.execute(update(LeaseRow).where(LeaseRow.name == name, LeaseRow.holder == holder).values(expires=now))
