"""An allocation owner's turn engine: its inbox, whose turn it is, how a turn runs operations a step
at a time, commits their writes together and publishes what is committed (see `owner` for the
whole). What a turn does with a command, and with the queue, it asks of its parts (`Deciding`,
`Queueing`), which `owner` composes: they are given the engine, and it is given them.
"""

from __future__ import annotations

import logging
import threading
import time
import typing
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import TYPE_CHECKING, Any, Protocol

from vipu import failpoints
from vipu.controller.core.agents import AgentCall, AgentCalls, CallEnds
from vipu.controller.core.commands import Command, Reply
from vipu.controller.core.effects import AfterPass, Calls, Effect, Join, Operation, Write
from vipu.controller.core.lending import STEP_OFF_SECONDS, Loan
from vipu.controller.core.snapshot import AllocationSnapshot, QueueView
from vipu.controller.core.state import AllocationState
from vipu.model.compaction import Budget
from vipu.model.errors import ConcurrentUpdate, Conflict, OutcomeUnknown, Unavailable, VipuError
from vipu.model.queue import WaitingRequest
from vipu.model.waiting import QueueLimits

if TYPE_CHECKING:
    from vipu.store.store import Store, Transaction

log = logging.getLogger("vipu.controller.core")

INBOX_LIMIT = 1024  # commands waiting for an owner's turn; past that, Unavailable
OPERATIONS_LIMIT = 512  # operations under way at once in one allocation; past that, Unavailable
BATCH = 256  # commands taken in one turn
REPORT_HORIZON = 60.0  # seconds: a health pass's read older than this when its owner takes it is not judged (a pass
# reads every agent at once, each within the agent timeout, and reports at once)
# IPUs kept out after a clear no machine confirmed are asked to be cleared again after these many
# seconds, doubling up to the longest while the machine does not answer: they come back as soon as
# it does, not at the next health pass.
RECLEAR_FIRST_SECONDS, RECLEAR_LONGEST_SECONDS = 1.0, 30.0
# An operation's name, as an answer about it says ("the create of partition p1"), by what it is doing.
OPERATION_NAMES = {"creating": "create", "removing": "remove", "resetting": "reset", "relocating": "move", "compacting": "move",
                   "updating": "change", "queueing": "request", "cancelling": "cancel"}


class Registry(Protocol):
    """What an owner asks of the registry of owners (`owners.Owners` is what gives it): the store
    and the agent calls all owners share, the limits of the queue and of compaction, the partition
    ids and the waiting users it counts across allocations, and that an owner be rebuilt, closed
    or published. Owners take it as this, so that they depend on none of the registry's code."""

    store: Store
    calls: AgentCalls
    limits: QueueLimits
    compaction_budget: Budget

    def rebuild(self, failed: TurnEngine, why: str) -> None: ...
    def closed(self, owner: TurnEngine) -> None: ...
    def published(self, owner: TurnEngine, partitions_changed: bool) -> None: ...
    def settle_id(self, partition_id: str, allocation_id: str) -> None: ...
    def release_id(self, partition_id: str, allocation_id: str) -> None: ...
    def enter_queue(self, user: str) -> None: ...
    def leave_queue(self, user: str) -> None: ...
    def record_ending(self, partition_id: str, allocation_id: str, ending: VipuError) -> None: ...


class Deciding(Protocol):
    """What a turn asks of the owner's decisions (`decisions.Decisions`)."""

    def decide(self, command: Command) -> None:
        """Take a command up: start its operation, answer it, or raise its refusal."""

    def drains_due(self) -> None:
        """Remove the partitions left on machines whose drain's deadline passed, and those whose reclaim's did."""

    def reclear(self) -> None:
        """Ask the machines again to clear what they did not confirm clearing."""


