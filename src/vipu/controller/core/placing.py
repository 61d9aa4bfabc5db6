"""Where an owner puts a partition: a new one, one waiting in its queue, and one that moves.

Pure functions over an allocation's layout and the IPUs in use, as `vipu.model.placement` is, with
the controller's rules around them: a request is checked before anything changes, an index
stands for its place, IPUs held for the queue's first request are kept off, and a move keeps off
the machines that failed the partition (`moved`).
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Mapping, Set
from datetime import UTC, datetime

from vipu.model import lifecycle
from vipu.model.entities import (
    IPUS_PER_MACHINE,
    MAX_AUTO_RESETS,
    Allocation,
    Partition,
    PartitionRequest,
    SyncType,
    check_partition_id,
    new_attach_key,
)
from vipu.model.errors import Conflict, InvalidArgument, NoRoom
from vipu.model.fragmentation import SizeMix
from vipu.model.linkhealth import NO_FAULTS, LinkFaults
from vipu.model.placement import Occupancy, Placement, Shape, place_partition
from vipu.model.reasons import span
from vipu.model.times import utc_text
from vipu.model.topology import ClusterLayout
from vipu.model.waiting import MAX_EXPECTED_SECONDS

Ipu = tuple[str, int]
# An error of a partition naming the agent that failed it: "agent ag2: ..." or "agent ag2 is down: ...".
_AGENT_IN_ERROR = re.compile(r"^agent (\S+?)(?::| is down)")
LOST = " is down: "  # in the error of a partition whose agent stopped answering
DRAINING = "is draining"  # what a machine an operator drains is, as a refusal says it (`Drain.describe`)
UNDER_TEST = "is under test"  # what a drained machine a cluster test claims alone is, as a refusal says it
NOTE_LENGTH = 500  # partitions.relocation holds 512 characters


def check_request(request: PartitionRequest) -> None:
    """InvalidArgument for a request no allocation could take, whatever is free."""
    check_partition_id(request.id)
    if request.size <= 0:
        raise InvalidArgument(f"partition size must be a power of two, not {request.size}")
    if request.num_replicas and (request.num_replicas % request.num_gcds or request.size % request.num_replicas):
        raise InvalidArgument(
            f"{request.num_replicas} replicas do not divide evenly into {request.num_gcds} GCD(s) "
            f"of a partition of {request.size} IPUs"
        )
    if request.sync_type is SyncType.GS2_INDEPENDENT_RAILS:
        raise InvalidArgument("the c2-independent-rails sync type is not supported (the published API marks it so)")
    if request.index is not None:
        if not request.reconfigurable:
            raise InvalidArgument("an index places a reconfigurable partition; ask for one (--reconfigurable)")
        if request.explicit_ipus:
            raise InvalidArgument("give the partition's index or its IPUs, not both")
    elif request.reconfigurable and request.sync_type not in (None, SyncType.GS2_DEFAULT):
        raise InvalidArgument("a reconfigurable partition supports only the c2-compatible sync type")
    if request.explicit_ipus and not request.cluster_id:
        raise InvalidArgument("naming the IPUs of a partition needs its cluster id too")
    if not 0 <= request.expected_seconds <= MAX_EXPECTED_SECONDS:
        raise InvalidArgument(f"an expected duration is 0 (unknown) to {MAX_EXPECTED_SECONDS} s, not {request.expected_seconds} s")


def explicit_ipus(layout: ClusterLayout, allocation: Allocation, request: PartitionRequest) -> tuple[tuple[int, int], ...]:
    """The (ILD, topology id) of the IPUs the request names, or of its index's place; empty if neither."""
    return request.explicit_ipus if request.index is None else _slot(layout, allocation, request)


def _slot(layout: ClusterLayout, allocation: Allocation, request: PartitionRequest) -> tuple[tuple[int, int], ...]:
    """The (ILD, topology id) of the IPUs at the request's index: the index-th run of its size of
    the allocation's IPUs, its machines in order and each machine's IPUs in order."""
    size, index = request.size, request.index or 0
    slots = len(allocation.agent_ids) * IPUS_PER_MACHINE // size
    if index >= slots:  # never there, in the allocation named; another of the caller's may have it
        family = InvalidArgument if request.allocation_id else Conflict
        raise family(f"allocation {allocation.id} has {slots} place(s) for a partition of {size} IPUs "
                     f"(indices 0 to {slots - 1}), not index {index}")
    ipus = [(agent, i) for agent in allocation.agent_ids for i in range(IPUS_PER_MACHINE)][index * size:(index + 1) * size]
    return tuple((layout.locate(agent)[0], layout.topology_id(agent, i)) for agent, i in ipus)


