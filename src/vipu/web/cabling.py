"""A cluster's cabling as the dashboard draws it: an SVG of its machines and every cable between
them, each coloured by the verdict of the last cluster test that judged it, and marked when the
link ledger finds either end's link suspect or failed (its trend, between tests).

Each IPU-Link domain is a column of machines, the lowest at the bottom. Between two machines of
a column run their four IPU-Link cables (ports 5-8 of the lower to 1-4 of the upper) and, to the
right, their two Sync-Link cables; a torus's loop-back cables go round the left of the column,
from its top machine to its bottom one. GW-Links join each machine to the one at the same place
in the next domain; those of the last domain, which loop back to the first, are drawn as a stub
at each end named after the machine at the other. Each end of a cable is a dot linking to the
page of its link; a cable the ledger marks tells on hover of both its ends in the ledger.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from vipu.api.protos import admin_pb2
from vipu.model.linkhealth import LinkName
from vipu.model.topology import LinkKind
from vipu.web.ledger import described

MACHINE_WIDTH, MACHINE_HEIGHT = 168, 34
GAP = 30  # between the machines of a column, where their cables run
COLUMN_GAP = 110  # between domains, where the GW-Links run
MARGIN = 44  # room for loop-back cables left of a column
STUB = 18  # a GW-Link drawn as two stubs: the length of the one out of the last domain
LABEL_ROOM = 70  # left of the first domain, for the names at the stubs into it
IPULINK_X = (22, 42, 62, 82)  # where each of a machine's four IPU-Link cables leaves it, from its left
SYNC_X = (124, 144)


@dataclass
class Box:
    agent_id: str
    x: float
    y: float
    width: float = MACHINE_WIDTH
    height: float = MACHINE_HEIGHT


UNHEALTHY = ("suspect", "failed")  # the ledger's marks, the worse last: a cable is as unhealthy as the worse of its two ends


def ends_of(cable: admin_pb2.Cable) -> tuple[str, str]:
    """The ledger's names of the links at a cable's two ends, lower first (ag3:5, ag4:sync2, ...)."""
    kind = LinkKind(cable.kind)
    return (str(LinkName.of_port(cable.lower_agent_id, kind, cable.lower_port)),
            str(LinkName.of_port(cable.upper_agent_id, kind, cable.upper_port)))


def partners(cables: Iterable[admin_pb2.Cable], unhealthy: Mapping[str, admin_pb2.Link]) -> set[str]:
    """The ends not unhealthy of the cables with an unhealthy end: to look up, so that a marked
    cable's hover tells of both its ends (the rest of a pod's links are not read for the page)."""
    return {end for cable in cables if any(e in unhealthy for e in ends_of(cable)) for end in ends_of(cable) if end not in unhealthy}


@dataclass
class Wire:
    cable: admin_pb2.Cable
    path: str
    end_points: tuple[tuple[float, float], tuple[float, float]]  # where the lower end and the upper end meet their machines
    labels: tuple[tuple[float, float, str], ...] = ()  # (x, y, text): where a stub's far end is named
    health: str = ""  # the link ledger's word for the worse end: suspect or failed ("" when neither is)
    health_lines: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        c = self.cable
        return f"{c.kind} {c.lower_agent_id}:{c.lower_port} <--> {c.upper_agent_id}:{c.upper_port}"

    @property
    def title(self) -> str:
        lines = [f"{self.name}: {self.cable.verdict}", *self.cable.failures, *self.health_lines]
        return "\n".join(lines)

    def linked_ends(self) -> list[tuple[str, float, float]]:
        """Each end's link name and where to put the dot linking to its page."""
        return [(name, x, y) for name, (x, y) in zip(ends_of(self.cable), self.end_points, strict=True)]


@dataclass
class Drawing:
    width: float
    height: float
    boxes: list[Box]
    wires: list[Wire]
    domains: list[tuple[str, float]]  # each domain's label and the x of its column


