"""The site's IPU-Machines as the orchestrator knows them, and picking machines for a vPOD.

The site is described as a rack description (the format `vipu-sim rack` writes): its machines
in rack order, where their agents answer, and every cable. A vPOD of N machines takes N free
machines consecutive in the rack whose cables form the asked shape: each cable the cluster's
layout expects (`vipu.model.topology`) must be in the rack, so that, say, a torus is given only
where its wrap-around cables exist.
"""

from __future__ import annotations

from pathlib import Path

from vipu.backends.sim.rack import Rack, load_rack
from vipu.model.entities import IldTopology
from vipu.model.errors import Conflict, InvalidArgument
from vipu.model.topology import ClusterLayout
from vipu.vpod.store import SiteMachine


def site_machines(rack: Rack) -> list[SiteMachine]:
    return [SiteMachine(m.name, position, m.host, m.port) for position, m in enumerate(rack.machines)]


def read_site(path: Path) -> Rack:
    return load_rack(path)


def _cabled(rack: Rack, layout: ClusterLayout) -> bool:
    present = {(c.kind, frozenset({(c.a.machine, c.a.port), (c.b.machine, c.b.port)})) for c in rack.cables}
    return all((c.lower.kind, frozenset({(c.lower.agent_id, c.lower.number), (c.upper.agent_id, c.upper.number)})) in present
               for c in layout.cables())


def pick_machines(rack: Rack, machines: list[SiteMachine], count: int, topology: IldTopology, ilds: int) -> list[str]:
    """The first run of `count` free machines, consecutive in the rack, cabled as the shape needs."""
    if count < 1:
        raise InvalidArgument("a vPOD needs at least one machine")
    if count % ilds:
        raise InvalidArgument(f"{count} machines cannot form {ilds} IPU-Link domains of equal size")
    ordered = sorted(machines, key=lambda m: m.position)
    free_runs = 0
    for start in range(len(ordered) - count + 1):
        run = ordered[start:start + count]
        if not all(m.free for m in run):
            continue
        free_runs += 1
        names = [m.name for m in run]
        if _cabled(rack, ClusterLayout(names, topology, ilds)):
            return names
    free = sum(m.free for m in ordered)
    if free_runs:
        raise InvalidArgument(f"no run of {count} free machines is cabled as a {topology.value} of {ilds} IPU-Link domain(s); "
                              f"the site's cables do not form that shape there")
    held_back = sum(bool(m.held_back) and not m.vpod_id for m in ordered)
    note = f" ({held_back} held back after a failed release test)" if held_back else ""
    raise Conflict(f"no {count} free machines side by side: {free} of {len(ordered)} are free{note}")
