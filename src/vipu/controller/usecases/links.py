"""The link ledger: every link's counters, sampled from its agent; its health judged by their trend
(`vipu.model.linkhealth`); each change of health, and each cable replaced, an event with its
reason and the partitions running over the link then; cluster tests' verdicts on cables folded
in; the history compacted as it ages.

It decides nothing about partitions and holds no lock across a call: each agent's readings are
recorded in one store transaction of their own, and an agent that does not answer is simply not
sampled this time (the health pass says why it is Down). After a change of any link's health is
committed, the unhealthy links are handed, whole and numbered, to `tell` (the allocations'
owners, which place around them and tell the partitions on them).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import CancelledError, ThreadPoolExecutor
from dataclasses import replace

from vipu.controller.core.agents import AgentGateway
from vipu.model.clustertests import CableResult, CableVerdict
from vipu.model.entities import Partition, shown
from vipu.model.errors import NotFound, VipuError
from vipu.model.linkhealth import (
    DAY,
    DEFAULT_POLICY,
    DEFAULT_REMEDIATION,
    DEFAULT_RETENTION,
    HOUR,
    CableRecord,
    History,
    LinkDetail,
    LinkEvent,
    LinkFaults,
    LinkHealth,
    LinkName,
    LinkReading,
    LinkState,
    RemediationPolicy,
    Retention,
    Sample,
    TrendPolicy,
    Verdict,
    breaker_holds,
    compact,
    judge,
    links_used,
)
from vipu.model.topology import ClusterLayout
from vipu.store.store import Store, Transaction

log = logging.getLogger(__name__)
HISTORY_PAGE = 10_000  # readings (and events) of a link at most in one reply: about 300 KB, well within a client's 4 MB
HEARTBEAT_SECONDS = HOUR  # a quiet link's reading is kept this often, so its history shows it was read


class LinkLedger:
    def __init__(self, store: Store, gateway: AgentGateway, policy: TrendPolicy = DEFAULT_POLICY,
                 retention: Retention = DEFAULT_RETENTION, clock: Callable[[], float] = time.time, workers: int = 8,
                 tell: Callable[[LinkFaults], None] | None = None, remediation: RemediationPolicy = DEFAULT_REMEDIATION):
        self.store = store
        self.tell = tell
        self.remediation = remediation  # its breaker's share; the rest is LinkRemediation's
        self.on_failed: Callable[[LinkName], None] | None = None  # told of each link that fails, once committed
        self._told = 0  # how many times the unhealthy links were told: their word's number
        self._telling = threading.Lock()
        self.gateway = gateway
        self.policy = policy
        self.retention = retention
        self.clock = clock
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="links")

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    def run(self, interval: float, stop: threading.Event, compact_every: float = HOUR) -> None:
        """Sample every `interval` seconds, and compact every `compact_every`, until `stop` is set."""
        compacted = time.monotonic()
        while not stop.wait(interval):
            try:
                self.sample_all()
                if time.monotonic() - compacted >= compact_every:
                    self.compact()
                    compacted = time.monotonic()
            except Exception:
                log.exception("link sampling failed")

    # Sampling

    def sample_all(self) -> int:
        """Read every Up agent's links, in parallel, and record what each answered; how many answered."""
        with self.store.reading() as tx:
            agents = [a for a in tx.list_agents() if a.answering]
        try:
            futures = {agent.id: self._pool.submit(self.gateway.link_counters, agent.host, agent.port) for agent in agents}
        except RuntimeError:  # closed: the controller stops
            return 0
        answered = 0
        for agent_id, future in futures.items():
            try:
                readings, read_at = future.result()
            except VipuError as error:
                log.info("links of %s not sampled: %s", agent_id, error.message)
                continue
            except CancelledError:  # closed: the controller stops
                return answered
            self.record(agent_id, readings, read_at or self.clock())
            answered += 1
        return answered

    def record(self, agent_id: str, readings: list[LinkReading], read_at: float) -> list[LinkEvent]:
        """One agent's readings into the ledger, in one transaction; the events they caused. A
        reading is kept when it differs from the link's last kept one (or that is an hour old), so
        a quiet link costs a row an hour, not one a reading; a link that is not healthy is judged
        again at each reading all the same, as its windows move on."""
        events: list[LinkEvent] = []
        failing: list[LinkName] = []
        with self.store.transaction() as tx:
            known = {state.name.place: state for state in tx.links(agent_id, for_update=True)}
            partitions = tx.partitions_on_agent(agent_id)
            for reading in readings:
                name = LinkName(agent_id, reading.place)
                first = LinkState(name, LinkHealth.HEALTHY, "first read", read_at, first_seen=read_at)
                events += self._record_one(tx, known.get(reading.place) or first, reading, read_at, partitions, failing)
        for event in events:
            log.info("link %s is %s: %s", event.name, event.health.value, event.reason)
        self._committed(events, failing)
        return events

    def _committed(self, events: list[LinkEvent], failing: list[LinkName]) -> None:
        """What follows a commit of links' changes: the owners are told, and each link that failed
        is handed to remediation."""
        self._tell_if(events)
        if self.on_failed is not None:
            for name in failing:
                self.on_failed(name)

    def _tell_if(self, events: list[LinkEvent]) -> None:
        """After a commit that changed links' health: every unhealthy link, to `tell`, numbered so
        that a later word is never overtaken by an earlier one (a word read after a later number
        was taken holds every change committed before it)."""
        if not events or self.tell is None:
            return
        with self._telling:
            self._told += 1
            sequence = self._told
        with self.store.reading() as tx:
            unhealthy = tx.unhealthy_links()
        self.tell(LinkFaults.of(unhealthy, sequence=sequence))

    def _running_over(self, name: LinkName, partitions: list[Partition]) -> tuple[str, ...]:
        """The partitions, among those on the link's machine, that run over the link."""
        return tuple(sorted(p.id for p in partitions if name in self._links_of(p)))

    def _record_one(self, tx: Transaction, state: LinkState, reading: LinkReading, at: float,
                    partitions: list[Partition], failing: list[LinkName]) -> list[LinkEvent]:
        name, events = state.name, []
        sample = Sample(at, reading.corrected, reading.recoveries, reading.up)
        # A cable is known by its serial: one that gives none (a cable with no EEPROM) is no new cable at every reading.
        new_cable = reading.cable is not None and bool(reading.cable.serial) and (state.cable is None or
                                                                                  state.cable.serial != reading.cable.serial)
        last = state.last
        changed = last is None or (last.corrected, last.recoveries, last.up) != (sample.corrected, sample.recoveries, sample.up)
        due = last is None or at - last.at >= HEARTBEAT_SECONDS
        if not (new_cable or changed or due or state.health is not LinkHealth.HEALTHY):
            return []  # nothing new, and nothing to judge again
        if new_cable:
            assert reading.cable is not None
            before = state.cable.serial if state.cable else ""
            if tx.cable_at(reading.cable.serial, name) is None:
                tx.add_cable(CableRecord(reading.cable, name, at, before))
            state = replace(state, cable=reading.cable, cable_since=at)
            if before:  # a new cable: its link starts afresh, the old cable's trend and test failure gone with it
                events.append(LinkEvent(name, at, state.health, f"cable {reading.cable.serial} replaced cable {before}",
                                        self._running_over(name, partitions)))
                state = replace(state, test_failure="")
        if new_cable or changed or due:
            tx.add_sample(name, sample)
            state = replace(state, last=sample)
        verdict = self._judge(tx, state, at, state.test_failure)
        state, settled = self._settled(tx, state, verdict, at, partitions, failing)
        events += settled
        for event in events:
            tx.add_link_event(event)
        tx.save_link(state)
        return events

    def _settled(self, tx: Transaction, state: LinkState, verdict: Verdict, at: float, partitions: list[Partition],
                 failing: list[LinkName], told: str | None = None) -> tuple[LinkState, list[LinkEvent]]:
        """The link's state with its new verdict, and its events: the change of its health (or
        `told`, an event whatever changed), then the breaker's word on it if it is failed, when
        that word changes. A link that fails is noted in `failing`."""
        changed = _is_change(state, verdict)
        if verdict.health is LinkHealth.FAILED and state.health is not LinkHealth.FAILED:
            failing.append(state.name)
        breaker = self._breaker(tx, state.name) if verdict.health is LinkHealth.FAILED else ""
        reasons = [told] if told is not None else [verdict.reason] if changed else []
        if breaker and breaker != state.breaker:
            log.warning("link %s failed: %s", state.name, breaker)
            reasons.append(f"not quarantined: {breaker}")
        elif state.breaker and not breaker and verdict.health is LinkHealth.FAILED:
            reasons.append("quarantined: the breaker no longer holds")
        over = self._running_over(state.name, partitions) if reasons else ()
        events = [LinkEvent(state.name, at, verdict.health, reason, over) for reason in reasons]
        changed_at = at if changed else state.changed_at
        return replace(state, health=verdict.health, reason=verdict.reason, changed_at=changed_at, breaker=breaker), events

    def _breaker(self, tx: Transaction, name: LinkName) -> str:
        """Why the breaker keeps this failed link out of quarantine, or "" (see `breaker_holds`)."""
        allocation = next((a for a in self.store.configuration().allocations.values() if name.agent_id in a.agent_ids), None)
        if allocation is None:
            return ""
        quarantined = {s.name.agent_id for s in tx.unhealthy_links() if s.quarantined and s.name != name}
        return breaker_holds(name, allocation.id, allocation.agent_ids, quarantined, self.remediation)

    def _judge(self, tx: Transaction, state: LinkState, at: float, test_failure: str) -> Verdict:
        """The link's health at `at` from the readings of its cable within the trend's windows."""
        return judge(tx.trend_samples(state.name, max(at - self.policy.span_seconds, state.cable_since)), self.policy, at, test_failure)

    def record_test(self, test: str, results: Iterable[CableResult]) -> list[LinkEvent]:
        """A cluster test's verdicts on the cables it judged: both ends of a failed cable fail with
        the test's words, and a passed one clears the failure a test had found there."""
        at, events, failing = self.clock(), [], list[LinkName]()
        with self.store.transaction() as tx:
            for result in results:
                if result.verdict is CableVerdict.UNTESTED:
                    continue
                failure = f"failed the {test} test: {result.lines[0] if result.lines else 'no reason given'}" \
                    if result.verdict is CableVerdict.FAILED else ""
                for end in (result.cable.lower, result.cable.upper):
                    name = LinkName.of_port(end.agent_id, end.kind, end.number)
                    state = tx.link(name, for_update=True) or LinkState(name, LinkHealth.HEALTHY, "no reading yet", at, first_seen=at)
                    if failure == state.test_failure:
                        continue
                    partitions = tx.partitions_on_agent(name.agent_id)
                    judged = self._judge(tx, state, at, failure)
                    state, settled = self._settled(tx, replace(state, test_failure=failure), judged, at, partitions, failing,
                                                   told=judged.reason)
                    for event in settled:
                        tx.add_link_event(event)
                    events += settled
                    tx.save_link(state)
        self._committed(events, failing)
        return events

    def retested(self, name: LinkName, why: str) -> LinkState:
        """After a reset that brought a link up again: the failure a cluster test found in it is
        set aside (the next test judges it again), and it is judged on its readings alone."""
        at, events, failing = self.clock(), list[LinkEvent](), list[LinkName]()
        with self.store.transaction() as tx:
            state = tx.link(name, for_update=True)
            if state is None:
                raise NotFound(f"no link {name} is in the ledger")
            if state.test_failure:
                partitions = tx.partitions_on_agent(name.agent_id)
                judged = self._judge(tx, state, at, "")
                state, events = self._settled(tx, replace(state, test_failure=""), judged, at, partitions, failing,
                                              told=f"{why}: {judged.reason}")
                for event in events:
                    tx.add_link_event(event)
                tx.save_link(state)
        self._committed(events, failing)
        return state

    # Ageing

    def compact(self) -> int:
        """Every link's history compacted, and events older than the history dropped; the number of links."""
        now = self.clock()
        with self.store.reading() as tx:
            names = [state.name for state in tx.links()]
        for name in names:
            with self.store.transaction() as tx:
                history = tx.history(name)
                compacted = compact(history, now, self.retention)
                if compacted != history:
                    tx.replace_history(name, compacted, before=compacted.samples[0].at if compacted.samples else now + 1)
        with self.store.transaction() as tx:
            tx.drop_link_events(now - self.retention.days * DAY)
        return len(names)

    # Reading

    def links(self, agent_id: str | None = None, unhealthy: bool = False, since: float | None = None,
              partition_id: str = "") -> list[LinkState]:
        """The links known, of one machine or all; only those suspect or failed; only those whose
        health changed since a time; only those a partition runs over now (NotFound if there is no
        such partition)."""
        with self.store.reading() as tx:
            states = tx.links(agent_id)
            partition = tx.get_partition(partition_id) if partition_id else None
        if partition_id and partition is None:
            raise NotFound(f"partition {shown(partition_id)} does not exist")
        over = self._links_of(partition) if partition is not None else None
        return [s for s in states if (not unhealthy or s.health is not LinkHealth.HEALTHY) and (since is None or s.changed_at >= since)
                and (over is None or s.name in over)]

    def _links_of(self, partition: Partition) -> frozenset[LinkName]:
        """The links a partition runs over, in its cluster's cabling."""
        cluster = self.store.configuration().clusters.get(partition.cluster_id)
        if cluster is None:
            return frozenset()
        return links_used(ClusterLayout.of(cluster), ((ipu.agent_id, ipu.index) for ipu in partition.ipus))

    def detail(self, name: LinkName, since: float = 0.0, before: float = 0.0, limit: int = 0) -> LinkDetail:
        """The link, with a page of its history: within `since` and `before` (0: now), the newest
        `limit` readings and events at most (0, or more than HISTORY_PAGE: HISTORY_PAGE), and its
        summaries and cables (bounded by the history kept). A week of readings every second no
        longer makes a reply larger than a client takes."""
        limit = min(limit or HISTORY_PAGE, HISTORY_PAGE)
        with self.store.reading() as tx:
            state = tx.link(name)
            if state is None:
                raise NotFound(f"no link {name} is in the ledger: its agent has not been sampled, or it has no such link")
            samples, samples_left_out = tx.sample_page(name, since, before, limit)
            events, events_left_out = tx.event_page(name, since, before, limit)
            summaries = tuple(s for s in tx.summaries(name, since) if not before or s.start < before)
            return LinkDetail(state, History(summaries, tuple(samples)), events, tx.cables_of(name), samples_left_out, events_left_out)


def _is_change(state: LinkState, verdict: Verdict) -> bool:
    """Whether a verdict changes the link as its events tell: its health, or why a failed link failed."""
    return verdict.health is not state.health or (verdict.health is LinkHealth.FAILED and verdict.reason != state.reason)
