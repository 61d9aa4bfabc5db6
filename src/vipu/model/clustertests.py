"""The cluster test suite's judgement: what each test counts, and what passes.

Agents only observe (what cable is in a port, whether a link came up and reaches whom, how many
corrected errors it shows, what an RNIC's PFC classes are); these pure functions compare the
observations with what the cluster's topology expects, count the elements as seed 002 does
(14 Sync-Link cables and 28 cables in an 8-machine mesh, 16 links inside each machine, traffic
windows of 16 IPUs sliding by two machines), and word the summary lines the CLI prints. Each
outcome also keeps the lines about each cable it failed, so that a cluster's cabling can be shown
with every cable's verdict: each cluster keeps, for each of its cables, the verdict of the last
of its tests that judged it (`CableVerdicts`), which a test of another cluster, or one judging
other kinds of cable, leaves as it was.

An agent that did not answer has `None` for its observations; every element that needs it fails.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum

from vipu.model.entities import IPUS_PER_MACHINE
from vipu.model.topology import INTERNAL_LINKS, Cable, ClusterLayout, InternalLink, LinkKind

TRAFFIC_ERROR_THRESHOLD = 300  # corrected errors on one link above which it fails
TRAFFIC_WINDOW_MACHINES = 4  # 16 IPUs
TRAFFIC_WINDOW_STEP = 2
EXPECTED_PFC_CLASSES = (0, 1, 2, 3, 4, 5, 6, 7)


class TestType(str, Enum):
    SYNC = "Sync-Link"
    CABLING = "Cabling"
    IPULINK = "IPU-Link"
    TRAFFIC = "Traffic"
    GWLINK = "GW-Link"
    VERSION = "Version"
    PFC = "PFC-settings"


ORDER = tuple(TestType)
# What `test cluster CL` runs with no test named: seed 002's six. The PFC-settings test reads the
# RNICs of the hosts, not the cluster's cabling, and runs when asked for by name.
DEFAULT_SUITE = frozenset(ORDER) - {TestType.PFC}
DEPENDS_ON = {
    TestType.IPULINK: (TestType.CABLING,),
    TestType.TRAFFIC: (TestType.SYNC, TestType.CABLING, TestType.IPULINK),
    TestType.GWLINK: (TestType.CABLING,),
}
# Tests that drive links or IPUs, and so must not run under partitions.
DISRUPTIVE = {TestType.SYNC, TestType.IPULINK, TestType.TRAFFIC, TestType.GWLINK}


class Probe(str, Enum):
    """What a test step asks each agent to do and report."""

    SYNC = "sync"  # drive the Sync-Links and GW-Link sync, report which came up and where they reach
    CABLING = "cabling"  # read the OSFP serial in every IPU-Link and GW-Link port
    IPULINK = "ipulink"  # train every IPU-Link, external and internal
    TRAFFIC = "traffic"  # run the test program on some IPUs and count corrected link errors
    GWLINK = "gwlink"  # bring up the GW-Links
    PFC = "pfc"  # read the RNICs' PFC classes


class Status(str, Enum):
    PASSED = "passed"
    FAILED = "failed"
    SKIPPED = "skipped"
    STOPPED = "stopped"  # cut short (an idle-time test giving its machines back): it judged nothing


@dataclass
class Outcome:
    test: TestType
    status: Status
    passed: int
    total: int
    summary: list[str]
    duration: float = 0.0
    cable_failures: dict[str, list[str]] = field(default_factory=dict)  # Cable.key -> the summary's lines about it
    machines: tuple[str, ...] = ()  # the machines it tested when not the whole cluster (an idle-time test's, an operator's of drained ones)

    def covers(self, cable: Cable) -> bool:
        """Whether it tested the machines at both ends of the cable."""
        return not self.machines or (cable.lower.agent_id in self.machines and cable.upper.agent_id in self.machines)


@dataclass(frozen=True)
class PortReading:
    kind: LinkKind
    port: int
    cable_serial: str = ""  # the OSFP cable's serial id, "" when the port is empty
    up: bool = False  # the link came up
    peer_serial: str = ""  # the machine at the far end, when up
    peer_port: int = 0
    errors: int = 0  # corrected errors under traffic


@dataclass(frozen=True)
class InternalReading:
    link: str  # "ipu1:4C"
    up: bool
    errors: int = 0


@dataclass(frozen=True)
class Observation:
    """What one agent reported for one test step."""

    ports: tuple[PortReading, ...] = ()
    internal: tuple[InternalReading, ...] = ()
    checksums: Mapping[int, int] = field(default_factory=dict)  # IPU index -> program result
    rnics: Mapping[str, tuple[int, ...]] = field(default_factory=dict)  # RNIC -> PFC classes


class RunState(str, Enum):
    RUNNING = "running"
    FINISHED = "finished"
    STOPPED = "stopped"
    INTERRUPTED = "interrupted"  # the controller stopped while it ran
    STEPPED_ASIDE = "stepped-aside"  # an idle-time test gave its machines back (to a partition): the tests it finished stand


@dataclass
class TestRun:
    cluster_id: str
    state: RunState
    tests: list[TestType]
    outcomes: list[Outcome] = field(default_factory=list)


Observations = Mapping[str, Observation | None]  # agent id -> what it saw, None if it did not answer


def plan(selected: set[TestType]) -> list[TestType]:
    """The tests to run, in the suite's order; none selected means the default suite."""
    return [t for t in ORDER if t in (selected or DEFAULT_SUITE)]


