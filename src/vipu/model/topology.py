"""The physical shape of a cluster: its IPU-Link domains and the cables it expects.

An IPU-M2000 holds four IPUs on a ladder of two rows and two columns: IPUs 0 and 1 on the lower
row, 2 and 3 on the upper, each row joined by a rung, each column joined inside the machine.
Machines stacked in a rack extend the ladder upwards:

- IPU-Link: four cables join rack-adjacent machines of an IPU-Link domain (ILD), chassis ports
  5-8 of the lower machine to ports 1-4 of the one above. Ports 1,2 belong to IPU 0, 3,4 to
  IPU 1, 5,6 to IPU 2 and 7,8 to IPU 3. A torus adds four loop-back cables from the top
  machine's ports 5-8 to the bottom machine's ports 1-4.
- Sync-Link: two cables per rack-adjacent pair, ports 6 and 7 of the lower machine to ports 2
  and 3 of the one above.
- GW-Link (looped multi-ILD clusters): GW port 1 of each machine meets GW port 2 of the machine
  at the same position in the next ILD; the last ILD loops back to the first.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Collection, Iterable, Set
from dataclasses import dataclass
from enum import Enum
from functools import lru_cache

from vipu.model.entities import IPUS_PER_MACHINE, Cluster, GwTopology, IldTopology
from vipu.model.errors import InvalidArgument


class LinkKind(str, Enum):
    IPULINK = "IPU-Link"
    SYNC = "Sync-Link"
    GWLINK = "GW-Link"


@dataclass(frozen=True, order=True)
class Port:
    agent_id: str
    kind: LinkKind
    number: int


@dataclass(frozen=True)
class Cable:
    """An expected cable; `lower` is the end on the machine lower in the rack (or earlier ILD)."""

    lower: Port
    upper: Port

    @property
    def kind(self) -> LinkKind:
        return self.lower.kind

    @property
    def key(self) -> str:
        """The cable's name in cluster test results: its kind and both ends, e.g. "IPU-Link ag3:5 ag4:1"."""
        return f"{self.kind.value} {self.lower.agent_id}:{self.lower.number} {self.upper.agent_id}:{self.upper.number}"


# An IPU-M2000's chassis ports of each kind, numbered from 1.
PORT_COUNTS = {LinkKind.IPULINK: 8, LinkKind.SYNC: 8, LinkKind.GWLINK: 2}
# IPU-Link chassis port -> the IPU it belongs to.
IPULINK_PORT_IPU = {1: 0, 2: 0, 3: 1, 4: 1, 5: 2, 6: 2, 7: 3, 8: 3}
UPWARD_IPULINK_PORTS = (5, 6, 7, 8)
DOWNWARD_IPULINK_PORTS = (1, 2, 3, 4)
UPWARD_SYNC_PORTS = (6, 7)
DOWNWARD_SYNC_PORTS = (2, 3)
GW_OUT_PORT = 1
GW_IN_PORT = 2

# Links inside one machine: rungs 0-1 and 2-3, columns 0-2 and 1-3.
INTERNAL_IPU_PAIRS = ((0, 1), (2, 3), (0, 2), (1, 3))


@dataclass(frozen=True)
class InternalLink:
    """One of the 16 IPU-Links inside an IPU-M2000: lane A-D of one of the four internal pairs."""

    lower_ipu: int
    upper_ipu: int
    name: str  # the same at both ends, e.g. "4C"

    @property
    def key(self) -> str:
        """How rack descriptions name it: by its lower IPU, e.g. "ipu1:4C"."""
        return f"ipu{self.lower_ipu}:{self.name}"


INTERNAL_LINKS = tuple(
    InternalLink(a, b, f"{pair}{lane}") for pair, (a, b) in enumerate(INTERNAL_IPU_PAIRS, start=1) for lane in "ABCD"
)


def internal_peers(index: int, members: set[int]) -> list[int]:
    """The IPUs among `members` that IPU `index` links to inside its machine."""
    peers = [b if a == index else a for a, b in INTERNAL_IPU_PAIRS if index in (a, b)]
    return sorted(peer for peer in peers if peer in members)


