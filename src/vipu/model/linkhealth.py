"""A link's health over time, judged from its counters' history rather than from one reading.

Each link is named by its machine's agent and its place: `ag3:5` is IPU-Link chassis port 5,
`ag3:sync2` Sync-Link port 2, `ag3:gw1` GW-Link port 1, `ag3:ipu1:4C` a link inside the machine.
Agents report each link's corrected-error and recovery counters (they only grow, until the
machine is reset and they start again from zero) and whether it is up.

A link is *suspect* when its counters grew in at least k of its last N windows (a trend, as in
NVIDIA's windowed NVLink check, not a threshold that one burst crosses), *failed* when a cluster
test fails it or it stops training, *healthy* otherwise. Old samples are compacted: full samples
for the recent past, then one summary per hour, then one per day, which keep each span's growth
and how often the link was down, so a year of a link's history stays small and its trend legible.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence, Set
from dataclasses import dataclass, field
from enum import Enum
from functools import cached_property
from itertools import groupby

from vipu.model.entities import IPUS_PER_MACHINE
from vipu.model.errors import InvalidArgument
from vipu.model.times import duration_text
from vipu.model.topology import INTERNAL_LINKS, PORT_COUNTS, ClusterLayout, LinkKind

HOUR = 3600.0
DAY = 24 * HOUR
_PLACE = re.compile(r"^(?:(?P<ipulink>\d+)|sync(?P<sync>\d+)|gw(?P<gw>\d+)|(?P<internal>ipu\d:\d[A-D]))$")
_INTERNAL_KEYS = frozenset(link.key for link in INTERNAL_LINKS)


class LinkHealth(str, Enum):
    HEALTHY = "healthy"
    SUSPECT = "suspect"
    FAILED = "failed"


@dataclass(frozen=True, order=True)
class LinkName:
    """A link by its machine's agent and its place: a chassis port of a kind, or an internal link
    (`kind` None, `place` its key, e.g. "ipu1:4C")."""

    agent_id: str
    place: str

    @property
    def kind(self) -> LinkKind | None:
        if self.place.startswith("sync"):
            return LinkKind.SYNC
        if self.place.startswith("gw"):
            return LinkKind.GWLINK
        return LinkKind.IPULINK if self.place.isdigit() else None

    @property
    def port(self) -> int | None:
        """Its chassis port's number; None for a link inside the machine."""
        digits = self.place.removeprefix("sync").removeprefix("gw")
        return int(digits) if digits.isdigit() else None

    def __str__(self) -> str:
        return f"{self.agent_id}:{self.place}"

    @classmethod
    def of_port(cls, agent_id: str, kind: LinkKind, port: int) -> LinkName:
        prefix = {LinkKind.IPULINK: "", LinkKind.SYNC: "sync", LinkKind.GWLINK: "gw"}[kind]
        return cls(agent_id, f"{prefix}{port}")

    @classmethod
    def parse(cls, text: str) -> LinkName:
        """`AGENT:PLACE`, as `vipu-admin get link ag3:5` takes it."""
        agent_id, _, place = text.partition(":")
        found = _PLACE.match(place)
        if not agent_id or found is None:
            raise InvalidArgument(f"{text!r} names no link: give AGENT:PORT (ag3:5), AGENT:syncN, AGENT:gwN or AGENT:ipuN:PL (ag3:ipu1:4C)")
        for kind, group in ((LinkKind.IPULINK, "ipulink"), (LinkKind.SYNC, "sync"), (LinkKind.GWLINK, "gw")):
            if found[group] is not None and not 1 <= int(found[group]) <= PORT_COUNTS[kind]:
                raise InvalidArgument(f"{kind.value} ports are numbered 1 to {PORT_COUNTS[kind]}, not {found[group]}")
        if found["internal"] is not None and found["internal"] not in _INTERNAL_KEYS:
            raise InvalidArgument(f"{found['internal']!r} is not a link inside an IPU-M2000; they are ipu0:1A to ipu2:4D")
        return cls(agent_id, place)


