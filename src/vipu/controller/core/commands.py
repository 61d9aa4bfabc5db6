"""What an allocation's owner is asked to do, and how the asker waits for its answer.

Use cases, the health pass and cluster tests put commands in an owner's inbox; the owner takes
them one at a time. Each carries a `Reply`, which its asker waits on for at most a deadline: a
command the owner has not started by then is withdrawn (and never started), one it has started
is bounded by its own steps' deadlines (agent calls, store statements), and the asker is told in
one line if even that runs out.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from vipu.controller.core.lending import Loan
from vipu.model.configuration import AgentSettings
from vipu.model.entities import OPEN_ACCESS, Access, PartitionRequest
from vipu.model.errors import Unavailable, VipuError
from vipu.model.linkhealth import LinkFaults

# How long a started operation may take before its asker stops waiting: its agent calls are each
# bounded by the agent timeout (10 s by default) and its store writes by the statement deadline.
OPERATION_SECONDS = 120.0
# How long a command may wait for its owner's turn; an owner takes hundreds of commands a turn.
START_SECONDS = 30.0

_QUEUED, _STARTED, _WITHDRAWN, _DONE = "queued", "started", "withdrawn", "done"


class Reply:
    """A command's answer: its result or its error, once the owner has one. The thread waiting for
    it also carries the operation's agent calls (`carry`): it makes them outside the owner's turn."""

    __slots__ = ("_carried", "_changed", "_error", "_lock", "_result", "_state", "_waiting")

    def __init__(self, waited: bool = True) -> None:
        """`waited`: a thread waits for it (and so may carry its operation's agent calls)."""
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._state = _QUEUED
        self._result: Any = None
        self._error: BaseException | None = None
        self._carried: list[Callable[[], None]] = []
        self._waiting = waited

    def start(self) -> bool:
        """The owner takes the command up; False if its asker withdrew it (it is then dropped)."""
        with self._lock:
            if self._state != _QUEUED:
                return self._state == _STARTED
            self._state = _STARTED
            return True

    def requeue(self) -> None:
        """The command waits again to be started (behind an operation under way): its asker may
        withdraw it meanwhile."""
        with self._lock:
            if self._state == _STARTED:
                self._state = _QUEUED

    def carry(self, work: Callable[[], None]) -> bool:
        """Hand `work` to the thread waiting for this answer, which runs it; False if none waits."""
        with self._lock:
            if not self._waiting or self._state in (_WITHDRAWN, _DONE):
                return False
            self._carried.append(work)
            self._changed.notify_all()
            return True

    def resolve(self, result: Any = None) -> None:
        with self._lock:
            if self._state == _DONE:
                return
            self._state, self._result = _DONE, result
            self._changed.notify_all()

    def fail(self, error: BaseException) -> None:
        with self._lock:
            if self._state == _DONE:
                return
            self._state, self._error = _DONE, error
            self._changed.notify_all()

    @property
    def done(self) -> bool:
        return self._state == _DONE

    @property
    def answered(self) -> bool:
        """Whether its waiting thread has something to take: the outcome, or work to carry."""
        return self._state == _DONE or bool(self._carried)

    def outcome(self) -> Any:
        """The result, or the error raised; only once done."""
        if self._error is not None:
            raise self._error
        return self._result

    def wait(self, start_seconds: float, what: str, finish_seconds: float = OPERATION_SECONDS, not_started: str = "") -> Any:
        """The result, or the command's error raised here, running meanwhile what the owner hands
        this thread to carry. A command not started within `start_seconds` is withdrawn
        (Unavailable, `not_started` if given); a started one is waited for up to `finish_seconds`
        more, then Unavailable says it goes on."""
        deadline, extended = time.monotonic() + start_seconds, False
        try:
            while True:
                with self._lock:
                    while not self._carried and self._state != _DONE:
                        remaining = deadline - time.monotonic()
                        if remaining <= 0:
                            break
                        self._changed.wait(remaining)
                    work, self._carried = self._carried, []
                    if not work and self._state != _DONE:
                        if self._state == _QUEUED:
                            self._state = _WITHDRAWN
                            raise Unavailable(not_started or f"{what} did not start within {start_seconds:g} s; try again")
                        if extended:
                            self._waiting = False
                            raise Unavailable(f"{what} is still under way after {start_seconds + finish_seconds:g} s; it goes on, "
                                              "and the partition's status tells how it ends")
                        extended, deadline = True, time.monotonic() + finish_seconds
                        continue
                for carried in work:
                    carried()
                if not work:
                    return self.outcome()
        finally:
            with self._lock:
                self._waiting = False
                leftover, self._carried = self._carried, []
            for carried in leftover:  # handed over just as this thread left: made all the same
                carried()


@dataclass
class Command:
    """Something an owner is asked; `reply` is how its asker hears the outcome."""

    reply: Reply = field(default_factory=Reply, kw_only=True)
    deadline: float = field(default=0.0, kw_only=True)  # monotonic; 0: none beyond the asker's wait

    @property
    def expired(self) -> bool:
        return bool(self.deadline) and time.monotonic() > self.deadline


@dataclass
class CreatePartition(Command):
    """Place and configure a partition; or, if there is no room and `wait_seconds`, queue the request."""

    request: PartitionRequest
    access: Access = OPEN_ACCESS
    keep_on_error: bool = False
    wait_seconds: float = 0.0
    detached: bool = False  # a request to be picked up later: it waits with no lease for a waiter to renew
    may_queue: bool = False  # the caller chose this allocation to wait in: queue here when there is no room
    placed: bool = False  # set by the owner once it has placed (or queued) it: a later failure is the partition's, not a refusal


@dataclass
class RemovePartition(Command):
    partition_id: str
    access: Access = OPEN_ACCESS
    force: bool = False


@dataclass
class ResetPartition(Command):
    partition_id: str
    access: Access = OPEN_ACCESS
    automatic: bool = False


@dataclass
class RelocatePartition(Command):
    """Move a partition off the machines that failed it (or all of its own); `only_off_failed`:
    reset it in place when none did."""

    partition_id: str
    access: Access = OPEN_ACCESS
    automatic: bool = False
    only_off_failed: bool = False


@dataclass
class CompactAllocation(Command):
    """Plan the moves of relocatable partitions that free the largest shape now broken up, and
    unless `dry_run` carry them out one at a time (`vipu.model.compaction`)."""

    dry_run: bool = True
    why: str = ""  # who asked, as the moved partitions' notes say


@dataclass
class ApplyTemplate(Command):
    """Make a template's partitions (`requests`, in order) all at once, or none: placed together on
    what is free now, then each created; with `dry_run`, only placed (`operations.apply_template`)."""

    template: str
    requests: list[PartitionRequest]
    access: Access = OPEN_ACCESS
    dry_run: bool = False


@dataclass
class CancelRequest(Command):
    partition_id: str
    access: Access = OPEN_ACCESS


@dataclass
class ClaimMachines(Command):
    """A disruptive cluster test takes the allocation's machines: refused while partitions are
    there or being made; partitions are refused while it holds them. Given `machines`, it takes
    those alone, each drained (Conflict, naming why, if one is not): partitions elsewhere go on."""

    test: str  # how refusals name it: "cluster cl0"
    machines: tuple[str, ...] = ()  # the allocation's machines the test is of; none: all of them


@dataclass
class ReleaseMachines(Command):
    test: str


@dataclass
class LendMachines(Command):
    """An idle-time test asks for the allocation's free machines for up to `seconds`: answered with
    a `Loan` of them, or None when none is free (or a disruptive test holds them, or one is
    lent already). A partition that needs one of them takes it back at once."""

    test: str  # how its results and the log name it: "idle-time test of cluster cl0"
    seconds: float


@dataclass
class ReturnMachines(Command):
    """The idle-time test is over: its loan ends, if it is still the allocation's."""

    loan: Loan


@dataclass
class AgentReport(Command):
    """What a health pass found at one of the allocation's agents: the settings its machine is
    configured with, or why it could not be asked (it is down), as read from `asked_at` on."""

    agent_id: str
    configured: dict[str, AgentSettings] | None = None  # by partition id; None when it did not answer
    error: VipuError | None = None
    asked_at: float = field(kw_only=True)  # monotonic, when the read began


@dataclass
class DrainsChanged(Command):
    """An operator drained or resumed some of the allocation's machines: the owner reads the drains
    from the store (so that two such words crossing cannot leave it with the older), places nothing
    on a draining machine, and moves its relocatable ACTIVE partitions off while idle, now and at
    each health pass until none is left; answered once the moves begun now have ended."""


@dataclass
class AccountsChanged(Command):
    """An administrator changed the accounts (their users, cohorts or quotas: `vipu.model.accounts`),
    which the owner reads from the configuration at each decision: its queue is passed over again,
    so that what a raised quota lets start starts, and each request's reason says the new rules."""


@dataclass
class Reserve(Command):
    """An administrator's reservation of IPUs of the allocation for a time (`vipu.model.reservations`):
    the machines named (`agent_ids`), or a shape of `size` IPUs the owner chooses, free of other
    reservations at that time and, where it can, of partitions expected to be there at its start.
    Answered with the reservation once it is committed (a window's moves go on after)."""

    name: str
    start: float
    end: float
    reason: str
    by: str = ""
    maintenance: bool = False
    users: tuple[str, ...] = ()
    accounts: tuple[str, ...] = ()
    agent_ids: tuple[str, ...] = ()
    size: int = 0


@dataclass
class Unreserve(Command):
    """An administrator's removal of one of the allocation's reservations; answered once committed."""

    name: str


@dataclass
class Powering(Command):
    """An administrator's power action on one of the allocation's machines. At its start (`begin`)
    the owner refuses it while a partition there is busy, or ACTIVE unless `force` (those are then
    failed as the agent's loss fails them: the reply names them), and keeps the machine down, out of
    placement and deaf to health passes, until told of the action's end (`begin` False, the same
    `token`) or until `until` (monotonic) passes, whichever comes first."""

    agent_id: str
    action: str
    token: object
    begin: bool = True
    force: bool = False
    until: float = 0.0


@dataclass
class LinksChanged(Command):
    """The link ledger's word on the allocation's unhealthy links, whole: placement steps around
    them from then on, and the partitions running over them are told."""

    faults: LinkFaults


@dataclass
class FinishInterrupted(Command):
    """Finish the operations nobody owns any more (a restart's, or those whose last write failed)."""


@dataclass
class RecoverFailed(Command):
    """Move or reset the ERROR partitions whose machines allow it, as their policy says."""


@dataclass
class CloseAllocation(Command):
    """The allocation is being removed: cancel its requests, remove its partitions (with `force`),
    delete it, and stop."""

    force: bool = False


@dataclass
class UpdatePartition(Command):
    """Change what its user may change of a partition: its consent to be moved while IPUoF clients
    are attached (`may_move`). Only its owner or an administrator may; it waits for an operation
    under way on the partition, so that no operation's copy of it undoes the change."""

    partition_id: str
    may_move: bool
    access: Access = OPEN_ACCESS
