"""An idle-time test's loan of an allocation's free machines, and how its steps are stopped.

An allocation's owner lends its free machines (no partition, no IPU held for the first waiting
request, none down) to an idle-time test for a bounded time. Placement does not see the loan:
the machines stay free for partitions. A partition committed on a lent machine (a create, a
grant from the queue, a move) ends the loan in the same turn, and before any agent call of that
partition is made the owner ends it: every test step still running on the lent machines is
cancelled, and the partition's agent calls to those machines wait until the step there has
stopped (its call has ended), for at most STEP_OFF_SECONDS; so the test gives its machines back
within a second and nothing configures a machine that a test step still drives.

A step is an agent's Diagnose call, cancelled as a gRPC call is: the call ends at once on the
controller's side, and the agent sees it cancelled. The simulated machines' steps only read the
rack, so nothing collides there; a real machine's agent must abort the link training or traffic
it started when its call is cancelled (its context ends), so that the partition's settings that
follow meet links the test no longer drives. A step that does not end within STEP_OFF_SECONDS
(one whose call cannot be cancelled) is logged, and the partition's calls go ahead.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Collection, Iterator
from contextlib import contextmanager

STEP_OFF_SECONDS = 1.0  # how long a partition's agent calls wait for a lent machine's test step to stop


class Cancellation:
    """How a call in flight is cancelled from another thread: the call arms it with its own way to
    cancel (`arm`), and `cancel` runs that, at once or as soon as it is armed. It never waits."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cancel: Callable[[], object] | None = None
        self.cancelled = False

    def arm(self, cancel: Callable[[], object]) -> None:
        with self._lock:
            self._cancel = cancel
            already = self.cancelled
        if already:
            cancel()

    def cancel(self) -> None:
        with self._lock:
            self.cancelled = True
            cancel = self._cancel
        if cancel is not None:
            cancel()


class Loan:
    """Machines an owner lent to an idle-time test, until `until` (monotonic) at the latest.

    The owner ends it (`end`) when it takes a machine back; the test's runner reads `why` to say
    why its run stopped. Any thread may call its methods."""

    def __init__(self, test: str, allocation_id: str, machines: tuple[str, ...], seconds: float):
        self.test = test  # the cluster test it is lent to, as logs and the test's results name it
        self.allocation_id = allocation_id
        self.machines = machines  # in the allocation's order
        self.seconds = seconds
        self.until = time.monotonic() + seconds
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._steps: dict[str, list[Cancellation]] = {}  # machine -> the test steps running there
        self.why = ""  # why it ended, once it has

    @property
    def ended(self) -> bool:
        return bool(self.why)

    def end(self, why: str) -> None:
        """The loan is over: the steps running on its machines are cancelled (never waited for)."""
        with self._lock:
            if self.why:
                return
            self.why = why
            running = [c for cancellations in self._steps.values() for c in cancellations]
            self._changed.notify_all()
        for cancellation in running:
            cancellation.cancel()

    @contextmanager
    def stepping(self, machine: str) -> Iterator[Cancellation]:
        """A test step on one lent machine, for as long as its call runs: cancelled when the loan
        ends (at once if it has), and counted until it ends."""
        cancellation = Cancellation()
        with self._lock:
            ended = bool(self.why)
            self._steps.setdefault(machine, []).append(cancellation)
        if ended:
            cancellation.cancel()
        try:
            yield cancellation
        finally:
            with self._lock:
                steps = self._steps[machine]
                steps.remove(cancellation)
                if not steps:
                    del self._steps[machine]
                self._changed.notify_all()

    def stepping_on(self, machines: Collection[str]) -> bool:
        """Whether a test step runs on any of these machines now."""
        with self._lock:
            return any(machine in self._steps for machine in machines)

    def stepped_off(self, machines: Collection[str], seconds: float) -> bool:
        """Wait up to `seconds` until no test step runs on these machines; whether none does."""
        deadline = time.monotonic() + seconds
        with self._changed:
            while any(machine in self._steps for machine in machines):
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._changed.wait(remaining)
            return True