def failed_dependency(test: TestType, outcomes: Mapping[TestType, Outcome]) -> TestType | None:
    """The first of `test`'s dependencies that ran in this run and failed."""
    for dependency in DEPENDS_ON.get(test, ()):
        if dependency in outcomes and outcomes[dependency].status is Status.FAILED:
            return dependency
    return None


def skipped(test: TestType, dependency: TestType) -> Outcome:
    return Outcome(test, Status.SKIPPED, 0, 0, [
        "Test skipped", f"Test did not run because of an earlier dependency test failure ({dependency.value})"
    ])


# How a test of some machines alone is refused when one of them may not be tested so (`not_drained`, ...).
TESTED_ALONE = "a test of some machines alone needs them drained"


def not_drained(agent_id: str) -> str:
    """Why a machine not drained is not tested alone, and how to drain it."""
    return f"agent {agent_id} is not drained (vipu-admin drain agent {agent_id} --reason ...)"


def no_traffic_window(layout: ClusterLayout, among: tuple[str, ...]) -> Outcome:
    """The Traffic test of machines no window of which lies wholly among them: nothing to run, and
    nothing failed (as GW-Link's in a one-domain cluster)."""
    width = min(TRAFFIC_WINDOW_MACHINES, layout.machines_per_ild)
    return Outcome(TestType.TRAFFIC, Status.PASSED, 0, 0, [
        f"Traffic test skipped: no window ({width} machines in a row of a domain) lies wholly within {', '.join(among)}"])


def stepped_aside(test: TestType, why: str, machines: tuple[str, ...]) -> Outcome:
    """The test an idle-time run was at when it gave its machines back; the tests before it stand."""
    return Outcome(test, Status.STOPPED, 0, 0, ["Test stopped", f"Stepped aside: {why}"], machines=machines)


def on_machines(outcome: Outcome, machines: tuple[str, ...], run: str = "Idle-time test") -> Outcome:
    """An outcome of a run that tested these machines only (and the cables between them): an
    idle-time test's, or an operator's test of drained machines."""
    outcome.machines = machines
    outcome.summary.append(f"{run} of {', '.join(machines)}")
    return outcome


def _outcome(test: TestType, passed: int, total: int, success: str, headline: str | None, lines: list[str],
             cable_failures: dict[str, list[str]] | None = None) -> Outcome:
    if passed == total and not lines:
        return Outcome(test, Status.PASSED, passed, total, [success])
    return Outcome(test, Status.FAILED, passed, total, ([headline] if headline else []) + lines, cable_failures=cable_failures or {})


