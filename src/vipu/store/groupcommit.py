"""Group commit: the writes that arrive while one commits share the next commit.

Each allocation's owner writes a turn's changes at once (`Store.write`); owners of several
allocations, and the other writers, arrive together. The thread whose turn comes commits every
write waiting by then; each runs under a savepoint of its own when there are several, so one that
fails (a refused transition, a lost race) is rolled back alone and raises in its own caller. If
the commit fails, every write of the group fails with it. A writer waits for its turn at most
STATEMENT_DEADLINE_SECONDS (every statement, and so every commit ahead, is bounded too), then is
told the store is busy: no write waits without a deadline.

An answer is never false. A writer that gives up waiting withdraws its work under the lock that
groups take it by, so no later group commits what its caller was told was not done; one whose
work another thread's group has already taken waits (bounded) for that group's outcome. A commit
whose own answer is lost (the connection gone during COMMIT, `CommitLost`), or a group that gives
no word in time, is OutcomeUnknown: its caller reads the store before it says or undoes anything.
"""

from __future__ import annotations

import threading
import typing
from collections.abc import Callable
from contextlib import AbstractContextManager

from vipu.model.errors import OutcomeUnknown, Unavailable
from vipu.store.engines import STATEMENT_DEADLINE_SECONDS

if typing.TYPE_CHECKING:
    from vipu.store.store import Transaction

T = typing.TypeVar("T")


class WriteTurn:
    """A lock taken within a deadline: who writes next. (A class rather than a generator's context
    manager: it is taken for every commit.)"""

    def __init__(self, what: str, seconds: float = STATEMENT_DEADLINE_SECONDS) -> None:
        self._lock = threading.Lock()
        self._what = what
        self._seconds = seconds

    @property
    def seconds(self) -> float:
        return self._seconds

    def __enter__(self) -> None:
        if not self._lock.acquire(timeout=self._seconds):
            raise Unavailable(f"{self._what} did not come free within {self._seconds:g} s (the writes ahead are slow); try again")

    def __exit__(self, *exc) -> None:
        self._lock.release()


class CommitLost(Exception):
    """The database's answer to COMMIT never came (the connection went): the transaction may or
    may not have been committed. Raised by a `writing()` transaction, from the driver's error; its
    callers learn OutcomeUnknown."""


class _GroupedWrite:
    """One caller's part of a group commit: its work, then its result or its error."""

    def __init__(self, work: Callable[[Transaction], typing.Any]):
        self.work = work
        self.result: typing.Any = None
        self.error: BaseException | None = None
        self.finished = threading.Event()

    def run(self, tx: Transaction) -> None:
        try:
            self.result = self.work(tx)
        except Exception as error:  # noqa: BLE001 - raised in its own caller, by `write`
            self.error = error


class GroupCommit:
    def __init__(self, turn: WriteTurn, writing: Callable[[], AbstractContextManager[Transaction]],
                 refusal: Callable[[BaseException], BaseException]):
        """`turn`: whose turn it is to commit a group; `writing()`: a fenced write transaction,
        committed when its block ends; `refusal(error)`: what a caller is told of a database's error."""
        self._turn = turn
        self._writing = writing
        self._refusal = refusal
        self._pending_lock = threading.Lock()
        self._pending: list[_GroupedWrite] = []

    def write(self, work: Callable[[Transaction], T]) -> T:
        """Run `work` in a write transaction shared with the writes that arrive while another
        commits; answered only after the commit. `work` may be run by another thread: it must
        only use the transaction it is given."""
        mine = _GroupedWrite(work)
        with self._pending_lock:
            self._pending.append(mine)
        try:
            with self._turn:
                if not mine.finished.is_set():  # else an earlier turn committed it with its own group
                    with self._pending_lock:
                        group, self._pending = self._pending, []
                    self._commit(group)
        except Unavailable:  # the turn did not come free in time
            with self._pending_lock:
                if mine in self._pending:  # no group took it: withdrawn, it is not done and never will be
                    self._pending.remove(mine)
                    raise
            # Another thread's group holds it and is committing it now: its outcome is that group's.
            if not mine.finished.wait(self._turn.seconds):
                raise OutcomeUnknown(f"the store's commit of this change gave no word within {2 * self._turn.seconds:g} s "
                                     "(the writes ahead are slow)") from None
        if mine.error is not None:
            raise self._refusal(mine.error)
        return typing.cast(T, mine.result)

    def _commit(self, group: list[_GroupedWrite]) -> None:
        committed = False
        try:
            with self._writing() as tx:
                if len(group) == 1:
                    group[0].run(tx)
                    if group[0].error is not None:
                        raise group[0].error  # rolls the transaction back
                else:
                    cursor = tx.driver.cursor()
                    try:
                        for write in group:
                            cursor.execute("SAVEPOINT grouped")
                            write.run(tx)
                            if write.error is not None:
                                cursor.execute("ROLLBACK TO SAVEPOINT grouped")
                            cursor.execute("RELEASE SAVEPOINT grouped")
                    finally:
                        cursor.close()
            committed = True
        except CommitLost as lost:  # every write of the group may be committed, or none
            for write in group:
                if write.error is None:
                    write.error = OutcomeUnknown(f"the store's answer to the commit was lost ({lost}); what it holds says "
                                                 "whether the change was made")
        except Exception as error:  # noqa: BLE001 - it is raised in every caller whose write it undid
            for write in group:
                if write.error is None:
                    write.error = error
        finally:
            for write in group:
                if not committed and write.error is None:  # the committing thread was interrupted
                    write.error = Unavailable("the store write was interrupted; try again")
                write.finished.set()
