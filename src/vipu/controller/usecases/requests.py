"""Requests that wait for room: queue, wait, list, cancel, and the clients that wait.

`vipu create partition P --size N --wait --timeout S` (an added field of the user API's create)
is placed at once if it fits around the IPUs held for the queue's first request; otherwise it
waits in the queue of the allocation it could fit in with the least work ahead, until it starts
or its deadline passes. The queue is its allocation owner's (`vipu.controller.core.owner`): after
every change of room it starts what fits, first come first served with backfill
(`vipu.model.queue`), each start committed with the end of its request and then configured as any
create, and it works out why the others wait. It lives in the store, so it outlives a restart or
a change of leader. How many requests may wait is bounded, per user and in all
(`vipu.controller.core.owners.QueueLimits`).

Clients wait with `wait`: a bounded call (at most WAIT_CALL_SECONDS) that returns when the
partition is settled, or at its time with the request's place and reason; clients call it again
until their own deadline. Each blocked call holds one of the user end-point's threads, so only
`waiting_places` of them block at once: half the threads the watchers of the change feed leave,
the other half kept for ordinary calls. A call past that answers at once, marked `busy`, and
clients pause before calling again, longer each time (`vipu.client.retry.answered_early`).
"""

from __future__ import annotations

import builtins
import logging
import threading
import time
from dataclasses import dataclass, replace

from vipu.controller.core.changes import MAX_WATCHERS
from vipu.controller.core.commands import START_SECONDS, CancelRequest
from vipu.controller.core.snapshot import Waiting
from vipu.controller.usecases.partitions import Created, PartitionService
from vipu.model import lifecycle
from vipu.model.configuration import GcdConfig
from vipu.model.entities import OPEN_ACCESS, Access, Partition, PartitionRequest, ReadyState, shown
from vipu.model.errors import Conflict, InvalidArgument, NotFound
from vipu.model.waiting import MAX_WAIT_SECONDS, WAIT_CALL_SECONDS

log = logging.getLogger(__name__)