class Queueing(Protocol):
    """What a turn asks of the owner's queue of waiting requests (`queueing.Queue`)."""

    explained: QueueView  # why each request waits, as the last pass worked it out

    def expire_due(self) -> None:
        """End the requests whose deadline, or whose waiter's lease, passed."""

    def matters(self) -> bool:
        """Whether a pass over the queue has anything to do."""

    def run_pass(self) -> None:
        """Start what fits, hold IPUs for the first request, and tell why the rest waits (the
        engine clears `Changes.room` first: what the pass changes marks it again)."""

    def next_expiry(self) -> datetime | None:
        """When the soonest deadline or lease of a waiting request comes due."""

    def renew(self, partition_id: str) -> None:
        """Its waiter asked after a request: its lease starts again (any thread)."""


@dataclass
class Changes:
    """What a turn has changed so far, which decides what it does before it lets go: every part
    marks what it changed here."""

    state: bool = True  # anything readers see: a new snapshot is published
    partitions: bool = True  # a partition: the change feed hears of it
    queue: bool = True  # which requests wait, or why: the snapshot's queue is made again
    room: bool = True  # the room or the queue: a pass over the queue looks again


class _WriteRefused(Exception):
    def __init__(self, index: int, error: VipuError):
        super().__init__(error.message)
        self.index, self.error = index, error


