"""The racks as the dashboard draws them, from what the API lists.

Each IPU-Machine is a box of four IPUs (IPUs 2 and 3 above 0 and 1, as on the machine's ladder),
in rack order, the lowest machine at the bottom, in columns of 8 machines (half an IPU-POD64 rack:
a column of 16 would put the lowest machines, the first a partition takes, below the fold).
An administrator sees every cluster, each IPU-Link domain outlined, and the machines of no
cluster; a user sees the machines of their allocations only. Each IPU takes the colour of the
partition holding it (`partition_tones`), or the free colour; the allocations are outlined
within. Colours are classes of a style sheet made here (`PALETTE_CSS`), so that a page of a
thousand machines does not repeat them four thousand times.
"""

from __future__ import annotations

import math
import zlib
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from vipu.api.convert import reservation_from_proto
from vipu.api.protos import admin_pb2, vipuuser_pb2
from vipu.model.entities import drain_state

IPUS_PER_MACHINE = 4
MACHINES_PER_COLUMN = 8
FREE = ("#e2e6ec", "#6b7785")
# Colours told apart at a glance, each with the text colour that reads on it; none red, which marks errors.
PALETTE = (
    ("#4e79a7", "#ffffff"), ("#f28e2b", "#1f2933"), ("#59a14f", "#ffffff"), ("#b07aa1", "#ffffff"),
    ("#76b7b2", "#1f2933"), ("#edc948", "#1f2933"), ("#9c755f", "#ffffff"), ("#ff9da7", "#1f2933"),
    ("#2f6690", "#ffffff"), ("#8cd17d", "#1f2933"), ("#a463f2", "#ffffff"), ("#17becf", "#1f2933"),
    ("#a0cbe8", "#1f2933"), ("#e377c2", "#1f2933"), ("#1b998b", "#ffffff"), ("#6b4c9a", "#ffffff"),
)


FREE_TONE = "free"
PALETTE_CSS = "".join(f".t{n}{{background-color:{background};color:{text}}}" for n, (background, text) in enumerate(PALETTE)) + (
    f".{FREE_TONE}{{background-color:{FREE[0]};color:{FREE[1]}}}")


def partition_tones(partition_ids: Iterable[str]) -> dict[str, str]:
    """Each partition's colour, as the class of PALETTE_CSS that gives it: the palette's entry its
    id hashes to, or the next one no other partition shown has. So up to 16 partitions all look
    different, and a partition keeps its colour as others come and go unless one took its entry first."""
    taken: set[int] = set()
    tones = {}
    for partition_id in sorted(partition_ids):
        start = zlib.crc32(partition_id.encode()) % len(PALETTE)
        entry = next((e % len(PALETTE) for e in range(start, start + len(PALETTE)) if e % len(PALETTE) not in taken), start)
        taken.add(entry)
        tones[partition_id] = f"t{entry}"
    return tones


def ready_state(partition: vipuuser_pb2.Partition) -> str:
    """ACTIVE, PENDING, ERROR, ... as the CLI shows it."""
    return vipuuser_pb2.PartitionReadyState.Name(partition.ready_state).removeprefix("PS_")


def operation_state(partition: vipuuser_pb2.Partition) -> str:
    return vipuuser_pb2.PartitionOperationState.Name(partition.status.operation_state).removeprefix("POS_")


@dataclass
class Ipu:
    index: int
    partition_id: str = ""  # "" when free
    state: str = "free"  # the holding partition's state
    tone: str = FREE_TONE  # its colour's class
    heat: str = ""  # with heat colouring on, its colour (a CSS colour), and what it shows ("62 °C")
    heat_label: str = ""

    @property
    def title(self) -> str:
        held = f"{self.partition_id} ({self.state})" if self.partition_id else "free"
        return f"IPU {self.index}: {held}" + (f", {self.heat_label}" if self.heat_label else "")


@dataclass
class Machine:
    agent_id: str
    status: str = ""  # Up | Down; "" where the viewer may not see it
    allocation_id: str = ""
    ipus: list[Ipu] = field(default_factory=list)
    power: str = ""   # On | Off | ...; "" where the machine has no power capability or the viewer may not see it
    health: str = ""  # OK | Warning | Critical | Unknown; likewise
    reason: str = ""  # why it is Down
    drain: str = ""  # DRAINING | DRAINED while an operator drains it
    drain_reason: str = ""

    @property
    def hardware(self) -> str:
        """Its power and health in a few words, for the title of its box."""
        said = [f"power {self.power}" if self.power else "", f"health {self.health}" if self.health else "", self.reason,
                f"{self.drain.lower()} for {self.drain_reason}" if self.drain else ""]
        return " · ".join(part for part in said if part)

    @property
    def in_error(self) -> bool:
        return any(ipu.state == "ERROR" for ipu in self.ipus)

    @property
    def ladder(self) -> list[Ipu]:
        """The IPUs as the machine holds them, read in rows: 2 and 3 above, 0 and 1 below."""
        return self.ipus[2:4] + self.ipus[0:2]


