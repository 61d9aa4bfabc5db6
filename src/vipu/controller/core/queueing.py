"""An owner's queue of requests waiting for room: queueing one, ending one (cancelled, expired),
and the pass after every change of room that starts what fits (`vipu.model.queue.admit`,
placement asked once per shape of request), holds IPUs for the first request and works out why
each of the others waits."""

from __future__ import annotations

import heapq
import logging
import time
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from vipu.controller.core import operations
from vipu.controller.core.commands import CreatePartition
from vipu.controller.core.effects import AfterPass, Body, Operation, Write
from vipu.controller.core.placing import UNDER_TEST, explicit_ipus, machines_left_out, partition_of
from vipu.controller.core.sharing import Ordering, Sharing
from vipu.controller.core.snapshot import QueueView, Waiting
from vipu.controller.core.steps import Steps
from vipu.controller.core.turns import OPERATIONS_LIMIT, TurnEngine
from vipu.model.compaction import Plan, plan_for
from vipu.model.entities import Partition, PartitionRequest
from vipu.model.errors import Conflict, NoRoom, VipuError
from vipu.model.placement import Occupancy, Placement, Shape, Used, choose_held_shape, free_ipu_count, place_partition, shifted, try_place
from vipu.model.queue import Lines, WaitingRequest, admit, held_free_at, shape_of
from vipu.model.reasons import span
from vipu.model.reservations import Reservation, kept_refusal
from vipu.model.topology import ClusterLayout

log = logging.getLogger("vipu.controller.core")

# A pass over the queue the owner or the store refused (at its limit of operations, unavailable)
# is tried again after this many seconds.
RETRY_SECONDS = 1.0
# Shapes of request whose reason one pass works out for the requests behind the first: requests of
# one shape share it, so this bounds the cost only when over this many differently shaped
# requests wait; those beyond are told their place.
EXPLAINED_SHAPES = 64


