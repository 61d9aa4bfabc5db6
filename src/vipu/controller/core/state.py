"""An allocation as its owner holds it: the one copy of its partitions, IPUs, queue, claims and loan.

Only the owner's thread reads or changes an `AllocationState`; readers get the snapshots it
publishes. The owner changes it as it stages each write of a turn (so that the next placement in
the same turn sees the IPUs just taken) and undoes a write the store refused before it publishes,
so nothing here is seen before it is committed.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections import Counter
from collections.abc import Iterable

from vipu.controller.core.lending import Loan
from vipu.model import queue as queue_model
from vipu.model.accounts import FairShare
from vipu.model.compaction import BudgetSpent
from vipu.model.entities import Allocation, Drain, Partition
from vipu.model.fragmentation import SizeMix
from vipu.model.linkhealth import NO_FAULTS, LinkFaults
from vipu.model.placement import Shape, shifted
from vipu.model.queue import WaitingRequest
from vipu.model.reasons import unconfirmed
from vipu.model.reservations import Reservation, kept_from, outside
from vipu.model.topology import ClusterLayout

REMOVAL_RETRY_SECONDS = 10.0  # a removal at a deadline that failed is tried again this long after

Ipu = tuple[str, int]


def request_lines() -> queue_model.Lines[WaitingRequest]:
    """An allocation's queue: its requests in arrival order, in lines of one shape each."""
    return queue_model.Lines(lambda r: r.partition_id, lambda r: queue_model.shape_of(r.request), lambda r: r.sequence,
                             lambda r: r.size)