@dataclass
class Run:
    """Machines next to each other in a column, of one allocation (or of none)."""

    allocation_id: str
    machines: list[Machine]  # top first


@dataclass
class Domain:
    label: str
    columns: list[list[Run]]  # each column's runs, top first


@dataclass
class Group:
    title: str
    subtitle: str
    domains: list[Domain]

    def machines(self) -> Iterator[Machine]:
        """Its machines as drawn, every domain, column and run."""
        return (machine for domain in self.domains for column in domain.columns for run in column for machine in run.machines)


@dataclass
class LegendEntry:
    partition_id: str
    tone: str
    state: str
    size: int


@dataclass
class Racks:
    groups: list[Group]
    legend: list[LegendEntry]
    machines: int
    down: int
    ipus: int
    used_ipus: int
    partition_states: Counter[str]
    tones: dict[str, str]  # by partition, for the other parts of a page


def _holders(partitions: Iterable[vipuuser_pb2.Partition]) -> dict[tuple[str, int], vipuuser_pb2.Partition]:
    return {(ipu.agent_id, ipu.agent_ipu_index): p for p in partitions for ipu in p.spec.ipus}


def _machine(agent_id: str, holders, tones, status: str = "", allocation_id: str = "", agent: admin_pb2.Agent | None = None) -> Machine:
    ipus = []
    for index in range(IPUS_PER_MACHINE):
        holder = holders.get((agent_id, index))
        ipus.append(Ipu(index) if holder is None else Ipu(index, holder.id, ready_state(holder), tones[holder.id]))
    if agent is None:
        return Machine(agent_id, status, allocation_id, ipus)
    drain = drain_state(agent.drain.partition_ids) if agent.HasField("drain") else ""
    return Machine(agent_id, status, allocation_id, ipus, agent.condition.power_state, agent.condition.health, agent.last_error, drain,
                   agent.drain.reason)


def _columns(machines: list[Machine]) -> list[list[Run]]:
    """Machines in rack order, lowest first, as columns of runs, each listed top first."""
    columns = []
    for start in range(0, len(machines), MACHINES_PER_COLUMN):
        runs: list[Run] = []
        for machine in reversed(machines[start:start + MACHINES_PER_COLUMN]):
            if runs and runs[-1].allocation_id == machine.allocation_id:
                runs[-1].machines.append(machine)
            else:
                runs.append(Run(machine.allocation_id, [machine]))
        columns.append(runs)
    return columns


def pod_racks(agents: list[admin_pb2.Agent], clusters: list[admin_pb2.Cluster],
              partitions: list[vipuuser_pb2.Partition]) -> Racks:
    """What an administrator sees: every cluster by its IPU-Link domains, then the machines of no cluster."""
    holders, tones = _holders(partitions), partition_tones(p.id for p in partitions)
    by_id = {a.id: a for a in agents}

    def machine(agent_id: str) -> Machine:
        agent = by_id.get(agent_id)
        return _machine(agent_id, holders, tones, agent.status if agent else "", agent.allocation_id if agent else "", agent)

    groups = []
    for cluster in sorted(clusters, key=lambda c: c.id):
        domains = max(1, cluster.num_ipulinkdomains)
        size = len(cluster.agent_ids) // domains
        topology = "torus" if cluster.topology == admin_pb2.ILD_TOPOLOGY_TORUS else "mesh"
        groups.append(Group(
            f"Cluster {cluster.id}", f"{len(cluster.agent_ids)} machines, {topology}, {domains} IPU-Link domain{'s' * (domains > 1)}",
            [Domain(f"IPU-Link domain {d}", _columns([machine(a) for a in cluster.agent_ids[d * size:(d + 1) * size]]))
             for d in range(domains)]))
    loose = sorted(a.id for a in agents if not a.cluster_id)
    if loose:
        groups.append(Group("Machines in no cluster", f"{len(loose)} machines", [Domain("", _columns([machine(a) for a in loose]))]))
    return _racks(groups, partitions, tones, len(agents), sum(a.status == "Down" for a in agents))