def _ends(cable: Cable) -> str:
    """A cable as the Sync-Link, IPU-Link and GW-Link tests name it: "ag4:6 <--> 2:ag5"."""
    return f"{cable.lower.agent_id}:{cable.lower.number} <--> {cable.upper.number}:{cable.upper.agent_id}"


def _failing(cables: list[Cable], observations: Observations, serials: Mapping[str, str]) -> dict[str, list[str]]:
    """The cables that did not link, each with its line."""
    return {c.key: [_ends(c)] for c in cables if not _linked(c, observations, serials)}


def _lines(cable_failures: dict[str, list[str]]) -> list[str]:
    return [line for lines in cable_failures.values() for line in lines]


def program_checksum(seed: int, chip_id: str, routing_id: int) -> int:
    """What the test program computes on one IPU: fixed by the seed, the chip and its place."""
    return zlib.crc32(f"{seed}/{chip_id}/{routing_id}".encode())


def _reading(observation: Observation | None, kind: LinkKind, port: int) -> PortReading | None:
    if observation is None:
        return None
    return next((r for r in observation.ports if r.kind is kind and r.port == port), PortReading(kind, port))


def _silent(observations: Observations, agents: Iterable[str]) -> list[str]:
    return [f"{agent}: does not answer" for agent in agents if observations.get(agent) is None]


def _linked(cable: Cable, observations: Observations, serials: Mapping[str, str]) -> bool:
    """Both ends of an expected cable are up and each reaches the other."""
    low, up = cable.lower, cable.upper
    a, b = _reading(observations.get(low.agent_id), low.kind, low.number), _reading(observations.get(up.agent_id), up.kind, up.number)
    return (
        a is not None and b is not None and a.up and b.up
        and (a.peer_serial, a.peer_port) == (serials[up.agent_id], up.number)
        and (b.peer_serial, b.peer_port) == (serials[low.agent_id], low.number)
    )


def _tested(layout: ClusterLayout, among: tuple[str, ...] | None) -> tuple[str, ...]:
    """The machines a run tests: the cluster's, or those `among` the given ones, in cluster order."""
    return layout.agent_ids if among is None else tuple(a for a in layout.agent_ids if a in among)


def judge_sync(layout: ClusterLayout, observations: Observations, serials: Mapping[str, str],
               among: tuple[str, ...] | None = None) -> Outcome:
    """Sync-Link cables, and in a multi-domain cluster the sync carried over GW-Links too; of the
    machines `among` only (the cables between them), if given."""
    cables = layout.sync_cables(among) + layout.gwlink_cables(among)
    failing = _failing(cables, observations, serials)
    return _outcome(TestType.SYNC, len(cables) - len(failing), len(cables), "Sync Link test passed", "Failed Sync Links:",
                    _silent(observations, _tested(layout, among)) + _lines(failing), failing)


def _port_label(kind: LinkKind) -> str:
    return "IPU-Cluster Port" if kind is LinkKind.IPULINK else "GW-Link Port"


