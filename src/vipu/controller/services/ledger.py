"""The serving controller's own copy of every partition, which its decisions are made from.

It is loaded from the store when the controller starts to serve (at start-up, or when it takes
the lead) and changed only after the store has committed the same change (write-through), so a
crash loses nothing it said. The exceptions are placements: placement reserves a new
partition's IPUs here, or a moving partition's new IPUs, under its allocation's lock, before the
store records them, so that the next placement in the allocation need not wait for that commit;
a reservation the store refuses is undone. A moving partition's old IPUs also stay taken here
(`linger`) until its old machines are cleared, though the store has let them go: a partition
placed on them meanwhile would meet the old settings there.
Placement reads the IPUs in use from here rather than from the store; operations read the
partition they work on from here. Callers get copies, never the entries themselves. After every
change, whoever waits for partitions to change inside the controller (the queue of waiting
requests) is told, and the change is published to the controller's change feed, if given, for
the clients watching (live views).
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Callable, Iterable

from vipu.controller.services.changes import ChangeFeed, Topic
from vipu.model.entities import Partition


def _copy(partition: Partition) -> Partition:
    return dataclasses.replace(partition, ipus=list(partition.ipus), errors=list(partition.errors))


class Ledger:
    def __init__(self, changes: ChangeFeed | None = None) -> None:
        self.changes = changes
        self._lock = threading.Lock()
        self._partitions: dict[str, Partition] = {}
        self._used: dict[str, dict[str, set[int]]] = {}  # allocation id -> agent id -> IPU indices
        self._placing: dict[str, threading.Lock] = {}
        self._lingering: dict[str, tuple[str, frozenset[tuple[str, int]]]] = {}  # partition id -> (allocation, old IPUs)
        self._watchers: list[Callable[[], None]] = []

    def watch(self, changed: Callable[[], None]) -> None:
        """Call `changed()` after every change of a partition (outside the ledger's lock)."""
        self._watchers.append(changed)

    def _changed(self) -> None:
        for changed in self._watchers:
            changed()

    def load(self, partitions: Iterable[Partition]) -> None:
        """Start afresh from what the store holds (the IPUs that moves under way left keep lingering)."""
        with self._lock:
            self._partitions, self._used = {}, {}
            for partition in partitions:
                self._add(_copy(partition))
        self._changed()

    def get(self, partition_id: str) -> Partition | None:
        with self._lock:
            partition = self._partitions.get(partition_id)
            return None if partition is None else _copy(partition)

    def list(self, allocation_id: str | None = None) -> list[Partition]:
        """The partitions (of one allocation), in id order."""
        with self._lock:
            chosen = [p for p in self._partitions.values() if allocation_id is None or p.allocation_id == allocation_id]
            return [_copy(p) for p in sorted(chosen, key=lambda p: p.id)]

    def used_ipus(self, allocation_id: str) -> dict[str, set[int]]:
        """The IPUs the allocation's partitions take, by agent, with those moves left and have not cleared yet."""
        with self._lock:
            used = {agent: set(indices) for agent, indices in self._used.get(allocation_id, {}).items()}
            for allocation, ipus in self._lingering.values():
                if allocation == allocation_id:
                    for agent, index in ipus:
                        used.setdefault(agent, set()).add(index)
            return used

    def holders(self, allocation_id: str) -> dict[tuple[str, int], str]:
        """The partition holding each IPU in use in the allocation, by (agent, index): a moving
        partition holds its old IPUs too until they are cleared."""
        with self._lock:
            held = {ipu: partition_id for partition_id, (allocation, ipus) in self._lingering.items()
                    if allocation == allocation_id for ipu in ipus}
            held.update({(ipu.agent_id, ipu.index): p.id for p in self._partitions.values() if p.allocation_id == allocation_id
                         for ipu in p.ipus})
            return held

    def placing(self, allocation_id: str) -> threading.Lock:
        """The lock under which partitions are placed in one allocation and recorded."""
        with self._lock:
            return self._placing.setdefault(allocation_id, threading.Lock())

    def reserve(self, partition: Partition) -> None:
        """A new partition placed under its allocation's lock, before the store records it."""
        self.record(partition)

    def record(self, partition: Partition) -> None:
        """A partition the store has just committed, new or changed."""
        with self._lock:
            self._remove(partition.id)
            self._add(_copy(partition))
        self._changed()
        self._published(partition.allocation_id)

    def linger(self, partition: Partition) -> None:
        """A partition about to move, under its allocation's lock: its present IPUs stay taken until
        `cleared`, whatever the store and this ledger record of it meanwhile."""
        with self._lock:
            self._lingering[partition.id] = (partition.allocation_id, frozenset((i.agent_id, i.index) for i in partition.ipus))

    def cleared(self, partition_id: str) -> None:
        """The old machines of a moved partition are cleared (or the move did not happen): its old IPUs are free."""
        with self._lock:
            gone = self._lingering.pop(partition_id, None)
        if gone is not None:
            self._changed()
            self._published(gone[0])

    def forget(self, partition_id: str) -> None:
        """A partition the store has just deleted; its IPUs are free."""
        with self._lock:
            gone = self._remove(partition_id)
        self._changed()
        if gone is not None:
            self._published(gone.allocation_id)

    def _published(self, allocation_id: str) -> None:
        if self.changes is not None:
            self.changes.publish(Topic.PARTITIONS, allocation_id)

    def _add(self, partition: Partition) -> None:
        self._partitions[partition.id] = partition
        used = self._used.setdefault(partition.allocation_id, {})
        for ipu in partition.ipus:
            used.setdefault(ipu.agent_id, set()).add(ipu.index)

    def _remove(self, partition_id: str) -> Partition | None:
        partition = self._partitions.pop(partition_id, None)
        if partition is None:
            return None
        used = self._used.get(partition.allocation_id, {})
        for ipu in partition.ipus:
            used.get(ipu.agent_id, set()).discard(ipu.index)
        return partition
