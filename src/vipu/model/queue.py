"""Waiting for room: requests queued in an allocation, and which of them may start now.

A request that does not fit when it arrives may wait (`vipu create partition --wait`). It waits in
one allocation's queue, first come, first served, with backfill:

- the first request starts as soon as any shape of it is free;
- until then a shape of it is held for it (`choose_held_shape`: the one the fewest partitions
  block): as those partitions end, their IPUs stay free for it, so it starts no later than the
  last of them ends, whatever else happens meanwhile;
- a request behind it, or a new one, starts ahead of it on IPUs outside that shape; or inside it
  when it is expected to end before the shape is needed (EASY backfill, as Slurm's): the held
  shape's expected start is the latest expected end of the partitions on it, and a request with
  an expected duration that ends by then may use its free IPUs. A request of unknown duration,
  or a held shape with a partition of unknown end on it, keeps the held IPUs for the first
  request alone. So a request behind the first delays its start only by outrunning its expected
  duration.

A waiting request is not a partition: it holds no IPUs, the published API has no state for it,
and it ends by becoming a partition or by going away. It has this small life cycle of its own,
which the store applies as a compare-and-set on the request's arrival number:

    enqueue  ABSENT  -> WAITING
    grant    WAITING -> ABSENT   (the same store transaction creates its partition, PENDING/CREATING)
    cancel   WAITING -> ABSENT   (by its user, an administrator, or with its allocation)
    expire   WAITING -> ABSENT   (its deadline passed: no request waits without one)
"""

from __future__ import annotations

from bisect import bisect_left, insort
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping, Sequence, Set
from dataclasses import dataclass, field
from datetime import datetime
from heapq import heapify, heappop, heappush
from typing import Generic, TypeVar

import immutables

from vipu.model.entities import PartitionRequest
from vipu.model.errors import Conflict
from vipu.model.placement import Placement, Shape, shifted
from vipu.model.waiting import ends_in_time

WAITING = "WAITING"
ABSENT = None


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
    detached: bool = False  # made to be picked up later: no waiter renews a lease on it (`vipu.controller.core.queueing`)
    held: Shape = field(default_factory=frozenset)  # the IPUs held for it while it is first

    @property
    def partition_id(self) -> str:
        return self.request.id

    @property
    def size(self) -> int:
        return self.request.size


T = TypeVar("T")
Used = Mapping[str, Set[int]]


def shape_of(request: PartitionRequest) -> Hashable:
    """What placement decides a request by: requests alike in it fit, or not, together (but for
    the reservations to come, which a request's expected duration may let it start on)."""
    return (request.size, request.num_gcds, request.num_segments, request.ipulink_routing, request.gw_routing,
            request.explicit_ipus, request.index, request.reservation)