def judge_cabling(layout: ClusterLayout, observations: Observations, among: tuple[str, ...] | None = None) -> Outcome:
    """IPU-Link and GW-Link cables: the OSFP serial at both expected ends must be the same; of the
    machines `among` only (the cables between them), if given."""
    cables = layout.ipulink_cables(among) + layout.gwlink_cables(among)
    missing, wrong = [], []
    failing: dict[str, list[str]] = {}
    for cable in cables:
        low, up = cable.lower, cable.upper
        a = _reading(observations.get(low.agent_id), low.kind, low.number)
        b = _reading(observations.get(up.agent_id), up.kind, up.number)
        if a is not None and b is not None and a.cable_serial and a.cable_serial == b.cable_serial:
            continue
        far = observations.get(up.agent_id)
        misplaced = a is not None and a.cable_serial and far is not None and any(
            r.kind is up.kind and r.cable_serial == a.cable_serial for r in far.ports
        )
        if misplaced:
            line = (f"{low.agent_id} ({_port_label(low.kind)} {low.number}) <--> {up.agent_id} "
                    f"({_port_label(up.kind)} {up.number}) (connected to wrong port)")
            wrong.append(line)
        else:
            line = f"{low.agent_id}:{low.number} [{low.kind.value}] <--> {up.agent_id}:{up.number} [{up.kind.value}] (failed)"
            missing.append(line)
        failing[cable.key] = [line]
    failures = len(missing) + len(wrong)
    headline = "Cables not connected as expected:" if wrong else None
    return _outcome(TestType.CABLING, len(cables) - failures, len(cables), "All cables connected as expected", headline,
                    _silent(observations, _tested(layout, among)) + wrong + missing, failing)


def _internal_line(agent: str, link: InternalLink, suffix: str = "") -> str:
    return f"{agent}:ipu{link.lower_ipu}:{link.name} <--> {link.name}:ipu{link.upper_ipu}:{agent}{suffix}"


def judge_ipulink(layout: ClusterLayout, observations: Observations, serials: Mapping[str, str],
                  among: tuple[str, ...] | None = None) -> Outcome:
    """Every IPU-Link trains: one per cable between machines, and the 16 inside each machine; of the
    machines `among` only (and the cables between them), if given."""
    cables = layout.ipulink_cables(among)
    agents = _tested(layout, among)
    failing = _failing(cables, observations, serials)
    lines = _lines(failing)
    for agent in agents:
        observation = observations.get(agent)
        up = {r.link for r in observation.internal if r.up} if observation is not None else set()
        lines += [_internal_line(agent, link) for link in INTERNAL_LINKS if link.key not in up]
    total = len(cables) + len(INTERNAL_LINKS) * len(agents)
    return _outcome(TestType.IPULINK, total - len(lines), total, "All Links Passed", "Links that did not train:",
                    _silent(observations, agents) + lines, failing)


def traffic_windows(layout: ClusterLayout, among: tuple[str, ...] | None = None) -> list[tuple[str, ...]]:
    """Overlapping windows of at most 16 IPUs in each domain, covering every link in it; only those
    wholly `among` the machines given, if given."""
    size = layout.machines_per_ild
    width = min(TRAFFIC_WINDOW_MACHINES, size)
    if size <= width:
        starts = [0]
    elif layout.is_torus:
        starts = list(range(0, size, TRAFFIC_WINDOW_STEP))
    else:
        starts = list(range(0, size - width + 1, TRAFFIC_WINDOW_STEP))
        if starts[-1] != size - width:
            starts.append(size - width)
    windows = [tuple(layout.agent_at(d, s + i) for i in range(width)) for d in range(layout.num_ilds) for s in starts]
    return windows if among is None else [w for w in windows if set(w) <= set(among)]


def traffic_phases(windows: list[tuple[str, ...]]) -> list[list[int]]:
    """Window numbers (from 1) grouped so that no two windows of a group share a machine.

    Overlapping windows share IPUs and must run one after the other; the windows of one phase
    can run together, so the whole test takes about two window-times however large the pod.
    """
    phases: list[tuple[list[int], set[str]]] = []
    for number, window in enumerate(windows, start=1):
        for members, machines in phases:
            if machines.isdisjoint(window):
                members.append(number)
                machines.update(window)
                break
        else:
            phases.append(([number], set(window)))
    return [members for members, _ in phases]


@dataclass
class WindowResult:
    """One traffic window's failure lines (none when it passed), and those about each cable."""

    lines: list[str]
    cable_failures: dict[str, list[str]] = field(default_factory=dict)