@dataclasses.dataclass
class AllocationState:
    allocation: Allocation
    layout: ClusterLayout
    partitions: dict[str, Partition] = dataclasses.field(default_factory=dict)
    used: dict[str, set[int]] = dataclasses.field(default_factory=dict)  # agent -> IPUs taken, as placement reads them
    lingering: dict[str, frozenset[Ipu]] = dataclasses.field(default_factory=dict)  # a moving partition's old IPUs, until cleared
    uncleared: dict[tuple[str, str], frozenset[Ipu]] = dataclasses.field(default_factory=dict)  # (agent, partition) -> IPUs its
    # machine may still hold settings on: forgotten or moved while that agent did not confirm the clear, until it is seen cleared
    queue: queue_model.Lines[WaitingRequest] = dataclasses.field(default_factory=request_lines)
    held: Shape = frozenset()  # the IPUs held for the first waiting request, `held_for`
    held_for: str = ""
    held_recorded: tuple[str, Shape] | None = None  # (request, IPUs) the store holds; None: not known to be recorded
    down: set[str] = dataclasses.field(default_factory=set)
    draining: dict[str, Drain] = dataclasses.field(default_factory=dict)  # machines an operator drains: nothing is placed there
    # (and those of a maintenance window under way, drained by it)
    reservations: dict[str, Reservation] = dataclasses.field(default_factory=dict)  # by name, as committed
    steered_at: float = 0.0  # when `draining` was last worked out (epoch seconds): a reservation's start or end since is to act on
    # Partitions a deadline removes (a drain's, a reclaim's) -> when their removal may be tried again (seconds since the
    # epoch, REMOVAL_RETRY_SECONDS after the last try), should it fail.
    removals_after: dict[str, float] = dataclasses.field(default_factory=dict)
    # Agents whose machines a power action is under way on: until when (monotonic), and the action's token.
    powering_until: dict[str, tuple[float, object]] = dataclasses.field(default_factory=dict)
    test: str = ""  # the disruptive cluster test holding every machine
    # Drained machines a cluster test claims alone -> that test: nothing is placed there until it ends,
    # though they be resumed meanwhile.
    claimed: dict[str, str] = dataclasses.field(default_factory=dict)
    loan: Loan | None = None  # its free machines lent to an idle-time test, which any partition takes back
    links: LinkFaults = NO_FAULTS  # its machines' unhealthy links, as the link ledger last said
    mix: SizeMix = dataclasses.field(default_factory=SizeMix)  # the sizes it has been asked for, which placement weighs
    # The (partition id, size) of requests refused for want of room lately, the least recently
    # refused first: asked again, they are not counted in the mix again (the last
    # `decisions.REFUSALS_REMEMBERED`; one that starts or waits is forgotten).
    refused: dict[tuple[str, int], None] = dataclasses.field(default_factory=dict)
    compactions: int = 0  # compactions under way (an administrator's, the queue's)
    # (first request, IPUs in use, machines up, links, budget room) the queue last looked for a plan at
    compaction_looked: tuple[object, ...] | None = None
    compaction: BudgetSpent | None = None  # its compaction moves of late, counted at the first compaction
    closing: bool = False
    usage: FairShare = dataclasses.field(default_factory=FairShare)  # its accounts' decayed usage (`vipu.model.accounts`)
    reclaiming: dict[str, float] = dataclasses.field(default_factory=dict)  # partitions a reclaim removes -> when (epoch seconds)
    # Waiting requests that reclaimed quota -> (their account, the accounts reclaimed from, the partitions
    # noticed): those accounts borrow nothing while the request waits (in memory: a new owner forgets it).
    reclaimed_for: dict[str, tuple[str, frozenset[str], frozenset[str]]] = dataclasses.field(default_factory=dict)
    _counts: Counter[Ipu] = dataclasses.field(default_factory=Counter)  # IPU -> how many hold it (a move and its old self)
    touched: set[str] = dataclasses.field(default_factory=set)  # agents whose IPUs in use changed since the last snapshot

    @classmethod
    def of(cls, allocation: Allocation, layout: ClusterLayout, partitions: Iterable[Partition],
           requests: Iterable[WaitingRequest], down: set[str], draining: dict[str, Drain] | None = None,
           links: LinkFaults = NO_FAULTS, reservations: Iterable[Reservation] = ()) -> AllocationState:
        state = cls(allocation, layout, down=down, links=links.within(set(allocation.agent_ids)),
                    reservations={r.name: r for r in reservations})
        state.draining = state.with_windows(draining or {}, time.time())
        for partition in partitions:
            state.put(partition)
        for request in requests:
            state.queue.add(request)
        state.mix = SizeMix.of([p.size for p in state.partitions.values()] + [r.request.size for r in state.queue])
        first = next((r for r in state.queue if r.held), state.queue.first())  # fair share's first may not be the first to come
        if first is not None:
            state.held, state.held_for = first.held, first.partition_id
            state.held_recorded = (first.partition_id, first.held)
        return state

    def _take(self, ipus: Iterable[Ipu]) -> None:
        for ipu in ipus:
            self._counts[ipu] += 1
            if self._counts[ipu] == 1:
                self.used.setdefault(ipu[0], set()).add(ipu[1])
                self.touched.add(ipu[0])

    def _free(self, ipus: Iterable[Ipu]) -> None:
        for ipu in ipus:
            self._counts[ipu] -= 1
            if self._counts[ipu] <= 0:
                del self._counts[ipu]
                self.touched.add(ipu[0])
                indices = self.used.get(ipu[0])
                if indices is not None:
                    indices.discard(ipu[1])
                    if not indices:
                        del self.used[ipu[0]]

    def put(self, partition: Partition) -> Partition | None:
        """A partition new or changed; the one it replaces."""
        old = self.partitions.get(partition.id)
        if old is not None:
            self._free((i.agent_id, i.index) for i in old.ipus)
        self.partitions[partition.id] = partition
        self._take((i.agent_id, i.index) for i in partition.ipus)
        if partition.reclaim_at:
            self.reclaiming[partition.id] = partition.reclaim_at
        elif self.reclaiming:
            self.reclaiming.pop(partition.id, None)
        return old

    def drop(self, partition_id: str) -> Partition | None:
        old = self.partitions.pop(partition_id, None)
        if old is not None:
            self._free((i.agent_id, i.index) for i in old.ipus)
        if self.reclaiming:
            self.reclaiming.pop(partition_id, None)
        return old

    def linger(self, partition: Partition) -> None:
        """A partition about to move: its present IPUs stay taken until `unlinger`."""
        ipus = frozenset((i.agent_id, i.index) for i in partition.ipus)
        self.unlinger(partition.id)
        self.lingering[partition.id] = ipus
        self._take(ipus)

    def unlinger(self, partition_id: str) -> bool:
        """The old machines of a moved partition are cleared (or the move did not happen); whether any lingered."""
        ipus = self.lingering.pop(partition_id, None)
        if ipus is None:
            return False
        self._free(ipus)
        return True

    def keep_uncleared(self, agent_id: str, partition_id: str, indices: Iterable[int]) -> None:
        """IPUs of an agent that may still hold a partition's settings stay out of placement (a
        create sent there would meet those settings) until `cleared`."""
        ipus = frozenset((agent_id, index) for index in indices)
        self.cleared(agent_id, partition_id)
        self.uncleared[(agent_id, partition_id)] = ipus
        self._take(ipus)

    def cleared(self, agent_id: str, partition_id: str) -> bool:
        """An agent is seen holding nothing of the partition (any more); whether IPUs were kept for it."""
        ipus = self.uncleared.pop((agent_id, partition_id), None)
        if ipus is None:
            return False
        self._free(ipus)
        return True

    def keep_out_as(self, failed: AllocationState) -> None:
        """A state made again from the store after its owner failed keeps out what the failed one
        knew only in memory and the store cannot tell: IPUs whose clear no agent confirmed, and
        machines a power action is under way on."""
        for (agent_id, partition_id), ipus in failed.uncleared.items():
            self.keep_uncleared(agent_id, partition_id, [index for _, index in ipus])
        for agent_id, (until, token) in failed.powering_until.items():
            self.keep_down_for_power([agent_id], until, token)

    def kept_out(self) -> dict[str, frozenset[Ipu]]:
        """IPUs taken by no partition that placement must not use yet, by the partition they were
        last of: a moving partition's old IPUs, and those whose clear is unconfirmed (by
        `reasons.unconfirmed`, naming the machine, once that partition is gone)."""
        kept = dict(self.lingering)
        for (agent_id, partition_id), ipus in self.uncleared.items():
            holder = partition_id if partition_id in self.partitions else unconfirmed(agent_id, partition_id)
            kept[holder] = kept.get(holder, frozenset()) | ipus
        return kept

    def kept_for_move(self, partition: Partition, now: float) -> dict[Ipu, Reservation]:
        """The IPUs a partition may not move to now for the reservations: as for a request of the
        reservation it was made in while that is under way (after it, as for any partition),
        expected to run until the partition's expected end."""
        if not self.reservations:
            return {}
        made_in = self.reservations.get(partition.reservation) if partition.reservation else None
        own = partition.reservation if made_in is not None and made_in.under_way(now) else ""
        end = partition.expected_end
        left = math.ceil(end.timestamp() - now) if end is not None and end.timestamp() > now else 0
        return self.kept_for_reservations(own, left, now)

    def taken_for_move(self, partition: Partition, now: float) -> dict[str, set[int]]:
        """The IPUs a move of the partition may not take: those in use, those held for the first
        waiting request while one waits, and those kept for reservations (`kept_for_move`)."""
        held = self.held if self.queue.first() is not None else frozenset()
        return shifted(self.used, on=held | self.kept_for_move(partition, now).keys())

    def with_windows(self, drains: dict[str, Drain], now: float) -> dict[str, Drain]:
        """The machines drained, given those an operator drains: those and the machines of every
        maintenance window under way at `now` (an operator's drain of one is what it shows). It
        notes `now` as when the drains were worked out (`steered_at`)."""
        self.steered_at = now
        windows = [r for r in self.reservations.values() if r.maintenance and r.under_way(now)]
        if not windows:
            return dict(drains)
        return {**{agent: window.drain() for window in windows for agent in window.agent_ids}, **drains}

    def unplaceable(self) -> set[str]:
        """The machines no partition is placed on, nor moved to: those down, those draining, and
        those a cluster test claims."""
        if not self.draining and not self.claimed:
            return self.down
        return self.down | self.draining.keys() | self.claimed.keys()

    def taken(self) -> dict[str, set[int]]:
        """The IPUs no move may take and no freed shape counts: those in use, those held for the
        first waiting request while one waits, and those of reservations not over (compaction, a
        reset that re-places, a move's target)."""
        held = self.held if self.queue.first() is not None else frozenset()
        return shifted(self.used, on=held | self.reserved(time.time()) if self.reservations else held)

    def reserved(self, now: float) -> frozenset[Ipu]:
        """The IPUs of the reservations not over at `now`."""
        return frozenset(ipu for r in self.reservations.values() if not r.ended(now) for ipu in r.ipus)

    def kept_for_reservations(self, named: str, expected_seconds: int, now: float) -> dict[Ipu, Reservation]:
        """The IPUs a request may not be placed on now for the reservations (`reservations.kept_from`);
        for one made in a reservation, every IPU outside it too, and its own until it starts."""
        if not self.reservations:
            return {}
        kept = kept_from(self.reservations.values(), named, expected_seconds, now)
        reservation = self.reservations.get(named)
        if reservation is not None:
            kept.update(outside(reservation, self.allocation.agent_ids))
            if not reservation.started(now) or reservation.ended(now):
                kept.update(dict.fromkeys(reservation.ipus, reservation))
        return kept

    def holders(self) -> dict[Ipu, str]:
        holding = {ipu: partition_id for partition_id, ipus in self.kept_out().items() for ipu in ipus}
        holding.update({(ipu.agent_id, ipu.index): p.id for p in self.partitions.values() for ipu in p.ipus})
        return holding

    def on_agent(self, agent_id: str) -> list[Partition]:
        return [p for p in self.partitions.values() if any(i.agent_id == agent_id for i in p.ipus)]

    def powering(self, agent_id: str) -> bool:
        """Whether a power action is under way on the agent's machine now; one past its deadline no longer does."""
        held = self.powering_until.get(agent_id)
        if held is not None and time.monotonic() > held[0]:
            del self.powering_until[agent_id]
            held = None
        return held is not None

    def keep_down_for_power(self, agent_ids: Iterable[str], until: float, token: object) -> set[str]:
        """Keep these machines down (out of placement, deaf to health passes) for a power action,
        until `until` at most; those it put down that were not."""
        added = set()
        for agent_id in agent_ids:
            self.powering_until[agent_id] = (until, token)
            if agent_id not in self.down:
                self.down.add(agent_id)
                added.add(agent_id)
        return added

    def release_power(self, agent_ids: Iterable[str], token: object, answering: Iterable[str] = ()) -> None:
        """The power action `token` ended: its machines are no longer kept down for it, and those
        `answering` (just configured) are up again; the others stay down until a health pass finds them."""
        for agent_id in agent_ids:
            if self.powering_until.get(agent_id, (0.0, None))[1] is token:
                del self.powering_until[agent_id]
        self.down.difference_update(answering)