@dataclass(frozen=True)
class CableIdentity:
    """An OSFP cable as its EEPROM names it; a new serial in a port is a new cable."""

    serial: str
    vendor: str = ""
    model: str = ""


@dataclass(frozen=True)
class LinkReading:
    """What an agent reads of one link of its machine: its counters, whether it is up, and for a
    chassis port the cable in it (None: an internal link, or an empty port) and where that leads."""

    place: str  # as LinkName.place: "5", "sync2", "gw1", "ipu1:4C"
    corrected: int
    recoveries: int
    up: bool
    cable: CableIdentity | None = None
    peer_serial: str = ""
    peer_port: int = 0


Counters = tuple[int, int]  # corrected errors and recoveries, as one reading gives them


@dataclass(frozen=True)
class Sample:
    """One reading of a link's counters."""

    at: float  # seconds since the epoch
    corrected: int  # corrected errors since the machine's last reset
    recoveries: int  # link recovery (retraining) events since then
    up: bool

    @property
    def counters(self) -> Counters:
        return self.corrected, self.recoveries


@dataclass(frozen=True)
class Summary:
    """A span of a link's samples, compacted: how much its counters grew in it (across resets),
    where they stood at its end, and how many of its samples found the link down."""

    start: float
    end: float  # the last sample's time
    samples: int
    down: int
    corrected_growth: int
    recovery_growth: int
    last_corrected: int
    last_recoveries: int

    @property
    def last_counters(self) -> Counters:
        return self.last_corrected, self.last_recoveries


def growth(before: Counters | None, after: Counters) -> Counters:
    """How much the counters grew from one reading to the next (none without an earlier one); a
    counter that went down was reset (the machine was), so all it reads now grew since."""
    if before is None:
        return 0, 0
    return _grew(before[0], after[0]), _grew(before[1], after[1])


def _grew(then: int, now: int) -> int:
    return now - then if now >= then else now


def summarise(samples: Sequence[Sample], start: float, before: Counters | None) -> Summary:
    """The samples of one span (in time order), `before` the counters just before it (None: none known)."""
    corrected = recoveries = 0
    last = before
    for sample in samples:
        grew = growth(last, sample.counters)
        corrected, recoveries = corrected + grew[0], recoveries + grew[1]
        last = sample.counters
    assert last is not None
    return Summary(start, samples[-1].at, len(samples), sum(not s.up for s in samples), corrected, recoveries, last[0], last[1])


def merge(summaries: Sequence[Summary], start: float) -> Summary:
    """Consecutive summaries as one (an hour's into a day's)."""
    return Summary(start, summaries[-1].end, sum(s.samples for s in summaries), sum(s.down for s in summaries),
                   sum(s.corrected_growth for s in summaries), sum(s.recovery_growth for s in summaries),
                   summaries[-1].last_corrected, summaries[-1].last_recoveries)


@dataclass(frozen=True)
class Retention:
    """How long each form of a link's history is kept: full samples, then hourly summaries, then
    daily ones; nothing older than `days`."""

    full_seconds: float = 7 * DAY
    hourly_seconds: float = 90 * DAY
    days: float = 400.0

    def __post_init__(self) -> None:
        if not 0 < self.full_seconds <= self.hourly_seconds <= self.days * DAY:
            raise InvalidArgument("keep full samples no longer than hourly summaries, and those no longer than the history")

    @classmethod
    def keeping(cls, days: float) -> Retention:
        """The default forms of history within `days`: a history shorter than the default hourly
        summaries' keeps them no longer than itself."""
        return cls(days=days, hourly_seconds=min(cls.hourly_seconds, days * DAY))


DEFAULT_RETENTION = Retention()


@dataclass(frozen=True)
class History:
    """One link's history: summaries (oldest first, hourly and daily), then full samples."""

    summaries: tuple[Summary, ...] = ()
    samples: tuple[Sample, ...] = ()


