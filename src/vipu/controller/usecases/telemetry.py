"""What the controller keeps of its machines' telemetry and logs, collected from their agents.

Every `--watch-interval` seconds the leader asks each agent whose machine has the telemetry or
logs capability for its last reading and its new log lines: one call each, in parallel, with a
deadline of WATCH_CALL_SECONDS, an agent whose last call has not ended being skipped, so one that
does not answer delays no other for longer than that. The round's new lines go to the store in
one transaction (a write per round, not per machine: the store's writes are the partitions' too),
the latest KEPT_MACHINE_LOG_LINES per machine, so any replica answers `vipu-admin logs agent` and
a restarted leader goes on where the last left off; where the write fails, the next round asks the
agents for the same lines again. An agent that restarted numbers its lines afresh (its incarnation says so) and sends
what it still holds again: the lines already stored are left out. A flood at the machine reaches
the store as the lines the agent kept and one line saying how many it dropped. Telemetry stays
in memory: the latest reading per machine, and each partition's IPUs' utilisation over its life
(`UtilisationHistory`, bounded), for `vipu get partition --telemetry` and the dashboard; a new
leader's history starts when it does.
"""

from __future__ import annotations

import logging
import math
import re
import threading
import time
from concurrent import futures
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from vipu.controller.core.agents import AgentGateway
from vipu.controller.core.owners import Owners
from vipu.model.entities import Agent, Partition
from vipu.model.errors import InvalidArgument, NotFound, VipuError
from vipu.model.hardware import Capability
from vipu.model.telemetry import AGENT_LOG_LINES, IpuReading, LogLine, TelemetryReading, UtilisationHistory
from vipu.store.store import Store

log = logging.getLogger(__name__)

WATCH_SECONDS = 1.0
WATCH_CALL_SECONDS = 3.0  # the most one agent's Watch call may take
MOST_LINES_READ = 1000  # lines one ReadMachineLog answers with at most
FOLLOW_POLL_SECONDS = 0.2  # how often a waiting read looks at the store again (a replica hears of no collection)


@dataclass(frozen=True)
class Latest:
    reading: TelemetryReading
    age: float  # seconds since its agent read it, when the controller got it
    received: float  # monotonic, when the controller got it

    def age_now(self) -> float:
        return self.age + time.monotonic() - self.received


@dataclass(frozen=True)
class IpuNow:
    """One IPU of a partition, as last read."""

    agent_id: str
    index: int
    routing_id: int
    reading: IpuReading | None
    age: float