class ClusterLayout:
    """A cluster's agents arranged into IPU-Link domains, with the cabling that implies."""

    def __init__(
        self,
        agent_ids: tuple[str, ...] | list[str],
        topology: IldTopology = IldTopology.MESH,
        num_ilds: int = 1,
        gw_topology: GwTopology | None = None,
    ):
        agent_ids = tuple(agent_ids)
        if not agent_ids:
            raise InvalidArgument("a cluster needs at least one agent")
        duplicates = sorted(a for a, n in Counter(agent_ids).items() if n > 1)
        if duplicates:
            raise InvalidArgument(f"agent {duplicates[0]} is listed more than once")
        if num_ilds < 1 or len(agent_ids) % num_ilds:
            raise InvalidArgument(
                f"{len(agent_ids)} agents cannot form {num_ilds} IPU-Link domains of equal size"
            )
        if num_ilds > 1 and gw_topology is None:
            gw_topology = GwTopology.LOOPED
        self.agent_ids = agent_ids
        self.topology = topology
        self.num_ilds = num_ilds
        self.gw_topology = gw_topology
        self.machines_per_ild = len(agent_ids) // num_ilds
        self.ilds: tuple[tuple[str, ...], ...] = tuple(
            agent_ids[d * self.machines_per_ild : (d + 1) * self.machines_per_ild] for d in range(num_ilds)
        )
        self._where = {agent: (d, p) for d, ild in enumerate(self.ilds) for p, agent in enumerate(ild)}

    def has(self, agent_id: str) -> bool:
        return agent_id in self._where

    def count_among(self, agents: Set[str]) -> int:
        """How many of `agents` are machines of this cluster (counted in C: placement asks at every create)."""
        return len(self._where.keys() & agents)

    @classmethod
    def of(cls, cluster: Cluster) -> ClusterLayout:
        """The layout of a cluster; layouts are immutable, so equal clusters share one."""
        return _layout(cluster.agent_ids, cluster.topology, cluster.num_ilds, cluster.gw_topology)

    @property
    def is_torus(self) -> bool:
        return self.topology is IldTopology.TORUS and self.machines_per_ild > 1

    @property
    def ipus_per_ild(self) -> int:
        return self.machines_per_ild * IPUS_PER_MACHINE

    def locate(self, agent_id: str) -> tuple[int, int]:
        """(ILD, position in the ILD counted from the bottom) of an agent."""
        return self._where[agent_id]

    def agent_at(self, ild: int, position: int) -> str:
        return self.ilds[ild][position % self.machines_per_ild]

    def topology_id(self, agent_id: str, index: int) -> int:
        return self.locate(agent_id)[1] * IPUS_PER_MACHINE + index

    def vertical_pairs(self, among: Collection[str] | None = None) -> list[tuple[str, str, bool]]:
        """Each (lower, upper, is_loop_back) pair of machines joined by IPU-Link cables; only pairs
        with both machines `among` the given agents, if given (found from them, not the whole cluster)."""
        pairs = []
        for ild, lower in self._lower_ends(among):
            if lower + 1 < len(ild):
                pairs.append((ild[lower], ild[lower + 1], False))
            elif self.is_torus:
                pairs.append((ild[lower], ild[0], True))
        return [p for p in pairs if among is None or p[1] in among]

    def _lower_ends(self, among: Collection[str] | None) -> list[tuple[tuple[str, ...], int]]:
        """(ILD, position) of every machine, or of those `among` the agents, in cluster order."""
        if among is None:
            return [(ild, p) for ild in self.ilds for p in range(len(ild))]
        places = sorted(self._where[a] for a in among if a in self._where)
        return [(self.ilds[d], p) for d, p in places]

    def ipulink_cables(self, among: Collection[str] | None = None) -> list[Cable]:
        return [
            Cable(Port(lower, LinkKind.IPULINK, out), Port(upper, LinkKind.IPULINK, into))
            for lower, upper, _ in self.vertical_pairs(among)
            for out, into in zip(UPWARD_IPULINK_PORTS, DOWNWARD_IPULINK_PORTS, strict=True)
        ]

    def sync_cables(self, among: Collection[str] | None = None) -> list[Cable]:
        return [
            Cable(Port(ild[p], LinkKind.SYNC, out), Port(ild[p + 1], LinkKind.SYNC, into))
            for ild, p in self._lower_ends(among)
            if p + 1 < len(ild) and (among is None or ild[p + 1] in among)
            for out, into in zip(UPWARD_SYNC_PORTS, DOWNWARD_SYNC_PORTS, strict=True)
        ]

    def gwlink_cables(self, among: Collection[str] | None = None) -> list[Cable]:
        if self.num_ilds < 2:
            return []
        ends = [self._where[a] for a in among if a in self._where] if among is not None else [
            (d, p) for d in range(self.num_ilds) for p in range(self.machines_per_ild)]
        cables = [
            Cable(
                Port(self.ilds[d][p], LinkKind.GWLINK, GW_OUT_PORT),
                Port(self.ilds[(d + 1) % self.num_ilds][p], LinkKind.GWLINK, GW_IN_PORT),
            )
            for d, p in sorted(ends)
        ]
        return [c for c in cables if among is None or c.upper.agent_id in among]

    def cables(self) -> list[Cable]:
        return self.ipulink_cables() + self.sync_cables() + self.gwlink_cables()


@lru_cache(maxsize=64)
def _layout(agent_ids: tuple[str, ...], topology: IldTopology, num_ilds: int, gw_topology: GwTopology | None) -> ClusterLayout:
    return ClusterLayout(agent_ids, topology, num_ilds, gw_topology)


def agent_ilds(clusters: Iterable[Cluster]) -> dict[str, int]:
    """The IPU-Link domain of each agent of the clusters, in its cluster (0 the lowest): what Slurm's
    topology is drawn from."""
    return {agent: domain for cluster in clusters for domain, members in enumerate(ClusterLayout.of(cluster).ilds) for agent in members}
