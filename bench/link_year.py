"""Issue 32's first proof: a simulated year of a 64-machine pod's links judged by the link ledger,
and a year of their history in the store behind `vipu-admin get link --history`.

**Detection.** Every link the simulator's `link_counters` reports for a torus of `--machines`
IPU-M2000s (IPU-Link ports, Sync-Link ports, the links inside each machine) is read every
`--interval` seconds (the controller's default, 60) for `--days` simulated days. A seeded share of
the physical links (a cable counts once: both its ends degrade) goes bad as the simulator models
it (`vipu.backends.sim.faults.degrade`: errors growing steadily or in bursts, or recoveries
repeating, the simulator's `Degradation.counters` giving the counters), from a random moment of
the year; most fail after a seeded warning and are repaired (a new cable; an internal link's
machine repaired, its counters starting again), some recover (`faults.recover`). Every link also
sees isolated corrected errors at random (Poisson, `--background` a link a day), as real links do.
The mix is `YEAR_MIX` below. The generated rack's Sync-Link cables, which have no serial, are given
one first: the ledger takes a cable without a serial for a new one at every reading, which keeps
every reading and restarts the link's trend each time (it could never be suspect). The figures:
the share of the failing links flagged suspect at least 24 simulated hours before they failed
(target 80 %), their lead times, and the share of the links that never degraded ever flagged
(target 1 %, and at the `--sweep` rates of background errors), with the default trend (3 of the
last 6 hours).

**Why not the store for the year.** A year of readings of ~1,800 links a minute is ~10^9 readings,
one store transaction per agent and minute: weeks on 2 cores. So the year runs the ledger's exact
keep-and-judge rule (`replay`: what `LinkLedger._record_one` keeps and when it judges, through the
model's own `judge` over the very samples the store's `trend_samples` would give it), and a
cross-check drives the real `LinkLedger.record` with a simulated clock on a real SQLite store,
compacting every simulated hour with its real `compact()`, over `--check-hours` of a compressed,
denser fault mix (`CHECK_MIX`) on `--check-machines` machines, and requires the same events, the
same end states (as far as the rule decides them) and the same compacted histories from both, or
the run fails.

**The store.** A SQLite store (the default) is filled, through the store's own repository methods,
with what the ledger holds of every link at the year's end: the readings it kept, compacted as
`LinkLedger.compact` would (full for 7 days, hourly summaries to 90, daily beyond), its events and
its cables; and one cable flapping through the year's last 8 days, the worst case for a history
(every reading kept). Its size is measured as built and after VACUUM; then a `vipu-server` on it
answers `GetLink` with the history for a quiet link, a repaired one and the flapping one, through
the admin API and as `vipu-admin get link NAME --history --json` (whole process); target 200 ms.

    python -m bench.link_year              # a year of 64 machines: about 10 minutes on 2 cores
    python -m bench.link_year --quick      # a smoke run: 4 machines, 30 days, in well under a minute
"""

from __future__ import annotations

import json
import math
import os
import random
import sqlite3
import tempfile
import time
from bisect import bisect_left, bisect_right
from collections import Counter
from collections.abc import Iterable
from concurrent.futures import ProcessPoolExecutor
from contextlib import closing
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path

import click

from bench.common import PRODUCTION_TIMINGS, percentile, save, split, summarise_ms, table
from tests.functional.harness import Pod
from vipu.api.protos import admin_pb2
from vipu.backends.sim import faults
from vipu.backends.sim.machine import RackFile, SimMachine
from vipu.backends.sim.rack import DEGRADATION_PATTERNS, Degradation, Rack, generate_rack, save_rack
from vipu.controller.infrastructure.agentclient import GrpcAgentGateway
from vipu.controller.server import ServerConfig
from vipu.controller.usecases.links import HEARTBEAT_SECONDS, LinkLedger
from vipu.model.entities import IldTopology
from vipu.model.linkhealth import (
    DAY,
    DEFAULT_POLICY,
    DEFAULT_RETENTION,
    HOUR,
    CableIdentity,
    CableRecord,
    History,
    LinkEvent,
    LinkHealth,
    LinkName,
    LinkReading,
    LinkState,
    Retention,
    Sample,
    TrendPolicy,
    compact,
    judge,
)
from vipu.model.topology import INTERNAL_LINKS, LinkKind
from vipu.store.store import Store

LEAD_TARGET_HOURS, DETECTED_TARGET, HEALTHY_FLAGGED_TARGET, HISTORY_TARGET_MS = 24.0, 0.80, 0.01, 200.0
FLAPPING_DAYS = 8  # the worst case for a history: a link whose every reading is kept, through the full samples' 7 days and more
WORKERS = os.cpu_count() or 1


