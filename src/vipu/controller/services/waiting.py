"""The serving controller's own copy of the requests waiting for room, as the ledger is of partitions.

Loaded from the store when the controller starts to serve and changed only after the store has
committed the same change. Besides the requests it keeps what the store need not: why each one
waits (worked out again by every pass over its queue), which are being granted, and for a while
how those that ended without a partition ended, for their waiting clients to be told. Clients
waiting for a request or a partition wait for a change (`wait_for_change`), which every change of
either makes (the ledger tells this copy of each).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from vipu.model.errors import VipuError
from vipu.model.placement import Shape
from vipu.model.queue import WaitingRequest

# How long the end of a request that became no partition (expired, cancelled, failed) is kept for
# a client that asks after it ended.
ENDINGS_KEPT_SECONDS = 600.0


class WaitingRequests:
    def __init__(self) -> None:
        self.changed = threading.Condition()  # notified after every change of a request or a partition
        self.version = 0  # counts those changes, so that a waiter misses none
        self.wake = threading.Event()  # set when a pass over the queues may start something
        self._requests: dict[str, WaitingRequest] = {}  # by partition id
        self._granting: set[str] = set()
        self._reasons: dict[str, str] = {}
        self._endings: dict[str, tuple[float, str, VipuError]] = {}  # by partition id: when, in which allocation, how
        self._closing: set[str] = set()  # allocations being removed: no request waits in them

    def notify(self) -> None:
        """Something changed: wake the waiting clients, and the dispatcher if a request waits."""
        if self._requests:
            self.wake.set()
        with self.changed:
            self.version += 1
            self.changed.notify_all()

    def wait_for_change(self, seen: int, timeout: float) -> None:
        """Until something changes after `version` was `seen`, or `timeout` seconds."""
        with self.changed:
            if self.version == seen:
                self.changed.wait(timeout)

    def load(self, requests: Iterable[WaitingRequest]) -> None:
        with self.changed:
            self._requests = {r.partition_id: r for r in requests}
            self._granting, self._reasons = set(), {}
        self.notify()

    def add(self, request: WaitingRequest) -> None:
        with self.changed:
            self._requests[request.partition_id] = dataclasses.replace(request)
        self.notify()

    def get(self, partition_id: str) -> WaitingRequest | None:
        with self.changed:
            request = self._requests.get(partition_id)
            return None if request is None else dataclasses.replace(request)

    def in_allocation(self, allocation_id: str, granting: bool = False) -> list[WaitingRequest]:
        """The allocation's waiting requests in arrival order; those being granted only if asked."""
        with self.changed:
            chosen = [r for r in self._requests.values() if r.allocation_id == allocation_id
                      and (granting or r.partition_id not in self._granting)]
            return [dataclasses.replace(r) for r in sorted(chosen, key=lambda r: r.sequence)]

    def all(self) -> list[WaitingRequest]:
        with self.changed:
            return [dataclasses.replace(r) for r in sorted(self._requests.values(), key=lambda r: r.sequence)]

    def allocations(self) -> list[str]:
        with self.changed:
            return sorted({r.allocation_id for r in self._requests.values()})

    def held(self, allocation_id: str) -> tuple[Shape, str]:
        """The IPUs held for the allocation's first waiting request, and its partition id: one being
        granted no longer counts (its partition has its IPUs), the request behind it does."""
        waiting = self.in_allocation(allocation_id)
        return (waiting[0].held, waiting[0].partition_id) if waiting else (frozenset(), "")

    def hold(self, partition_id: str, held: Shape) -> None:
        with self.changed:
            if partition_id in self._requests:
                self._requests[partition_id].held = held

    @contextmanager
    def closing(self, allocation_id: str) -> Iterator[None]:
        """While an allocation is being removed: no request is to wait in it."""
        with self.changed:
            self._closing.add(allocation_id)
        try:
            yield
        finally:
            with self.changed:
                self._closing.discard(allocation_id)

    def is_closing(self, allocation_id: str) -> bool:
        with self.changed:
            return allocation_id in self._closing

    def is_granting(self, partition_id: str) -> bool:
        with self.changed:
            return partition_id in self._granting

    def granting(self, partition_id: str, underway: bool = True) -> None:
        """Mark a request as being granted (its partition is being recorded), or no longer."""
        with self.changed:
            (self._granting.add if underway else self._granting.discard)(partition_id)
        self.notify()

    def explain(self, reasons: dict[str, str]) -> None:
        """Why requests wait, as a pass found it: no change that wakes anyone (waiting clients read it when they are answered)."""
        with self.changed:
            self._reasons.update(reasons)

    def reason(self, partition_id: str) -> str:
        with self.changed:
            return self._reasons.get(partition_id, "waiting for the next pass over its queue")

    def position(self, request: WaitingRequest) -> int:
        """Its place in its allocation's queue, from 1."""
        with self.changed:
            return 1 + sum(1 for r in self._requests.values() if r.allocation_id == request.allocation_id
                           and r.sequence < request.sequence)

    def remove(self, request: WaitingRequest, ending: VipuError | None = None) -> None:
        """The request stopped waiting: granted (no `ending`), or ended without a partition, which
        clients asking after it (those who may use its allocation) are told for a while."""
        now = time.monotonic()
        partition_id = request.partition_id
        with self.changed:
            self._requests.pop(partition_id, None)
            self._granting.discard(partition_id)
            self._reasons.pop(partition_id, None)
            if ending is not None:
                self._endings[partition_id] = (now, request.allocation_id, ending)
            self._endings = {p: e for p, e in self._endings.items() if now - e[0] < ENDINGS_KEPT_SECONDS}
        self.notify()

    def ending(self, partition_id: str) -> tuple[str, VipuError] | None:
        """How the request of that id ended without a partition, if it did lately, and the allocation it waited in."""
        with self.changed:
            kept = self._endings.get(partition_id)
            if kept is None or time.monotonic() - kept[0] >= ENDINGS_KEPT_SECONDS:
                return None
            return kept[1], kept[2]

    def forget_ending(self, partition_id: str) -> None:
        """A new request or partition of that id is made: the old one's ending no longer applies."""
        with self.changed:
            self._endings.pop(partition_id, None)