def judge_traffic_window(number: int, window: tuple[str, ...], layout: ClusterLayout, observations: Observations,
                         serials: Mapping[str, str], chips: Mapping[str, Mapping[int, str]], seed: int) -> WindowResult:
    """What one traffic window saw go wrong."""
    lines = _silent(observations, window)
    failing: dict[str, list[str]] = {}
    members = set(window)
    for cable in layout.ipulink_cables():
        lower, upper = cable.lower.agent_id, cable.upper.agent_id
        if lower not in members or upper not in members:
            continue
        reading = _reading(observations.get(lower), LinkKind.IPULINK, cable.lower.number)
        if reading is None:
            continue
        name = f"{upper}:{cable.upper.number} <--> {lower}:{cable.lower.number}"
        if not _linked(cable, observations, serials):
            line = f"{name}: link down"
        elif reading.errors > TRAFFIC_ERROR_THRESHOLD:
            line = f"{name}: {reading.errors} link errors"
        else:
            continue
        lines.append(line)
        failing[cable.key] = [f"traffic test {number}: {line}"]
    routing = {(agent, ipu): n for n, (agent, ipu) in enumerate((a, i) for a in window for i in range(IPUS_PER_MACHINE))}
    for agent in window:
        observation = observations.get(agent)
        if observation is None:
            continue
        errors = {r.link: r for r in observation.internal}
        for link in INTERNAL_LINKS:
            internal = errors.get(link.key)
            if internal is None or not internal.up:
                lines.append(_internal_line(agent, link, ": link down"))
            elif internal.errors > TRAFFIC_ERROR_THRESHOLD:
                lines.append(_internal_line(agent, link, f": {internal.errors} link errors"))
        for ipu in range(IPUS_PER_MACHINE):
            expected = program_checksum(seed, chips[agent].get(ipu, ""), routing[(agent, ipu)])
            if observation.checksums.get(ipu) != expected:
                lines.append(f"{agent}:ipu{ipu}: wrong result from the test program")
    return WindowResult([f"Errors encountered in traffic test {number}", *lines] if lines else [], failing)


def traffic_outcome(windows: list[WindowResult]) -> Outcome:
    failed = [window.lines for window in windows if window.lines]
    failing: dict[str, list[str]] = {}
    for window in windows:
        for key, lines in window.cable_failures.items():
            failing.setdefault(key, []).extend(lines)
    return _outcome(TestType.TRAFFIC, len(windows) - len(failed), len(windows), "Traffic test passed",
                    "Traffic test failed", [line for lines in failed for line in lines], failing)


def judge_gwlink(layout: ClusterLayout, observations: Observations, serials: Mapping[str, str],
                 among: tuple[str, ...] | None = None) -> Outcome:
    """GW-Link cables (of the machines `among` only, if given); skipped in a one-domain cluster."""
    cables = layout.gwlink_cables(among)
    if not cables:
        return Outcome(TestType.GWLINK, Status.PASSED, 0, 0, ["GW Link test skipped"])
    failing = _failing(cables, observations, serials)
    return _outcome(TestType.GWLINK, len(cables) - len(failing), len(cables), "GW Link test passed", "Failed GW-Links:",
                    _silent(observations, _tested(layout, among)) + _lines(failing), failing)


COMPONENT_LABELS = {
    "agent": "Agent", "gateway-software": "Gateway-Software", "ipum-software": "IPU-M-Software",
    "ipuof-server": "IPUoF-Server", "firmware": "Firmware", "bmc": "BMC",
}


def judge_versions(agents: tuple[str, ...], versions: Mapping[str, Mapping[str, str] | None]) -> Outcome:
    """Each component type must have one version across the cluster's agents."""
    answered = {a: v for a, v in versions.items() if v is not None}
    components = sorted({c for v in answered.values() for c in v})
    silent = [f"{agent}: does not answer" for agent in agents if versions.get(agent) is None]
    mismatched = [c for c in components if len({answered[a].get(c, "") for a in answered}) > 1]
    lines = []
    for component in mismatched:
        label = COMPONENT_LABELS.get(component, component)
        lines += [f"{agent}-{label}: {answered[agent].get(component, '-')}" for agent in agents if agent in answered]
    passed = 0 if silent else len(components) - len(mismatched)
    return _outcome(TestType.VERSION, passed, len(components), "All component versions are consistent",
                    "Components with mismatched versions found:", silent + lines)