def check_retention(policy: TrendPolicy) -> Retention:
    """The cross-check's retention: full readings just longer than the trend's windows (which must
    find them unsummarised, as the default's 7 days do), hourly summaries an hour longer, so that
    a cross-check of --check-hours compacts both ways."""
    return Retention(full_seconds=policy.span_seconds + HOUR, hourly_seconds=policy.span_seconds + 2 * HOUR, days=400)


@dataclass(frozen=True)
class FaultMix:
    """How the simulated links go bad; durations in hours, drawn uniformly or log-uniformly (those
    spanning orders of magnitude) within their range."""

    degrading_share: float  # of the physical links: a cable counts once, both its ends degrade
    recovering_share: float  # of those: they stop getting worse and never fail
    sudden_share: float  # of the failing ones: they fail within `sudden_hours` (uniform)
    sudden_hours: tuple[float, float]
    warning_hours: tuple[float, float]  # the other failing ones' warning, log-uniform
    recovering_hours: tuple[float, float]  # how long the recovering ones degrade first, log-uniform
    repair_hours: tuple[float, float]  # from failure to a new cable or a repaired machine, uniform
    per_minute: tuple[int, int]  # the simulator's events a minute (errors, or recoveries when flapping), log-uniform
    background_per_day: float  # isolated corrected errors on every link (Poisson), degrading or not


# 5 % degrading is far above what a pod sees in a year (a few links); each link is judged on its own,
# so the share changes how many cases the figures rest on, not the figures.
YEAR_MIX = FaultMix(degrading_share=0.05, recovering_share=0.2, sudden_share=0.15, sudden_hours=(1, 24), warning_hours=(24, 21 * 24),
                    recovering_hours=(2, 7 * 24), repair_hours=(4, 72), per_minute=(1, 30), background_per_day=0.1)
# The cross-check's day: every path of the rule (flags from background errors, failures, repairs, recoveries) within it.
CHECK_MIX = FaultMix(degrading_share=0.3, recovering_share=0.25, sudden_share=0.3, sudden_hours=(1, 3), warning_hours=(3, 10),
                     recovering_hours=(1, 6), repair_hours=(1, 3), per_minute=(1, 30), background_per_day=4.0)


@dataclass(frozen=True)
class Ticks:
    """The readings' times: `count` of them, every `interval` seconds from `start`."""

    start: float
    interval: float
    count: int

    def at(self, index: int) -> float:
        return self.start + index * self.interval

    @property
    def end(self) -> float:
        return self.at(self.count - 1)

    def first_from(self, moment: float) -> int:
        """The index of the first reading at or after `moment`."""
        return max(0, math.ceil((moment - self.start) / self.interval))


@dataclass(frozen=True)
class Story:
    """One physical link going bad, as `vipu-sim fault --degrade` makes it (and `--recover`)."""

    machine: str
    link: str  # a port's number or an internal link's key, as faults.degrade takes it
    kind: LinkKind  # of a port's cable; faults.degrade ignores it for an internal link
    pattern: str
    per_minute: int
    since: float
    fails_after: float  # 0: it recovers instead
    recovered_at: float  # 0: it does not recover
    repaired_at: float  # when a failed one is repaired; 0: it recovers

    @property
    def fails_at(self) -> float:
        return self.since + self.fails_after if self.fails_after else 0.0

    @property
    def sudden(self) -> bool:
        return 0 < self.fails_after < DAY


@dataclass(frozen=True)
class SimulatedLink:
    """One link as the ledger reads it: as the simulator's `link_counters` first reported it, the
    simulator's `Degradation` of it, when its failure was repaired (a new cable in a port; for an
    internal link, the repaired machine's counters starting again), and the moments of its
    isolated background errors."""

    name: LinkName
    first: LinkReading
    degradation: Degradation | None
    repaired_at: float
    background: tuple[float, ...]

    def counters(self, at: float) -> tuple[int, int, bool, CableIdentity | None]:
        """Its corrected errors, recoveries, whether it is up, and the cable in its port, at `at`."""
        repaired = bool(self.repaired_at) and at >= self.repaired_at
        corrected, recoveries, up = self.degradation.counters(at) if self.degradation and not repaired else (0, 0, True)
        cable = self.first.cable
        if repaired and cable is not None:
            cable = replace(cable, serial=f"{cable.serial}-R")
        return corrected + bisect_right(self.background, at), recoveries, up, cable

    def reading(self, at: float) -> LinkReading:
        """What its agent answers at `at`, as `SimMachine.link_counters` would."""
        corrected, recoveries, up, cable = self.counters(at)
        return replace(self.first, corrected=corrected, recoveries=recoveries, up=up, cable=cable,
                       peer_serial=self.first.peer_serial if up else "", peer_port=self.first.peer_port if up else 0)

    def next_change(self, index: int, ticks: Ticks) -> int:
        """The first reading after reading `index` whose counters may differ from its."""
        at = ticks.at(index)
        moments = [ticks.first_from(self.background[n])] if (n := bisect_right(self.background, at)) < len(self.background) else []
        if self.repaired_at > at:
            moments.append(ticks.first_from(self.repaired_at))
        if self.degradation is not None and not (self.repaired_at and at >= self.repaired_at):
            if at < self.degradation.since:
                moments.append(ticks.first_from(self.degradation.since))
            elif not self.degradation.recovered_at or at < self.degradation.recovered_at:
                moments.append(index + 1)  # growing (or down and growing): every reading changes
        return max(index + 1, min(moments, default=ticks.count))


