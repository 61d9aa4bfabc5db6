"""Pushing settings to agents: in parallel, and never interleaved with a reconciliation.

Every hardware operation on an agent holds that agent's lock: partition operations share it
(each touches only its own partition, and machines hold several), a reconciliation pass holds
it alone, since it compares everything the agent holds with the store. Operations spanning
several agents take their locks in sorted order; a reconciliation holds one agent at a time,
so they never deadlock.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, contextmanager
from typing import TypeVar

from vipu.controller.services.gateway import AgentGateway
from vipu.model.configuration import AgentSettings
from vipu.model.entities import Agent
from vipu.model.errors import VipuError

T = TypeVar("T")
R = TypeVar("R")


class SharedLock:
    """Held by many at once in shared mode, or by one alone; a waiting sole holder goes first."""

    def __init__(self):
        self._changed = threading.Condition()
        self._sharers = 0
        self._sole = False
        self._sole_waiting = 0

    @contextmanager
    def shared(self) -> Iterator[None]:
        with self._changed:
            self._changed.wait_for(lambda: not self._sole and not self._sole_waiting)
            self._sharers += 1
        try:
            yield
        finally:
            with self._changed:
                self._sharers -= 1
                self._changed.notify_all()

    @contextmanager
    def sole(self) -> Iterator[None]:
        with self._changed:
            self._sole_waiting += 1
            self._changed.wait_for(lambda: not self._sole and not self._sharers)
            self._sole_waiting -= 1
            self._sole = True
        try:
            yield
        finally:
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
    def hold(self, agent_ids: Iterable[str]) -> Iterator[None]:
        """Shared hold of several agents, for an operation on one partition."""
        with ExitStack() as stack:
            for agent_id in sorted(set(agent_ids)):
                stack.enter_context(self._lock(agent_id).shared())
            yield

    def hold_alone(self, agent_id: str):
        """Sole hold of one agent, for comparing all it holds with the store."""
        return self._lock(agent_id).sole()


class Hardware:
    def __init__(self, gateway: AgentGateway, workers: int = 32):
        self.gateway = gateway
        self.locks = AgentLocks()
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="agent-call")

    def each(self, items: Iterable[T], call: Callable[[T], R]) -> list[R | VipuError]:
        """Run `call` on every item in parallel; each result, or the VipuError it raised, in order."""

        def attempt(item: T) -> R | VipuError:
            try:
                return call(item)
            except VipuError as error:
                return error

        items = list(items)
        if len(items) == 1:
            return [attempt(items[0])]
        return list(self._pool.map(attempt, items))

    def apply(self, agents: dict[str, Agent], settings: dict[str, AgentSettings]) -> dict[str, VipuError]:
        """Apply each agent's settings; the failures, by agent id. Caller holds the agents' locks."""
        ids = list(settings)
        results = self.each(ids, lambda a: self.gateway.apply(agents[a].host, agents[a].port, settings[a]))
        return {a: r for a, r in zip(ids, results, strict=True) if isinstance(r, VipuError)}

    def clear(self, agents: Iterable[Agent], partition_id: str) -> dict[str, VipuError]:
        """Clear a partition on each agent; the failures, by agent id. Caller holds the agents' locks."""
        agents = list(agents)
        results = self.each(agents, lambda a: self.gateway.clear(a.host, a.port, partition_id))
        return {a.id: r for a, r in zip(agents, results, strict=True) if isinstance(r, VipuError)}

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