def _bucket(at: float, width: float) -> float:
    return at - at % width


def compact(history: History, now: float, retention: Retention = DEFAULT_RETENTION) -> History:
    """The history with samples older than `retention.full_seconds` summarised per hour, hourly
    summaries older than `retention.hourly_seconds` merged per day, and anything older than
    `retention.days` dropped. Compacting again changes nothing; growth is never lost within
    what is kept."""
    full_from, hourly_from, oldest = now - retention.full_seconds, now - retention.hourly_seconds, now - retention.days * DAY
    last_known = history.summaries[-1].last_counters if history.summaries else None
    old = [s for s in history.samples if _bucket(s.at, HOUR) + HOUR <= full_from]
    recent = history.samples[len(old):]  # samples are in time order
    hourly = list(history.summaries)
    for start, grouped in groupby(old, key=lambda s: _bucket(s.at, HOUR)):
        span = list(grouped)
        hourly.append(summarise(span, start, last_known))
        last_known = span[-1].counters
    kept: list[Summary] = []
    for day, grouped_hours in groupby(hourly, key=lambda s: _bucket(s.start, DAY) if _bucket(s.start, DAY) + DAY <= hourly_from else None):
        spans = list(grouped_hours)
        if day is None or (len(spans) == 1 and spans[0].start == day):  # recent hours, or a day merged already
            kept += spans
        else:
            kept.append(merge(spans, day))
    return History(tuple(s for s in kept if s.end >= oldest), recent)


@dataclass(frozen=True)
class TrendPolicy:
    """A link is suspect when its counters grew in at least `growing` of its last `windows`
    windows of `window_seconds` each.

    The default, 4 of the last 12 hours, is chosen by `bench/link_year.py`: a degrading link grows
    in every window, so it is flagged 4 h after it starts either way, while a healthy link's
    isolated corrected errors (0.1 a day) fall in 4 of 12 hours about ten times more rarely than
    in 3 of 6 (0 of 1,703 healthy links flagged in a simulated year, against 18)."""

    window_seconds: float = HOUR
    windows: int = 12
    growing: int = 4

    def __post_init__(self) -> None:
        if not 0 < self.window_seconds < math.inf or not 1 <= self.growing <= self.windows:
            raise InvalidArgument("a trend needs windows longer than 0 s and 1 <= k <= N windows (k of the last N)")
        if self.span_seconds > DEFAULT_RETENTION.full_seconds:
            raise InvalidArgument(f"a trend's N windows must fit in the {duration_text(DEFAULT_RETENTION.full_seconds)} of full readings "
                                  "the ledger keeps")

    @property
    def span_seconds(self) -> float:
        """How far back the trend looks: its N windows."""
        return self.window_seconds * self.windows


DEFAULT_POLICY = TrendPolicy()


