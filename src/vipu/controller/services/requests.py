"""Requests that wait for room: queue, start, explain, cancel, expire, and the clients that wait.

`vipu create partition P --size N --wait --timeout S` (an added field of the user API's create)
is placed at once if it fits around the IPUs held for the queue's first request; otherwise it is
recorded in the store (`vipu.model.queue`) in the queue of the allocation it could fit in with
the least work ahead, and waits there until it starts or its deadline passes. A dispatcher pass
(`dispatch`, run whenever partitions or requests change and every second for deadlines) admits
each allocation's queue by `vipu.model.queue.admit` under that allocation's placing lock, as a
create is placed: the request's partition is reserved in the ledger there, then recorded,
PENDING/CREATING, in the same store transaction that ends the request (its 'grant'), and
configured on its agents by a worker of its own, like any create. The pass also works out why
each request still waits, with placement's reasons.

Clients wait with `wait`: a bounded call (at most WAIT_CALL_SECONDS) that returns when the
partition is settled, or at its time with the request's place and reason; clients call it again
until their own deadline. Each blocked call holds one of the user end-point's threads, so only
`waiting_places` of them block at once: half the threads the watchers of the change feed leave,
the other half kept for ordinary calls. A call past that answers at once, marked `busy`, and
clients pause before calling again, longer each time (`vipu.client.retry.answered_early`).

The queue lives in the store, so it outlives a restart or a change of leader, and the next
serving controller goes on from it.
"""

from __future__ import annotations

import builtins
import contextlib
import itertools
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

from vipu.controller.services.changes import MAX_WATCHERS
from vipu.controller.services.partitions import PartitionService
from vipu.model import lifecycle
from vipu.model.configuration import GcdConfig
from vipu.model.entities import OPEN_ACCESS, Access, Allocation, Partition, PartitionRequest, ReadyState, shown
from vipu.model.errors import (
    AlreadyExists,
    ConcurrentUpdate,
    Conflict,
    InvalidArgument,
    NoRoom,
    NotFound,
    PermissionDenied,
    Unavailable,
    VipuError,
)
from vipu.model.placement import Occupancy, Shape, choose_reservation, place_partition, try_place
from vipu.model.queue import MAX_WAIT_SECONDS, WAIT_CALL_SECONDS, WaitingRequest, admit
from vipu.model.reasons import span
from vipu.model.topology import ClusterLayout

log = logging.getLogger(__name__)

# Shapes of request whose reason one pass works out for the requests behind the first: requests of
# one shape (size, GCDs, segments, routings, explicit IPUs or index) share it, so this bounds the
# cost only when over this many differently shaped requests wait; those beyond are told their place.
EXPLAINED_SHAPES = 64
GRANT_WORKERS = 4
# How long a cancel waits for an operation holding its partition id (its grant under way).
CANCEL_WAIT_SECONDS = 5.0


@dataclass(frozen=True)
class Waiting:
    """A request as its clients see it: where it waits and why."""

    request: WaitingRequest
    position: int
    reason: str


@dataclass(frozen=True)
class Settled:
    """What a waiting client is told: the partition, with its IPUoF configuration once ACTIVE; or
    the request, still waiting."""

    partition: Partition | None = None
    gcds: list[GcdConfig] | None = None
    ipuof_version: str = ""
    waiting: Waiting | None = None
    busy: bool = False  # every place for a waiting call was taken: this call did not wait


