"""Waiting for room: requests queued in an allocation, and which of them may start now.

A request that does not fit when it arrives may wait (`vipu create partition --wait`). It waits in
one allocation's queue, first come, first served, with backfill:

- the first request starts as soon as any shape of it is free;
- until then a shape of it is held for it (`choose_reservation`: the one the fewest partitions
  block): as those partitions end, their IPUs stay free for it, so it starts no later than the
  last of them ends, whatever else happens meanwhile;
- a request behind it, or a new one, starts ahead of it only on IPUs outside that shape, so it
  cannot delay the first one's start.

A waiting request is not a partition: it holds no IPUs, the published API has no state for it,
and it ends by becoming a partition or by going away. It has this small life cycle of its own,
which the store applies as a compare-and-set on the request's arrival number:

    enqueue  ABSENT  -> WAITING
    grant    WAITING -> ABSENT   (the same store transaction creates its partition, PENDING/CREATING)
    cancel   WAITING -> ABSENT   (by its user, an administrator, or with its allocation)
    expire   WAITING -> ABSENT   (its deadline passed: no request waits without one)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence, Set
from dataclasses import dataclass, field
from datetime import datetime
from typing import Generic, TypeVar

from vipu.model.entities import PartitionRequest
from vipu.model.errors import Conflict
from vipu.model.placement import Placement, Shape

WAITING = "WAITING"
ABSENT = None

# The longest a request may wait: no request waits without a deadline.
MAX_WAIT_SECONDS = 7 * 24 * 3600
# The longest one waiting call (the API's WaitPartition) lasts; clients call again until their own deadline.
WAIT_CALL_SECONDS = 20

TRANSITIONS: dict[str, dict[str | None, str | None]] = {
    "enqueue": {ABSENT: WAITING},
    "grant": {WAITING: ABSENT},
    "cancel": {WAITING: ABSENT},
    "expire": {WAITING: ABSENT},
}


def target(partition_id: str, transition: str, source: str | None) -> str | None:
    """The state `transition` takes a request to from `source`; a `Conflict` if the table has no such move."""
    moves = TRANSITIONS.get(transition)
    if moves is None:
        raise ValueError(f"no transition named {transition!r} in the request life cycle")
    if source not in moves:
        raise Conflict(f"the request for partition {partition_id} is {'already waiting' if source else 'no longer waiting'}: "
                       f"'{transition}' does not apply")
    return moves[source]


@dataclass
class WaitingRequest:
    """A partition request waiting in an allocation's queue."""

    request: PartitionRequest
    allocation_id: str
    owner: str  # the user who asked; empty in open mode
    since: datetime  # UTC
    deadline: datetime  # UTC: it goes away then, if it has not started
    keep_on_error: bool = False
    sequence: int = 0  # its place in arrival order, given by the store
    held: Shape = field(default_factory=frozenset)  # the IPUs held for it while it is first

    @property
    def partition_id(self) -> str:
        return self.request.id

    @property
    def size(self) -> int:
        return self.request.size


T = TypeVar("T")
Used = Mapping[str, Set[int]]


@dataclass(frozen=True)
class Admission(Generic[T]):
    """What one pass over a queue decides: the requests that start now, where, in the order they
    start; then the first request still waiting and the IPUs held for it."""

    started: tuple[tuple[T, Placement], ...]
    first: T | None
    held: Shape


def admit(queue: Sequence[T], used: Used, place: Callable[[T, Used], Placement | None],
          choose_held: Callable[[T, Used, Sequence[tuple[T, Placement]]], Shape], held: Shape = frozenset(),
          backfill: bool = True) -> Admission[T]:
    """Which of the waiting requests (in arrival order) start now, against the IPUs `used`.

    `place(request, used)` is placement (None: no room); `choose_held(request, used, started)`
    picks the shape to hold for a first request that does not fit, `used` counting the requests
    `started` ahead of it in this pass (and where); `held` is what is already held for the
    queue's first request (kept while it stays first, so that what backfill decided around it
    stays true). Without `backfill`, nothing starts ahead of the first request: plain FIFO, the
    baseline the allocator benchmark compares against.
    """
    taken = {agent: set(indices) for agent, indices in used.items()}
    started: list[tuple[T, Placement]] = []
    waiting = list(queue)
    while waiting:
        placement = place(waiting[0], taken)
        if placement is None:
            break
        started.append((waiting.pop(0), placement))
        _take(taken, placement)
        held = frozenset()
    if not waiting:
        return Admission(tuple(started), None, frozenset())
    first = waiting[0]
    if not held:
        held = choose_held(first, taken, started)
    if backfill:
        outside = {agent: set(indices) for agent, indices in taken.items()}
        for agent, index in held:
            outside.setdefault(agent, set()).add(index)
        for request in waiting[1:]:
            placement = place(request, outside)
            if placement is not None:
                started.append((request, placement))
                _take(outside, placement)
    return Admission(tuple(started), first, held)


def _take(used: dict[str, set[int]], placement: Placement) -> None:
    for ipu in placement.ipus:
        used.setdefault(ipu.agent_id, set()).add(ipu.index)