@dataclass
class Replay:
    """What the ledger holds of one link after its readings, and what it said on the way."""

    state: LinkState
    samples: list[Sample]
    events: list[LinkEvent]
    cables: list[CableRecord]


def replay(link: SimulatedLink, ticks: Ticks, policy: TrendPolicy) -> Replay:
    """`LinkLedger._record_one`'s rule (no cluster tests, partitions or allocations) over the link's readings: a
    reading is kept when it changed, when the last kept one is an hour old or with a new cable; it is
    judged whenever kept, and at every reading while the link is not healthy, by `judge` over the
    kept samples since the trend's span (or the cable) began and the one before them, as the store's
    `trend_samples` gives them. A healthy link's readings that would be neither kept nor judged are
    skipped: the ledger does nothing with them. (Every cable here is new to its port, so each one
    met is recorded.)"""
    name = link.name
    health, reason, changed_at = LinkHealth.HEALTHY, "first read", ticks.start
    cable: CableIdentity | None = None
    cable_since, last = 0.0, None
    samples: list[Sample] = []
    times: list[float] = []
    events: list[LinkEvent] = []
    cables: list[CableRecord] = []
    index = 0
    while index < ticks.count:
        at = ticks.at(index)
        corrected, recoveries, up, identity = link.counters(at)
        new_cable = identity is not None and (cable is None or cable.serial != identity.serial)
        changed = last is None or (last.corrected, last.recoveries, last.up) != (corrected, recoveries, up)
        due = last is None or at - last.at >= HEARTBEAT_SECONDS
        if new_cable or changed or due or health is not LinkHealth.HEALTHY:
            if new_cable:
                assert identity is not None
                before = cable.serial if cable else ""
                cables.append(CableRecord(identity, name, at, before))
                cable, cable_since = identity, at
                if before:
                    events.append(LinkEvent(name, at, health, f"cable {identity.serial} replaced cable {before}"))
            if new_cable or changed or due:
                last = Sample(at, corrected, recoveries, up)
                samples.append(last)
                times.append(at)
            first = bisect_left(times, max(at - policy.span_seconds, cable_since))
            verdict = judge(samples[max(0, first - 1):], policy, at)
            if verdict.health is not health or (verdict.health is LinkHealth.FAILED and verdict.reason != reason):
                events.append(LinkEvent(name, at, verdict.health, verdict.reason))
                health, changed_at = verdict.health, at
            reason = verdict.reason
        assert last is not None
        healthy = health is LinkHealth.HEALTHY
        index = min(link.next_change(index, ticks), ticks.first_from(last.at + HEARTBEAT_SECONDS)) if healthy else index + 1
    return Replay(LinkState(name, health, reason, changed_at, cable, cable_since, last), samples, events, cables)


@dataclass
class LinkYear:
    """A link at the end of the replayed span: what the ledger holds of it, its history compacted."""

    state: LinkState
    events: list[LinkEvent]
    cables: list[CableRecord]
    history: History
    kept: int  # readings kept over the span, before compaction


def replay_links(links: list[SimulatedLink], ticks: Ticks, policy: TrendPolicy, retention: Retention) -> list[LinkYear]:
    """Each link replayed and its history compacted at the last reading, as the hourly compaction leaves it."""
    years = []
    for link in links:
        done = replay(link, ticks, policy)
        years.append(LinkYear(done.state, done.events, done.cables, compact(History((), tuple(done.samples)), ticks.end, retention),
                              len(done.samples)))
    return years


def flagged_links(links: list[SimulatedLink], ticks: Ticks, policy: TrendPolicy) -> int:
    """How many of the links were ever suspect."""
    return sum(any(e.health is LinkHealth.SUSPECT for e in replay(link, ticks, policy).events) for link in links)


# The pod and its faults


@dataclass
class SimulatedPod:
    """A generated torus with its faults applied as the simulator applies them, and its links."""

    rack: Rack
    stories: list[Story]  # with the flapping worst case, if any
    links: list[SimulatedLink]
    agent_of: dict[str, str]  # machine -> its agent's id, as the controller names it
    flapping: Story | None

    def links_of(self, agent_id: str) -> list[SimulatedLink]:
        return [link for link in self.links if link.name.agent_id == agent_id]


def log_uniform(rng: random.Random, low: float, high: float) -> float:
    return math.exp(rng.uniform(math.log(low), math.log(high)))


