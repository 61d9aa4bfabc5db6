"""One allocation's owner: the one place that decides anything about its partitions, IPUs and queue.

Commands arrive in a bounded inbox (a full inbox refuses at once, as temporarily unavailable,
which clients retry) and are decided in turns, one thing at a time. Whichever thread brings work
and finds the turn free takes it and runs turns until no work is left; a thread that finds it
taken leaves its command for the one holding it (flat combining, `_drive`): nobody waits for a
turn, and a lone request is decided on its own thread without a hand-off. In a turn the owner
places against its own state (`state`), runs each operation a step at a time (`flows`, whose
steps are `effects`), groups the store writes of the turn into one commit, takes back in its
state any the store refused, and only then publishes an immutable snapshot that every reader
reads without a lock (`snapshot`).

Agent calls run outside the turn: the thread waiting for the operation's answer makes them (the
request's own thread does its network work, as it would without an owner), or, for the owner's
own upkeep, a pool does (`agents.AgentCalls`); their outcomes come back as the operation's next
step, in a turn. So no turn ever waits for an agent, nor holds anything across a network call;
an operation waits for nothing but its own steps, each bounded.

One operation at a time holds a partition: another's command is refused as busy, or waits for
it (a forced remove; any command behind the owner's own upkeep, which is brief). The queue of
waiting requests is the owner's too: after each turn that changed the room or the queue, one
pass starts what now fits (`vipu.model.queue.admit`, placement asked once per shape of request)
and works out why the others wait. A thread of the owner's keeps time (requests' deadlines, a pass
tried again) while anything is due, and lets go when nothing is.
"""

from __future__ import annotations

import heapq
import logging
import threading
import time
import typing
from collections import deque
from collections.abc import Callable, Mapping
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING, Any, ClassVar

from vipu import failpoints
from vipu.controller.core import flows
from vipu.controller.core.agents import AgentCall
from vipu.controller.core.commands import (
    AgentReport,
    CancelRequest,
    ClaimMachines,
    CloseAllocation,
    Command,
    CreatePartition,
    FinishInterrupted,
    Inspect,
    RecoverFailed,
    ReleaseMachines,
    RelocatePartition,
    RemovePartition,
    ResetPartition,
)
from vipu.controller.core.effects import AfterPass, Body, Calls, Effect, Flow, Join, Write
from vipu.controller.core.placing import LOST, due_for_relocation, due_for_reset, explicit_ipus, partition_of, place_request
from vipu.controller.core.snapshot import AllocationSnapshot, QueueView, Waiting
from vipu.controller.core.state import AllocationState
from vipu.model import lifecycle
from vipu.model.configuration import agent_settings
from vipu.model.entities import MAX_AUTO_RESETS, Agent, Partition, ReadyState, shown
from vipu.model.errors import (
    AlreadyExists,
    ConcurrentUpdate,
    Conflict,
    NoRoom,
    NotFound,
    PermissionDenied,
    Unavailable,
    VipuError,
)
from vipu.model.placement import Occupancy, Shape, choose_reservation, place_partition, try_place
from vipu.model.queue import WaitingRequest, admit, shape_of

if TYPE_CHECKING:
    from vipu.controller.core.owners import Owners

log = logging.getLogger("vipu.controller.core")

INBOX_LIMIT = 1024  # commands waiting for an owner's turn; past that, Unavailable
OPERATIONS_LIMIT = 512  # operations under way at once in one allocation; past that, Unavailable
BATCH = 256  # commands taken in one turn
RETRY_SECONDS = 1.0  # a pass over the queue that failed (the store, say) is tried again after this
# Shapes of request whose reason one pass works out for the requests behind the first: requests of
# one shape share it, so this bounds the cost only when over this many differently shaped
# requests wait; those beyond are told their place.
EXPLAINED_SHAPES = 64


class _WriteRefused(Exception):
    def __init__(self, index: int, error: VipuError):
        super().__init__(error.message)
        self.index, self.error = index, error


