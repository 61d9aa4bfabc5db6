"""Slurm's network topology drawn from vipu's IPU-Link domains, so that Slurm places a job's nodes
where vipu can join the machines beside them into one partition.

Slurm nodes are hosts; vipu knows machines. A site says which machines sit beside which nodes
(vipu.conf's `NodeMachines`, `vipu-admin export slurm-topology --nodes`), as Slurm hostlists:

    n[01-04]:ag[1-4] n[05-08]:ag[5-8] login1:

A block is the machines of one IPU-Link domain in one allocation that vipu gives Slurm: one
partition can take any run of them. A node is in the block of its machines; a node beside no
machine of those allocations (or none at all) is in no block. Rendered three ways:

- `tree`: topology.conf for topology/tree (Slurm 22.05 on): a leaf switch per block, under a
  switch per allocation of several domains (a looped cluster joins its domains by GW-Links), under
  one top switch `vipu`; the nodes in no block under a leaf `vipu-no-ipus` (topology/tree uses
  only nodes under some switch).
- `block`: topology.conf for topology/block (23.11 on): `BlockName=... Nodes=...` lines in the
  allocations' and domains' order (Slurm pairs neighbouring blocks into larger ones), and
  `BlockSizes` the fewest nodes of a block (every block must have at least that many).
- `yaml`: topology.yaml (24.11 on): the same blocks as one block topology, the cluster's default.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from vipu.model.entities import natural_key
from vipu.model.errors import InvalidArgument

FORMATS = ("tree", "block", "yaml")
TOP_SWITCH = "vipu"
NO_IPUS_SWITCH = "vipu-no-ipus"
MAX_SWITCH_NAME = 64  # topology.conf(5)
_HOSTS = re.compile(r"(?P<prefix>[A-Za-z0-9_.-]*)(?:\[(?P<ranges>[^\]]*)\](?P<suffix>[A-Za-z0-9_.-]*))?")
_RANGE = re.compile(r"(\d+)(?:-(\d+))?")


def file_name(form: str) -> str:
    """The file Slurm reads the form from, beside slurm.conf."""
    return "topology.yaml" if form == "yaml" else "topology.conf"


def expand_hostlist(text: str) -> list[str]:
    """The names of a Slurm hostlist (`n[01-03,7],login1`), in its order; InvalidArgument if malformed."""
    parts = re.findall(r"(?:[^,\[]|\[[^\]]*\])+", text)
    if not parts or ",".join(parts) != text:
        raise InvalidArgument(f"{text!r} is not a hostlist like n[01-04],login1")
    names: list[str] = []
    for part in parts:
        found = _HOSTS.fullmatch(part)
        if found is None or not (found["prefix"] or found["suffix"]):
            raise InvalidArgument(f"{part!r} is not a host name or a hostlist like n[01-04]")
        if found["ranges"] is None:
            names.append(part)
            continue
        for piece in found["ranges"].split(","):
            bounds = _RANGE.fullmatch(piece)
            if bounds is None or int(bounds[2] or bounds[1]) < int(bounds[1]):
                raise InvalidArgument(f"{part!r}: {piece!r} is not a number or a range like 01-04")
            low, high = bounds[1], bounds[2] or bounds[1]
            width = len(low) if low.startswith("0") else 0  # n[01-10]: n01 ... n10
            names.extend(f"{found['prefix']}{number:0{width}d}{found['suffix']}" for number in range(int(low), int(high) + 1))
    return names


def parse_node_machines(text: str) -> dict[str, tuple[str, ...]]:
    """`NODES:MACHINES ...` (hostlists; MACHINES may be empty) as node -> the machines beside it."""
    mapping: dict[str, tuple[str, ...]] = {}
    for entry in text.split():
        nodes, colon, machines = entry.partition(":")
        if not colon or not nodes:
            raise InvalidArgument(f"{entry!r} is not NODES:MACHINES (n[01-04]:ag[1-4]; n5: for a node beside none)")
        agents = tuple(expand_hostlist(machines)) if machines else ()
        for node in expand_hostlist(nodes):
            if node in mapping:
                raise InvalidArgument(f"node {node} is named more than once")
            mapping[node] = agents
    if not mapping:
        raise InvalidArgument("no nodes are named: give NODES:MACHINES entries, like n[01-04]:ag[1-4]")
    return mapping


@dataclass(frozen=True)
class Block:
    name: str  # vipu-<allocation>-ild<domain>
    allocation_id: str
    nodes: tuple[str, ...]


@dataclass(frozen=True)
class SlurmTopology:
    blocks: tuple[Block, ...]
    unplaced: tuple[str, ...]  # nodes beside no machine of the allocations

    def render(self, form: str) -> str:
        if form not in FORMATS:
            raise InvalidArgument(f"unknown Slurm topology form {form!r} (known: {', '.join(FORMATS)})")
        return {"tree": self.tree_conf, "block": self.block_conf, "yaml": self.yaml}[form]()

    def tree_conf(self) -> str:
        lines = [_HEADER.format(form="topology/tree (TopologyPlugin=topology/tree)")]
        tops = []
        by_allocation: dict[str, list[Block]] = {}
        for block in self.blocks:
            by_allocation.setdefault(block.allocation_id, []).append(block)
            lines.append(f"SwitchName={block.name} Nodes={','.join(block.nodes)}")
        for allocation_id, blocks in by_allocation.items():
            if len(blocks) == 1:
                tops.append(blocks[0].name)
                continue
            name = _switch_name(f"vipu-{allocation_id}")
            lines.append(f"SwitchName={name} Switches={','.join(b.name for b in blocks)}")
            tops.append(name)
        if self.unplaced:
            lines.append(f"SwitchName={NO_IPUS_SWITCH} Nodes={','.join(self.unplaced)}")
            tops.append(NO_IPUS_SWITCH)
        lines.append(f"SwitchName={TOP_SWITCH} Switches={','.join(tops)}")
        names = [line.split()[0].removeprefix("SwitchName=") for line in lines[1:]]
        twice = sorted({name for name in names if names.count(name) > 1})
        if twice:  # allocation x-ild0's switch is allocation x's first block; an allocation no-ipus is the leaf of no IPUs
            raise InvalidArgument(f"allocation ids give two of Slurm's switches the name {twice[0]}: rename one of those allocations")
        return "\n".join(lines) + "\n"

    def block_conf(self) -> str:
        lines = [_HEADER.format(form="topology/block (TopologyPlugin=topology/block, Slurm 23.11 on)"), *self._unplaced_note()]
        lines += [f"BlockName={block.name} Nodes={','.join(block.nodes)}" for block in self.blocks]
        lines.append(f"BlockSizes={self._base_size()}")
        return "\n".join(lines) + "\n"

    def yaml(self) -> str:
        lines = [_HEADER.format(form="topology.yaml (Slurm 24.11 on)"), *self._unplaced_note(),
                 f"- topology: {TOP_SWITCH}", "  cluster_default: true", "  block:", "    block_sizes:",
                 f"      - {self._base_size()}", "    blocks:"]
        for block in self.blocks:
            lines += [f"      - block: {json.dumps(block.name)}", f"        nodes: {json.dumps(','.join(block.nodes))}"]
        return "\n".join(lines) + "\n"

    def _base_size(self) -> int:
        if not self.blocks:
            raise InvalidArgument("no node is beside a machine of vipu's allocations: Slurm's blocks would be empty")
        return min(len(block.nodes) for block in self.blocks)

    def _unplaced_note(self) -> list[str]:
        return [f"# in no block, beside no IPUs of vipu's allocations: {','.join(self.unplaced)}"] if self.unplaced else []


_HEADER = "# Slurm's {form}, made by vipu from its IPU-Link domains and allocations: do not edit"


def _switch_name(name: str) -> str:
    if len(name) > MAX_SWITCH_NAME:
        raise InvalidArgument(f"Slurm's switch and block names have at most {MAX_SWITCH_NAME} characters; {name!r} has more")
    return name


def slurm_topology(node_machines: Mapping[str, tuple[str, ...]],
                   allocations: Iterable[tuple[str, Mapping[str, int]]]) -> SlurmTopology:
    """The blocks of `allocations` (each its id and the IPU-Link domain of each of its machines) and
    the nodes beside them; InvalidArgument for a node beside machines of several blocks."""
    block_of: dict[str, tuple[str, int]] = {}
    order: list[tuple[str, int]] = []
    for allocation_id, ilds in allocations:
        for agent, domain in sorted(ilds.items(), key=lambda pair: (pair[1], natural_key(pair[0]))):
            block_of[agent] = (allocation_id, domain)
            if (allocation_id, domain) not in order:
                order.append((allocation_id, domain))
    members: dict[tuple[str, int], list[str]] = {key: [] for key in order}
    unplaced = []
    for node in sorted(node_machines, key=natural_key):
        blocks = {block_of[agent] for agent in node_machines[node] if agent in block_of}
        if len(blocks) > 1:
            named = ", ".join(f"{_block_name(*key)} ({_beside(node_machines[node], block_of, key)})" for key in sorted(blocks))
            raise InvalidArgument(f"node {node} is beside machines of several blocks, {named}: name machines of one "
                                  "IPU-Link domain of one allocation for it")
        if blocks:
            members[blocks.pop()].append(node)
        else:
            unplaced.append(node)
    blocks_made = tuple(Block(_block_name(*key), key[0], tuple(nodes)) for key, nodes in members.items() if nodes)
    return SlurmTopology(blocks_made, tuple(unplaced))


def _block_name(allocation_id: str, domain: int) -> str:
    return _switch_name(f"vipu-{allocation_id}-ild{domain}")


def _beside(machines: tuple[str, ...], block_of: Mapping[str, tuple[str, int]], key: tuple[str, int]) -> str:
    return ",".join(agent for agent in machines if block_of.get(agent) == key)