def physical_links(rack: Rack) -> list[tuple[str, str, LinkKind]]:
    """Every cable (by its first end) and every internal link, as faults.degrade names them."""
    return [(c.a.machine, str(c.a.port), c.kind) for c in rack.cables] + \
        [(m.name, link.key, LinkKind.IPULINK) for m in rack.machines for link in INTERNAL_LINKS]


def draw_stories(rng: random.Random, candidates: list[tuple[str, str, LinkKind]], mix: FaultMix, start: float, end: float) -> list[Story]:
    stories = []
    for machine, link, kind in rng.sample(candidates, round(mix.degrading_share * len(candidates))):
        pattern, per_minute = rng.choice(DEGRADATION_PATTERNS), int(log_uniform(rng, mix.per_minute[0], mix.per_minute[1] + 1))
        since = rng.uniform(start, end)
        if rng.random() < mix.recovering_share:
            stories.append(Story(machine, link, kind, pattern, per_minute, since, 0.0,
                                 since + HOUR * log_uniform(rng, *mix.recovering_hours), 0.0))
            continue
        warning = HOUR * (rng.uniform(*mix.sudden_hours) if rng.random() < mix.sudden_share else log_uniform(rng, *mix.warning_hours))
        stories.append(Story(machine, link, kind, pattern, per_minute, since, warning, 0.0,
                             since + warning + HOUR * rng.uniform(*mix.repair_hours)))
    return stories


def build_pod(machines: int, mix: FaultMix, ticks: Ticks, seed: int, directory: Path, with_flapping: bool) -> SimulatedPod:
    """The pod: a torus rack, its links as `link_counters` reports them before any fault, the
    stories drawn and applied through `faults.degrade`/`faults.recover`, background errors drawn
    for every link; `with_flapping`, one cable flapping through the span's last days."""
    rng = random.Random(seed)
    rack = generate_rack(machines, topology=IldTopology.TORUS)
    for n, cable in enumerate([c for c in rack.cables if not c.serial], start=1):
        # A generated rack's Sync-Link cables have no serial, and the ledger takes a serial-less cable
        # for a new one at every reading (its trend restarts each time): given serials, as swapped in.
        faults.swap_cable(rack, cable.a.machine, cable.kind, cable.a.port, f"OSFP-S-{n:05d}")
    save_rack(rack, directory / "rack.yaml")
    clean = RackFile(directory / "rack.yaml")
    first = {m.name: SimMachine(clean, m.name).link_counters() for m in rack.machines}
    candidates = physical_links(rack)
    flapping = Story(*candidates.pop(0), "flapping", 1, ticks.end - FLAPPING_DAYS * DAY, 0.0, 0.0, 0.0) if with_flapping else None
    stories = [*([flapping] if flapping else []), *draw_stories(rng, candidates, mix, ticks.start, ticks.end)]
    for story in stories:
        faults.degrade(rack, story.machine, story.link, story.pattern, story.per_minute, story.since, story.fails_after, story.kind)
        if story.recovered_at:
            faults.recover(rack, story.machine, story.link, story.recovered_at, story.kind)
    repaired = {}
    for story in stories:
        if story.link.isdigit():
            cable = rack.plugged(story.machine, story.kind, int(story.link))
            assert cable is not None
            repaired.update({(end.machine, story.kind, end.port): story.repaired_at for end in (cable[0].a, cable[0].b)})
        else:
            repaired[(story.machine, None, story.link)] = story.repaired_at
    agent_of = {m.name: f"ag{n}" for n, m in enumerate(rack.machines, start=1)}
    links = []
    for machine in rack.machines:
        for reading in first[machine.name]:
            name = LinkName(agent_of[machine.name], reading.place)
            if name.kind is None:
                degradation, key = machine.degrading_links.get(reading.place), (machine.name, None, reading.place)
            else:
                assert name.port is not None
                plugged = rack.plugged(machine.name, name.kind, name.port)
                assert plugged is not None
                degradation, key = plugged[0].degradation, (machine.name, name.kind, name.port)
            links.append(SimulatedLink(name, reading, degradation, repaired.get(key, 0.0),
                                       background_errors(seed, name, mix.background_per_day, ticks)))
    return SimulatedPod(rack, stories, links, agent_of, flapping)


def background_errors(seed: int, name: LinkName, per_day: float, ticks: Ticks) -> tuple[float, ...]:
    """Isolated corrected errors on a link, a Poisson process of `per_day`, seeded by the link."""
    rng, moments = random.Random(f"{seed}/{name}/{per_day}"), []
    at = ticks.start + rng.expovariate(per_day / DAY) if per_day else math.inf
    while at <= ticks.end:
        moments.append(at)
        at += rng.expovariate(per_day / DAY)
    return tuple(moments)


