"""Who may work on what, and how much at once: the exclusions and capacities of the controller.

`PartitionHolds` gives one operation at a time a partition: a create from the moment it claims
the id, a reset or a remove from before it reads the partition, until its last write. The store's
compare-and-set transitions keep controllers sharing a store honest; the holds keep this
controller's own operations from racing each other, and let a forced remove wait for the
operation under way instead of tearing the partition down beside it.

`Capacity` bounds the operations of one kind under way at once; a request that finds it full
waits briefly and is then refused as temporarily unavailable, never queued without end.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from vipu.model.errors import Conflict, Unavailable, VipuError

FINISHING = "finishing"  # what a health pass holds a partition for: finishing an interrupted operation
# How long an operation waits for a health pass finishing its partition; that work's agent calls
# are each bounded by the agent timeout.
FINISHING_WAIT_SECONDS = 30.0


class PartitionHolds:
    def __init__(self, released: Callable[[], None] = lambda: None) -> None:
        """`released()` is called after each hold ends (outside the holds' lock)."""
        self._changed = threading.Condition()
        self._held: dict[str, str] = {}  # partition id -> what the holder is doing
        self._released = released

    @contextmanager
    def hold(self, partition_id: str, doing: str, wait: float = 0.0, busy: VipuError | None = None) -> Iterator[None]:
        """Hold the partition for an operation `doing` (e.g. "removing"). If another holds it, wait
        up to `wait` seconds for it; then refuse with `busy`, or a Conflict saying what is under way."""
        began = time.monotonic()
        with self._changed:
            while partition_id in self._held:
                under_way = self._held[partition_id]
                # A health pass finishing an interrupted operation is brief, and finishes what the
                # partition's last operation began: a user's operation waits for it in any case.
                limit = max(wait, FINISHING_WAIT_SECONDS) if under_way == FINISHING else wait
                remaining = began + limit - time.monotonic()
                if remaining <= 0:
                    if busy is not None:
                        raise busy
                    if limit:
                        raise Unavailable(f"partition {partition_id} is still busy ({under_way}) after {limit:g} s; try again")
                    raise Conflict(f"partition {partition_id} is busy ({under_way})")
                self._changed.wait(remaining)
            self._held[partition_id] = doing
        try:
            yield
        finally:
            self.release(partition_id)

    def claim(self, partition_id: str, doing: str) -> bool:
        """Hold the partition if nobody does, never waiting, for work another thread finishes and
        `release`s (a grant of a waiting request, handed from the dispatcher to a worker)."""
        with self._changed:
            if partition_id in self._held:
                return False
            self._held[partition_id] = doing
            return True

    def is_held(self, partition_id: str) -> bool:
        """Whether an operation holds the partition now."""
        with self._changed:
            return partition_id in self._held

    def release(self, partition_id: str) -> None:
        with self._changed:
            self._held.pop(partition_id, None)
            self._changed.notify_all()
        self._released()

    @contextmanager
    def held_if_free(self, partition_id: str, doing: str) -> Iterator[bool]:
        """Hold the partition if nobody does, never waiting; yields whether it is held."""
        with self._changed:
            free = partition_id not in self._held
            if free:
                self._held[partition_id] = doing
        try:
            yield free
        finally:
            if free:
                self.release(partition_id)


class Capacity:
    def __init__(self, name: str, limit: int, wait: float):
        self.name, self.limit, self.wait = name, limit, wait
        self._slots = threading.BoundedSemaphore(limit)

    @contextmanager
    def admitted(self) -> Iterator[None]:
        if not self._slots.acquire(timeout=self.wait):
            raise Unavailable(f"this vipu-server has {self.limit} {self.name} under way, its limit; try again shortly")
        try:
            yield
        finally:
            self._slots.release()