def place_request(layout: ClusterLayout, allocation: Allocation, used: Mapping[str, Set[int]], request: PartitionRequest,
                  occupancy: Occupancy, faults: LinkFaults = NO_FAULTS, mix: SizeMix | None = None,
                  left_out: Mapping[str, str] | None = None) -> Placement:
    """The request placed in the allocation's free IPUs (around those `occupancy` holds for the
    queue's first request, and around the unhealthy links `faults` names), leaving the most room
    for the allocation's `mix` of sizes, on none of the machines `left_out` names (with what each
    is, as a clause: "is down: it does not answer", or `DRAINING` and the operator's reason; IPUs
    named outright are placed as named, on a machine that is down too, but never on one being
    drained); NoRoom saying why it does not fit, or InvalidArgument naming the rule it breaks."""
    explicit = explicit_ipus(layout, allocation, request)
    kept_out = {a: what for a, what in (left_out or {}).items()
                if a in allocation.agent_ids and (not explicit or what.startswith((DRAINING, UNDER_TEST)))}

    def placed(machines: set[str], where: str) -> Placement:
        return place_partition(
            layout, machines, used, request.size, num_gcds=request.num_gcds, num_segments=request.num_segments,
            ipulink_routing=request.ipulink_routing, gw_routing=request.gw_routing, explicit=explicit, where=where,
            occupancy=occupancy, faults=faults, mix=mix)

    if not kept_out:
        return placed(set(allocation.agent_ids), f"allocation {allocation.id}")
    that_are, listed = machines_left_out(kept_out)
    try:
        return placed(set(allocation.agent_ids) - set(kept_out), f"allocation {allocation.id} without its machines {that_are} ({listed})")
    except InvalidArgument:  # it fits in no shape of the machines that are up; with them all, it may
        with contextlib.suppress(NoRoom):
            placed(set(allocation.agent_ids), f"allocation {allocation.id}")  # InvalidArgument: a rule it breaks with every machine
        raise NoRoom(f"no room for a partition of {request.size} IPUs in allocation {allocation.id} while its machines {that_are} "
                     f"are left out ({listed})", (allocation.id,)) from None


def machines_left_out(kept_out: Mapping[str, str]) -> tuple[str, str]:
    """How a refusal names the machines placement leaves out, from what each is (`place_request`'s
    `left_out`): ("that are draining", "agent ag1 is draining for ...; agent ag2 ..."), three at most."""
    kinds = {"draining" if what.startswith(DRAINING) else "under test" if what.startswith(UNDER_TEST) else "down"
             for what in kept_out.values()}
    that_are = "that are " + " or ".join(kind for kind in ("down", "draining", "under test") if kind in kinds)
    listed = "; ".join(f"agent {agent} {what}" for agent, what in sorted(kept_out.items())[:3])
    return that_are, listed + (f"; and {len(kept_out) - 3} more" if len(kept_out) > 3 else "")


def partition_of(request: PartitionRequest, owner: str, allocation: Allocation, placement: Placement) -> Partition:
    """The new partition a request makes at a placement in an allocation."""
    if request.index is not None:  # the vendor's rule: an indexed reconfigurable partition is c2-compatible, whatever was asked
        sync = SyncType.GS2_DEFAULT
    else:
        sync = request.sync_type or (SyncType.GS2_DEFAULT if request.reconfigurable else SyncType.POD_NATIVE_DEFAULT)
    return Partition(
        id=request.id, cluster_id=allocation.cluster_id, allocation_id=allocation.id, size=request.size, num_gcds=request.num_gcds,
        num_replicas=request.num_replicas or request.num_gcds, reconfigurable=request.reconfigurable, sync_type=sync,
        ipulink_routing=placement.ipulink_routing, gw_routing=placement.gw_routing, num_segments=placement.num_segments,
        ipus=list(placement.ipus), disable_auto_reset=request.disable_auto_reset, owner=owner, created=datetime.now(UTC),
        attach_key=new_attach_key(), relocatable=request.relocatable, placement_note=placement.link_note,
        may_move=request.may_move, expected_seconds=request.expected_seconds, reservation=request.reservation,
        account=request.account, preemptible=request.preemptible, labels=dict(request.labels),
    )


def failed_machines(partition: Partition, down: Set[str]) -> set[str]:
    """The partition's agents that failed it: those down, and those its errors name."""
    named = {m.group(1) for error in partition.errors if (m := _AGENT_IN_ERROR.match(error))}
    return (set(down) | named) & set(partition.agent_ids)


