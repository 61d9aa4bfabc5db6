"""Pushing settings to agents: in parallel, never interleaved with a reconciliation, and never
waiting without a deadline.

Every hardware operation on an agent holds that agent's lock: partition operations share it
(each touches only its own partition, and machines hold several), a reconciliation holds it alone,
since it compares everything the agent holds with the store. Operations spanning several agents
take their locks in sorted order, each within a deadline; a reconciliation takes one agent at a
time and only when nobody holds it (a busy agent is skipped, and comes back at the next pass).

A partition's settings go to its agents all at once through the gateway (`apply_all`: gRPC runs
the calls together, with no thread per call). Health passes and cluster tests, which do more
than one call per agent, run on pools of threads, one per kind of work, so that one kind filling
its pool (a health pass over a thousand agents) never starves another.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from enum import Enum
from typing import TypeVar

from vipu.controller.services.gateway import AgentGateway
from vipu.model.configuration import AgentSettings
from vipu.model.entities import Agent
from vipu.model.errors import Unavailable, VipuError

T = TypeVar("T")
R = TypeVar("R")

# How long an operation waits for an agent that a reconciliation holds alone; a reconciliation
# of one agent takes a few of its calls, each bounded by the agent timeout.
SHARED_WAIT_SECONDS = 30.0


class Work(Enum):
    """The kinds of work that call agents on threads, each with a pool of its own (a partition's
    operations fan out through the gateway instead)."""

    HEALTH = "health"  # health passes and reconciliation
    TESTS = "tests"  # cluster tests


class SharedLock:
    """Held by many at once in shared mode, or by one alone; taken alone only when free."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._sharers = 0
        self._sole = False

    @contextmanager
    def shared(self, timeout: float, what: str) -> Iterator[None]:
        with self._changed:
            if not self._changed.wait_for(lambda: not self._sole, timeout):
                raise Unavailable(f"{what} is being reconciled and did not come free within {timeout:g} s; try again")
            self._sharers += 1
        try:
            yield
        finally:
            with self._changed:
                self._sharers -= 1
                self._changed.notify_all()

    def try_sole(self) -> bool:
        """Take the lock alone if nobody holds it; never waits."""
        with self._changed:
            if self._sole or self._sharers:
                return False
            self._sole = True
            return True

    def release_sole(self) -> None:
        with self._changed:
            self._sole = False
            self._changed.notify_all()


class AgentLocks:
    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[str, SharedLock] = {}

    def _lock(self, agent_id: str) -> SharedLock:
        with self._guard:
            return self._locks.setdefault(agent_id, SharedLock())

    @contextmanager
    def hold(self, agent_ids: Iterable[str], timeout: float = SHARED_WAIT_SECONDS) -> Iterator[None]:
        """Shared hold of several agents, for an operation on one partition; `Unavailable` when
        one stays held alone past the deadline."""
        with ExitStack() as stack:
            for agent_id in sorted(set(agent_ids)):
                stack.enter_context(self._lock(agent_id).shared(timeout, f"agent {agent_id}"))
            yield

    @contextmanager
    def hold_alone(self, agent_id: str) -> Iterator[bool]:
        """Sole hold of one agent if nobody holds it; yields whether it was taken."""
        lock = self._lock(agent_id)
        taken = lock.try_sole()
        try:
            yield taken
        finally:
            if taken:
                lock.release_sole()


class Hardware:
    def __init__(self, gateway: AgentGateway, workers: int = 32):
        self.gateway = gateway
        self.locks = AgentLocks()
        self._pools = {work: ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"agent-call-{work.value}") for work in Work}

    def each(self, items: Iterable[T], call: Callable[[T], R], work: Work) -> list[R | VipuError]:
        """Run `call` on every item in parallel, in the pool of `work`; each result, or the
        VipuError it raised, in order."""

        def attempt(item: T) -> R | VipuError:
            try:
                return call(item)
            except VipuError as error:
                return error

        items = list(items)
        if len(items) == 1:
            return [attempt(items[0])]
        return list(self._pools[work].map(attempt, items))

    def apply(self, agents: dict[str, Agent], settings: dict[str, AgentSettings]) -> dict[str, VipuError]:
        """Apply each agent's settings, all at once; the failures, by agent id. Caller holds the agents' locks."""
        ids = list(settings)
        outcomes = self.gateway.apply_all([(agents[a].host, agents[a].port, settings[a]) for a in ids])
        return {a: error for a, error in zip(ids, outcomes, strict=True) if error is not None}

    def clear(self, agents: Iterable[Agent], partition_id: str) -> dict[str, VipuError]:
        """Clear a partition on each agent, all at once; the failures, by agent id. Caller holds the agents' locks."""
        agents = list(agents)
        outcomes = self.gateway.clear_all([(a.host, a.port) for a in agents], partition_id)
        return {a.id: error for a, error in zip(agents, outcomes, strict=True) if error is not None}

    def close(self) -> None:
        for pool in self._pools.values():
            pool.shutdown(wait=False, cancel_futures=True)