def growth_windows(samples: Iterable[Sample], policy: TrendPolicy, now: float) -> list[bool]:
    """For each of the last N windows, newest first, whether the counters grew within it (a window
    with no reading shows no growth: there is no evidence of any)."""
    grew = [False] * policy.windows
    last: Counters | None = None
    for sample in sorted(samples, key=lambda s: s.at):
        corrected, recoveries = growth(last, sample.counters)
        last = sample.counters
        age = now - sample.at
        if 0 <= age < policy.span_seconds and (corrected or recoveries):
            grew[int(age // policy.window_seconds)] = True
    return grew


@dataclass(frozen=True)
class Verdict:
    health: LinkHealth
    reason: str


def judge(samples: Sequence[Sample], policy: TrendPolicy, now: float, test_failure: str = "") -> Verdict:
    """The link's health now: failed by a test's failure or by its last reading down, suspect by
    its trend, healthy otherwise; each with its reason in words."""
    if test_failure:
        return Verdict(LinkHealth.FAILED, test_failure)
    latest = max(samples, key=lambda s: s.at, default=None)
    if latest is not None and not latest.up:
        return Verdict(LinkHealth.FAILED, "it is down: it stopped training")
    windows = growth_windows(samples, policy, now)
    span = f"{policy.windows} windows of {duration_text(policy.window_seconds)}"
    if sum(windows) >= policy.growing:
        return Verdict(LinkHealth.SUSPECT, f"its errors or recoveries grew in {sum(windows)} of its last {span}")
    return Verdict(LinkHealth.HEALTHY, f"its errors or recoveries grew in {sum(windows)} of its last {span}")


@dataclass(frozen=True)
class LinkState:
    """What the ledger knows of a link now: its health and why, since when, the cable in it, its
    last reading, and the failure a cluster test found in it (kept until a test passes it or its
    cable is replaced)."""

    name: LinkName
    health: LinkHealth
    reason: str
    changed_at: float
    cable: CableIdentity | None = None
    cable_since: float = 0.0  # when that cable was first seen there
    last: Sample | None = None
    test_failure: str = ""
    breaker: str = ""  # why a failed link is not quarantined: the breaker holds (see `breaker_holds`)
    first_seen: float = 0.0  # when the ledger first met it

    @property
    def quarantined(self) -> bool:
        """Failed, and kept out of every partition's shape (unless the breaker holds)."""
        return self.health is LinkHealth.FAILED and not self.breaker


@dataclass(frozen=True)
class LinkEvent:
    """A change in a link's life, kept in the ledger: its health changed (and why), or its cable
    was replaced; with the partitions that used the link then."""

    name: LinkName
    at: float
    health: LinkHealth
    reason: str
    partitions: tuple[str, ...] = ()


@dataclass(frozen=True)
class CableRecord:
    """A cable as the ledger met it: in which link's port, from when, and the cable it replaced."""

    identity: CableIdentity
    name: LinkName
    first_seen: float
    replaced: str = ""  # the serial of the cable that was there before


@dataclass(frozen=True)
class LinkDetail:
    """One link with what the ledger kept of it: `vipu-admin get link --history`."""

    state: LinkState
    history: History
    events: list[LinkEvent]
    cables: list[CableRecord]
    samples_left_out: int = 0  # older readings within the times asked, past the page's limit
    events_left_out: int = 0


def links_used(layout: ClusterLayout, ipus: Iterable[tuple[str, int]]) -> frozenset[LinkName]:
    """The links a partition on these IPUs (as (agent, index) pairs) trains and runs over: on each
    machine the internal links between two of its IPUs, and, between machines it takes whole,
    both ends of every cable joining two of them (IPU-Links and Sync-Links between rack neighbours
    and a torus's loop-back, GW-Links between domains)."""
    by_agent: dict[str, set[int]] = {}
    for agent, index in ipus:
        by_agent.setdefault(agent, set()).add(index)
    names = {LinkName(agent, link.key) for agent, indices in by_agent.items() for link in INTERNAL_LINKS
             if link.lower_ipu in indices and link.upper_ipu in indices}
    whole = [agent for agent, indices in by_agent.items() if len(indices) == IPUS_PER_MACHINE]
    if len(whole) > 1:
        for cable in layout.ipulink_cables(whole) + layout.sync_cables(whole) + layout.gwlink_cables(whole):
            for end in (cable.lower, cable.upper):
                names.add(LinkName.of_port(end.agent_id, end.kind, end.number))
    return frozenset(names)


@dataclass(frozen=True)
class LinkFaults:
    """Some machines' unhealthy links as placement weighs them, each with the ledger's reason: a
    failed link is quarantined (no partition is placed on a shape that needs it, while shapes that
    do not still use its machine), a suspect one is stepped around while another shape fits.
    `sequence` orders the ledger's word of them: a later word replaces an earlier, never the reverse."""

    failed: Mapping[LinkName, str] = field(default_factory=dict)
    suspect: Mapping[LinkName, str] = field(default_factory=dict)
    sequence: int = 0

    def __bool__(self) -> bool:
        return bool(self.failed or self.suspect)

    @classmethod
    def of(cls, states: Iterable[LinkState], agents: Set[str] | None = None, sequence: int = 0) -> LinkFaults:
        """The faults among the links' states, of the `agents` given (all if None): a failed link
        the breaker keeps out of quarantine is only stepped around, as a suspect one."""
        failed, suspect = {}, {}
        for state in states:
            if agents is not None and state.name.agent_id not in agents:
                continue
            if state.quarantined:
                failed[state.name] = state.reason
            elif state.health is LinkHealth.FAILED:  # the breaker holds: stepped around while another shape fits
                suspect[state.name] = f"failed ({state.reason}), not quarantined: {state.breaker}"
            elif state.health is LinkHealth.SUSPECT:
                suspect[state.name] = state.reason
        return cls(failed, suspect, sequence)

    @cached_property
    def agents(self) -> frozenset[str]:
        """The machines with an unhealthy link (asked of every shape placement weighs: worked out once)."""
        return frozenset(name.agent_id for name in (*self.failed, *self.suspect))

    def within(self, agents: Set[str]) -> LinkFaults:
        return LinkFaults({n: r for n, r in self.failed.items() if n.agent_id in agents},
                          {n: r for n, r in self.suspect.items() if n.agent_id in agents}, self.sequence)

    def met(self, layout: ClusterLayout, ipus: Iterable[tuple[str, int]]) -> tuple[list[LinkName], list[LinkName]]:
        """The failed links and the suspect ones, in name order, that a partition on these IPUs needs."""
        ipus = list(ipus)
        if not self or self.agents.isdisjoint(agent for agent, _ in ipus):
            return [], []
        used = links_used(layout, ipus)
        return sorted(used & self.failed.keys()), sorted(used & self.suspect.keys())

    def described(self, names: Iterable[LinkName]) -> str:
        """Links with their health and why, in one line: "ag1:5 (suspect: its errors grew ...)"."""
        return "; ".join(f"{name} ({'failed' if name in self.failed else 'suspect'}: "
                         f"{self.failed.get(name) or self.suspect.get(name, '')})" for name in names)

    def warnings(self, layout: ClusterLayout, ipus: Iterable[tuple[str, int]]) -> list[str]:
        """What a partition on these IPUs is told of the unhealthy links it runs over, a line each."""
        failed, suspect = self.met(layout, ipus)
        return [f"link {name} it runs over is {'failed' if name in self.failed else 'suspect'}: "
                f"{self.failed.get(name) or self.suspect.get(name, '')}" for name in (*failed, *suspect)]


NO_FAULTS = LinkFaults()


@dataclass(frozen=True)
class RemediationPolicy:
    """Automatic remediation of a failed link: reset it, re-test it (read it again once it has
    had `settle_seconds` to train), and leave it quarantined if that does not bring it back; at
    most `attempts` in `window_seconds` for a link or for its machine (a link that keeps failing
    is left to a person). The breaker: no automatic quarantine that would leave more than
    `breaker_share` of an allocation's machines with a quarantined link."""

    attempts: int = 3
    window_seconds: float = 7 * DAY
    settle_seconds: float = 5.0
    breaker_share: float = 0.2

    def __post_init__(self) -> None:
        if self.attempts < 0 or self.window_seconds <= 0 or self.settle_seconds < 0 or not 0 < self.breaker_share <= 1:
            raise InvalidArgument("remediation needs attempts >= 0, a window longer than 0 s, a settle time >= 0 s "
                                  "and a breaker share above 0 and at most 1")


DEFAULT_REMEDIATION = RemediationPolicy()
REFUSED = "automatic remediation refused"  # how a refused attempt's outcome starts: the caps do not count it


@dataclass(frozen=True)
class Attempt:
    """One automatic remediation of a link: when, and how it ended ("" while under way)."""

    name: LinkName
    at: float
    outcome: str = ""


def attempts_refusal(name: LinkName, attempts: Sequence[Attempt], policy: RemediationPolicy, now: float) -> str:
    """Why a new automatic remediation of the link is refused ("" if it may go ahead): the link,
    or its machine, had `policy.attempts` already within the window (refused ones not counted)."""
    recent = [a for a in attempts if now - a.at < policy.window_seconds and not a.outcome.startswith(REFUSED)]
    of_link = sum(a.name == name for a in recent)
    of_machine = sum(a.name.agent_id == name.agent_id for a in recent)
    span = duration_text(policy.window_seconds)
    if of_link >= policy.attempts:
        return f"{REFUSED}: link {name} had {of_link} attempts in the last {span} (at most {policy.attempts})"
    if of_machine >= policy.attempts:
        return (f"{REFUSED}: machine {name.agent_id} had {of_machine} attempts in the last {span} "
                f"(at most {policy.attempts})")
    return ""


def breaker_holds(name: LinkName, allocation_id: str, allocation_agents: Sequence[str], quarantined_agents: Set[str],
                  policy: RemediationPolicy) -> str:
    """Why the breaker keeps a failed link out of quarantine ("" if it may be quarantined): its
    allocation would have more than `policy.breaker_share` of its machines with a quarantined link
    (`quarantined_agents`, besides this one). One machine may always be quarantined, or a small
    allocation could quarantine nothing."""
    machines = set(allocation_agents)
    after = (set(quarantined_agents) & machines) | {name.agent_id}
    if len(after) <= 1 or len(after) <= policy.breaker_share * len(machines):
        return ""
    return (f"the breaker holds: quarantining {name} would leave {len(after)} of the {len(machines)} machines of allocation "
            f"{allocation_id} ({len(after) / len(machines):.0%}) with a quarantined link, over {policy.breaker_share:.0%}")


@dataclass(frozen=True)
class Reliability:
    """How often a link (or a machine's links) failed, and how soon it came back: the mean time
    between failures (from the first sight of it, time down excluded) and the mean time to repair
    (from failing to any other health), over the events kept."""

    failures: int
    mtbf_seconds: float
    mttr_seconds: float


def reliability(events: Iterable[LinkEvent], first_seen: float, now: float) -> Reliability:
    """From the events of one link, or of a machine's links (whose spans down are merged: a
    machine is down while any of its links is), and when it was first seen. Time down so far
    counts for a link failed now; a repair not yet made is not in MTTR."""
    by_link: dict[LinkName, list[LinkEvent]] = {}
    for event in events:
        by_link.setdefault(event.name, []).append(event)
    spans = sorted(span for link_events in by_link.values() for span in _down_spans(link_events, now))
    merged: list[list[float]] = []  # [from, to, repaired], widened as spans overlap
    for start, end, repaired in spans:
        if merged and start <= merged[-1][1]:
            merged[-1][1], merged[-1][2] = max(merged[-1][1], end), repaired if end >= merged[-1][1] else merged[-1][2]
        else:
            merged.append([start, end, repaired])
    failures, down = len(merged), sum(end - start for start, end, _ in merged)
    repairs = [end - start for start, end, repaired in merged if repaired]
    up = max(0.0, now - first_seen - down)
    return Reliability(failures, up / failures if failures else 0.0, sum(repairs) / len(repairs) if repairs else 0.0)


def _down_spans(events: Sequence[LinkEvent], now: float) -> list[tuple[float, float, bool]]:
    """(from, to, repaired) of each span one link spent failed; one not over yet ends `now`, unrepaired."""
    spans, down_since = [], None
    for event in sorted(events, key=lambda e: e.at):
        failed = event.health is LinkHealth.FAILED
        if failed and down_since is None:
            down_since = event.at
        elif not failed and down_since is not None:
            spans.append((down_since, event.at, True))
            down_since = None
    if down_since is not None:
        spans.append((down_since, now, False))
    return spans