def moved(layout: ClusterLayout, allocation: Allocation, partition: Partition, used: Mapping[str, Set[int]],
          holders: Mapping[Ipu, str], held: Shape, held_for: str, avoid: Set[str], down: Set[str],
          faults: LinkFaults = NO_FAULTS) -> Placement:
    """Where a partition moves: off the machines `avoid` and any machine down, to other IPUs of its
    allocation; NoRoom if there are none. In order of preference: off the machines that failed it
    before, then (when nothing else is free) on IPUs held for the queue's first request, and last
    on a machine that failed it before. Taking held IPUs restores work that was running, and may so
    delay that request's start (the one exception to backfill never delaying it). It keeps off
    quarantined links, and off suspect ones while it can (`faults`)."""
    own = {(ipu.agent_id, ipu.index) for ipu in partition.ipus}
    free_of_own = {agent: set(indices) - {i for a, i in own if a == agent} for agent, indices in used.items()}
    others = {ipu: holder for ipu, holder in holders.items() if ipu not in own}
    allowed = set(allocation.agent_ids) - set(avoid) - set(down)
    failed_before = set(partition.failed_on) & allowed

    def place(without: set[str], occupancy: Occupancy) -> Placement:
        where = f"allocation {allocation.id} without {', '.join(sorted(set(avoid) | set(down) | without))}"
        return place_partition(layout, allowed - without, free_of_own, partition.size, num_gcds=partition.num_gcds,
                               num_segments=partition.num_segments, ipulink_routing=partition.ipulink_routing, where=where,
                               occupancy=occupancy, faults=faults)

    leaving_held, taking_held = Occupancy(others, held, held_for), Occupancy(others)
    attempts = [(failed_before, leaving_held), (failed_before, taking_held)] if failed_before else []
    attempts += [(set(), leaving_held), (set(), taking_held)]
    refusal: NoRoom | None = None
    for without, occupancy in attempts:
        try:
            return place(without, occupancy)
        except NoRoom as no_room:
            refusal = no_room
    assert refusal is not None
    raise refusal


def move_note(layout: ClusterLayout, before: Partition, placement: Placement, why: str) -> str:
    """Where a partition went, when and why, as its status says."""
    own = {(ipu.agent_id, ipu.index) for ipu in before.ipus}
    to = {(ipu.agent_id, ipu.index) for ipu in placement.ipus}
    placed = f"; {placement.link_note}" if placement.link_note else ""
    return (f"moved from {span(layout, own)} to {span(layout, to)} on {utc_text(datetime.now(UTC))}: "
            f"{why}{placed}")[:NOTE_LENGTH]


def due_for_relocation(partition: Partition, down: Set[str]) -> bool:
    """Whether a health pass moves this ERROR partition now: relocatable, automatic moves allowed
    and not used up, and a machine failed it (an agent down, or a fault the agent reported, which
    a reset in place would only meet again)."""
    if not partition.relocatable or partition.disable_auto_reset or partition.auto_reset_count >= MAX_AUTO_RESETS:
        return False
    if lifecycle.state_of(partition) != lifecycle.ERROR_FAILED or not partition.errors:
        return False
    return bool(set(partition.agent_ids) & set(down)) or not all(LOST in error for error in partition.errors)


def due_to_leave_unhealthy_links(partition: Partition, links: LinkFaults, layout: ClusterLayout) -> bool:
    """Whether a health pass tries to move this partition off the unhealthy links it runs over: a
    relocatable, ACTIVE one that runs over a failed or suspect link."""
    return (partition.relocatable and lifecycle.state_of(partition) == lifecycle.ACTIVE_IDLE
            and bool(links.warnings(layout, [(ipu.agent_id, ipu.index) for ipu in partition.ipus])))


def due_to_leave_draining(partition: Partition, draining: Set[str]) -> bool:
    """Whether this partition moves off the machines an operator drains: a relocatable, ACTIVE one
    on one of them (the others are left to finish)."""
    return (partition.relocatable and lifecycle.state_of(partition) == lifecycle.ACTIVE_IDLE
            and not draining.isdisjoint(partition.agent_ids))


def due_for_reset(partition: Partition, down: Set[str]) -> bool:
    """Whether a health pass resets this ERROR partition now: it went to ERROR only because an agent
    stopped answering (a fault of the hardware would only fail again), every agent answers again,
    automatic resets are allowed and not used up."""
    return (lifecycle.state_of(partition) == lifecycle.ERROR_FAILED and not partition.disable_auto_reset and bool(partition.errors)
            and all(LOST in e for e in partition.errors) and partition.auto_reset_count < MAX_AUTO_RESETS
            and not set(partition.agent_ids) & set(down))