def story_links(pod: SimulatedPod) -> dict[LinkName, Story]:
    """The links each story degrades: both ends of a cable, or one internal link."""
    by_key = {}
    for story in pod.stories:
        agent = pod.agent_of[story.machine]
        if story.link.isdigit():
            plugged = pod.rack.plugged(story.machine, story.kind, int(story.link))
            assert plugged is not None
            for end in (plugged[0].a, plugged[0].b):
                by_key[LinkName.of_port(pod.agent_of[end.machine], story.kind, end.port)] = story
        else:
            by_key[LinkName(agent, story.link)] = story
    return by_key


# The figures


def first_flag(events: list[LinkEvent], onset: float, until: float) -> float | None:
    """When the link was first suspect within [onset, until): at onset if it already was."""
    before = [e for e in events if e.at <= onset]
    if before and before[-1].health is LinkHealth.SUSPECT:
        return onset
    return next((e.at for e in events if onset < e.at < until and e.health is LinkHealth.SUSPECT), None)


def hours(seconds: float) -> float:
    return round(seconds / HOUR, 1)


def detection(pod: SimulatedPod, years: dict[LinkName, LinkYear], ticks: Ticks) -> dict:
    """How early the ledger flagged the links that failed within the year, and the recovering ones."""
    failing, recovering, unfinished = [], [], 0
    for name, story in story_links(pod).items():
        events = years[name].events
        if story is pod.flapping:
            continue
        if story.fails_at and story.fails_at <= ticks.end:
            flag = first_flag(events, story.since, story.fails_at)
            held = flag is not None and not any(flag < e.at < story.fails_at and e.health is LinkHealth.HEALTHY for e in events)
            failing.append((story, story.fails_at - flag if flag is not None else 0.0, held))
        elif story.recovered_at and story.recovered_at <= ticks.end:
            flag = first_flag(events, story.since, story.recovered_at)
            cleared = next((e.at for e in events if e.at >= story.recovered_at and e.health is LinkHealth.HEALTHY), None)
            recovering.append((flag is not None, hours(cleared - story.recovered_at) if cleared else None))
        else:
            unfinished += 1
    leads = [lead for _, lead, _ in failing]

    def share(group: list) -> dict:
        early = sum(lead >= LEAD_TARGET_HOURS * HOUR for _, lead, _ in group)
        return {"links": len(group), "flagged_24h_before": early, "percent": round(100 * early / len(group), 1) if group else None}

    overall = share(failing)
    cleared = [h for _, h in recovering if h is not None]
    return {
        "failing_links": len(failing), "flagged_24h_before": overall["flagged_24h_before"], "percent": overall["percent"],
        "met": bool(failing) and overall["flagged_24h_before"] >= DETECTED_TARGET * len(failing),
        "unfinished_at_the_end": unfinished,
        "lead_hours": {"p10": hours(percentile(leads, 0.1)), "median": hours(percentile(leads, 0.5)), "min": hours(min(leads)),
                       "max": hours(max(leads))} if leads else {},
        "never_flagged_before_failure": sum(1 for lead in leads if lead == 0),
        "flag_held_until_failure": sum(held for _, _, held in failing),
        "by_warning": {"under a day": share([f for f in failing if f[0].sudden]),
                       "a day or more": share([f for f in failing if not f[0].sudden])},
        "by_pattern": {p: share([f for f in failing if f[0].pattern == p]) for p in DEGRADATION_PATTERNS},
        "recovering": {"links": len(recovering), "flagged": sum(f for f, _ in recovering),
                       "healthy_again_median_hours": percentile(cleared, 0.5) if cleared else None},
    }


def healthy_flags(pod: SimulatedPod, years: dict[LinkName, LinkYear]) -> dict:
    stories = story_links(pod)
    healthy = [name for name in years if name not in stories]
    flagged = [name for name in healthy if any(e.health is LinkHealth.SUSPECT for e in years[name].events)]
    suspect_events = sum(1 for name in healthy for e in years[name].events if e.health is LinkHealth.SUSPECT)
    return {"links": len(healthy), "flagged": len(flagged), "percent": round(100 * len(flagged) / len(healthy), 2),
            "met": len(flagged) <= HEALTHY_FLAGGED_TARGET * len(healthy), "suspect_events": suspect_events,
            "examples": [str(name) for name in flagged[:5]]}


# The cross-check


class Clock:
    """The simulated time the ledger reads."""

    def __init__(self, now: float):
        self.now = now

    def __call__(self) -> float:
        return self.now


def ruled(state: LinkState) -> tuple:
    """What the keep-and-judge rule decides of a link's state (what other parts of the ledger keep there, such as
    remediation's, it leaves alone)."""
    return state.health, state.reason, state.changed_at, state.cable, state.cable_since, state.last