def judge_pfc(agents: tuple[str, ...], observations: Observations) -> Outcome:
    expected = " ".join(str(c) for c in EXPECTED_PFC_CLASSES)
    lines = []
    for agent in agents:
        observation = observations.get(agent)
        if observation is None:
            lines.append(f"{agent}: does not answer")
            continue
        bad = [f"{rnic}: pfc classes: got [{', '.join(str(c) for c in classes)}], expected [{expected}]"
               for rnic, classes in sorted(observation.rnics.items()) if tuple(classes) != EXPECTED_PFC_CLASSES]
        if bad:
            lines.append(f"{agent}: {{{', '.join(bad)}}}")
    return _outcome(TestType.PFC, len(agents) - len(lines), len(agents), "All PFC settings as expected",
                    "PFC settings not as expected:", lines)


# The kinds of cable each test judges.
JUDGED_CABLES = {
    TestType.SYNC: {LinkKind.SYNC, LinkKind.GWLINK},  # GW-Links carry the sync between domains
    TestType.CABLING: {LinkKind.IPULINK, LinkKind.GWLINK},
    TestType.IPULINK: {LinkKind.IPULINK},
    TestType.TRAFFIC: {LinkKind.IPULINK},
    TestType.GWLINK: {LinkKind.GWLINK},
}


class CableVerdict(str, Enum):
    PASSED = "passed"
    FAILED = "failed"
    UNTESTED = "untested"


@dataclass(frozen=True)
class CableResult:
    cable: Cable
    verdict: CableVerdict
    lines: tuple[str, ...] = ()  # "<test>: <its line about the cable>", for each test that failed it


def cable_results(layout: ClusterLayout, outcomes: list[Outcome]) -> list[CableResult]:
    """Every cable the cluster expects, judged by the tests among `outcomes` (one run's): failed
    if any of them failed it, passed if one that ran judges its kind (at both its ends' machines)
    and none failed it, untested otherwise (no such test ran, or it was skipped or stopped)."""
    ran = [o for o in outcomes if o.status not in (Status.SKIPPED, Status.STOPPED)]
    results = []
    for cable in layout.cables():
        lines = tuple(f"{o.test.value}: {line}" for o in ran for line in o.cable_failures.get(cable.key, ()))
        judged = any(cable.kind in JUDGED_CABLES.get(o.test, ()) and o.covers(cable) for o in ran)
        verdict = CableVerdict.FAILED if lines else CableVerdict.PASSED if judged else CableVerdict.UNTESTED
        results.append(CableResult(cable, verdict, lines))
    return results


@dataclass
class CableVerdicts:
    """What one cluster's tests last said of each of its cables they judged, kept across runs."""

    run_state: RunState  # the cluster's latest run's
    cables: dict[str, tuple[CableVerdict, tuple[str, ...]]] = field(default_factory=dict)  # Cable.key -> verdict, lines


def kept_verdicts(kept: CableVerdicts | None, layout: ClusterLayout, run: TestRun) -> CableVerdicts:
    """A cluster's verdicts once `run` of it (perhaps under way) has judged what it has so far:
    each cable it judged takes its verdict; the others keep theirs."""
    judged = {r.cable.key: (r.verdict, r.lines) for r in cable_results(layout, run.outcomes) if r.verdict is not CableVerdict.UNTESTED}
    return CableVerdicts(run.state, {**(kept.cables if kept is not None else {}), **judged})


def kept_results(layout: ClusterLayout, kept: CableVerdicts | None) -> list[CableResult]:
    """Every cable the cluster expects, with its kept verdict; untested when no test of the cluster judged it."""
    cables = kept.cables if kept is not None else {}
    return [CableResult(cable, *cables.get(cable.key, (CableVerdict.UNTESTED, ()))) for cable in layout.cables()]