class TurnEngine:
    """The engine of one allocation's owner: its inbox, its turns and the operations they run, the
    commits and what is published. Its parts (`attach`) decide commands and keep the queue."""

    def __init__(self, owners: Registry, state: AllocationState):
        self.owners = owners
        self.id = state.allocation.id
        self.state = state
        self.on_partition: dict[str, Operation] = {}  # partition id -> the operation holding it
        self.clears: dict[tuple[str, str], Operation] = {}  # (agent, partition id) -> the reconciliation clearing old settings there
        self._lock = threading.Lock()  # over the inbox and whose turn it is; never held through a turn
        self._quiet = threading.Condition(self._lock)  # notified at the end of every turn
        self._timer = threading.Condition(self._lock)  # the timer thread waits on it for the next thing due
        self._busy = False  # a thread has the owner's turn
        self._inbox: deque[Command] = deque()
        self._answers: deque[tuple[Operation, list[AgentCall], Any]] = deque()  # agent calls and their outcomes
        self.call_ends = CallEnds(REPORT_HORIZON)  # when each call's outcome came back, which a health report must be newer than
        self._timer_thread: threading.Thread | None = None
        self._stopped = ""  # why, once stopped
        self._failed = False  # stopped because a turn raised: what its operations under way did is unknown
        self._in_flight = 0  # batches of agent calls not yet answered
        self.under_way: set[Operation] = set()  # every operation started and not ended
        # What one turn does, and what it leaves for the next:
        self._commands: deque[Command] = deque()
        self._ready: deque[tuple[Operation, Any, BaseException | None]] = deque()
        self._staged: list[tuple[Operation, Write]] = []
        self._launch: list[tuple[Operation, Calls]] = []
        self._after_pass: list[Operation] = []
        self._loans_ending: list[tuple[Loan, str]] = []  # loans taken back this turn, ended once it is committed
        self._stepping_off: list[Loan] = []  # loans taken back whose test steps may still run
        self.changes = Changes()
        self._pass_due = 0.0  # monotonic; 0: no pass waits to be retried
        self._reclear_due = 0.0  # monotonic; 0: no unconfirmed clear waits to be asked again
        self._reclear_wait = RECLEAR_FIRST_SECONDS
        self.snapshot = AllocationSnapshot(state.allocation, state.layout)
        # When a drain's deadline next removes a partition (seconds since the epoch), worked out by each
        # turn: the timer thread reads this number, never the state a turn changes.
        self._drain_due: float | None = self._drain_deadline()
        self._decisions: Deciding | None = None
        self._queue: Queueing | None = None

    def attach(self, decisions: Deciding, queue: Queueing) -> None:
        """Take the parts a turn asks, and publish the state it starts from."""
        self._decisions, self._queue = decisions, queue
        self._publish()

    @property
    def decisions(self) -> Deciding:
        assert self._decisions is not None, "an owner's engine runs no turn before its parts are attached"
        return self._decisions

    @property
    def queue(self) -> Queueing:
        assert self._queue is not None, "an owner's engine runs no turn before its parts are attached"
        return self._queue

    def renew(self, partition_id: str) -> None:
        """Its waiter asked after a waiting request (`Queueing.renew`)."""
        self.queue.renew(partition_id)

    def pass_again(self, seconds: float) -> None:
        """A pass over the queue that could not do its work is tried again in `seconds`."""
        self._pass_due = time.monotonic() + seconds

    # The inbox, and whose turn it is

    def submit(self, command: Command, always: bool = False) -> Command:
        """Put a command in the inbox and take the owner's turn if it is free (see `_drive`);
        Unavailable if the owner stopped or its inbox is full (unless `always`: a command that
        must not be lost, as machines given back by a cluster test)."""
        with self._lock:
            if self._stopped:
                raise Unavailable(self._stopped)
            if len(self._inbox) >= INBOX_LIMIT and not always:
                raise Unavailable(f"allocation {self.id} has {INBOX_LIMIT} requests waiting for its owner's turn, its limit; "
                                  "try again shortly")
            self._inbox.append(command)
        self._drive(command.reply)
        return command

    def _answered(self, operation: Operation, calls: list[AgentCall], outcomes: Any) -> None:
        """Agent calls' outcomes, from whichever thread made them: the operation goes on in a turn."""
        with self._lock:
            self._in_flight -= 1
            if self._stopped:
                return  # a deposed or stopped owner commits nothing of what comes back
            self._answers.append((operation, calls, outcomes))
        self._drive(operation.reply)

    def _drive(self, mine: Reply | None = None) -> None:
        """Take the owner's turn if nobody has it and there is work, and run turns until none is
        left. A thread that finds the turn taken leaves its work in the inbox and goes: the one
        holding the turn takes that too before it lets go (flat combining). So the owner decides
        one thing at a time, nobody ever waits for its turn, and a lone request is decided on the
        thread that brought it, without a hand-off. A thread waiting for an answer of its own
        (`mine`) stops once that answer has come, or work for it to carry, and hands what is left
        to the pool: others' work never keeps it from its own."""
        while True:
            with self._lock:
                if self._busy or self._stopped or not self._has_work():
                    return
                self._busy = True
                commands = [self._inbox.popleft() for _ in range(min(BATCH, len(self._inbox)))]
                answers, self._answers = list(self._answers), deque()
            try:
                self._turn(commands, answers)
            except Exception as error:  # noqa: BLE001 - fail-stop: the owner is rebuilt from the store
                self._fail_stop(error)
            finally:
                with self._lock:
                    self._busy = False
                    self._quiet.notify_all()
                    self._timer.notify()
                    stopped = bool(self._stopped)
                if stopped:
                    self._abandon()
                self._keep_time()
            if mine is not None and mine.answered:
                with self._lock:
                    left = not self._stopped and self._has_work()
                if left:
                    self.owners.calls.hand_off(self._drive)
                return

    def _fail_stop(self, error: Exception) -> None:
        """A turn raised: what this owner holds in memory may no longer be what the store holds (a
        write staged and not committed, a commit whose outcome is unknown, a step cut short). It
        decides nothing more; its operations under way are told their outcome is unknown, and a new
        owner is made from the store, as at a takeover, which finishes them (`Owners.rebuild`)."""
        if isinstance(error, OutcomeUnknown):
            why = error.message
            log.warning("allocation %s: %s; its owner is rebuilt from the store", self.id, why)
        else:
            why = f"the owner of allocation {self.id} failed ({type(error).__name__}: {error})"
            log.exception("allocation %s: a turn failed; its owner is rebuilt from the store", self.id)
        with self._lock:
            self._failed = True
        self.owners.rebuild(self, why)

    def _has_work(self) -> bool:
        """Commands or answers wait, or a timer is due; the caller holds the lock."""
        if self._inbox or self._answers:
            return True
        timer = self._next_timer()
        return timer is not None and timer <= time.monotonic()

    def _keep_time(self) -> None:
        """Start the owner's timer thread when something is to happen later (a request's deadline, a
        pass tried again) and it is not running; it lets go when nothing is."""
        with self._lock:
            if self._timer_thread is None and not self._stopped and self._next_timer() is not None:
                self._timer_thread = threading.Thread(target=self._timers, name=f"owner-{self.id}", daemon=True)
                self._timer_thread.start()

    def _timers(self) -> None:
        while True:
            with self._lock:
                timer = self._next_timer()
                if self._stopped or timer is None:
                    self._timer_thread = None
                    self._quiet.notify_all()
                    return
                if timer > time.monotonic():
                    self._timer.wait(timer - time.monotonic())
                    continue
            self._drive()
            with self._lock:
                due = self._next_timer()
                if due is not None and due <= time.monotonic() and self._busy:
                    self._timer.wait(0.05)  # a turn holder takes it; look again shortly

    def wake(self) -> None:
        """A pass over the queue, and its requests' deadlines kept, with no command (a restart's queue)."""
        with self._lock:
            self._pass_due = self._pass_due or time.monotonic()
        self._drive()
        self._keep_time()

    def stop(self, reason: str) -> None:
        """Stop deciding at once: commands waiting and operations under way are told `reason`
        (the latter when the turn under way ends); agent calls in flight finish, and nothing of
        them is committed."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = reason
            waiting, self._inbox = list(self._inbox), deque()
            in_turn = self._busy
            self._timer.notify_all()
            self._quiet.notify_all()
        for command in waiting:
            command.reply.fail(Unavailable(reason))
        if not in_turn:
            self._abandon()

    def _abandon(self) -> None:
        """Tell the askers of the operations under way, and of the commands its last turn left
        undecided or kept waiting behind an operation, that this owner stopped; after a failed turn,
        that the outcome of an operation under way is unknown, and where to look."""
        self._staged, self._launch = [], []
        while self._commands:
            self._commands.popleft().reply.fail(Unavailable(self._stopped))
        if self.state.loan is not None:  # the idle-time test stops: nothing decides who uses the machines now
            self.state.loan.end(self._stopped)
        for operation in list(self.under_way):
            for follower in operation.followers:
                follower.reply.fail(Unavailable(self._stopped))
            if operation.reply is not None:
                operation.reply.fail(self._stopped_error(operation))

    def _stopped_error(self, operation: Operation) -> VipuError:
        if not self._failed:
            return Unavailable(self._stopped)
        if not operation.partition_id:
            return OutcomeUnknown(f"outcome unknown: {self._stopped}")
        named = OPERATION_NAMES.get(operation.kind, operation.kind)
        return OutcomeUnknown(f"outcome unknown: {self._stopped}; `vipu get partition {operation.partition_id}` says whether "
                              f"the {named} was done")

    def join(self, seconds: float) -> bool:
        """Wait up to `seconds` for a stopped owner's turn under way and timer to end; whether they have."""
        deadline = time.monotonic() + seconds
        with self._quiet:
            while self._busy or self._timer_thread is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._quiet.wait(remaining)
            return True

    def wait_quiet(self, seconds: float) -> bool:
        """Wait up to `seconds` until the owner has nothing to do: no command waiting, no operation
        under way, no agent call in flight; whether it has come to that."""
        deadline = time.monotonic() + seconds
        with self._quiet:
            while self._inbox or self._answers or self.under_way or self._in_flight or self._busy:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._stopped:
                    return False
                self._quiet.wait(remaining)
            return True

    @property
    def in_turn(self) -> bool:
        """Whether a turn is under way (it may be waiting for its commit)."""
        return self._busy

    def _next_timer(self) -> float | None:
        """When the owner must act without a command (monotonic): a request's deadline, a retried
        pass, the end of a loan of its machines, a drain's deadline."""
        timers = []
        expiry = self.queue.next_expiry()
        if expiry is not None:
            timers.append(time.monotonic() + (expiry - datetime.now(UTC)).total_seconds())
        if self._pass_due:
            timers.append(self._pass_due)
        if self._reclear_due:
            timers.append(self._reclear_due)
        if self.state.loan is not None:
            timers.append(self.state.loan.until)
        if self._drain_due is not None:
            timers.append(time.monotonic() + self._drain_due - time.time())
        return min(timers, default=None)

    def _drain_deadline(self) -> float | None:
        """When the owner next acts on a drain or a reservation (seconds since the epoch): a drain's
        deadline, when a partition left on a machine being drained is removed (or, if a removal of
        it failed, tried again), and a reservation's start or end; None if there is none to come.
        On the turn's thread only."""
        state = self.state
        due = [max(drain.deadline, state.removals_after.get(partition.id, 0.0))
               for agent_id, drain in state.draining.items() if drain.deadline
               for partition in state.on_agent(agent_id) if partition.id not in self.on_partition]
        due += [moment for r in state.reservations.values() for moment in (r.start, r.end) if moment > state.steered_at]
        due += [max(at, state.removals_after.get(partition_id, 0.0)) for partition_id, at in state.reclaiming.items()
                if partition_id not in self.on_partition]  # a reclaim's deadline (`sharing`)
        return min(due, default=None)

    def _turn(self, commands: list[Command], answers: list[tuple[Operation, list[AgentCall], Any]]) -> None:
        for operation, _, outcomes in answers:  # first, so that a turn that raises leaves them to be failed truthfully
            self._ready.append((operation, outcomes, None))
        now = time.monotonic()
        for _, made, outcomes in answers:
            self.call_ends.record(made, outcomes, now)
        self._commands.extend(commands)
        failpoints.hit("owner.turn")
        self.queue.expire_due()
        self.decisions.drains_due()
        loan = self.state.loan
        if loan is not None and time.monotonic() >= loan.until:
            self.take_back(f"its loan of {loan.seconds:g} s ran out")
        if self._pass_due and time.monotonic() >= self._pass_due:
            self._pass_due, self.changes.room = 0.0, True
        if self._reclear_due and time.monotonic() >= self._reclear_due:
            self._reclear_due = 0.0
            self.decisions.reclear()
        passed = False
        while not self._stopped:  # a deposed owner decides nothing more, not even within this turn
            while self._commands or self._ready:
                while self._commands:
                    command = self._commands.popleft()
                    if command.reply.start():
                        self._handle(command)
                while self._ready:
                    operation, value, error = self._ready.popleft()
                    self._step(operation, value, error)
            if self._staged:
                self._commit_staged()
                self._take_back_used()
                self._publish(queue=False)  # what is committed is seen at once, not after the turn's other commits
                continue
            if self.changes.room and not passed and self.queue.matters():
                passed = True
                self.changes.room = False
                self.queue.run_pass()
                continue
            if self._after_pass:
                self._ready.extend((operation, None, None) for operation in self._after_pass)
                self._after_pass = []
                continue
            break
        self._take_back_used()
        for loan, why in self._loans_ending:  # before the calls this turn launches
            loan.end(why)
        self._loans_ending = []
        if self._stopped:  # what it staged is neither committed nor shown, and no agent is called for it
            self._staged, self._launch = [], []
            return
        if self.changes.room and not self._pass_due and self.queue.matters():  # a change came after this turn's pass
            self._pass_due = time.monotonic()
        self._keep_reclearing()
        self.changes.room = self.changes.room and self.queue.matters()
        self._drain_due = self._drain_deadline()
        self._publish()
        launch, self._launch = self._launch, []
        self._stepping_off = [loan for loan in self._stepping_off if loan.stepping_on(loan.machines)]
        for operation, calls in launch:
            with self._lock:
                self._in_flight += 1
            before = self._step_off(calls.calls)
            if operation.reply is None or not operation.reply.carry(partial(self._carry, operation, calls.calls, before)):
                self.owners.calls.start(calls.calls, partial(self._answered, operation, calls.calls), before)

    def _keep_reclearing(self) -> None:
        """While IPUs stay kept out for a clear no machine confirmed, and none is being asked now,
        ask again later, each time later while it does not answer; at once from scratch once none are."""
        waiting = [pair for pair in self.state.uncleared if pair not in self.clears]
        if not waiting:
            self._reclear_due, self._reclear_wait = 0.0, RECLEAR_FIRST_SECONDS
        elif not self._reclear_due:
            self._reclear_due = time.monotonic() + self._reclear_wait
            self._reclear_wait = min(2 * self._reclear_wait, RECLEAR_LONGEST_SECONDS)

    def _carry(self, operation: Operation, calls: list[AgentCall], before: Callable[[], None] | None) -> None:
        """An operation's agent calls, made by the thread waiting for its answer (no turn held):
        the request's own thread does its network work, as it would without an owner."""
        self._answered(operation, calls, self.owners.calls.run(calls, before))

    # Machines lent to an idle-time test

    def _take_back_used(self) -> None:
        """Anything of a partition on a lent machine (one just committed there, by a create, a grant
        or a move) takes the loan back in the same turn."""
        loan = self.state.loan
        if loan is None:
            return
        taken = [machine for machine in loan.machines if machine in self.state.used]
        if taken:
            partitions = sorted({p for (agent, _), p in self.state.holders().items() if agent in taken})
            self.take_back(f"{' and '.join(self._taker(p) for p in partitions)} took {', '.join(taken)}")

    def _taker(self, partition_id: str) -> str:
        """What took a lent machine, as the idle-time test's results say: "the create of partition p1"."""
        operation = self.on_partition.get(partition_id)
        named = OPERATION_NAMES.get(operation.kind, "") if operation is not None and operation.kind in ("creating", "relocating") else ""
        return f"the {named} of partition {partition_id}" if named else f"partition {partition_id}"

    def take_back(self, why: str) -> None:
        """The lent machines are the allocation's alone again. The loan ends once this turn's writes
        are committed and before any agent call it launches, which cancels the test's steps; calls
        to those machines wait for their steps there to stop (`_step_off`)."""
        loan = self.state.loan
        if loan is None:
            return
        self.state.loan = None
        self._loans_ending.append((loan, why))
        self._stepping_off.append(loan)
        self.changes.state = True
        log.info("allocation %s takes back %s from the %s: %s", self.id, ", ".join(loan.machines), loan.test, why)

    def _step_off(self, calls: list[AgentCall]) -> Callable[[], None] | None:
        """For calls to machines where a test step of a loan taken back may still run: a wait for
        those steps to stop, at most STEP_OFF_SECONDS, made before the calls outside the turn."""
        machines = {call.agent_id for call in calls}
        loans = [loan for loan in self._stepping_off if loan.stepping_on(machines)]
        if not loans:
            return None

        def step_off() -> None:
            deadline = time.monotonic() + STEP_OFF_SECONDS
            for loan in loans:
                if not loan.stepped_off(machines, max(0.0, deadline - time.monotonic())):
                    log.warning("allocation %s: the %s's step on %s did not stop within %g s; the calls there go ahead",
                                self.id, loan.test, ", ".join(sorted(machines & set(loan.machines))), STEP_OFF_SECONDS)

        return step_off

    def _handle(self, command: Command) -> None:
        try:
            self.decisions.decide(command)
        except VipuError as refusal:
            command.reply.fail(refusal)
        except Exception as error:  # the turn fails: nothing it staged is committed, and the owner is rebuilt
            command.reply.fail(VipuError(f"the controller failed to decide: {type(error).__name__}; nothing of it was done"))
            raise

    def start(self, operation: Operation, holds: tuple[str, ...] = ()) -> Operation:
        """Begin an operation, running it to its first step; it holds its partition (and `holds`) until it ends."""
        if len(self.under_way) >= OPERATIONS_LIMIT:
            raise Unavailable(f"allocation {self.id} has {OPERATIONS_LIMIT} operations under way, its limit; try again shortly")
        self.under_way.add(operation)
        for partition_id in (operation.partition_id, *holds):
            if partition_id:
                self.on_partition[partition_id] = operation
        self.changes.state = True
        self._step(operation)  # to its first effect now: a write it stages is in the state before the next command is placed
        return operation

    def _step(self, operation: Operation, value: Any = None, error: BaseException | None = None) -> None:
        try:
            effect = operation.body.throw(error) if error is not None else operation.body.send(value)
        except StopIteration as stop:
            self._end(operation, result=stop.value)
        except VipuError as failure:
            self._end(operation, error=failure)
        except Exception:  # the turn fails (`_fail_stop`): what the operation did so far is read back from the store
            log.error("allocation %s: the %s of %s failed unexpectedly", self.id, operation.kind,
                      operation.partition_id or "the allocation")
            raise
        else:
            self._take(operation, effect)

    def _take(self, operation: Operation, effect: Effect) -> None:
        if isinstance(effect, Write):
            effect.apply()
            self._staged.append((operation, effect))
        elif isinstance(effect, Calls):
            self._launch.append((operation, effect))
        elif isinstance(effect, Join):
            operation.joined = effect.operations
            for child in effect.operations:
                child.parent = operation
            self._joined(operation)
        elif isinstance(effect, AfterPass):
            self._after_pass.append(operation)
        else:
            raise TypeError(f"an operation yielded {effect!r}, which is no effect")

    def _joined(self, operation: Operation) -> None:
        if all(child.ended for child in operation.joined):
            joined, operation.joined = operation.joined, []
            self._ready.append((operation, [child.error for child in joined], None))

    def _end(self, operation: Operation, result: Any = None, error: BaseException | None = None) -> None:
        operation.ended, operation.error = True, error
        self.under_way.discard(operation)
        for partition_id in [p for p, f in self.on_partition.items() if f is operation]:
            del self.on_partition[partition_id]
        for pair in [pair for pair, f in self.clears.items() if f is operation]:
            del self.clears[pair]
        self.changes.state = True
        if operation.reply is not None:
            if error is None:
                operation.reply.resolve(result)
            else:
                operation.reply.fail(error)
        elif error is not None and operation.parent is None:
            log.warning("partition %s: %s", operation.partition_id or self.id, getattr(error, "message", error))
        self._commands.extend(operation.followers)
        if operation.parent is not None and operation.parent.joined:
            self._joined(operation.parent)

    def _commit_staged(self) -> None:
        """Commit the writes staged by this turn's steps together; take back those the store
        refused (another writer's change to a row is read again, that row alone), then resume
        each operation with its outcome."""
        staged, self._staged = self._staged, []
        errors = self._commit([write for _, write in staged])
        for (_, write), error in reversed(list(zip(staged, errors, strict=True))):
            if error is not None:
                write.undo()
        for (operation, write), error in zip(staged, errors, strict=True):
            if error is None:
                write.committed()
                operation.committed = True
                self._ready.append((operation, write.result, None))
            else:
                if write.partition_id and isinstance(error, Conflict) and not isinstance(error, ConcurrentUpdate):
                    self._reread(write.partition_id)
                if isinstance(error, Unavailable) and operation.committed and operation.partition_id:
                    error = self._left_unfinished(operation, error)
                self._ready.append((operation, None, error))
        self.changes.state = True

    def _commit(self, writes: list[Write]) -> list[VipuError | None]:
        """Each write's refusal, or None: all are committed together but those the store refuses
        alone, which are left out of the commit tried again."""
        errors: list[VipuError | None] = [None] * len(writes)
        remaining = list(range(len(writes)))
        while remaining:
            def work(tx: Transaction, batch: tuple[int, ...] = tuple(remaining)) -> None:
                for index in batch:
                    try:
                        writes[index].work(tx)
                    except Unavailable:
                        raise  # the store's trouble (a deadline, a lost connection), not this write's: all of it fails
                    except VipuError as error:
                        raise _WriteRefused(index, error) from error

            try:
                self.owners.store.write(work)
                return errors
            except _WriteRefused as refused:
                errors[refused.index] = refused.error
                remaining.remove(refused.index)
            except OutcomeUnknown:
                raise  # neither undone nor answered: the owner is rebuilt from what the store holds (`_fail_stop`)
            except VipuError as error:  # the commit itself failed, and nothing of it is committed
                for index in remaining:
                    errors[index] = error
                return errors
        return errors

    @staticmethod
    def _left_unfinished(operation: Operation, error: Unavailable) -> OutcomeUnknown:
        """A store write refused after the operation's first was committed: the partition is left
        in the middle of it, which the next health pass finishes (done, or undone). Not "failed"."""
        named = OPERATION_NAMES.get(operation.kind, operation.kind)
        return OutcomeUnknown(f"{error.message}; the {named} of partition {operation.partition_id} is left unfinished, and the "
                              f"next health pass finishes it: `vipu get partition {operation.partition_id}` says how it stands")

    def _reread(self, partition_id: str) -> None:
        """Another writer (another replica, an operator's SQL) changed a partition this owner thought
        it alone wrote: take its row as the store has it, and nothing else."""
        try:
            with self.owners.store.reading() as tx:
                current = tx.get_partition(partition_id)
        except VipuError as error:
            log.warning("partition %s: could not read it again: %s", partition_id, error.message)
            return
        if current is None:
            if self.state.drop(partition_id) is not None:
                self.owners.release_id(partition_id, self.id)
        elif current.allocation_id == self.id:
            self.state.put(current)
        self.changes.partitions = self.changes.state = self.changes.room = True

    def _publish(self, queue: bool = True) -> None:
        """The state as committed, for every reader: a new snapshot, replacing the last at once.
        Within a turn (not `queue`) the queue's part shows which requests wait as committed (a
        granted one gone with its partition there) with the reasons of the last pass; at the end of
        the turn, once its pass has told why each waits, with those."""
        changes = self.changes
        if not changes.state:
            return
        state = self.state
        queue_view = self.snapshot.queue
        if changes.queue:
            explained, first = self.queue.explained, state.queue.first()
            if not queue and first is not self.snapshot.queue.first:  # the last pass's reasons were not about this first
                explained = QueueView(every=explained.every)
            queue_view = QueueView(by_id=typing.cast(Mapping[str, WaitingRequest], state.queue.by_key), sequences=state.queue.sequences(),
                                   first=first, waiting_ipus=state.queue.weight, held=explained.held, held_for=state.held_for,
                                   first_verdict=explained.first_verdict, verdicts=explained.verdicts, layout=state.layout,
                                   every=explained.every, held_needed_at=explained.held_needed_at,
                                   kept_off_held=explained.kept_off_held, told=explained.told)
            changes.queue = not queue
        used = dict(self.snapshot.used)  # only the machines whose IPUs changed are copied again
        for agent in state.touched:
            indices = state.used.get(agent)
            if indices:
                used[agent] = frozenset(indices)
            else:
                used.pop(agent, None)
        state.touched.clear()
        self.snapshot = AllocationSnapshot(
            state.allocation, state.layout, self.snapshot.version + 1, partitions=dict(state.partitions),
            used=used, kept_out=state.kept_out(),
            busy={partition_id: operation.kind for partition_id, operation in self.on_partition.items()}, queue=queue_view,
            down=frozenset(state.down), test=state.test, claimed=dict(state.claimed),
            lent=state.loan.machines if state.loan is not None else (),
            closing=state.closing, links=state.links, draining=dict(state.draining),
            reservations=dict(state.reservations))
        partitions_changed = changes.partitions
        changes.state, changes.partitions = changes.queue, False  # a queue changed meanwhile: at the turn's end
        self.owners.published(self, partitions_changed)