class Queue:
    """The owner's queue of waiting requests: its deadlines and leases, and the pass over it, on
    the engine's state; what it starts (grants, expiries, the moves of a compaction) are the
    engine's operations."""

    def __init__(self, engine: TurnEngine, steps: Steps, sharing: Sharing):
        self.engine = engine
        self.steps = steps
        self.sharing = sharing
        self.id = engine.id
        self.state = state = engine.state
        self.owners = engine.owners
        self.changes = engine.changes
        self.start = engine.start  # begin an operation in this turn
        self.on_partition = engine.on_partition  # partition id -> the operation holding it
        self.under_way = engine.under_way  # every operation started and not ended
        self._expiries: list[tuple[datetime, int, str]] = [(r.deadline, r.sequence, r.partition_id) for r in state.queue]
        # A waiting request's lease, which its waiter renews by asking after it (`renew`); one loaded
        # from the store (a restart, a new leader) gets a whole lease, for its waiter to come back.
        self._asked: dict[str, datetime] = {}  # waiting request -> when its waiter last asked after it; its lease ends a lease later
        for request in state.queue:
            self._lease(request)
        heapq.heapify(self._expiries)  # the waiting requests' deadlines and leases, soonest first
        self.explained = QueueView(held=state.held, layout=state.layout)  # until the first pass: what the store holds

    def next_expiry(self) -> datetime | None:
        return self._expiries[0][0] if self._expiries else None

    def held_needed_at(self) -> float | None:
        """When the IPUs held for the first waiting request are expected to be free, and so needed
        (seconds since the epoch), from what is on them now; None if unknown: what a create that
        does not wait is weighed against, as the queue's backfill weighs a waiting one."""
        state = self.state
        return held_free_at(state.held, state.used, {}, expected_ends(state.partitions.values()), time.time())

    def enqueue(self, command: CreatePartition, refusal: NoRoom) -> Body:
        now = datetime.now(UTC)
        waiting = WaitingRequest(command.request, self.id, command.access.user_id, now,
                                 now + timedelta(seconds=command.wait_seconds), command.keep_on_error, detached=command.detached)
        self.owners.enter_queue(waiting.owner)
        entered = True

        def committed() -> None:
            self.state.queue.add(waiting)
            heapq.heappush(self._expiries, (waiting.deadline, waiting.sequence, waiting.partition_id))
            self._lease(waiting)
            self.owners.settle_id(waiting.partition_id, self.id)
            self.changes.queue = self.changes.room = True

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
        view = self.explained
        position = self.state.queue.position(request)
        return Waiting(request, position, view.reason_at(position, request, self.state.queue.first(), shape_of(request.request)))

    def ending(self, request: WaitingRequest, transition: str, ending: VipuError) -> Body:
        """Take a request out of the queue by `transition`, keeping how it ended for its clients. One
        whose row went without this owner ending it (deleted with its allocation) is taken out all
        the same: it waits no more."""
        state = self.state

        def apply() -> None:
            state.queue.remove(request.partition_id)
            self.changes.queue = self.changes.room = True

        def committed() -> None:
            self.owners.leave_queue(request.owner)
            self.owners.release_id(request.partition_id, self.id)
            self.steps.ended(request, ending)

        try:
            yield Write(lambda tx: tx.end_request(request, transition), apply, lambda: state.queue.add(request), committed)
        except Conflict:
            apply()
            committed()
            log.info("partition %s: its request was no longer in the store (its allocation was removed)", request.partition_id)
        log.info("partition %s: %s", request.partition_id, ending.message)

    def expire_due(self) -> None:
        """End the requests whose deadline has passed. One whose end the store refused, or that
        finds the owner at its limit of operations, is tried again RETRY_SECONDS later."""
        queue = self.state.queue
        if len(self._expiries) > 3 * len(queue) + 64:  # most are of requests granted or cancelled since
            self._expiries = [(r.deadline, r.sequence, r.partition_id) for r in queue]
            for partition_id in [p for p in self._asked if p not in queue.by_key]:  # in place: `renew` writes into it meanwhile
                self._asked.pop(partition_id, None)
            lease_time = timedelta(seconds=self.owners.limits.lease_seconds)
            self._expiries += [(asked + lease_time, queue.by_key[p].sequence, p) for p, asked in list(self._asked.items())]
            heapq.heapify(self._expiries)
        now = datetime.now(UTC)
        while self._expiries and self._expiries[0][0] <= now:
            _, sequence, partition_id = heapq.heappop(self._expiries)
            request = queue.get(partition_id)
            if request is None or request.sequence != sequence:
                continue
            if request.deadline > now:  # its lease came due, not its deadline
                until = self._lease_end(partition_id)
                if until is None:
                    continue
                if until > now:  # renewed meanwhile
                    heapq.heappush(self._expiries, (until, sequence, partition_id))
                    continue
                lease = self.owners.limits.lease_seconds
                ending: VipuError = Conflict(f"the request of partition {partition_id} was withdrawn: nobody asked after it for "
                                             f"{lease:g} s, so its waiter is gone")
            else:
                waited = (request.deadline - request.since).total_seconds()
                reason = self.waiting(partition_id)
                ending = NoRoom(f"no room for partition {partition_id} after waiting {waited:g} s: {reason.reason if reason else ''}")
            if partition_id in self.on_partition or len(self.under_way) >= OPERATIONS_LIMIT:
                self._expire_later(request)
                continue
            self.start(Operation("expiring", self._expiring(request, ending), partition_id=partition_id))

    def _lease(self, request: WaitingRequest) -> None:
        """A whole lease for a waiting request (none for one to be picked up later), due in the
        expiry heap when it ends before the request's deadline."""
        if request.detached:
            return
        self._asked[request.partition_id] = datetime.now(UTC)
        until = self._lease_end(request.partition_id)
        if until is not None and until < request.deadline:
            heapq.heappush(self._expiries, (until, request.sequence, request.partition_id))

    def renew(self, partition_id: str) -> None:
        """Its waiter asked after a request: its lease starts again. Any thread may call it: it
        replaces one time in `_asked` (which the queue never replaces whole), read when the lease comes due."""
        if partition_id in self._asked:
            self._asked[partition_id] = datetime.now(UTC)

    def _lease_end(self, partition_id: str) -> datetime | None:
        """When a waiting request's lease ends: a lease after its waiter last asked; None without a lease."""
        asked = self._asked.get(partition_id)
        return None if asked is None else asked + timedelta(seconds=self.owners.limits.lease_seconds)

    def _expiring(self, request: WaitingRequest, ending: VipuError) -> Body:
        try:
            yield from self.ending(request, "expire", ending)
        except VipuError as refused:
            log.warning("partition %s: its request could not be ended at its deadline: %s", request.partition_id, refused.message)
            self._expire_later(request)

    def _expire_later(self, request: WaitingRequest) -> None:
        retry = datetime.now(UTC) + timedelta(seconds=RETRY_SECONDS)
        heapq.heappush(self._expiries, (retry, request.sequence, request.partition_id))

    def matters(self) -> bool:
        """Whether a pass over the queue has anything to do: requests wait, or what readers were told of them is to go."""
        return bool(len(self.state.queue) or len(self.engine.snapshot.queue) or self.explained.first_verdict)

    def run_pass(self) -> None:
        """Start what fits in the queue now, hold IPUs for the first request, and work out why each
        still waits. One refused (the owner at its limit of operations, the store unavailable) is
        tried again after RETRY_SECONDS; one that fails unexpectedly fails the turn, and the owner
        is rebuilt from the store (`TurnEngine._fail_stop`), as it is for any other part's failure."""
        try:
            self._admit()
        except VipuError as error:
            log.warning("the pass over the queue of allocation %s stopped: %s", self.id, error.message)
            self.engine.pass_again(RETRY_SECONDS)

    def _admit(self) -> None:
        state = self.state
        self._end_requests_of_reservations_gone(time.time())  # first: what is left waiting decides what is held
        first = state.queue.first()
        if first is None:
            state.held = frozenset()
            self._explain(frozenset(), set())
            return
        if state.test or state.closing:
            why = (f"{state.test} is under test; no partition starts in it until the test ends" if state.test
                   else f"allocation {self.id} is being removed")
            self.explained = QueueView(held=frozenset(), first_verdict=why, verdicts={}, layout=state.layout, every=why)
            self.changes.queue = self.changes.state = True
            return
        allowed = set(state.allocation.agent_ids) - state.unplaceable()  # nothing starts, nor is held, on a machine down or draining
        layout, allocation, now = state.layout, state.allocation, time.time()

        def kept_for(request: WaitingRequest) -> dict[tuple[str, int], Reservation]:
            return state.kept_for_reservations(request.request.reservation, request.request.expected_seconds, now)

        def around_reservations(request: WaitingRequest, used: Used) -> Used:
            kept = kept_for(request)
            return shifted(used, on=kept) if kept else used

        quotas = self.sharing.quotas()
        lines: Lines[WaitingRequest] | None = None
        allowance, ordering = None, None
        if quotas is not None:  # shared by accounts: fair-share order, each account's quota kept
            ordering = self.sharing.order(quotas, now)
            lines = Lines.of(ordering.requests, lambda r: shape_of(r.request))
            allowance = self.sharing.allowance(quotas)
            first = next((r for r in ordering.requests if r.partition_id not in ordering.blocked), first)
        held = state.held if (state.held_for == first.partition_id and {agent for agent, _ in state.held} <= allowed
                              and state.held.isdisjoint(kept_for(first))) else frozenset()
        holders = state.holders()

        def place(request: WaitingRequest, used: Used) -> Placement | None:
            r = request.request
            used = around_reservations(request, used)
            return try_place(layout, allowed, used, r.size, num_gcds=r.num_gcds, num_segments=r.num_segments,
                             ipulink_routing=r.ipulink_routing, gw_routing=r.gw_routing,
                             explicit=explicit_ipus(layout, allocation, r), faults=state.links, mix=state.mix)

        def choose_held(request: WaitingRequest, used: Used, started: Sequence[tuple[WaitingRequest, Placement]]) -> Shape:
            """The shape the fewest partitions block, counting those this pass starts."""
            r = request.request
            blocking = {**holders, **{(ipu.agent_id, ipu.index): s.partition_id for s, p in started for ipu in p.ipus}}
            return choose_held_shape(layout, allowed, used, r.size, holders=blocking, avoid=kept_for(request).keys(),
                                      num_segments=r.num_segments,
                                      ipulink_routing=r.ipulink_routing, explicit=explicit_ipus(layout, allocation, r),
                                      faults=state.links)

        admission = admit(state.queue if lines is None else lines, state.used, place, choose_held, held=held,
                          expected_duration=lambda request: request.request.expected_seconds or None,
                          expected_ends=expected_ends(state.partitions.values()), now=now, allowed=allowance)
        for request, placement in admission.started:
            partition = partition_of(request.request, request.owner, allocation, placement)
            self.start(Operation("creating", operations.grant(self.steps, request, partition), partition_id=partition.id))
        if admission.first is not None:
            state.held, state.held_for = admission.held, admission.first.partition_id
            if state.held_recorded != (admission.first.partition_id, admission.held):
                self.start(Operation("holding", self._recording_hold(admission.first, admission.held), system=True))
        else:
            state.held, state.held_for = frozenset(), ""
        if admission.first is not None and not admission.started:
            self._compact_for(admission.first, allowed)
        if quotas is not None:
            after = self.sharing.quotas() or quotas  # what the pass started counted
            ordering = self.sharing.order(after, now)  # the requests left, told in the order of what now holds
            if admission.first is not None:
                self.sharing.reclaim_for(ordering.requests, after, place, state.used, admission.first, state.held)
        self._explain(state.held, allowed, admission.expected_start, ordering)

    def _end_requests_of_reservations_gone(self, now: float) -> None:
        """End the waiting requests made in a reservation that is over or was removed: they could
        never start. One whose end the store refused is tried again at a pass RETRY_SECONDS later."""
        state = self.state
        for line in list(state.queue.lines().values()):
            name = line[0].request.reservation if line else ""  # one per line: it is part of a request's shape
            reservation = state.reservations.get(name) if name else None
            if not name or (reservation is not None and not reservation.ended(now)):
                continue
            why = reservation.closed(now) if reservation is not None else f"reservation {name} was removed"
            for request in [r for r in line if r.partition_id not in self.on_partition]:
                ending = Conflict(f"the request of partition {request.partition_id} ends: {why}")
                self.start(Operation("expiring", self._ending_now(request, ending), partition_id=request.partition_id))

    def _ending_now(self, request: WaitingRequest, ending: VipuError) -> Body:
        try:
            yield from self.ending(request, "expire", ending)
        except VipuError as refused:
            log.warning("partition %s: its request could not be ended: %s", request.partition_id, refused.message)
            self.engine.pass_again(RETRY_SECONDS)

    def refusal_in(self, request: PartitionRequest, reservation: Reservation, kept: Mapping[tuple[str, int], Reservation],
                    occupancy: Occupancy, fallback: str) -> str:
        """Why a request made in a reservation does not fit, in words of the reservation's machines
        alone (what is free there, which partitions stand in the way), or else `fallback`."""
        state = self.state
        try:
            place_partition(state.layout, set(reservation.agent_ids) - state.unplaceable(), shifted(state.used, on=kept), request.size,
                            num_gcds=request.num_gcds, num_segments=request.num_segments, ipulink_routing=request.ipulink_routing,
                            gw_routing=request.gw_routing, where=f"reservation {reservation.name}", occupancy=occupancy)
        except NoRoom as refusal:
            return reservation.no_room(refusal.message)
        except VipuError:  # a rule it breaks on those machines alone: the allocation's refusal says it better
            pass
        return reservation.no_room(fallback)

    def _compact_for(self, first: WaitingRequest, allowed: set[str]) -> None:
        """When the first request waits although enough IPUs are free, plan the moves of relocatable
        partitions that free a shape for it, within the budget, and make them: it starts at the
        pass that follows. A plan is looked for once per first request and room (not at every pass),
        and never while a compaction is under way. Nothing moves for a request made in a
        reservation, nor onto the IPUs of a reservation not over."""
        state, r, now = self.state, first.request, time.time()
        kept = state.kept_for_reservations(r.reservation, r.expected_seconds, now)
        if r.reservation or r.size > free_ipu_count(state.layout, allowed, shifted(state.used, on=kept)) or state.compactions:
            return
        holders = state.holders()
        spent = self.steps.compaction_spent()
        room = spent.room(now)
        looked = (first.partition_id, frozenset(holders.items()), frozenset(allowed), state.links.sequence, room)
        if state.compaction_looked == looked:
            return
        state.compaction_looked = looked
        used = shifted(state.used, on=state.reserved(now)) if state.reservations else state.used
        plan = plan_for(state.layout, allowed, used, holders, r.size, operations.movable(self.steps, spent, now), max_moves=room,
                        mix=state.mix, num_segments=r.num_segments, ipulink_routing=r.ipulink_routing, faults=state.links)
        if plan is None or not self._takes(first, allowed, plan, kept):
            return
        log.info("allocation %s: %d move(s) to free %d IPUs for waiting request %s", self.id, len(plan.moves), plan.size,
                 first.partition_id)
        body = operations.compact(self.steps, plan, spent, f"the queue for {first.partition_id}")
        self.start(Operation("compacting", self.compacting(self._reporting(body)), system=True))

    def _takes(self, first: WaitingRequest, allowed: set[str], plan: Plan, kept: Iterable[tuple[str, int]]) -> bool:
        """Whether the request, with all it asks (GCDs, routing, IPUs named, links to keep off), fits
        once the plan's moves are made, off the IPUs `kept` for reservations: nothing moves for a
        shape it could not take."""
        state, r = self.state, first.request
        after = shifted(state.used, off=(ipu for move in plan.moves for ipu in move.before),
                        on=[*(ipu for move in plan.moves for ipu in move.to), *kept])
        return try_place(state.layout, allowed, after, r.size, num_gcds=r.num_gcds, num_segments=r.num_segments,
                         ipulink_routing=r.ipulink_routing, gw_routing=r.gw_routing,
                         explicit=explicit_ipus(state.layout, state.allocation, r), faults=state.links) is not None

    def compacting(self, body: Body) -> Body:
        """A compaction under way (an administrator's or the queue's): the queue starts none of its
        own meanwhile, and looks again once it has ended."""
        self.state.compactions += 1
        try:
            return (yield from body)
        finally:
            self.state.compactions -= 1
            self.changes.room = True

    def _reporting(self, body: Body) -> Body:
        """A compaction the queue asked for: why it stopped or failed, logged (nobody waits for it)."""
        try:
            report = yield from body
            if report.stopped:
                log.warning("allocation %s: the compaction for the queue stopped: %s", self.id, report.stopped)
        except VipuError as error:
            log.warning("allocation %s: the compaction for the queue failed: %s", self.id, error.message)

    def _recording_hold(self, first: WaitingRequest, held: Shape) -> Body:
        """Write the IPUs held for a first request to its row, so that they outlive a restart, and
        none to the row of the request they were held for before if it still waits (fair share's
        first changes while it waits); one that could not be written is written by the next pass."""
        recorded = self.state.held_recorded
        before = self.state.queue.get(recorded[0]) if recorded is not None and recorded[0] != first.partition_id else None

        def write(tx: Any) -> None:
            if before is not None:
                tx.hold_for(before, frozenset())
            tx.hold_for(first, held)

        def committed() -> None:
            self.state.held_recorded = (first.partition_id, held)

        try:
            yield Write(write, committed=committed)
        except VipuError as error:
            self.engine.pass_again(RETRY_SECONDS)
            log.warning("could not record the IPUs held for partition %s (the next pass tries again): %s",
                        first.partition_id, error.message)

    def machines_left_out(self) -> dict[str, str]:
        """The allocation's machines that are down or draining (or a cluster test holds), and what
        each is, as a refusal says it: no partition is placed there (it would fail at a machine that
        is down while others are free; an operator is emptying one that drains)."""
        state = self.state
        if not state.down and not state.draining and not state.claimed:
            return {}
        agents = self.steps.agents()
        kept = {agent_id: f"{UNDER_TEST} ({test}) until the test ends" for agent_id, test in state.claimed.items()}
        kept.update({agent_id: f"is {drain.describe()}" for agent_id, drain in state.draining.items()})
        kept.update({agent_id: "is down: " + ("a power action is under way on it" if state.powering(agent_id) else
                                              agents[agent_id].last_error if agent_id in agents and agents[agent_id].last_error
                                              else "it does not answer")
                     for agent_id in state.down})
        return kept

    def _explain(self, held: Shape, allowed: set[str], held_needed_at: float | None = None, ordering: Ordering | None = None) -> None:
        """Why each request still waits, from placement, against the state as the pass left it.
        Every request behind the first sees the same room (less what is held for the first), so
        placement is asked once per shape of request."""
        self.changes.queue = self.changes.state = True
        state = self.state
        first = state.queue.get(state.held_for) or state.queue.first()
        if first is None:
            self.explained = QueueView(layout=state.layout)
            return
        holders = state.holders()
        used, layout, allocation = state.used, state.layout, state.allocation
        left_out = {agent: what for agent, what in self.machines_left_out().items() if agent not in allowed}
        where = f"allocation {allocation.id}"
        if left_out:
            that_are, listed = machines_left_out(left_out)
            where = f"{where} without its machines {that_are} ({listed})"

        now = time.time()

        def verdict(request: WaitingRequest, occupancy: Occupancy) -> tuple[str, bool]:
            """What placement says of the request, and whether free IPUs held for the first were kept from it;
            the reservations whose IPUs it may not use named."""
            r = request.request
            named = state.reservations.get(r.reservation)
            if named is not None and named.closed(now):
                return named.closed(now), False
            kept = state.kept_for_reservations(r.reservation, r.expected_seconds, now)

            def place(around: Used) -> None:
                place_partition(layout, allowed, around, r.size, num_gcds=r.num_gcds, num_segments=r.num_segments,
                                ipulink_routing=r.ipulink_routing, gw_routing=r.gw_routing,
                                explicit=explicit_ipus(layout, allocation, r), where=where, occupancy=occupancy, faults=state.links)

            try:
                place(shifted(used, on=kept) if kept else used)
                return "starting", False
            except VipuError as error:
                refusal = error
            held_free = isinstance(refusal, NoRoom) and refusal.held_free > 0
            if named is not None:
                return self.refusal_in(r, named, kept, occupancy, refusal.message), held_free
            if not kept:
                return refusal.message, held_free
            try:
                place(used)
            except VipuError:
                return refusal.message, held_free  # the reservations alone do not keep it off
            return kept_refusal(r.size, where, kept, used, r.expected_seconds, now, layout), held_free

        behind_first = Occupancy(holders, held, first.partition_id)
        verdicts: dict[Any, str] = {}
        kept_off_held = set()
        for shape, line in state.queue.lines().items():
            if len(verdicts) >= EXPLAINED_SHAPES:
                break
            behind = next((r for r in line if r is not first), None)
            if behind is not None:
                verdicts[shape], kept_off = verdict(behind, behind_first)
                if kept_off:
                    kept_off_held.add(shape)
        first_verdict = verdict(first, Occupancy(holders))[0]
        told = _in_fair_order(ordering, first, first_verdict, verdicts, held, layout) if ordering is not None else {}
        self.explained = QueueView(held=held, first_verdict=first_verdict, verdicts=verdicts, layout=layout,
                                    held_needed_at=held_needed_at, kept_off_held=frozenset(kept_off_held), told=told)