def waiting_places(workers: int, watchers: int) -> int:
    """How many waiting calls may block at once on an end-point of `workers` threads, `watchers`
    of which the change feed's watchers may hold: half of the rest, so that ordinary calls
    always find a thread."""
    return max(1, (workers - watchers) // 2)


class RequestService:
    def __init__(self, partitions: PartitionService, workers: int = 32, watchers: int = MAX_WATCHERS):
        """`workers`: the user end-point's threads; `watchers`: how many the change feed's watchers may hold."""
        self.partitions = partitions
        self.store = partitions.store
        self.queue = partitions.queue
        self.ledger = partitions.ledger
        self._waiting_calls = threading.BoundedSemaphore(waiting_places(workers, watchers))
        self._grants = ThreadPoolExecutor(GRANT_WORKERS, thread_name_prefix="grant")
        # A create's own pass and the dispatcher's may end together. One at a time works out an
        # allocation's reasons, and a pass that placed before the last one through gives way to it:
        # the reasons written last are never from an older look at the queue than those before.
        self._explaining: dict[str, threading.Lock] = {}  # allocation -> held while its reasons are worked out
        self._looks = itertools.count()  # passes in the order they placed, under their allocation's placing lock
        self._explained: dict[str, tuple[int, int]] = {}  # allocation -> (the last pass through, the queue's version explained)
        self._holds_unrecorded: set[str] = set()  # first requests whose held IPUs the store does not have yet

    def close(self) -> None:
        self._grants.shutdown(wait=True, cancel_futures=True)

    # Use cases

    def create(self, request: PartitionRequest, access: Access = OPEN_ACCESS, keep_on_error: bool = False,
               wait_seconds: float = 0.0) -> tuple[Partition, list[GcdConfig], str] | Waiting:
        """Create the partition now if it fits (as `PartitionService.create_with_ipuof`); else, given
        `wait_seconds`, queue the request and say where it waits and why."""
        if wait_seconds < 0 or wait_seconds > MAX_WAIT_SECONDS:
            raise InvalidArgument(f"a request waits from 1 s to {MAX_WAIT_SECONDS} s (7 days), not {wait_seconds:g} s")
        try:
            return self.partitions.create_with_ipuof(request, access, keep_on_error)
        except NoRoom as refusal:
            if not wait_seconds:
                raise
            return self._enqueue(request, access, keep_on_error, wait_seconds, refusal)

    def _enqueue(self, request: PartitionRequest, access: Access, keep_on_error: bool, wait_seconds: float,
                 refusal: NoRoom) -> Waiting:
        fitting = refusal.allocations or self._allocation_ids(request, access)
        open_ones = tuple(a for a in fitting if not self.queue.is_closing(a))
        if not open_ones:
            raise Conflict(f"allocation {fitting[0]} is being removed: no request waits in it")
        allocation_id = self._least_work_ahead(open_ones)
        now = datetime.now(UTC)
        waiting = WaitingRequest(request, allocation_id, access.user_id, now, now + timedelta(seconds=wait_seconds), keep_on_error)
        taken = AlreadyExists(f"partition {request.id} already exists")
        with self.partitions.holds.hold(request.id, "queueing", busy=taken):
            self.partitions.refuse_if_taken(request.id, access)
            self.store.write(lambda tx: tx.add_request(waiting))
            self.queue.add(waiting)
            if self.queue.is_closing(allocation_id):  # its removal began meanwhile, and may have missed it
                closed = Conflict(f"allocation {allocation_id} is being removed: no request waits in it")
                with contextlib.suppress(Conflict):
                    self._end(waiting, "cancel", closed)
                raise closed
        log.info("partition %s of %d IPUs waits in allocation %s (up to %g s): %s", request.id, request.size,
                 allocation_id, wait_seconds, refusal.message)
        self.dispatch(allocation_id)  # it may start at once, should room have appeared meanwhile
        return self._seen(waiting)

    def _allocation_ids(self, request: PartitionRequest, access: Access) -> tuple[str, ...]:
        return tuple(a.id for a in self.partitions.allocations_for(request, access))

    def _least_work_ahead(self, allocation_ids: tuple[str, ...]) -> str:
        """Of the allocations a request could fit in, the one with the fewest IPUs in use and waiting."""
        def work(allocation_id: str) -> int:
            used = sum(len(ipus) for ipus in self.ledger.used_ipus(allocation_id).values())
            return used + sum(r.size for r in self.queue.in_allocation(allocation_id, granting=True))

        return min(allocation_ids, key=lambda a: (work(a), a))

    def wait(self, partition_id: str, seconds: float, access: Access = OPEN_ACCESS) -> Settled:
        """Until the partition is settled (ACTIVE or ERROR), or for at most `seconds` (bounded by
        WAIT_CALL_SECONDS) while its request waits or its create is under way; then what it is,
        `busy` if every waiting place was taken so that the call did not wait. A request that
        ended without a partition raises how it ended."""
        asked = min(max(seconds, 0.0), WAIT_CALL_SECONDS)
        blocking = asked > 0 and self._waiting_calls.acquire(blocking=False)  # else answer at once: threads stay free
        busy = asked > 0 and not blocking
        deadline = time.monotonic() + (asked if blocking else 0.0)
        try:
            while True:
                seen = self.queue.version
                settled = self._settled(partition_id, access)
                remaining = deadline - time.monotonic()
                if settled is not None and (settled.waiting is None or remaining <= 0):
                    return replace(settled, busy=busy)
                if remaining <= 0:
                    return Settled(partition=self.partitions.get(partition_id, access), busy=busy)  # its create is under way
                self.queue.wait_for_change(seen, remaining)
        finally:
            if blocking:
                self._waiting_calls.release()

    def _settled(self, partition_id: str, access: Access) -> Settled | None:
        """The partition if it is settled, or its request if it waits; None while its create is under way."""
        partition = self.ledger.get(partition_id)
        if partition is not None and access.may_use(partition.allocation_id):
            if lifecycle.state_of(partition) in lifecycle.BUSY or self.partitions.holds.is_held(partition_id):
                return None  # an operation is under way: a failed create, say, that moves it elsewhere
            if partition.ready_state is ReadyState.ACTIVE:
                _, gcds, version = self.partitions.ipuof_config(partition_id, access=access)
                return Settled(partition, gcds, version)
            return Settled(partition)
        request = self.queue.get(partition_id)
        if request is not None and access.may_use(request.allocation_id):
            return Settled(waiting=self._seen(request))
        ended = self.queue.ending(partition_id)
        if ended is not None and access.may_use(ended[0]):
            raise ended[1]
        raise NotFound(f"partition {shown(partition_id)} does not exist and no request of it waits")

    def list(self, allocation_id: str = "", access: Access = OPEN_ACCESS) -> list[Waiting]:
        """The waiting requests of the allocations the caller may use (or of one), each queue in order."""
        if allocation_id:
            self.partitions.allocation(allocation_id, access)
        chosen = [allocation_id] if allocation_id else [a for a in self.queue.allocations() if access.may_use(a)]
        return [Waiting(request, position, self.queue.reason(request.partition_id))
                for a in chosen for position, request in enumerate(self.queue.in_allocation(a, granting=True), start=1)]

    def cancel(self, partition_id: str, access: Access = OPEN_ACCESS) -> None:
        """Cancel a waiting request: its user's, or anyone's for an administrator."""
        request = self.queue.get(partition_id)
        if request is None or not access.may_use(request.allocation_id):
            raise NotFound(f"no request of partition {shown(partition_id)} waits")
        if not access.unrestricted and request.owner and request.owner != access.user_id:
            raise PermissionDenied(f"the request of partition {partition_id} is user {request.owner}'s; only its owner or an "
                                   "administrator cancels it")
        with self.partitions.holds.hold(partition_id, "cancelling", wait=CANCEL_WAIT_SECONDS):
            request = self.queue.get(partition_id)
            if request is None:
                raise Conflict(f"the request of partition {partition_id} started meanwhile; remove the partition instead")
            who = f" by {access.user_id}" if access.user_id else ""
            self._end(request, "cancel", Conflict(f"the request of partition {partition_id} was cancelled{who}"))

    def cancel_all(self, allocation_id: str, reason: str) -> builtins.list[str]:
        """Cancel every request waiting in an allocation (it is being removed); their partition ids."""
        cancelled = []
        for request in self.queue.in_allocation(allocation_id, granting=True):
            try:
                self._end(request, "cancel", Conflict(f"the request of partition {request.partition_id} was cancelled: {reason}"))
                cancelled.append(request.partition_id)
            except Conflict:
                pass  # it ended meanwhile
        return cancelled

    def remove(self, partition_id: str, force: bool = False, access: Access = OPEN_ACCESS) -> None:
        """Remove a partition, or cancel its request if it still waits (what integrations call when a
        job ends). A request that starts meanwhile has its partition removed instead (a forced
        remove waits for its create to end)."""
        waiting = self.queue.get(partition_id)
        if waiting is not None and self.ledger.get(partition_id) is None:
            try:
                self.cancel(partition_id, access)
                return
            except (Conflict, Unavailable) as started:  # granted meanwhile: it is a partition now, or about to be
                log.info("partition %s: %s; removing the partition instead", partition_id, started.message)
        self.partitions.remove(partition_id, force=force, access=access)

    def _end(self, request: WaitingRequest, transition: str, ending: VipuError) -> None:
        """Take the request out of the queue by `transition`, keeping how it ended for its clients.
        A Conflict if it ended meanwhile; but one whose row went without this controller ending
        it (deleted with its allocation) is taken out all the same: it waits no more."""
        try:
            self.store.write(lambda tx: tx.end_request(request, transition))
        except Conflict:
            current = self.queue.get(request.partition_id)
            if (current is None or current.sequence != request.sequence or self.queue.is_granting(request.partition_id)
                    or self.ledger.get(request.partition_id) is not None):
                raise  # ended here meanwhile, or became its partition
            log.info("partition %s: its request was no longer in the store (its allocation was removed)", request.partition_id)
        self.queue.remove(request, ending)
        log.info("partition %s: %s", request.partition_id, ending.message)

    def _seen(self, request: WaitingRequest) -> Waiting:
        return Waiting(request, self.queue.position(request), self.queue.reason(request.partition_id))

    # The dispatcher

    def run(self, stop: threading.Event) -> None:
        """Passes over the queues whenever something changed, and every second for deadlines, until `stop`."""
        while not stop.is_set():
            self.queue.wake.wait(1.0)
            self.queue.wake.clear()
            if stop.is_set():
                return
            try:
                self.dispatch()
            except Exception:
                log.exception("a pass over the waiting requests failed")

    def dispatch(self, only: str = "") -> None:
        """One pass: expire what is due, then start what fits in each allocation's queue (or one's).
        What fails for one request or one allocation (the store, say) is logged and tried again
        by the next pass; the others go on."""
        self._expire_due()
        for allocation_id in [only] if only else self.queue.allocations():
            try:
                self._pass(allocation_id)
            except Exception:
                log.exception("the pass over the queue of allocation %s failed", allocation_id)

    def _expire_due(self) -> None:
        now = datetime.now(UTC)
        for request in self.queue.all():
            if request.deadline <= now:
                waited = (request.deadline - request.since).total_seconds()
                ending = NoRoom(f"no room for partition {request.partition_id} after waiting {waited:g} s: "
                                f"{self.queue.reason(request.partition_id)}")
                try:
                    self._end(request, "expire", ending)
                except Conflict:  # granted or cancelled meanwhile
                    pass
                except Exception:
                    log.exception("partition %s: its request could not be expired; the next pass tries again", request.partition_id)

    def _pass(self, allocation_id: str) -> None:
        with self.store.reading() as tx:
            allocation = tx.get_allocation(allocation_id)
            cluster = tx.get_cluster(allocation.cluster_id) if allocation is not None else None
            down = self.partitions.down_agents(tx, allocation.agent_ids) if allocation is not None else set()
        if allocation is None or cluster is None:
            self.cancel_all(allocation_id, f"allocation {allocation_id} was removed")
            return
        layout = ClusterLayout.of(cluster)
        grants: builtins.list[tuple[WaitingRequest, Partition]] = []
        seen = self.queue.version
        try:  # the grants reserved are made whatever fails after them
            with self.ledger.placing(allocation_id):
                look = next(self._looks)
                waiting = self.queue.in_allocation(allocation_id)
                if not waiting:
                    return
                if allocation.cluster_id in self.partitions.under_test:
                    self.queue.explain({r.partition_id: f"cluster {allocation.cluster_id} is under test; "
                                        "no partition starts in it until the test ends" for r in waiting})
                    return
                allowed = set(allocation.agent_ids) - down  # nothing starts, nor is held, on a machine that is down
                first_held = waiting[0].held if {agent for agent, _ in waiting[0].held} <= allowed else frozenset()
                holders = self.ledger.holders(allocation_id)

                def choose_held(r: WaitingRequest, used, started) -> Shape:
                    """The shape the fewest partitions block, counting those this pass starts."""
                    blocking = {**holders, **{(ipu.agent_id, ipu.index): s.partition_id for s, p in started for ipu in p.ipus}}
                    return choose_reservation(layout, allowed, used, r.size, holders=blocking,
                                              num_segments=r.request.num_segments, ipulink_routing=r.request.ipulink_routing,
                                              explicit=self.partitions.explicit_ipus(layout, allocation, r.request))

                admission = admit(waiting, self.ledger.used_ipus(allocation_id),
                                  place=lambda r, used: try_place(layout, allowed, used, r.size, num_gcds=r.request.num_gcds,
                                                                  num_segments=r.request.num_segments,
                                                                  ipulink_routing=r.request.ipulink_routing,
                                                                  gw_routing=r.request.gw_routing,
                                                                  explicit=self.partitions.explicit_ipus(layout, allocation,
                                                                                                         r.request)),
                                  choose_held=choose_held, held=first_held)
                for request, placement in admission.started:
                    if not self.partitions.holds.claim(request.partition_id, "creating"):
                        continue  # an operation on its id (a cancel) is under way: the next pass decides
                    partition = self.partitions.partition_of(request.request, request.owner, allocation, placement)
                    self.ledger.reserve(partition)
                    self.queue.granting(request.partition_id)
                    grants.append((request, partition))
                first = admission.first
                changed = first is not None and admission.held != first.held
                if first is not None and changed:
                    self.queue.hold(first.partition_id, admission.held)
            with self._explaining.setdefault(allocation_id, threading.Lock()):
                last_look, explained = self._explained.get(allocation_id, (-1, -1))
                if look > last_look:  # else a pass that placed after this one has been through
                    if grants or explained != seen:  # else nothing changed since its reasons were found
                        self._explain(allocation, layout, allowed, admission.held)
                        explained = seen
                    self._explained[allocation_id] = (look, explained)
            if first is not None and (changed or first.partition_id in self._holds_unrecorded):
                self._record_hold(first, admission.held)
        finally:
            for request, partition in grants:
                self._grants.submit(self._grant, request, partition, layout)

    def _record_hold(self, first: WaitingRequest, held: Shape) -> None:
        """Write the IPUs held for a first request to its row, so that they outlive a restart; one
        that could not be written is kept in memory and written by the next pass."""
        try:
            self.store.write(lambda tx: tx.hold_for(first, held))
        except VipuError as error:
            self._holds_unrecorded.add(first.partition_id)
            log.warning("could not record the IPUs held for partition %s (the next pass tries again): %s",
                        first.partition_id, error.message)
        else:
            self._holds_unrecorded.discard(first.partition_id)

    def _explain(self, allocation: Allocation, layout: ClusterLayout, allowed: set[str], held: Shape) -> None:
        """Why each request of the allocation still waits, from placement, against the ledger as the
        pass left it. Every request behind the first sees the same room (less what is held for the
        first), so placement is asked once per shape of request."""
        waiting = self.queue.in_allocation(allocation.id)
        if not waiting:
            return
        used, holders = self.ledger.used_ipus(allocation.id), self.ledger.holders(allocation.id)
        first = waiting[0]
        behind_first = Occupancy(holders, held, first.partition_id)
        verdicts: dict[tuple, str] = {}  # a shape of request -> what placement says of it behind the first

        def verdict(r: PartitionRequest, occupancy: Occupancy) -> str:
            try:
                place_partition(layout, allowed, used, r.size, num_gcds=r.num_gcds, num_segments=r.num_segments,
                                ipulink_routing=r.ipulink_routing, gw_routing=r.gw_routing,
                                explicit=self.partitions.explicit_ipus(layout, allocation, r),
                                where=f"allocation {allocation.id}", occupancy=occupancy)
                return "starting"
            except VipuError as refusal:
                return refusal.message

        reasons = {}
        for position, request in enumerate(waiting, start=1):
            r = request.request
            if position == 1:
                where = f"first in the queue, {span(layout, held)} held for it" if held else "first in the queue"
                reasons[request.partition_id] = f"{where}; {verdict(r, Occupancy(holders))}"
                continue
            shape = (r.size, r.num_gcds, r.num_segments, r.ipulink_routing, r.gw_routing, r.explicit_ipus, r.index)
            if shape not in verdicts and len(verdicts) < EXPLAINED_SHAPES:
                verdicts[shape] = verdict(r, behind_first)
            where = f"number {position} in the queue, behind {first.partition_id} ({first.size} IPUs)"
            reasons[request.partition_id] = f"{where}; {verdicts[shape]}" if shape in verdicts else where
        self.queue.explain(reasons)

    def _grant(self, request: WaitingRequest, partition: Partition, layout: ClusterLayout) -> None:
        """Record a granted request's partition, ending the request in the same transaction, then
        configure it as a create does; the pass has claimed its id for this. If the request ended
        meanwhile (cancelled, expired) or its IPUs were taken, its reservation in the ledger is
        undone, and a request still waiting is tried again by the next pass."""
        recorded = False
        try:
            with self.partitions.operations.admitted():
                self.store.write(lambda tx: self._record_grant(tx, request, partition))
                recorded = True
                self.queue.remove(request)
                log.info("partition %s of %d IPUs starts in allocation %s after waiting %.1f s", partition.id, partition.size,
                         partition.allocation_id, (datetime.now(UTC) - request.since).total_seconds())
                self.partitions.configure_new(partition, layout, keep_on_error=request.keep_on_error)
        except Exception as failure:  # whatever it was, nothing is left reserved or marked for ever
            if isinstance(failure, VipuError):
                error = failure
                log.warning("partition %s: %s", partition.id, error.message)
            else:
                error = VipuError(f"partition {partition.id} could not be started: {failure}")
                log.exception("partition %s: its grant failed", partition.id)
            if not recorded:
                self.ledger.forget(partition.id)
                self.queue.granting(request.partition_id, underway=False)  # still waiting: the next pass tries again
                if isinstance(error, Conflict) and not isinstance(error, ConcurrentUpdate):
                    with contextlib.suppress(Conflict):  # its row went (with its allocation, say): it waits no more
                        self._end(request, "cancel", error)
            elif self.ledger.get(partition.id) is None:
                self.queue.remove(request, error)  # for its waiting clients: no partition came of it
        finally:
            self.partitions.holds.release(partition.id)

    @staticmethod
    def _record_grant(tx, request: WaitingRequest, partition: Partition) -> None:
        tx.end_request(request, "grant")
        tx.add_partition(partition)