class Lines(Generic[T]):
    """Waiting requests in arrival order, and in lines of one shape each (each line in arrival order),
    so that a pass over the queue asks placement once per line rather than once per request, and a
    request's place is found without counting those ahead of it.

    `key_of` names a request, `shape_of` gives its line, `sequence_of` its arrival number and
    `weight_of` what it counts for in `weight` (the IPUs it asks for, say). A new request is
    appended, so every change costs the same however many wait, but for the memmove of two lists
    (a few microseconds for ten thousand). The requests by key are an immutable map (`by_key`: a
    change makes a new one sharing all but a path of the old), so a snapshot takes it as it is."""

    def __init__(self, key_of: Callable[[T], Hashable], shape_of: Callable[[T], Hashable], sequence_of: Callable[[T], int],
                 weight_of: Callable[[T], int] = lambda item: 1):
        self.key_of, self.shape_of, self.sequence_of, self.weight_of = key_of, shape_of, sequence_of, weight_of
        self._items: list[T] = []  # in arrival order
        self._sequences: list[int] = []  # their arrival numbers, in the same order
        self._by_key: immutables.Map[Hashable, T] = immutables.Map()
        self._lines: dict[Hashable, list[T]] = {}
        self.weight = 0

    @classmethod
    def of(cls, items: Iterable[T], shape: Callable[[T], Hashable] | None = None) -> Lines[T]:
        """Items in arrival order, each its own line unless `shape` groups them."""
        listed = list(items)
        number = {id(item): n for n, item in enumerate(listed)}
        lines = cls(id, shape or id, lambda item: number[id(item)])
        for item in listed:
            lines.add(item)
        return lines

    def add(self, item: T) -> None:
        """A request that arrived after every other; or one put back in its place (a change that
        was not committed after all)."""
        sequence = self.sequence_of(item)
        line = self._lines.setdefault(self.shape_of(item), [])
        self._by_key = self._by_key.set(self.key_of(item), item)
        self.weight += self.weight_of(item)
        if not self._sequences or sequence > self._sequences[-1]:
            self._sequences.append(sequence)
            self._items.append(item)
            line.append(item)
            return
        at = bisect_left(self._sequences, sequence)
        self._sequences.insert(at, sequence)
        self._items.insert(at, item)
        insort(line, item, key=self.sequence_of)

    def remove(self, key: Hashable) -> T | None:
        item = self._by_key.get(key)
        if item is None:
            return None
        self._by_key = self._by_key.delete(key)
        at = bisect_left(self._sequences, self.sequence_of(item))
        del self._sequences[at]
        del self._items[at]
        self.weight -= self.weight_of(item)
        shape = self.shape_of(item)
        line = self._lines[shape]
        line.remove(item)
        if not line:
            del self._lines[shape]
        return item

    def get(self, key: Hashable) -> T | None:
        return self._by_key.get(key)

    def first(self) -> T | None:
        return self._items[0] if self._items else None

    def position(self, item: T) -> int:
        """Its place in the queue, from 1."""
        return bisect_left(self._sequences, self.sequence_of(item)) + 1

    def lines(self) -> dict[Hashable, list[T]]:
        """Each shape's line, in arrival order (not to be changed)."""
        return self._lines

    @property
    def by_key(self) -> immutables.Map[Hashable, T]:
        """The requests by key, as they are now (immutable: a later change makes another map)."""
        return self._by_key

    def sequences(self) -> tuple[int, ...]:
        """The arrival numbers, in order (a copy, made in C: tens of microseconds for ten thousand)."""
        return tuple(self._sequences)

    def __iter__(self) -> Iterator[T]:
        return iter(self._items)

    def __len__(self) -> int:
        return len(self._items)


@dataclass(frozen=True)
class Admission(Generic[T]):
    """What one pass over a queue decides: the requests that start now, where, in the order they
    start; then the first request still waiting, the IPUs held for it, and when they are expected
    to be free (None: unknown, or no expected durations were given)."""

    started: tuple[tuple[T, Placement], ...]
    first: T | None
    held: Shape
    expected_start: float | None = None


Ipu = tuple[str, int]  # (agent, index)