def draw(cluster: admin_pb2.Cluster, cabling: admin_pb2.Cabling, ledger: Mapping[str, admin_pb2.Link] | None = None) -> Drawing:
    """`ledger`: links as the link ledger has them, by name: its suspect and failed ones, and
    their cables' other ends (`partners`)."""
    ledger = ledger or {}
    domains = max(1, cluster.num_ipulinkdomains)
    size = len(cluster.agent_ids) // domains
    places: dict[str, tuple[int, int]] = {}  # agent -> (domain, position from the bottom)
    for n, agent in enumerate(cluster.agent_ids):
        places[agent] = divmod(n, size)
    looped = any(c.kind == "GW-Link" for c in cabling.cables)
    top = 58 if cluster.topology == admin_pb2.ILD_TOPOLOGY_TORUS else 34  # loop-backs go over the top machine
    height = top + size * MACHINE_HEIGHT + (size - 1) * GAP + MARGIN

    def box_x(domain: int) -> float:
        return MARGIN + (LABEL_ROOM if looped else 0) + domain * (MACHINE_WIDTH + COLUMN_GAP)

    def box_y(position: int) -> float:
        return top + (size - 1 - position) * (MACHINE_HEIGHT + GAP)

    boxes = [Box(agent, box_x(d), box_y(p)) for agent, (d, p) in places.items()]
    wires = []
    for cable in cabling.cables:
        lower, upper = places.get(cable.lower_agent_id), places.get(cable.upper_agent_id)
        if lower is None or upper is None:  # the cluster changed since the test
            continue
        wire = _wire(cable, lower, upper, box_x, box_y)
        ends = ends_of(cable)
        unhealthy = [link for end in ends if (link := ledger.get(end)) is not None and link.health in UNHEALTHY]
        if unhealthy:
            wire.health = max(unhealthy, key=lambda link: UNHEALTHY.index(link.health)).health
            wire.health_lines = tuple(described(end, ledger.get(end)) for end in ends)
        wires.append(wire)
    width = box_x(domains - 1) + MACHINE_WIDTH + MARGIN + (STUB + 30 if looped else 0)
    labels = [(f"IPU-Link domain {d}", box_x(d)) for d in range(domains)]
    return Drawing(width, height, boxes, wires, labels)


def _wire(cable: admin_pb2.Cable, lower: tuple[int, int], upper: tuple[int, int], box_x, box_y) -> Wire:
    if cable.kind == "GW-Link":
        y = box_y(lower[1]) + MACHINE_HEIGHT / 2
        start, end = box_x(lower[0]) + MACHINE_WIDTH, box_x(upper[0])
        if upper[0] > lower[0]:
            return Wire(cable, f"M{start},{y} H{end}", ((start, y), (end, y)))
        # Back from the last domain to the first: a stub out of each end, named after the other; the
        # one into the first domain crosses its loop-back cables.
        return Wire(cable, f"M{start},{y} h{STUB} M{end - MARGIN},{y} H{end}", ((start, y), (end, y)),
                    ((start + STUB + 3, y + 4, f"to {cable.upper_agent_id}"), (end - MARGIN - 3, y + 4, f"from {cable.lower_agent_id}")))
    return _vertical(cable, lower, upper, box_x, box_y)


def _vertical(cable: admin_pb2.Cable, lower: tuple[int, int], upper: tuple[int, int], box_x, box_y) -> Wire:
    offsets = SYNC_X if cable.kind == "Sync-Link" else IPULINK_X
    lane = (cable.lower_port - (6 if cable.kind == "Sync-Link" else 5)) % len(offsets)
    x = box_x(lower[0]) + offsets[lane]
    bottom, top = box_y(lower[1]), box_y(upper[1]) + MACHINE_HEIGHT  # out of the lower end's top, into the upper end's bottom
    if upper[1] == lower[1] + 1:  # neighbours: straight up
        return Wire(cable, f"M{x},{bottom} V{top}", ((x, bottom), (x, top)))
    # A torus's loop-back: from the top machine up, round the left of the column, into the bottom one.
    left = box_x(lower[0]) - 10 - 7 * lane
    over, under = box_y(lower[1]) - 6 - 4 * lane, box_y(upper[1]) + MACHINE_HEIGHT + 6 + 4 * lane
    return Wire(cable, f"M{x},{bottom} V{over} H{left} V{under} H{x} V{top}", ((x, bottom), (x, top)))