def expected_ends(partitions: Iterable[Partition]) -> dict[tuple[str, int], float | None]:
    """When the partition on each IPU in use is expected to end (seconds since the epoch), for
    backfill by expected duration; None where its duration is unknown. IPUs held back for no
    partition (a move's old ones, say) are left out, which backfill reads as unknown too."""
    ends: dict[tuple[str, int], float | None] = {}
    for partition in partitions:
        end = partition.expected_end
        for ipu in partition.ipus:
            ends[(ipu.agent_id, ipu.index)] = None if end is None else end.timestamp()
    return ends


def _in_fair_order(ordering: Ordering, first: WaitingRequest, first_verdict: str, verdicts: Mapping[Any, str], held: Shape,
                   layout: ClusterLayout) -> dict[str, str]:
    """Why each request waits in a queue in fair-share order: its place in that order, what its
    account says of it, and placement's verdict."""
    told: dict[str, str] = {}
    place = 0
    if first.partition_id in ordering.blocked:  # nothing held: the first its quota lets start leads
        first = next((r for r in ordering.requests if r.partition_id not in ordering.blocked), first)
    for request in ordering.requests:
        clause = ordering.clauses.get(request.partition_id, "")
        if request.partition_id in ordering.blocked:
            told[request.partition_id] = clause
            continue
        place += 1
        if request is first:
            where = f"first in fair-share order, {span(layout, held)} held for it" if held else "first in fair-share order"
            found = first_verdict
        else:
            where = f"number {place} in fair-share order, behind {first.partition_id} ({first.size} IPUs)"
            found = verdicts.get(shape_of(request.request), "")
        told[request.partition_id] = "; ".join(part for part in (where, clause, found) if part)
    return told
