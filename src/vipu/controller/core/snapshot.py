"""What readers see of an allocation: the immutable snapshot its owner publishes after each commit.

Every reader (get, list, IPUoF configuration, capacity, the queue and its reasons, the change
feed, the dashboard through the API) reads the snapshot last published, without a lock: an owner
builds a new one from its committed state and replaces the old in one assignment, so a reader
sees one committed moment whole. Nothing the owner has not committed is in it: a create is
visible from its (PENDING, CREATING) commit, a move on its new IPUs from its 'relocate' commit.

Nothing here is ever changed after it is published; the partitions and requests in it are shared
by every reader and must be copied before any change (`PartitionService.get` hands out copies).
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, field
from functools import cached_property

from vipu.model.entities import IPUS_PER_MACHINE, Allocation, Drain, Partition
from vipu.model.linkhealth import NO_FAULTS, LinkFaults
from vipu.model.placement import Shape
from vipu.model.queue import WaitingRequest, shape_of
from vipu.model.reasons import held_clause, span
from vipu.model.reservations import Reservation
from vipu.model.topology import ClusterLayout

Ipu = tuple[str, int]
NOT_EXPLAINED = "waiting for the next pass over its queue"


@dataclass(frozen=True)
class Waiting:
    """A request as its clients see it: where it waits and why."""

    request: WaitingRequest
    position: int
    reason: str


@dataclass(frozen=True)
class QueueView:
    """An allocation's waiting requests as last committed, and why each waits: placement's verdict
    on each shape of request (once per shape, however many wait). Made for every change of the
    queue, so it shares what it can with the last: the requests by id are an immutable map, and
    only their arrival numbers are copied (a request's place is found by bisecting them)."""

    by_id: Mapping[str, WaitingRequest] = field(default_factory=dict)
    sequences: tuple[int, ...] = ()  # the requests' arrival numbers, in order
    first: WaitingRequest | None = None
    waiting_ipus: int = 0  # the IPUs they ask for, in all
    held: Shape = frozenset()  # the IPUs held for the first request
    held_for: str = ""  # the request they are held for: the first in arrival order, or in fair-share order (`sharing`)
    first_verdict: str = ""  # what placement says of the first request
    verdicts: Mapping[Hashable, str] = field(default_factory=dict)  # shape -> what placement says of requests of it behind the first
    layout: ClusterLayout | None = None
    every: str = ""  # why every request waits, when nothing starts in the allocation (under test, being removed)
    held_needed_at: float | None = None  # when the IPUs held for the first are expected to be needed (epoch seconds); None: unknown
    kept_off_held: frozenset[Hashable] = frozenset()  # the shapes behind the first that free IPUs held for it were kept from
    told: Mapping[str, str] = field(default_factory=dict)  # request -> why it waits, where its account's quota or share decides

    @cached_property
    def requests(self) -> tuple[WaitingRequest, ...]:
        """Every waiting request, in arrival order (sorted when first asked: a listing's cost, not a change's)."""
        return tuple(sorted(self.by_id.values(), key=lambda r: r.sequence))

    def __len__(self) -> int:
        return len(self.sequences)

    def get(self, partition_id: str) -> WaitingRequest | None:
        return self.by_id.get(partition_id)

    def position(self, request: WaitingRequest) -> int:
        """Its place in its allocation's queue, from 1."""
        return bisect_left(self.sequences, request.sequence) + 1

    def seen(self, request: WaitingRequest) -> Waiting:
        position = self.position(request)
        return Waiting(request, position, self.reason_at(position, request, self.first, shape_of(request.request)))

    def reason_at(self, position: int, request: WaitingRequest, first: WaitingRequest | None, shape: Hashable) -> str:
        """Why the request at `position` waits, as the last pass over the queue found it."""
        if self.every:
            return self.every
        if request.partition_id in self.told:
            return self.told[request.partition_id]
        if not self.first_verdict or first is None:
            return NOT_EXPLAINED
        if position == 1:
            where = (f"first in the queue, {span(self.layout, self.held)} held for it" if self.held and self.layout is not None
                     else "first in the queue")
            return f"{where}; {self.first_verdict}"
        where = f"number {position} in the queue, behind {first.partition_id} ({first.size} IPUs)"
        verdict = self.verdicts.get(shape)
        if not verdict:
            return where
        if shape in self.kept_off_held:  # free IPUs it could start on, by its duration
            clause = held_clause(request.request.expected_seconds, first.partition_id, self.held_needed_at, time.time())
            verdict += f"; {clause}" if clause else ""
        return f"{where}; {verdict}"


EMPTY_QUEUE = QueueView()


@dataclass(frozen=True)
class AllocationSnapshot:
    """One allocation as its owner last committed it."""

    allocation: Allocation
    layout: ClusterLayout
    version: int = 0
    partitions: Mapping[str, Partition] = field(default_factory=dict)  # by id
    used: Mapping[str, frozenset[int]] = field(default_factory=dict)  # agent -> IPUs taken (old IPUs of moves included)
    kept_out: Mapping[str, frozenset[Ipu]] = field(default_factory=dict)  # IPUs kept out of use: a move's old ones, those not seen cleared
    busy: Mapping[str, str] = field(default_factory=dict)  # partition id -> the operation under way on it
    queue: QueueView = EMPTY_QUEUE
    down: frozenset[str] = frozenset()  # its machines found down by the last health pass
    test: str = ""  # the cluster test holding its machines (a disruptive one), if any
    claimed: Mapping[str, str] = field(default_factory=dict)  # drained machines a cluster test claims alone -> that test
    lent: tuple[str, ...] = ()  # its machines lent to an idle-time test now (free for any partition all the same)
    closing: bool = False  # being removed
    links: LinkFaults = NO_FAULTS  # its machines' unhealthy links, as the link ledger last said
    draining: Mapping[str, Drain] = field(default_factory=dict)  # its machines drained (by an operator, a maintenance window)
    reservations: Mapping[str, Reservation] = field(default_factory=dict)  # by name

    def link_warnings(self, partition: Partition) -> tuple[str, ...]:
        """What the partition is told of the unhealthy links it runs over, a line each."""
        return tuple(self.links.warnings(self.layout, ((ipu.agent_id, ipu.index) for ipu in partition.ipus)))

    def drain_notices(self, partition: Partition) -> tuple[str, ...]:
        """What the partition is told of the machines it runs on that an operator drains, a line each,
        and of a reclaim of the quota it borrows (`vipu.model.accounts`): what the Slurm job and the IPUJob hear too."""
        drained = tuple(f"agent {agent_id} is {drain.describe()}: {drain.fate(partition.relocatable)}" for agent_id in partition.agent_ids
                        if (drain := self.draining.get(agent_id)) is not None)
        return drained + ((f"partition {partition.id} is {partition.reclaim_notice}",) if partition.reclaim_notice else ())

    @property
    def id(self) -> str:
        return self.allocation.id

    def holders(self) -> dict[Ipu, str]:
        """The partition holding each IPU in use, by (agent, index): a moving partition holds its
        old IPUs too until they are cleared, and a forgotten one those whose clear is unconfirmed."""
        holding = {ipu: partition_id for partition_id, ipus in self.kept_out.items() for ipu in ipus}
        holding.update({(ipu.agent_id, ipu.index): p.id for p in self.partitions.values() for ipu in p.ipus})
        return holding

    def used_ipus(self) -> dict[str, set[int]]:
        """The IPUs in use, by agent, as placement takes them (a copy it may change)."""
        return {agent: set(indices) for agent, indices in self.used.items()}

    @property
    def total_ipus(self) -> int:
        return len(self.allocation.agent_ids) * IPUS_PER_MACHINE