def admit(queue: Lines[T] | Sequence[T], used: Used, place: Callable[[T, Used], Placement | None],
          choose_held: Callable[[T, Used, Sequence[tuple[T, Placement]]], Shape], held: Shape = frozenset(),
          backfill: bool = True, *, expected_duration: Callable[[T], float | None] | None = None,
          expected_ends: Mapping[Ipu, float | None] | None = None, now: float = 0.0,
          allowed: Callable[[T, Sequence[tuple[T, Placement]]], bool] | None = None) -> Admission[T]:
    """Which of the waiting requests (in arrival order) start now, against the IPUs `used`.

    `place(request, used)` is placement (None: no room); `choose_held(request, used, started)`
    picks the shape to hold for a first request that does not fit, `used` counting the requests
    `started` ahead of it in this pass (and where); `held` is what is already held for the
    queue's first request (kept while it stays first, so that what backfill decided around it
    stays true). Without `backfill`, nothing starts ahead of the first request: plain FIFO, the
    baseline the allocator benchmark compares against.

    Durations, in any one unit of time: `expected_duration(request)` is how long a request is
    expected to run (None: unknown), `expected_ends[ipu]` when the partition on an IPU in use is
    expected to end (missing or None: unknown), `now` the time of the pass. With them, a request
    behind the first may also start on free IPUs of the held shape if now plus its duration is
    no later than the held shape's expected start (the module's backfill rule). Without them,
    nothing starts inside the held shape.

    `allowed(request, started)`, if given, says whether a request may start at all now, those
    `started` ahead of it in this pass counted (an account's quota, say): one that may not is
    passed over, neither started nor first, and so holds nothing. A request behind the first may
    backfill only if the first is still allowed with it started (asked with `started` and it): so
    an account's small requests do not take the quota its held request needs. The `started` it
    is given is this pass's list, or that list with the one supposed start added.

    Placement is asked once per line of requests of one shape, and again only for a request that
    started: requests of one shape fit or not together, and what is free only shrinks as the pass
    starts requests, so a line that did not fit does not fit again in the same pass. Backfill goes
    through the lines' requests in arrival order all the same, a line at a time where it fits.
    With a known expected start, a line that does not fit outside the held shape is asked once
    more, with the held shape's free IPUs, for its first request short enough to end in time (so
    twice per line at most): finding it compares durations along the line, not placement.
    """
    lines = queue if isinstance(queue, Lines) else Lines.of(queue)
    taken = shifted(used)
    started: list[tuple[T, Placement]] = []
    first: T | None = None
    settled: set[int] = set()  # the requests started, or first, or not allowed (by id): backfill passes over them
    ends_started: dict[Ipu, float | None] = {}  # the expected ends of what this pass started ahead of the first
    for request in lines:
        if allowed is not None and not allowed(request, started):
            settled.add(id(request))
            continue
        placement = place(request, taken)
        if placement is None:
            first = request
            break
        started.append((request, placement))
        _take(taken, placement)
        if expected_duration is not None:
            duration = expected_duration(request)
            ends_started.update(((ipu.agent_id, ipu.index), None if duration is None else now + duration) for ipu in placement.ipus)
        settled.add(id(request))
        held = frozenset()
    if first is None:
        return Admission(tuple(started), None, frozenset())
    if not held:
        held = choose_held(first, taken, started)
    expected_start = None
    if expected_duration is not None and held:
        expected_start = held_free_at(held, taken, ends_started, expected_ends or {}, now)
    if backfill:
        inside = taken  # what is free to a request that ends before the held shape is needed
        outside = shifted(taken, on=held)

        def in_time(request: T) -> bool:
            return ends_in_time(expected_duration(request) if expected_duration is not None else None, expected_start, now)

        def next_open(line: list[T], position: int, ending_in_time: bool) -> int:
            """The next request of the line from `position` that may start: not settled, allowed by
            `allowed`, and, once the line fits only inside the held shape, expected to end in time."""
            while position < len(line):
                request = line[position]
                if id(request) not in settled and (not ending_in_time or in_time(request)):
                    if allowed is None or allowed(request, started):
                        return position
                    settled.add(id(request))
                position += 1
            return position

        settled.add(id(first))
        fronts = []
        for n, line in enumerate(lines.lines().values()):
            position = next_open(line, 0, False)
            if position < len(line):
                fronts.append((lines.sequence_of(line[position]), n, position, line, True))
        heapify(fronts)
        while fronts:
            _, n, position, line, fits_outside = heappop(fronts)
            if allowed is not None and not allowed(line[position], started):  # what started since it was pushed counts
                settled.add(id(line[position]))
                position = next_open(line, position + 1, not fits_outside)
                if position < len(line):
                    heappush(fronts, (lines.sequence_of(line[position]), n, position, line, fits_outside))
                continue
            placement = place(line[position], outside) if fits_outside else None
            if placement is None and fits_outside:  # from here on, only what ends in time may start, inside
                fits_outside = False
                position = next_open(line, position, True) if expected_start is not None else len(line)
                if position == len(line):
                    continue  # the rest of its line waits too
            if placement is None:
                placement = place(line[position], inside)
                if placement is None:
                    continue  # not even the held IPUs make room: the rest of its line waits too
            if allowed is not None and not allowed(first, [*started, (line[position], placement)]):
                settled.add(id(line[position]))  # it would take what the first needs of its quota: it waits
                position = next_open(line, position + 1, not fits_outside)
                if position < len(line):
                    heappush(fronts, (lines.sequence_of(line[position]), n, position, line, fits_outside))
                continue
            started.append((line[position], placement))
            _take(outside, placement)
            _take(inside, placement)
            settled.add(id(line[position]))
            position = next_open(line, position + 1, not fits_outside)
            if position < len(line):
                heappush(fronts, (lines.sequence_of(line[position]), n, position, line, fits_outside))
    return Admission(tuple(started), first, held, expected_start)


def held_free_at(held: Shape, taken: Used, ends_started: Mapping[Ipu, float | None],
                 expected_ends: Mapping[Ipu, float | None], now: float) -> float | None:
    """When the held IPUs are expected to be free: the latest expected end of the partitions on
    them (now, if none is on them); None if any of those ends is unknown."""
    latest = now
    for agent, index in held:
        if index not in taken.get(agent, ()):
            continue
        end = ends_started[(agent, index)] if (agent, index) in ends_started else expected_ends.get((agent, index))
        if end is None:
            return None
        latest = max(latest, end)
    return latest


def _take(used: dict[str, set[int]], placement: Placement) -> None:
    for ipu in placement.ipus:
        used.setdefault(ipu.agent_id, set()).add(ipu.index)