def cross_check(machines: int, check_hours: int, seed: int, interval: float, policy: TrendPolicy, directory: Path) -> dict:
    """The real `LinkLedger.record` on a real SQLite store with a simulated clock, compacting every
    simulated hour, against `replay` and `compact` over the same readings: the same events, end
    states and histories, link by link, or a failure."""
    start = (time.time() // DAY - 2) * DAY + 12 * HOUR  # noon UTC: the span's first day is merged to one before it ends
    ticks = Ticks(start, interval, int(check_hours * HOUR / interval) + 1)
    pod = build_pod(machines, CHECK_MIX, ticks, seed + 1, directory, with_flapping=False)
    agents = sorted(pod.agent_of.values(), key=lambda a: int(a[2:]))
    clock = Clock(start)
    store = Store(f"sqlite:///{directory / 'check.db'}")
    ledger = LinkLedger(store, GrpcAgentGateway(), policy, check_retention(policy), clock)
    began = time.monotonic()
    try:
        by_agent = {agent: pod.links_of(agent) for agent in agents}
        every_hour = round(HOUR / interval)
        for index in range(ticks.count):
            clock.now = at = ticks.at(index)
            for agent, links in by_agent.items():
                ledger.record(agent, [link.reading(at) for link in links], at)
            if index and index % every_hour == 0:
                ledger.compact()
        seconds = time.monotonic() - began
        expected = {y.state.name: y for y in replay_links(pod.links, ticks, policy, check_retention(policy))}
        differing = []
        for name, year in expected.items():
            held = ledger.detail(name)
            if (ruled(held.state), held.events, held.cables, held.history) != (ruled(year.state), year.events, year.cables, year.history):
                differing.append(str(name))
    finally:
        ledger.close()
        store.close()
    if differing:
        raise click.ClickException(f"the replay and the real ledger differ on {len(differing)} links: {', '.join(differing[:10])}")
    years = list(expected.values())
    return {"machines": machines, "hours": check_hours, "links": len(years), "record_calls": ticks.count * len(agents),
            "ledger_seconds": round(seconds, 1), "stories": len(pod.stories),
            "events": sum(len(y.events) for y in years), "events_by_health": dict(Counter(e.health.value for y in years for e in y.events)),
            "cables_replaced": sum(len(y.cables) - 1 for y in years if y.cables),
            "samples": sum(len(y.history.samples) for y in years), "summaries": sum(len(y.history.summaries) for y in years),
            "identical": True}


# The store and the history's speed


def year_into_store(pod: SimulatedPod, ticks: Ticks, policy: TrendPolicy, database: Path,
                    pool: ProcessPoolExecutor) -> tuple[dict[LinkName, LinkYear], Counter[str]]:
    """Every machine's links replayed over the span in parallel, each machine's written to a new
    store as it comes; what the ledger holds of each link, and the rows written."""
    agents = sorted({link.name.agent_id for link in pod.links}, key=lambda a: int(a[2:]))
    results = pool.map(partial(replay_links, ticks=ticks, policy=policy, retention=DEFAULT_RETENTION), [pod.links_of(a) for a in agents])
    store = Store(f"sqlite:///{database}")  # opened once the workers have forked
    years: dict[LinkName, LinkYear] = {}
    rows: Counter[str] = Counter()
    try:
        for machine_years in results:
            rows.update(fill_store(store, machine_years, ticks.end))
            years.update((year.state.name, year) for year in machine_years)
    finally:
        store.close()
    return years, rows


def sweep_background(pod: SimulatedPod, names: list[LinkName], rates: Iterable[float], count: int, seed: int, ticks: Ticks,
                     policy: TrendPolicy, pool: ProcessPoolExecutor) -> list[dict]:
    """The share of a seeded subset of the links that never degrade ever flagged at other rates of background errors."""
    stories = story_links(pod)
    quiet = sorted(name for name in names if name not in stories)
    subset = set(random.Random(seed).sample(quiet, min(count, len(quiet))))
    rows = []
    for rate in rates:
        noisy = [replace(link, background=background_errors(seed, link.name, rate, ticks)) for link in pod.links if link.name in subset]
        flagged = sum(pool.map(partial(flagged_links, ticks=ticks, policy=policy), [noisy[n::WORKERS] for n in range(WORKERS)]))
        rows.append({"background_per_day": rate, "links": len(noisy), "flagged": flagged, "percent": round(100 * flagged / len(noisy), 2)})
    return rows


def fill_store(store: Store, years: list[LinkYear], end: float) -> dict[str, int]:
    """One machine's links as the ledger holds them at the year's end, through the store's own methods."""
    with store.transaction() as tx:
        for year in years:
            name, history = year.state.name, year.history
            tx.replace_history(name, History(history.summaries, ()), before=history.samples[0].at if history.samples else end + 1)
            for sample in history.samples:
                tx.add_sample(name, sample)
            for event in year.events:
                tx.add_link_event(event)
            for cable in year.cables:
                tx.add_cable(cable)
            tx.save_link(year.state)
    return {"samples": sum(len(y.history.samples) for y in years), "summaries": sum(len(y.history.summaries) for y in years),
            "events": sum(len(y.events) for y in years), "cables": sum(len(y.cables) for y in years)}


def file_bytes(database: Path) -> int:
    return sum(path.stat().st_size for path in (database, Path(f"{database}-wal"), Path(f"{database}-shm")) if path.exists())


def time_history(database: Path, directory: Path, chosen: dict[str, LinkName], api_repeats: int, cli_repeats: int) -> list[dict]:
    """`GetLink` with the history of each chosen link, through a vipu-server on the store: the
    admin API as a client sees it, and the whole `vipu-admin ... --json` process."""
    pod = Pod(directory, machines=1, db_url=f"sqlite:///{database}", server_options=PRODUCTION_TIMINGS)
    rows = []
    try:
        pod.start_server()
        api = pod.admin_api
        for what, name in chosen.items():
            request = admin_pb2.GetLinkRequest(name=str(name), history=True)
            for _ in range(3):
                reply = api.GetLink(request, timeout=60)
            seconds = []
            for _ in range(api_repeats):
                began = time.perf_counter()
                api.GetLink(request, timeout=60)
                seconds.append(time.perf_counter() - began)
            whole = []
            for _ in range(cli_repeats):
                began = time.perf_counter()
                done = pod.admin("get", "link", str(name), "--history", "--json")
                whole.append(time.perf_counter() - began)
                if done.code != 0 or len(json.loads(done.out).get("samples", [])) != len(reply.samples):
                    raise click.ClickException(f"vipu-admin get link {name} --history --json: {done.err or done.out[:200]}")
            rows.append({"link": str(name), "what": what, "health": reply.health, "samples": len(reply.samples),
                         "samples_left_out": reply.samples_left_out,  # past the reply's page of 10,000
                         "summaries": len(reply.summaries), "events": len(reply.events), "cables": len(reply.cables),
                         "reply_kb": round(reply.ByteSize() / 1024, 1), "api": summarise_ms(seconds), "cli": summarise_ms(whole)})
    finally:
        pod.stop()
    return rows


def choose_links(pod: SimulatedPod, years: dict[LinkName, LinkYear]) -> dict[str, LinkName]:
    """A quiet link (never degraded, never flagged), a repaired one (the most cables, then events), an end of the flapping cable."""
    stories = story_links(pod)
    chosen = {"quiet": next(n for n, y in sorted(years.items()) if n not in stories and not y.events)}
    repaired = [n for n in stories if len(years[n].cables) > 1]
    if repaired:
        chosen["failed and repaired"] = max(repaired, key=lambda n: (len(years[n].cables), len(years[n].events)))
    chosen[f"flapping through its last {FLAPPING_DAYS} days"] = min(n for n, story in stories.items() if story is pod.flapping)
    return chosen


@click.command()
@click.option("--machines", default=64, show_default=True, help="IPU-M2000s in the torus.")
@click.option("--days", default=365, show_default=True, help="Simulated days.")
@click.option("--interval", default=ServerConfig.link_sample_interval, show_default=True,
              help="Seconds between readings (the controller's --link-sample-interval).")
@click.option("--background", default=YEAR_MIX.background_per_day, show_default=True,
              help="Isolated corrected errors a link a day, on every link (Poisson).")
@click.option("--degrading", default=YEAR_MIX.degrading_share, show_default=True, help="Share of the physical links that degrade.")
@click.option("--sweep", default="0.03,0.3,1", show_default=True,
              help="Other background rates whose share of healthy links flagged is measured too (on --sweep-links links).")
@click.option("--sweep-links", default=300, show_default=True)
@click.option("--check-machines", default=2, show_default=True, help="Machines of the cross-check on the real ledger and store.")
@click.option("--check-hours", default=40, show_default=True, help="Its simulated span (past a day beyond the hourly summaries' "
              "span, for a daily merge).")
@click.option("--api-repeats", default=200, show_default=True, help="GetLink calls timed per link.")
@click.option("--cli-repeats", default=20, show_default=True, help="vipu-admin processes timed per link.")
@click.option("--seed", default=2026, show_default=True)
@click.option("--quick", is_flag=True, help="A smoke run: 4 machines, 30 days, short cross-check and few repeats.")
@click.option("--name", default="link-year", show_default=True, help="Results file: bench/results/NAME.json.")
def main(machines, days, interval, background, degrading, sweep, sweep_links, check_machines, check_hours, api_repeats, cli_repeats,
         seed, quick, name):
    """A simulated year of a pod's links through the ledger's rule, and its history in the store."""
    if quick:
        machines, days, sweep_links, check_machines, check_hours, api_repeats, cli_repeats = 4, 30, 20, 2, 6, 20, 3
    began = time.monotonic()
    policy, mix = DEFAULT_POLICY, replace(YEAR_MIX, background_per_day=background, degrading_share=degrading)
    end = time.time() // DAY * DAY  # midnight UTC: a year of history up to today
    ticks = Ticks(end - days * DAY, interval, int(days * DAY / interval) + 1)
    with tempfile.TemporaryDirectory(prefix="vipu-link-year-") as work:
        directory = Path(work)
        check = cross_check(check_machines, check_hours, seed, interval, policy, directory)
        click.echo(f"cross-check: the real ledger and the replay agree on {check['links']} links over {check_hours} h "
                   f"({check['events']} events, {check['samples']} samples, {check['summaries']} summaries)")
        pod = build_pod(machines, mix, ticks, seed, directory, with_flapping=True)
        database = directory / "year.db"
        with ProcessPoolExecutor(max_workers=WORKERS) as pool:
            building = time.monotonic()
            years, rows = year_into_store(pod, ticks, policy, database, pool)
            build_seconds = time.monotonic() - building
            sweep_rows = sweep_background(pod, list(years), map(float, split(sweep)), sweep_links, seed, ticks, policy, pool)
        healthy = healthy_flags(pod, years)
        size_built = file_bytes(database)
        with closing(sqlite3.connect(database)) as db:
            counts = {table_name: db.execute(f"SELECT count(*) FROM {table_name}").fetchone()[0]
                      for table_name in ("links", "link_samples", "link_summaries", "link_events", "cables")}
            db.execute("VACUUM")
            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        size_vacuumed = file_bytes(database)
        found = detection(pod, years, ticks)
        history = time_history(database, directory / "server", choose_links(pod, years), api_repeats, cli_repeats)
    links = len(years)
    kinds = Counter(n.kind.value if n.kind else "internal" for n in years)
    result = {
        "benchmark": "link_year", "machines": machines, "days": days, "interval_s": interval, "seed": seed, "quick": quick,
        "policy": {"window_s": policy.window_seconds, "windows": policy.windows, "growing": policy.growing},
        "retention": {"full_days": DEFAULT_RETENTION.full_seconds / DAY, "hourly_days": DEFAULT_RETENTION.hourly_seconds / DAY,
                      "days": DEFAULT_RETENTION.days},
        "mix": {**mix.__dict__, "flapping_worst_case_days": FLAPPING_DAYS},
        "links": {"total": links, "by_kind": dict(kinds), "stories": len(pod.stories), "degrading_links": len(story_links(pod))},
        "detection": found, "healthy": {**healthy, "background_per_day": background, "sweep": sweep_rows},
        "cross_check": check,
        "store": {"rows": counts, "rows_written": dict(rows), "build_seconds": round(build_seconds, 1),
                  "readings": links * ticks.count, "readings_kept_before_compaction": sum(y.kept for y in years.values()),
                  "bytes_as_built": size_built, "bytes_vacuumed": size_vacuumed, "mb_vacuumed": round(size_vacuumed / 2**20, 1),
                  "kb_per_link_vacuumed": round(size_vacuumed / 1024 / links, 1)},
        "history": {"target_ms": HISTORY_TARGET_MS, "links": history,
                    "met": all(row["api"]["p99_ms"] < HISTORY_TARGET_MS for row in history)},
        "seconds": round(time.monotonic() - began),
    }
    path = save(name, result)
    print_summary(result)
    click.echo(f"written: {path}")


def print_summary(result: dict) -> None:
    found, healthy, store = result["detection"], result["healthy"], result["store"]
    lead = found["lead_hours"]
    click.echo(table(["figure", "value", "target"], [
        ["links (IPU-Link, Sync-Link, internal)", result["links"]["total"], ""],
        ["failing links flagged >= 24 h before failing", f"{found['flagged_24h_before']}/{found['failing_links']} "
         f"({found['percent']} %)", "80 %"],
        ["lead time p10 / median (h)", f"{lead.get('p10')} / {lead.get('median')}", ""],
        ["healthy links ever flagged", f"{healthy['flagged']}/{healthy['links']} ({healthy['percent']} %)", "1 %"],
        ["store: MB after VACUUM (as built)", f"{store['mb_vacuumed']} ({round(store['bytes_as_built'] / 2**20, 1)})", ""],
        ["store: KB a link", store["kb_per_link_vacuumed"], ""],
        *[[f"get link --history, {row['what']}: API p50 / p99 ms; CLI p50 ms", f"{row['api']['p50_ms']} / {row['api']['p99_ms']}; "
           f"{row['cli']['p50_ms']}", "200 ms"] for row in result["history"]["links"]],
    ]))
    click.echo(table(["background errors a link a day", "healthy links", "ever flagged %"],
                     [[r["background_per_day"], r["links"], r["percent"]] for r in healthy["sweep"]]))
    click.echo(f"took {result['seconds']} s")


if __name__ == "__main__":
    main()