__all__ = ["RequestService", "Settled", "Waiting", "waiting_places"]


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
        self.owners = partitions.owners
        self._waiting_calls = threading.BoundedSemaphore(waiting_places(workers, watchers))

    def create(self, request: PartitionRequest, access: Access = OPEN_ACCESS, keep_on_error: bool = False,
               wait_seconds: float = 0.0, detached: bool = False) -> Created | Waiting:
        """Create the partition now if it fits (as `PartitionService.create_with_ipuof`); else, given
        `wait_seconds`, queue the request and say where it waits and why. A queued request is
        withdrawn once nobody has asked after it (`wait`) for the queue's lease, unless `detached`."""
        if wait_seconds < 0 or wait_seconds > MAX_WAIT_SECONDS:
            raise InvalidArgument(f"a request waits from 1 s to {MAX_WAIT_SECONDS} s (7 days), not {wait_seconds:g} s")
        return self.partitions.create_or_queue(request, access, keep_on_error, wait_seconds, self._least_work_ahead, detached)

    def _least_work_ahead(self, allocation_ids: tuple[str, ...]) -> str:
        """Of the allocations a request could fit in, the one with the fewest IPUs in use and waiting."""
        def work(allocation_id: str) -> int:
            owner = self.owners.owner(allocation_id)
            if owner is None:
                return 1 << 62
            snapshot = owner.snapshot
            return sum(len(ipus) for ipus in snapshot.used.values()) + snapshot.queue.waiting_ipus

        return min(allocation_ids, key=lambda a: (work(a), a))

    def wait(self, partition_id: str, seconds: float, access: Access = OPEN_ACCESS) -> Settled:
        """Until the partition is settled (ACTIVE or ERROR), or for at most `seconds` (bounded by
        WAIT_CALL_SECONDS) while its request waits or its create is under way; then what it is,
        `busy` if every waiting place was taken so that the call did not wait. A request that
        ended without a partition raises how it ended."""
        asked = min(max(seconds, 0.0), WAIT_CALL_SECONDS)
        self._renew(partition_id, access)
        blocking = asked > 0 and self._waiting_calls.acquire(blocking=False)  # else answer at once: threads stay free
        busy = asked > 0 and not blocking
        deadline = time.monotonic() + (asked if blocking else 0.0)
        try:
            while True:
                seen = self.owners.version
                settled = self._settled(partition_id, access)
                remaining = deadline - time.monotonic()
                if settled is not None and (settled.waiting is None or remaining <= 0):
                    return replace(settled, busy=busy)
                if remaining <= 0:
                    return Settled(partition=self.partitions.get(partition_id, access), busy=busy)  # its create is under way
                self.owners.wait_for_change(seen, remaining)
        finally:
            if blocking:
                self._waiting_calls.release()
            self._renew(partition_id, access)

    def _renew(self, partition_id: str, access: Access) -> None:
        """Its waiter asks after a waiting request: its lease starts again (at each end of a call, so
        that the time between calls is what counts)."""
        owner = self.owners.holding(partition_id)
        if owner is not None and access.may_use(owner.id):
            owner.renew(partition_id)

    def _settled(self, partition_id: str, access: Access) -> Settled | None:
        """The partition if it is settled, or its request if it waits; None while an operation on it is under way."""
        owner = self.owners.holding(partition_id)
        if owner is not None and access.may_use(owner.id):
            snapshot = owner.snapshot
            partition = snapshot.partitions.get(partition_id)
            if partition is not None:
                if lifecycle.state_of(partition) in lifecycle.BUSY or partition_id in snapshot.busy:
                    return None  # an operation is under way: a failed create, say, that moves it elsewhere
                if partition.ready_state is ReadyState.ACTIVE:
                    return Settled(*self.partitions.with_ipuof(lifecycle.copy(partition)))
                return Settled(lifecycle.copy(partition))
            request = snapshot.queue.get(partition_id)
            if request is not None:
                return Settled(waiting=snapshot.queue.seen(request))
            if partition_id in snapshot.busy:
                return None
        ended = self.owners.ending(partition_id)
        if ended is not None and access.may_use(ended[0]):
            raise ended[1]
        raise NotFound(f"partition {shown(partition_id)} does not exist and no request of it waits")

    def list(self, allocation_id: str = "", access: Access = OPEN_ACCESS) -> list[Waiting]:
        """The waiting requests of the allocations the caller may use (or of one), each queue in order."""
        if allocation_id:
            self.partitions.allocation(allocation_id, access)
            owner = self.owners.owner(allocation_id)
            snapshots = [owner.snapshot] if owner is not None else []
        else:
            snapshots = [s for s in self.owners.snapshots() if access.may_use(s.id)]
        return [s.queue.seen(request) for s in snapshots for request in s.queue.requests]

    def cancel(self, partition_id: str, access: Access = OPEN_ACCESS) -> None:
        """Cancel a waiting request: its user's, or anyone's for an administrator."""
        owner = self.owners.holding(partition_id)
        if owner is None or not access.may_use(owner.id):
            raise NotFound(f"no request of partition {shown(partition_id)} waits")
        command = CancelRequest(partition_id=partition_id, access=access)
        owner.submit(command)
        command.reply.wait(START_SECONDS, f"the cancel of the request of partition {partition_id}")

    def remove(self, partition_id: str, force: bool = False, access: Access = OPEN_ACCESS) -> builtins.list[str]:
        """Remove a partition, or cancel its request if it still waits (what integrations call when a
        job ends). A request that starts meanwhile has its partition removed instead (a forced
        remove waits for its create to end). Returns the agents a forced remove could not clear."""
        owner = self.owners.holding(partition_id)
        if owner is not None and partition_id not in owner.snapshot.partitions and owner.snapshot.queue.get(partition_id):
            try:
                self.cancel(partition_id, access)
                return []
            except Conflict as started:  # granted meanwhile: it is a partition now, or about to be
                log.info("partition %s: %s; removing the partition instead", partition_id, started.message)
                self._settle_start(partition_id)
        return self.partitions.remove(partition_id, force=force, access=access)

    def _settle_start(self, partition_id: str, seconds: float = 5.0) -> None:
        """Until the partition of a request granted meanwhile is committed and seen, briefly."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            seen = self.owners.version
            owner = self.owners.holding(partition_id)
            if owner is None or partition_id in owner.snapshot.partitions:
                return
            self.owners.wait_for_change(seen, deadline - time.monotonic())