class TelemetryService:
    def __init__(self, store: Store, gateway: AgentGateway, owners: Owners, workers: int = 8):
        self.store = store
        self.gateway = gateway
        self.owners = owners
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="watch")
        self._lock = threading.Condition()
        self._latest: dict[str, Latest] = {}
        self._histories: dict[str, UtilisationHistory] = {}
        # Each agent's last line collected: the run of the agent that numbered it, and its number.
        self._after: dict[str, tuple[str, int]] | None = None
        self._calling: set[str] = set()  # agents whose Watch call has not ended
        # What calls brought that the store does not have yet: (agent, its run, the new lines, the last line's number there)
        self._pending: list[tuple[str, str, list[LogLine], int]] = []

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def run(self, interval: float, stop: threading.Event) -> None:
        while not stop.wait(interval):
            try:
                self.collect_all()
            except Exception:
                log.exception("collecting telemetry and logs failed")

    def collect_all(self) -> None:
        """One look at every agent whose machine has telemetry or logs."""
        if self._after is None:
            with self.store.reading() as tx:
                self._after = tx.last_agent_lines()
        configured = self.store.configuration().agents
        with self._lock:
            for gone in self._latest.keys() - configured.keys():
                del self._latest[gone]
            waiting = self._calling | {agent_id for agent_id, _, _, _ in self._pending}  # a call late for its round: not asked again
            due = [a for a in configured.values() if a.id not in waiting   # until what it brought is stored
                   and (a.inventory.has(Capability.TELEMETRY) or a.inventory.has(Capability.LOGS))]
            self._calling.update(a.id for a in due)
        calls = []
        for n, agent in enumerate(due):
            try:
                calls.append(self._pool.submit(self._collect, agent))
            except RuntimeError:  # its pool was shut down: the controller stops
                with self._lock:
                    self._calling.difference_update(a.id for a in due[n:])
                return
        futures.wait(calls, timeout=WATCH_CALL_SECONDS)
        self._store_lines()
        self._follow_partitions()

    def _store_lines(self) -> None:
        """Write the lines the calls brought, in one transaction; then each agent's next call goes on after them."""
        with self._lock:
            pending, self._pending = self._pending, []
        if not any(lines for _, _, lines, _ in pending):
            self._advance(pending)
            return
        try:
            with self.store.transaction() as tx:
                for agent_id, incarnation, lines, _ in pending:
                    tx.add_log_lines(agent_id, incarnation, lines)
        except VipuError as error:
            log.warning("machine log lines not stored (asked for again next time): %s", error.message)
            return
        self._advance(pending)
        with self._lock:
            self._lock.notify_all()

    def _advance(self, stored: list[tuple[str, str, list[LogLine], int]]) -> None:
        assert self._after is not None
        for agent_id, incarnation, _, last in stored:
            self._after[agent_id] = (incarnation, last)

    def _collect(self, agent: Agent) -> None:
        try:
            self._collect_one(agent)
        except VipuError as error:
            log.debug("agent %s: not watched: %s", agent.id, error.message)
        except Exception:
            log.exception("agent %s: collecting its telemetry and log failed", agent.id)
        finally:
            with self._lock:
                self._calling.discard(agent.id)

    def _collect_one(self, agent: Agent) -> None:
        assert self._after is not None
        incarnation, after = self._after.get(agent.id, ("", 0))
        report = self.gateway.watch(agent.host, agent.port, after, AGENT_LOG_LINES, incarnation, WATCH_CALL_SECONDS)
        lines = list(report.lines)
        if lines and report.incarnation != incarnation and incarnation:  # a restarted agent: what it sends again is stored
            with self.store.reading() as tx:
                stored = tx.log_lines_from(agent.id, min(line.at for line in lines))
            lines = [line for line in lines if (line.at, line.source, line.text) not in stored]
        if report.missed:
            first = lines[0] if lines else None
            lines.insert(0, LogLine(first.sequence - 1 if first else 0, first.at if first else time.time(), "vipu",
                                    f"{report.missed} lines of the machine's log were dropped at its agent before they were collected"))
        with self._lock:
            if report.lines or lines:
                self._pending.append((agent.id, report.incarnation, lines, report.lines[-1].sequence if report.lines else after))
            if report.reading is not None:
                self._latest[agent.id] = Latest(report.reading, report.age, time.monotonic())

    def _follow_partitions(self) -> None:
        """A sample of each partition's IPUs' utilisation; the histories of partitions gone are dropped."""
        now = time.time()
        live = set()
        for owner in self.owners.all():
            for partition in owner.snapshot.partitions.values():
                live.add(partition.id)
                values = tuple(ipu.reading.utilisation if ipu.reading is not None else None for ipu in self._ipus_now(partition))
                if any(value is not None for value in values):
                    with self._lock:
                        self._histories.setdefault(partition.id, UtilisationHistory()).add(now, values)
        with self._lock:
            for gone in self._histories.keys() - live:
                del self._histories[gone]

    def _ipus_now(self, partition: Partition) -> list[IpuNow]:
        with self._lock:
            latest = dict(self._latest)
        ipus = []
        for ipu in sorted(partition.ipus, key=lambda i: i.routing_id):
            held = latest.get(ipu.agent_id)
            ipus.append(IpuNow(ipu.agent_id, ipu.index, ipu.routing_id, held.reading.ipu(ipu.index) if held else None,
                               held.age_now() if held else math.inf))
        return ipus

    def partition(self, partition: Partition) -> tuple[list[IpuNow], list[tuple[float, tuple[float | None, ...]]]]:
        """A partition's IPUs as last read, and their utilisation over its life (as this controller collected it)."""
        with self._lock:
            history = list(self._histories[partition.id].samples) if partition.id in self._histories else []
        return self._ipus_now(partition), history

    def machines(self) -> dict[str, Latest]:
        """Each machine's last reading, by agent."""
        with self._lock:
            return dict(self._latest)

    def log(self, agent_id: str, after: int = 0, since: float = 0.0, grep: str = "", limit: int = 0,
            wait: float = 0.0) -> tuple[list[LogLine], int]:
        """An agent's machine's lines after line `after` (or the latest, stamped at or after `since`)
        that match `grep`, at most `limit`; waiting up to `wait` seconds for one to come. Also the
        last line looked through, matched or not: where the next read goes on from."""
        if agent_id not in self.store.configuration().agents:
            raise NotFound(f"agent {agent_id} does not exist")
        try:
            pattern = re.compile(grep) if grep else None
        except re.error as error:
            raise InvalidArgument(f"--grep {grep!r:.60} is no regular expression: {error}") from None
        limit = min(limit or MOST_LINES_READ, MOST_LINES_READ)
        deadline = time.monotonic() + wait
        while True:
            with self.store.reading() as tx:
                lines = tx.log_lines(agent_id, after, since, limit if pattern is None else MOST_LINES_READ * 10)
                newest = tx.last_log_line(agent_id) if not after else 0
            # The last line looked through: with nothing after `after`, it stays; a first read that found
            # nothing to show goes on from the newest line kept, not from the start.
            last = lines[-1].sequence if lines else (after or newest)
            found = [line for line in lines if pattern is None or pattern.search(line.text)]
            if pattern is not None and not after:
                found = found[-limit:]
            found = found[:limit]
            if found or time.monotonic() >= deadline:
                return found, (found[-1].sequence if found and len(found) == limit else last)
            after = last
            with self._lock:
                self._lock.wait(min(FOLLOW_POLL_SECONDS, max(0.0, deadline - time.monotonic())))