def allocation_racks(allocations: list[vipuuser_pb2.Allocation], partitions: list[vipuuser_pb2.Partition]) -> Racks:
    """What a user sees: the machines of their allocations, each allocation by itself."""
    holders, tones = _holders(partitions), partition_tones(p.id for p in partitions)
    groups = [Group(f"Allocation {a.id}", f"cluster {a.spec.cluster_id}, {len(a.spec.agent_ids)} machines",
                    [Domain("", _columns([_machine(agent, holders, tones, allocation_id=a.id) for agent in a.spec.agent_ids]))])
              for a in sorted(allocations, key=lambda a: a.id)]
    return _racks(groups, partitions, tones, sum(len(a.spec.agent_ids) for a in allocations), 0)


def _racks(groups: list[Group], partitions: list[vipuuser_pb2.Partition], tones, machines: int, down: int) -> Racks:
    legend = [LegendEntry(p.id, tones[p.id], ready_state(p), len(p.spec.ipus)) for p in sorted(partitions, key=lambda p: p.id)]
    return Racks(groups, legend, machines, down, machines * IPUS_PER_MACHINE, sum(len(p.spec.ipus) for p in partitions),
                 Counter(ready_state(p) for p in partitions), tones)


# Heat colouring: what each kind colours by, and the range its scale spans (cool blue to hot red).
HEAT_SCALES = {"temperature": ("temperature", 30.0, 95.0, "{:.0f} °C"), "utilisation": ("utilisation", 0.0, 100.0, "{:.0f} % busy")}


def heat_colour(value: float, low: float, high: float) -> str:
    """A colour from blue (at `low` or below) through green and yellow to red (at `high` or above)."""
    share = min(1.0, max(0.0, (value - low) / (high - low)))
    return f"hsl({round(220 * (1 - share))}, 75%, 50%)"


def colour_by_heat(racks: Racks, telemetry: Iterable[admin_pb2.AgentTelemetry], kind: str) -> None:
    """Give each IPU drawn the colour of its reading of `kind` (HEAT_SCALES); one with no reading keeps its own."""
    field_name, low, high, form = HEAT_SCALES[kind]
    readings = {(t.agent_id, ipu.index): ipu for t in telemetry for ipu in t.telemetry.ipus}
    for machine in (machine for group in racks.groups for machine in group.machines()):
        for ipu in machine.ipus:
            read = readings.get((machine.agent_id, ipu.index))
            if read is not None and read.HasField(field_name):
                value = getattr(read, field_name)
                ipu.heat, ipu.heat_label = heat_colour(value, low, high), form.format(value)


def utilisation_line(history: Iterable[vipuuser_pb2.UtilisationSample], width: int = 600, height: int = 80) -> str:
    """The points of an SVG polyline of a partition's mean utilisation over its life, in a
    `width` by `height` box (0 % at the bottom); "" with fewer than two samples."""
    means = []
    for sample in history:
        read = [value for value in sample.utilisation if not math.isnan(value)]
        if read:
            means.append((sample.at, sum(read) / len(read)))
    if len(means) < 2:
        return ""
    first, span = means[0][0], (means[-1][0] - means[0][0]) or 1.0
    return " ".join(f"{(at - first) / span * width:.1f},{height - mean / 100 * height:.1f}" for at, mean in means)


TIMELINE_DAYS = 7  # how far ahead the racks page's timeline of reservations looks


@dataclass(frozen=True)
class Booking:
    """A reservation on the racks page's timeline: where its bar starts and how wide it is, in
    percent of the timeline, and what its title says."""

    name: str
    kind: str  # maintenance window | reservation
    phase: str  # TO COME | UNDER WAY
    machines: str
    left: float
    width: float
    title: str


def timeline(reservations: Iterable[vipuuser_pb2.Reservation], now: float, days: int = TIMELINE_DAYS) -> list[Booking]:
    """The reservations not over, as bars over the next `days` from `now`, soonest first; one
    starting later is listed with no width (the page draws it no bar)."""
    span_seconds = days * 86_400.0
    shown = []
    for message in sorted(reservations, key=lambda m: (m.start, m.name)):
        r = reservation_from_proto(message)
        if r.ended(now):
            continue
        begin, finish = max(r.start, now), min(r.end, now + span_seconds)
        left = 100 * (begin - now) / span_seconds if begin < now + span_seconds else 100.0
        width = max(0.0, 100 * (finish - begin) / span_seconds)
        who = f" for {', '.join(r.users)}" if r.users else ""
        shown.append(Booking(r.name, r.kind, r.phase(now), " ".join(r.agent_ids), round(left, 2), round(width, 2),
                             f"{r.describe()}{who}; {r.size} IPUs, {message.ipus_in_use} in use"))
    return shown