class AllocationOwner:
    def __init__(self, owners: Owners, state: AllocationState):
        self.owners = owners
        self.id = state.allocation.id
        self.state = state
        self.flows: dict[str, Flow] = {}  # partition id -> the operation holding it
        self._clears: dict[tuple[str, str], Flow] = {}  # (agent, partition id) -> the reconciliation clearing old settings there
        self._lock = threading.Lock()  # over the inbox and whose turn it is; never held through a turn
        self._quiet = threading.Condition(self._lock)  # notified at the end of every turn
        self._timer = threading.Condition(self._lock)  # the timer thread waits on it for the next thing due
        self._busy = False  # a thread has the owner's turn
        self._inbox: deque[Command] = deque()
        self._answers: deque[tuple[Flow, Any]] = deque()  # agent calls' outcomes
        self._timer_thread: threading.Thread | None = None
        self._stopped = ""  # why, once stopped
        self._in_flight = 0  # batches of agent calls not yet answered
        self._operations = 0
        # What one turn does, and what it leaves for the next:
        self._commands: deque[Command] = deque()
        self._ready: deque[tuple[Flow, Any, BaseException | None]] = deque()
        self._staged: list[tuple[Flow, Write]] = []
        self._launch: list[tuple[Flow, Calls]] = []
        self._after_pass: list[Flow] = []
        self._changed = True
        self._partitions_changed = True
        self._queue_changed = True
        self._queue_dirty = True
        self._pass_due = 0.0  # monotonic; 0: no pass waits to be retried
        self._expiries: list[tuple[datetime, int, str]] = [(r.deadline, r.sequence, r.partition_id) for r in state.queue]
        heapq.heapify(self._expiries)
        self._explained = QueueView(held=state.held, layout=state.layout)  # until the first pass: what the store holds
        self.snapshot = AllocationSnapshot(state.allocation, state.layout)
        self._publish()

    # The inbox, and whose turn it is

    def submit(self, command: Command) -> Command:
        """Put a command in the inbox and take the owner's turn if it is free (see `_drive`);
        Unavailable if the owner stopped or its inbox is full."""
        with self._lock:
            if self._stopped:
                raise Unavailable(self._stopped)
            if len(self._inbox) >= INBOX_LIMIT:
                raise Unavailable(f"allocation {self.id} has {INBOX_LIMIT} requests waiting for its owner's turn, its limit; "
                                  "try again shortly")
            self._inbox.append(command)
        self._drive()
        return command

    def _answered(self, flow: Flow, outcomes: Any) -> None:
        """Agent calls' outcomes, from whichever thread made them: the operation goes on in a turn."""
        with self._lock:
            self._in_flight -= 1
            if self._stopped:
                return  # a deposed or stopped owner commits nothing of what comes back
            self._answers.append((flow, outcomes))
        self._drive()

    def _drive(self) -> None:
        """Take the owner's turn if nobody has it and there is work, and run turns until none is
        left. A thread that finds the turn taken leaves its work in the inbox and goes: the one
        holding the turn takes that too before it lets go (flat combining). So the owner decides
        one thing at a time, nobody ever waits for its turn, and a lone request is decided on the
        thread that brought it, without a hand-off."""
        while True:
            with self._lock:
                if self._busy or self._stopped or not self._has_work():
                    return
                self._busy = True
                commands = [self._inbox.popleft() for _ in range(min(BATCH, len(self._inbox)))]
                answers, self._answers = list(self._answers), deque()
            try:
                self._turn(commands, answers)
            except Exception as error:
                log.exception("the owner of allocation %s failed a turn", self.id)
                for command in commands:
                    command.reply.fail(VipuError(f"the controller failed to decide: {type(error).__name__}"))
            finally:
                with self._lock:
                    self._busy = False
                    self._quiet.notify_all()
                    self._timer.notify()
                    stopped = bool(self._stopped)
                if stopped:
                    self._abandon()
                self._keep_time()

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
        """Tell the askers of the operations under way that this owner stopped."""
        for flow in list({id(f): f for f in self.flows.values()}.values()):
            if flow.reply is not None:
                flow.reply.fail(Unavailable(self._stopped))

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
            while self._inbox or self._answers or self._operations or self._in_flight or self._busy:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or self._stopped:
                    return False
                self._quiet.wait(remaining)
            return True

    @property
    def in_turn(self) -> bool:
        """Whether a turn is under way (it may be waiting for its commit)."""
        return self._busy

    @property
    def stopped(self) -> bool:
        return bool(self._stopped)

    def _next_timer(self) -> float | None:
        """When the owner must act without a command (monotonic): a request's deadline, a retried pass."""
        timers = []
        if self._expiries:
            timers.append(time.monotonic() + (self._expiries[0][0] - datetime.now(UTC)).total_seconds())
        if self._pass_due:
            timers.append(self._pass_due)
        return min(timers, default=None)

    # A turn

    def _turn(self, commands: list[Command], answers: list[tuple[Flow, Any]]) -> None:
        failpoints.hit("owner.turn")
        for flow, outcomes in answers:
            self._ready.append((flow, outcomes, None))
        self._commands.extend(commands)
        self._expire_due()
        if self._pass_due and time.monotonic() >= self._pass_due:
            self._pass_due, self._queue_dirty = 0.0, True
        passed = False
        while True:
            while self._commands or self._ready:
                while self._commands:
                    command = self._commands.popleft()
                    if command.reply.start():
                        self._handle(command)
                while self._ready:
                    flow, value, error = self._ready.popleft()
                    self._step(flow, value, error)
            if self._staged:
                self._commit_staged()
                self._publish(queue=False)  # what is committed is seen at once, not after the turn's other commits
                continue
            if self._queue_dirty and not passed and self._queue_matters():
                passed = True
                self._queue_pass()
                continue
            if self._after_pass:
                self._ready.extend((flow, None, None) for flow in self._after_pass)
                self._after_pass = []
                continue
            break
        if self._queue_dirty and not self._pass_due and self._queue_matters():  # a change came after this turn's pass
            self._pass_due = time.monotonic()
        self._queue_dirty = self._queue_dirty and self._queue_matters()
        self._publish()
        launch, self._launch = self._launch, []
        for flow, calls in launch:
            with self._lock:
                self._in_flight += 1
            if flow.reply is None or not flow.reply.carry(partial(self._carry, flow, calls.calls)):
                self.owners.calls.start(calls.calls, partial(self._answered, flow))

    def _carry(self, flow: Flow, calls: list[AgentCall]) -> None:
        """An operation's agent calls, made by the thread waiting for its answer (no turn held):
        the request's own thread does its network work, as it would without an owner."""
        self._answered(flow, self.owners.calls.run(calls))

    def _handle(self, command: Command) -> None:
        try:
            self._HANDLERS[type(command)](self, command)
        except VipuError as refusal:
            command.reply.fail(refusal)
        except Exception as error:
            log.exception("allocation %s: %s failed", self.id, type(command).__name__)
            command.reply.fail(VipuError(f"the controller failed to decide: {type(error).__name__}"))

    # Operations and their steps

    def start(self, flow: Flow, holds: tuple[str, ...] = ()) -> Flow:
        """Begin an operation, running it to its first step; it holds its partition (and `holds`) until it ends."""
        if self._operations >= OPERATIONS_LIMIT:
            raise Unavailable(f"allocation {self.id} has {OPERATIONS_LIMIT} operations under way, its limit; try again shortly")
        self._operations += 1
        for partition_id in (flow.partition_id, *holds):
            if partition_id:
                self.flows[partition_id] = flow
        self._changed = True
        self._step(flow)  # to its first effect now: a write it stages is in the state before the next command is placed
        return flow

    def _step(self, flow: Flow, value: Any = None, error: BaseException | None = None) -> None:
        try:
            effect = flow.body.throw(error) if error is not None else flow.body.send(value)
        except StopIteration as stop:
            self._end(flow, result=stop.value)
        except VipuError as failure:
            self._end(flow, error=failure)
        except Exception as failure:
            log.exception("allocation %s: the %s of %s failed", self.id, flow.doing, flow.partition_id or "the allocation")
            self._end(flow, error=VipuError(f"the {flow.doing} of {flow.partition_id or 'the allocation'} failed: "
                                            f"{type(failure).__name__}"))
        else:
            self._take(flow, effect)

    def _take(self, flow: Flow, effect: Effect) -> None:
        if isinstance(effect, Write):
            effect.apply()
            self._staged.append((flow, effect))
        elif isinstance(effect, Calls):
            self._launch.append((flow, effect))
        elif isinstance(effect, Join):
            flow.joined = effect.flows
            for child in effect.flows:
                child.parent = flow
            self._joined(flow)
        elif isinstance(effect, AfterPass):
            self._after_pass.append(flow)
        else:
            raise TypeError(f"an operation yielded {effect!r}, which is no effect")

    def _joined(self, flow: Flow) -> None:
        if all(child.ended for child in flow.joined):
            joined, flow.joined = flow.joined, []
            self._ready.append((flow, [child.error for child in joined], None))

    def _end(self, flow: Flow, result: Any = None, error: BaseException | None = None) -> None:
        flow.ended, flow.error = True, error
        self._operations -= 1
        for partition_id in [p for p, f in self.flows.items() if f is flow]:
            del self.flows[partition_id]
        for pair in [pair for pair, f in self._clears.items() if f is flow]:
            del self._clears[pair]
        self._changed = True
        if flow.reply is not None:
            if error is None:
                flow.reply.resolve(result)
            else:
                flow.reply.fail(error)
        elif error is not None and flow.parent is None:
            log.warning("partition %s: %s", flow.partition_id or self.id, getattr(error, "message", error))
        self._commands.extend(flow.followers)
        if flow.parent is not None and flow.parent.joined:
            self._joined(flow.parent)

    def _commit_staged(self) -> None:
        """Commit the writes staged by this turn's steps together; take back those the store
        refused (another writer's change to a row is read again, that row alone), then resume
        each operation with its outcome."""
        staged, self._staged = self._staged, []
        errors = self._commit([write for _, write in staged])
        for (_, write), error in reversed(list(zip(staged, errors, strict=True))):
            if error is not None:
                write.undo()
        for (flow, write), error in zip(staged, errors, strict=True):
            if error is None:
                write.committed()
                self._ready.append((flow, write.result, None))
            else:
                if write.partition_id and isinstance(error, Conflict) and not isinstance(error, ConcurrentUpdate):
                    self._reread(write.partition_id)
                self._ready.append((flow, None, error))
        self._changed = True

    def _commit(self, writes: list[Write]) -> list[VipuError | None]:
        """Each write's refusal, or None: all are committed together but those the store refuses
        alone, which are left out of the commit tried again."""
        errors: list[VipuError | None] = [None] * len(writes)
        remaining = list(range(len(writes)))
        while remaining:
            def work(tx, batch=tuple(remaining)) -> None:
                for index in batch:
                    try:
                        writes[index].work(tx)
                    except VipuError as error:
                        raise _WriteRefused(index, error) from error

            try:
                self.owners.store.write(work)
                return errors
            except _WriteRefused as refused:
                errors[refused.index] = refused.error
                remaining.remove(refused.index)
            except VipuError as error:  # the commit itself failed: all of it
                for index in remaining:
                    errors[index] = error
                return errors
            except Exception as error:
                log.exception("allocation %s: a commit failed", self.id)
                for index in remaining:
                    errors[index] = Unavailable(f"the store could not record the change: {type(error).__name__}")
                return errors
        return errors

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
        self._partitions_changed = self._changed = self._queue_dirty = True

    # What operations use

    def partition(self, partition_id: str) -> Partition | None:
        return self.state.partitions.get(partition_id)

    def agents(self) -> dict[str, Agent]:
        return self.owners.store.configuration().agents

    def agents_of(self, partition: Partition) -> list[Agent]:
        agents = self.agents()
        found = []
        for agent_id in partition.agent_ids:
            agent = agents.get(agent_id)
            if agent is None:  # not while the partition exists: the store's foreign keys keep its agents
                raise NotFound(f"agent {shown(agent_id)} does not exist")
            found.append(agent)
        return found

    def call(self, agent: Agent, settings=None, partition_id: str = "") -> AgentCall:
        return AgentCall(agent.id, agent.host, agent.port, settings, partition_id)

    def clears_under_way(self, partition_id: str, agents: list[Agent]) -> list[Flow]:
        """The reconciliations clearing old settings of that id from these agents, which its new
        settings must not race."""
        return list({id(f): f for a in agents if (f := self._clears.get((a.id, partition_id))) is not None}.values())

    def applying(self, partition: Partition, agents: list[Agent]) -> Calls:
        settings = agent_settings(partition, self.state.layout, {a.id: a.inventory.serial for a in agents})
        return Calls([self.call(agent, settings=settings[agent.id]) for agent in agents])

    def clearing(self, partition_id: str, agents: list[Agent]) -> Calls:
        return Calls([self.call(agent, partition_id=partition_id) for agent in agents])

    def _partition_write(self, work: Callable[[Any], Any], before: Partition | None, after: Partition | None,
                         partition_id: str) -> Write:
        """A write of one partition: `after` (None: gone) in the state at once, `before` again if refused."""
        state = self.state
        moves = before is None or after is None or before.ipus != after.ipus  # the room changes: the queue looks again

        def put(partition: Partition | None) -> None:
            if partition is None:
                state.drop(partition_id)
            else:
                state.put(partition)

        def apply() -> None:
            put(after)
            self._partitions_changed = True
            self._queue_dirty = self._queue_dirty or moves

        def committed() -> None:
            if before is None and after is not None:
                self.owners.settle_id(partition_id, self.id)
            elif after is None:
                self.owners.release_id(partition_id, self.id)

        return Write(work, apply, lambda: put(before), committed, result=after, partition_id=partition_id)

    def transit(self, partition: Partition, *transitions: tuple[str, dict]) -> Write:
        """The life cycle's transitions of a partition, applied together as compare-and-sets; the
        operation gets the partition as it then is (None once it is gone)."""
        after = lifecycle.after(partition, transitions)

        def work(tx) -> None:
            current = lifecycle.copy(partition)
            for name, fields in transitions:
                tx.transition(current, name, **{k: v for k, v in fields.items() if v is not None})

        return self._partition_write(work, partition, after, partition.id)

    def inserting(self, partition: Partition) -> Write:
        return self._partition_write(lambda tx: tx.add_partition(partition), None, partition, partition.id)

    def moving(self, partition: Partition, fields: dict) -> Write:
        """A partition's 'relocate' to new IPUs; its old IPUs stay taken (`unlinger`)."""
        write = self.transit(partition, ("relocate", fields))
        plain_apply, plain_undo = write.apply, write.undo

        def apply() -> None:
            self.state.linger(partition)
            plain_apply()

        def undo() -> None:
            plain_undo()
            self.state.unlinger(partition.id)

        write.apply, write.undo = apply, undo
        return write

    def unlinger(self, partition_id: str) -> None:
        if self.state.unlinger(partition_id):
            self._changed = self._queue_dirty = True

    def granting(self, request: WaitingRequest, partition: Partition) -> Write:
        """A request's grant: it ends, and its partition is recorded, in one transaction."""
        state = self.state

        def work(tx) -> None:
            tx.end_request(request, "grant")
            tx.add_partition(partition)

        def apply() -> None:
            state.queue.remove(request.partition_id)
            state.put(partition)
            self._partitions_changed = self._queue_changed = self._queue_dirty = True

        def undo() -> None:
            state.drop(partition.id)
            state.queue.add(request)

        def committed() -> None:
            self.owners.leave_queue(request.owner)

        return Write(work, apply, undo, committed, result=partition, partition_id=partition.id)

    def ended(self, request: WaitingRequest, ending: VipuError) -> None:
        """A request that ended without a partition: its clients are told how, for a while."""
        self.owners.record_ending(request.partition_id, self.id, ending)

    # Commands

    def _visible(self, partition_id: str, access) -> Partition:
        partition = self.state.partitions.get(partition_id)
        if partition is None or not access.may_use(self.id):
            raise NotFound(f"partition {shown(partition_id)} does not exist")
        return partition

    def _holding(self, partition_id: str, command: Command, wait: bool) -> bool:
        """Whether an operation holds the partition: then the command waits for it to end (when
        `wait`, or behind the owner's own upkeep) or is refused as busy."""
        flow = self.flows.get(partition_id)
        if flow is None:
            return False
        if wait or flow.system:
            command.reply.requeue()
            flow.followers.append(command)
            return True
        raise Conflict(f"partition {partition_id} is busy ({flow.doing})")

    @staticmethod
    def _refuse_if_busy(partition: Partition) -> None:
        if lifecycle.state_of(partition) in lifecycle.BUSY:
            raise Conflict(f"partition {partition.id} is busy ({partition.operation_state.value.lower()})")

    def _refuse_if_tested(self) -> None:
        if self.state.test:
            raise Conflict(f"{self.state.test} is under test; no partition is configured in it until the test ends")

    def _create(self, command: CreatePartition) -> None:
        request = command.request
        if self.state.closing:
            raise Conflict(f"allocation {self.id} is being removed")
        if request.id in self.state.partitions or self.state.queue.get(request.id) is not None:
            raise AlreadyExists(f"partition {request.id} already exists")
        try:
            partition = self._place_new(request, command.access)
        except NoRoom as refusal:
            if not command.may_queue:
                raise
            self.start(Flow("queueing", self._enqueue(command, refusal), command.reply))
            command.placed = True
            return
        self.start(Flow("creating", flows.create(self, partition, command.keep_on_error), command.reply, partition.id))
        command.placed = True

    def _place_new(self, request, access) -> Partition:
        state = self.state
        if state.test:
            raise NoRoom(f"{state.test} is under test; no partition can be created in it until the test ends")
        first = state.queue.first()
        occupancy = Occupancy(state.holders, state.held if first is not None else frozenset(),
                              first.partition_id if first is not None else "")
        placement = place_request(state.layout, state.allocation, state.used, request, occupancy)
        return partition_of(request, access.user_id, state.allocation, placement)

    def _enqueue(self, command: CreatePartition, refusal: NoRoom) -> Body:
        now = datetime.now(UTC)
        waiting = WaitingRequest(command.request, self.id, command.access.user_id, now,
                                 now + timedelta(seconds=command.wait_seconds), command.keep_on_error)
        self.owners.enter_queue(waiting.owner)
        entered = True

        def committed() -> None:
            self.state.queue.add(waiting)
            heapq.heappush(self._expiries, (waiting.deadline, waiting.sequence, waiting.partition_id))
            self.owners.settle_id(waiting.partition_id, self.id)
            self._queue_changed = self._queue_dirty = True

        try:
            yield Write(lambda tx: tx.add_request(waiting), committed=committed)
            entered = False
        finally:
            if entered:
                self.owners.leave_queue(waiting.owner)
        log.info("partition %s of %d IPUs waits in allocation %s (up to %g s): %s", waiting.partition_id, waiting.size, self.id,
                 command.wait_seconds, refusal.message)
        yield AfterPass()
        return self.waiting(waiting.partition_id) or Waiting(waiting, 1, "starting")  # the pass started it at once

    def waiting(self, partition_id: str) -> Waiting | None:
        """A request as its clients see it, from the queue as this turn left it."""
        request = self.state.queue.get(partition_id)
        if request is None:
            return None
        view = self._explained
        position = self.state.queue.position(request)
        return Waiting(request, position, view.reason_at(position, request, self.state.queue.first(), shape_of(request.request)))

    def _remove(self, command: RemovePartition) -> None:
        partition = self._visible(command.partition_id, command.access)
        access = command.access
        if not access.unrestricted and partition.owner and partition.owner != access.user_id:
            raise PermissionDenied(f"partition {partition.id} belongs to user {partition.owner}; only its owner or an administrator "
                                   "removes it")
        if self._holding(partition.id, command, wait=command.force):
            return
        if not command.force:
            self._refuse_if_busy(partition)
        self.start(Flow("removing", flows.remove(self, partition, command.force), command.reply, partition.id))

    def _reset(self, command: ResetPartition) -> None:
        partition = self._visible(command.partition_id, command.access)
        if self._holding(partition.id, command, wait=False):
            return
        self._refuse_if_busy(partition)
        self._refuse_if_tested()
        self.start(Flow("resetting", flows.reset(self, partition, command.automatic), command.reply, partition.id))

    def _relocate(self, command: RelocatePartition) -> None:
        partition = self._visible(command.partition_id, command.access)
        if self._holding(partition.id, command, wait=False):
            return
        self._refuse_if_busy(partition)
        self._refuse_if_tested()
        body = flows.relocate_asked(self, partition, command.access.user_id, command.automatic, command.only_off_failed)
        self.start(Flow("relocating", body, command.reply, partition.id))

    def _cancel(self, command: CancelRequest) -> None:
        request = self.state.queue.get(command.partition_id)
        access = command.access
        if request is None:
            if command.partition_id in self.state.partitions and access.may_use(self.id):
                raise Conflict(f"the request of partition {command.partition_id} started meanwhile; remove the partition instead")
            raise NotFound(f"no request of partition {shown(command.partition_id)} waits")
        if not access.may_use(self.id):
            raise NotFound(f"no request of partition {shown(command.partition_id)} waits")
        if not access.unrestricted and request.owner and request.owner != access.user_id:
            raise PermissionDenied(f"the request of partition {request.partition_id} is user {request.owner}'s; only its owner or an "
                                   "administrator cancels it")
        who = f" by {access.user_id}" if access.user_id else ""
        ending = Conflict(f"the request of partition {request.partition_id} was cancelled{who}")
        self.start(Flow("cancelling", self._ending(request, "cancel", ending), command.reply))

    def _ending(self, request: WaitingRequest, transition: str, ending: VipuError) -> Body:
        """Take a request out of the queue by `transition`, keeping how it ended for its clients. One
        whose row went without this owner ending it (deleted with its allocation) is taken out all
        the same: it waits no more."""
        state = self.state

        def apply() -> None:
            state.queue.remove(request.partition_id)
            self._queue_changed = self._queue_dirty = True

        def committed() -> None:
            self.owners.leave_queue(request.owner)
            self.owners.release_id(request.partition_id, self.id)
            self.ended(request, ending)

        try:
            yield Write(lambda tx: tx.end_request(request, transition), apply, lambda: state.queue.add(request), committed)
        except Conflict:
            apply()
            committed()
            log.info("partition %s: its request was no longer in the store (its allocation was removed)", request.partition_id)
        log.info("partition %s: %s", request.partition_id, ending.message)

    def _claim(self, command: ClaimMachines) -> None:
        """A disruptive test's claim: the partitions in its way (settled ERROR ones are configured
        nowhere), or none and the machines are its own."""
        in_the_way = sorted({p.id for p in self.state.partitions.values() if p.ready_state is not ReadyState.ERROR}
                            | {partition_id for partition_id, flow in self.flows.items() if not flow.system})
        if not in_the_way:
            self.state.test = command.test
            self._changed = self._queue_dirty = True
        command.reply.resolve(in_the_way)

    def _release(self, command: ReleaseMachines) -> None:
        if self.state.test == command.test:
            self.state.test = ""
            self._changed = self._queue_dirty = True
        command.reply.resolve()

    def _report(self, command: AgentReport) -> None:
        """What a health pass found at an agent: lost partitions go to ERROR if it is down; else
        what it should not hold is cleared and what it lost applied again, except what an
        operation under way owns."""
        state, agent_id = self.state, command.agent_id
        agent = self.agents().get(agent_id)
        children: list[Flow] = []
        if command.error is not None or agent is None:
            if agent_id not in state.down:
                state.down.add(agent_id)
                self._changed = True
            reason = command.error.message if command.error is not None else "it was removed"
            for partition in state.on_agent(agent_id):
                if lifecycle.state_of(partition) == lifecycle.ACTIVE_IDLE and partition.id not in self.flows:
                    children.append(self.start(Flow("failing", flows.mark_lost(self, partition, f"agent {agent_id}{LOST}{reason}"),
                                                    partition_id=partition.id, system=True)))
        else:
            if agent_id in state.down:
                state.down.discard(agent_id)
                self._changed = self._queue_dirty = True
            held = command.held or {}
            here = {p.id: p for p in state.on_agent(agent_id)}
            stray = [partition_id for partition_id in held if partition_id not in self.flows and (
                partition_id not in here or lifecycle.state_of(here[partition_id]) == lifecycle.ERROR_FAILED)]
            serials = {a.id: a.inventory.serial for a in self.agents().values()}
            lost = []
            for partition in here.values():
                if partition.id in self.flows or lifecycle.state_of(partition) != lifecycle.ACTIVE_IDLE:
                    continue
                wanted = agent_settings(partition, state.layout, serials)[agent_id]
                if held.get(partition.id) != wanted:
                    lost.append((partition, wanted))
            if stray or lost:
                reconciling = Flow("reconciling", flows.reconcile(self, agent, stray, lost), system=True)
                for partition_id in stray:  # settings of that id are applied there only once these are cleared
                    self._clears[(agent_id, partition_id)] = reconciling
                children.append(self.start(reconciling, holds=tuple(p.id for p, _ in lost)))
        self._answer_when_done(command, children)

    def _answer_when_done(self, command: Command, children: list[Flow]) -> None:
        """Answer once the operations a command started have ended (the health pass waits for them)."""
        if not children:
            command.reply.resolve()
            return

        def joined() -> Body:
            yield Join(children)

        self.start(Flow("waiting", joined(), command.reply, system=True))

    def _finish_interrupted(self, command: FinishInterrupted) -> None:
        children = [self.start(Flow("finishing", flows.finish(self, partition), partition_id=partition.id, system=True))
                    for partition in list(self.state.partitions.values())
                    if lifecycle.state_of(partition) in lifecycle.BUSY and partition.id not in self.flows]
        self._answer_when_done(command, children)

    def _recover_failed(self, command: RecoverFailed) -> None:
        """Move relocatable ERROR partitions off the machines that failed them, and reset ERROR
        partitions whose agents all answer, as their automatic reset policy allows."""
        children = []
        if not self.state.test:
            down = self.state.down
            for partition in list(self.state.partitions.values()):
                if partition.id in self.flows:
                    continue
                if due_for_relocation(partition, down):
                    body = _quietly(flows.relocate_asked(self, partition, "", automatic=True, only_off_failed=False), partition.id,
                                    "automatic relocation")
                    children.append(self.start(Flow("relocating", body, partition_id=partition.id)))
                elif due_for_reset(partition, down):
                    log.info("partition %s: automatic reset %d of %d", partition.id, partition.auto_reset_count + 1,
                             MAX_AUTO_RESETS)
                    body = _quietly(flows.reset(self, partition, automatic=True), partition.id, "automatic reset")
                    children.append(self.start(Flow("resetting", body, partition_id=partition.id)))
        self._answer_when_done(command, children)

    def _close(self, command: CloseAllocation) -> None:
        partitions = sorted(self.state.partitions)
        if partitions and not command.force:
            raise Conflict(f"allocation {self.id} holds {len(partitions)} partition(s) ({', '.join(partitions)}); "
                           "remove them first, or use --force to remove them with it")
        self.state.closing = True
        self._changed = True
        self.start(Flow("closing", self._closing(), command.reply))

    def _closing(self) -> Body:
        removed = []
        try:
            for request in list(self.state.queue):
                ending = Conflict(f"the request of partition {request.partition_id} was cancelled: allocation {self.id} is removed")
                yield from self._ending(request, "cancel", ending)
                removed.append(f"request of partition {request.partition_id}")
            under_way = list({id(f): f for f in self.flows.values()}.values())
            if under_way:
                yield Join(under_way)
            children = [self.start(Flow("removing", flows.remove(self, partition, force=True), partition_id=partition.id))
                        for partition in list(self.state.partitions.values())]
            errors = yield Join(children)
            failed = next((error for error in errors if error is not None), None)
            if failed is not None:
                raise failed
            removed += [f"partition {child.partition_id}" for child in children]
            yield Write(lambda tx: tx.delete_allocation(self.id))
        except BaseException:
            self.state.closing = False
            self._changed = True
            raise
        self.owners.closed(self)
        return removed

    def _inspect(self, command: Inspect) -> None:
        command.reply.resolve(command.look(self))

    # The queue

    def _expire_due(self) -> None:
        now = datetime.now(UTC)
        while self._expiries and self._expiries[0][0] <= now:
            _, sequence, partition_id = heapq.heappop(self._expiries)
            request = self.state.queue.get(partition_id)
            if request is None or request.sequence != sequence or partition_id in self.flows:
                continue
            waited = (request.deadline - request.since).total_seconds()
            reason = self.waiting(partition_id)
            ending = NoRoom(f"no room for partition {partition_id} after waiting {waited:g} s: {reason.reason if reason else ''}")
            self.start(Flow("expiring", self._ending(request, "expire", ending), partition_id=partition_id))

    def _queue_matters(self) -> bool:
        """Whether a pass over the queue has anything to do: requests wait, or what readers were told of them is to go."""
        return bool(len(self.state.queue) or len(self.snapshot.queue) or self._explained.first_verdict)

    def _queue_pass(self) -> None:
        """Start what fits in the queue now, hold IPUs for the first request, and work out why each
        still waits. One that fails (the store, say) is tried again after RETRY_SECONDS."""
        self._queue_dirty = False
        try:
            self._admit()
        except Exception:
            log.exception("the pass over the queue of allocation %s failed", self.id)
            self._pass_due = time.monotonic() + RETRY_SECONDS

    def _admit(self) -> None:
        state = self.state
        first = state.queue.first()
        if first is None:
            state.held = frozenset()
            self._explain(frozenset(), set())
            return
        if state.test or state.closing:
            why = (f"{state.test} is under test; no partition starts in it until the test ends" if state.test
                   else f"allocation {self.id} is being removed")
            self._explained = QueueView(held=frozenset(), first_verdict=why, verdicts={}, layout=state.layout, every=why)
            self._queue_changed = self._changed = True
            return
        allowed = set(state.allocation.agent_ids) - state.down  # nothing starts, nor is held, on a machine that is down
        held = state.held if state.held_for == first.partition_id and {agent for agent, _ in state.held} <= allowed else frozenset()
        holders = state.holders()
        layout, allocation = state.layout, state.allocation

        def place(request: WaitingRequest, used) -> Any:
            r = request.request
            return try_place(layout, allowed, used, r.size, num_gcds=r.num_gcds, num_segments=r.num_segments,
                             ipulink_routing=r.ipulink_routing, gw_routing=r.gw_routing,
                             explicit=explicit_ipus(layout, allocation, r))

        def choose_held(request: WaitingRequest, used, started) -> Shape:
            """The shape the fewest partitions block, counting those this pass starts."""
            r = request.request
            blocking = {**holders, **{(ipu.agent_id, ipu.index): s.partition_id for s, p in started for ipu in p.ipus}}
            return choose_reservation(layout, allowed, used, r.size, holders=blocking, num_segments=r.num_segments,
                                      ipulink_routing=r.ipulink_routing, explicit=explicit_ipus(layout, allocation, r))

        admission = admit(state.queue, state.used, place, choose_held, held=held)
        for request, placement in admission.started:
            partition = partition_of(request.request, request.owner, allocation, placement)
            self.start(Flow("creating", flows.grant(self, request, partition), partition_id=partition.id))
        if admission.first is not None:
            state.held, state.held_for = admission.held, admission.first.partition_id
            if state.held_recorded != (admission.first.partition_id, admission.held):
                self.start(Flow("holding", self._recording_hold(admission.first, admission.held), system=True))
        else:
            state.held, state.held_for = frozenset(), ""
        self._explain(state.held, allowed)

    def _recording_hold(self, first: WaitingRequest, held: Shape) -> Body:
        """Write the IPUs held for a first request to its row, so that they outlive a restart; one
        that could not be written is written by the next pass."""
        def committed() -> None:
            self.state.held_recorded = (first.partition_id, held)

        try:
            yield Write(lambda tx: tx.hold_for(first, held), committed=committed)
        except VipuError as error:
            self._pass_due = time.monotonic() + RETRY_SECONDS
            log.warning("could not record the IPUs held for partition %s (the next pass tries again): %s",
                        first.partition_id, error.message)

    def _explain(self, held: Shape, allowed: set[str]) -> None:
        """Why each request still waits, from placement, against the state as the pass left it.
        Every request behind the first sees the same room (less what is held for the first), so
        placement is asked once per shape of request."""
        self._queue_changed = self._changed = True
        state = self.state
        first = state.queue.first()
        if first is None:
            self._explained = QueueView(layout=state.layout)
            return
        holders = state.holders()
        used, layout, allocation = state.used, state.layout, state.allocation

        def verdict(request: WaitingRequest, occupancy: Occupancy) -> str:
            r = request.request
            try:
                place_partition(layout, allowed, used, r.size, num_gcds=r.num_gcds, num_segments=r.num_segments,
                                ipulink_routing=r.ipulink_routing, gw_routing=r.gw_routing,
                                explicit=explicit_ipus(layout, allocation, r), where=f"allocation {allocation.id}",
                                occupancy=occupancy)
                return "starting"
            except VipuError as refusal:
                return refusal.message

        behind_first = Occupancy(holders, held, first.partition_id)
        verdicts: dict[Any, str] = {}
        for shape, line in state.queue.lines().items():
            if len(verdicts) >= EXPLAINED_SHAPES:
                break
            behind = next((r for r in line if r is not first), None)
            if behind is not None:
                verdicts[shape] = verdict(behind, behind_first)
        self._explained = QueueView(held=held, first_verdict=verdict(first, Occupancy(holders)), verdicts=verdicts, layout=layout)

    # Publishing

    def _publish(self, queue: bool = True) -> None:
        """The state as committed, for every reader: a new snapshot, replacing the last at once.
        The queue's part (a copy of every waiting request) is made again only at the end of a turn
        (`queue`), once its pass has told why each waits: ten thousand waiting then cost a turn one
        copy, not one per commit."""
        if not self._changed:
            return
        state = self.state
        queue_view = self.snapshot.queue
        if queue and self._queue_changed:
            explained = self._explained
            queue_view = QueueView(by_id=typing.cast(Mapping[str, WaitingRequest], state.queue.by_key), sequences=state.queue.sequences(),
                                   first=state.queue.first(), waiting_ipus=state.queue.weight, held=explained.held,
                                   first_verdict=explained.first_verdict, verdicts=explained.verdicts, layout=state.layout,
                                   every=explained.every)
            self._queue_changed = False
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
            used=used, lingering=dict(state.lingering),
            busy={partition_id: flow.doing for partition_id, flow in self.flows.items()}, queue=queue_view,
            down=frozenset(state.down), test=state.test, closing=state.closing)
        partitions_changed = self._partitions_changed
        self._changed, self._partitions_changed = self._queue_changed, False  # a queue changed meanwhile: at the turn's end
        self.owners.published(self, partitions_changed)


    _HANDLERS: ClassVar[dict[type, Callable[[AllocationOwner, Any], None]]] = {
        CreatePartition: _create,
        RemovePartition: _remove,
        ResetPartition: _reset,
        RelocatePartition: _relocate,
        CancelRequest: _cancel,
        ClaimMachines: _claim,
        ReleaseMachines: _release,
        AgentReport: _report,
        FinishInterrupted: _finish_interrupted,
        RecoverFailed: _recover_failed,
        CloseAllocation: _close,
        Inspect: _inspect,
    }


def _quietly(body: Body, partition_id: str, what: str) -> Body:
    """An operation of the owner's own upkeep: its failure is logged, not raised (nobody asked for it)."""
    try:
        return (yield from body)
    except NoRoom as refusal:  # it waits in ERROR for room, or for its machines to answer again
        log.debug("partition %s cannot move yet: %s", partition_id, refusal.message)
    except VipuError as error:
        log.warning("partition %s: %s failed: %s", partition_id, what, error.message)
    return None
