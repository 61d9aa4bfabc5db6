"""Pushing settings to agents: in parallel, one operation per agent at a time.

Every hardware operation on an agent holds that agent's lock, and operations spanning several
agents take their locks in sorted order, so a partition operation and a reconciliation pass on
the same agent never interleave and never deadlock.
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


class AgentLocks:
    def __init__(self):
        self._guard = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}

    def _lock(self, agent_id: str) -> threading.Lock:
        with self._guard:
            return self._locks.setdefault(agent_id, threading.Lock())

    @contextmanager
    def hold(self, agent_ids: Iterable[str]) -> Iterator[None]:
        with ExitStack() as stack:
            for agent_id in sorted(set(agent_ids)):
                stack.enter_context(self._lock(agent_id))
            yield


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
