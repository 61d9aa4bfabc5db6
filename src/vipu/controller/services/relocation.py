"""Moving a partition to healthy IPUs of its allocation, keeping its id.

A partition created relocatable (the published API's flag) whose machine fails moves when its
allocation has room: at create, when an agent fails to apply it; at a health pass, when one of
its agents stops answering or loses it and cannot take it back; and on demand, with `vipu reset
partition P --relocate` (the reset request's added `relocate`), for any partition, or with the
published reset's `relocatable`, for a partition that machines failed. It avoids the machines
that failed it (agents down, or named in its errors), or, when none did, all of its own. It also
keeps off the machines that failed the same partition before, while other room is left, so that
a partition does not go back and forth between two faulty machines until its automatic moves are
used up; the store keeps those machines with the partition (`Partition.failed_on`, written by the
same 'relocate'), so a restarted controller keeps off them too.

A move is the life cycle's 'relocate' (ACTIVE/IDLE or ERROR/FAILED to PENDING/RESETTING), which
the store applies together with the change of IPUs and a note of where it went and why; then the
reachable old agents are cleared and the new ones configured, as a reset does. A controller
stopped half-way finishes it as an interrupted reset; an old agent that was down is cleared by
the reconciler when it answers again, since the store no longer gives it the partition. The
partition's IPUoF configuration changes with its devices, so clients read it again: `vipu reset
partition --relocate` rewrites the files, and `vipu-ipuof` rewrites files it finds out of date.

Relocation never moves a partition onto a machine that is down. It may take IPUs held for the
first request waiting in the allocation, if nothing else is free: it restores work that was
running, and may so delay that request's start (the one exception to backfill never delaying
it); that request is then held another shape, chosen afresh by the queue's next pass.

The attach key stays the same: IPUoF files written before the move, and the old settings that an
agent down during the move still holds when it returns, carry the same old key, so a new key
would not keep such files from attaching there. What does is the reconciler clearing those
settings at the first health pass that reaches the agent, before it is used again.
"""

from __future__ import annotations

import dataclasses
import logging
import re
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from vipu.model import lifecycle
from vipu.model.entities import MAX_AUTO_RESETS, OPEN_ACCESS, AgentStatus, Partition
from vipu.model.errors import Conflict, NoRoom, VipuError
from vipu.model.placement import Occupancy, place_partition
from vipu.model.reasons import span
from vipu.model.topology import ClusterLayout

if TYPE_CHECKING:
    from vipu.controller.services.partitions import PartitionService

log = logging.getLogger(__name__)

# An error of a partition naming the agent that failed it: "agent ag2: ..." or "agent ag2 is down: ...".
_AGENT_IN_ERROR = re.compile(r"^agent (\S+?)(?::| is down)")
NOTE_LENGTH = 500  # partitions.relocation holds 512 characters


def failed_machines(service: PartitionService, partition: Partition) -> set[str]:
    """The partition's agents that failed it: those down, and those its errors name."""
    with service.store.reading() as tx:
        down = {a.id for a in tx.list_agents() if a.status is AgentStatus.DOWN}
    named = {m.group(1) for error in partition.errors if (m := _AGENT_IN_ERROR.match(error))}
    return (down | named) & set(partition.agent_ids)


def relocate(service: PartitionService, partition: Partition, avoid: set[str], why: str, automatic: bool = False,
             because_failed: bool = True) -> Partition:
    """Move a settled partition off the machines `avoid` (and any machine down), to other IPUs of
    its allocation, and configure it there; the caller holds it. `because_failed`: the machines of
    `avoid` failed it, and are kept off while other room is left. NoRoom if the allocation has no
    room for it elsewhere; the configuration's failure (the partition then in ERROR on its new
    IPUs) if that fails.

    As a create is placed, the move is placed and its new IPUs reserved in the ledger under the
    allocation's lock, and recorded in the store after it. Its old IPUs stay taken in the ledger
    until its reachable old machines are cleared, so that nothing is placed on settings still
    there."""
    with service.store.reading() as tx:
        allocation = service._allocation(tx, partition.allocation_id, OPEN_ACCESS)
        layout = ClusterLayout.of(service._cluster(tx, partition.cluster_id))
        down = service.down_agents(tx, allocation.agent_ids)
    own = {(ipu.agent_id, ipu.index) for ipu in partition.ipus}
    before = dataclasses.replace(partition, ipus=list(partition.ipus))
    with service.ledger.placing(allocation.id):
        used = {agent: set(indices) for agent, indices in service.ledger.used_ipus(allocation.id).items()}
        for agent, index in own:
            used[agent].discard(index)
        holders = {ipu: holder for ipu, holder in service.ledger.holders(allocation.id).items() if ipu not in own}
        held, held_for = service.queue.held(allocation.id)
        allowed = set(allocation.agent_ids) - avoid - down
        failed_before = set(partition.failed_on) & allowed

        def place(without: set[str], occupancy: Occupancy):
            where = f"allocation {allocation.id} without {', '.join(sorted(avoid | down | without))}"
            return place_partition(layout, allowed - without, used, partition.size, num_gcds=partition.num_gcds,
                                   num_segments=partition.num_segments, ipulink_routing=partition.ipulink_routing, where=where,
                                   occupancy=occupancy)

        # In order: off the machines that failed it before, then, when nothing else is free, on
        # IPUs held for the queue's first request, and last on a machine that failed it before.
        leaving_held, taking_held = Occupancy(holders, held, held_for), Occupancy(holders)
        attempts = [(failed_before, leaving_held), (failed_before, taking_held)] if failed_before else []
        attempts += [(set(), leaving_held), (set(), taking_held)]
        for without, occupancy in attempts:
            try:
                placement = place(without, occupancy)
                break
            except NoRoom as refusal:
                no_room = refusal
        else:
            raise no_room
        moved = {(ipu.agent_id, ipu.index) for ipu in placement.ipus}
        if moved & held:  # that request is held another shape at the next pass, not one it may never get
            service.queue.hold(held_for, frozenset())
        service.ledger.linger(partition)
        service.ledger.reserve(dataclasses.replace(partition, ipus=list(placement.ipus)))
    note = (f"moved from {span(layout, own)} to {span(layout, moved)} on {datetime.now(UTC):%Y-%m-%d %H:%M:%S} UTC: "
            f"{why}")[:NOTE_LENGTH]
    fields: dict = {"ipus": list(placement.ipus), "relocation": note}
    if because_failed:
        fields["failed_on"] = tuple(sorted(set(partition.failed_on) | avoid))
    if automatic:
        fields["auto_reset_count"] = partition.auto_reset_count + 1
    try:
        try:
            service._apply(partition, ("relocate", fields))
        except Conflict:  # another change won: the ledger holds what the store holds
            raise
        except BaseException:
            service.ledger.record(before)  # the store did not take the move
            raise
        log.warning("partition %s %s", partition.id, note)
        with service.store.reading() as tx:
            reachable = [found for agent_id in before.agent_ids
                         if (found := tx.get_agent(agent_id)) is not None and found.status is AgentStatus.UP]
        with service.hardware.locks.hold([a.id for a in reachable]):
            for agent_id, error in service.hardware.clear(reachable, partition.id).items():
                log.warning("partition %s moved; agent %s still holds its old settings until the reconciler clears them: %s",
                            partition.id, agent_id, error.message)
    finally:
        service.ledger.cleared(partition.id)
    layout, agents = service._where(partition)
    return service._configure(partition, layout, agents, on_failure="fail")


def moved_after_failure(service: PartitionService, partition: Partition, failure: VipuError, attempts: int = 2) -> Partition | None:
    """A relocatable partition that failed at some agents, now in ERROR, moved off them and
    configured elsewhere; None if its allocation has no room elsewhere, or it failed there too."""
    for _ in range(attempts):
        current = service.ledger.get(partition.id)
        if current is None or lifecycle.state_of(current) != lifecycle.ERROR_FAILED:
            return None
        try:
            return relocate(service, current, failed_machines(service, current), "; ".join(current.errors) or failure.message)
        except NoRoom as refusal:
            log.info("partition %s stays in ERROR: %s", partition.id, refusal.message)
            return None
        except VipuError as again:  # it failed on its new machines too: those are avoided next
            failure = again
    return None


def due_for_relocation(partition: Partition, down: set[str], lost_marker: str) -> bool:
    """Whether a health pass moves this ERROR partition now: relocatable, automatic moves allowed
    and not used up, and a machine failed it (an agent down, or a fault the agent reported, which
    a reset in place would only meet again)."""
    if not partition.relocatable or partition.disable_auto_reset or partition.auto_reset_count >= MAX_AUTO_RESETS:
        return False
    if lifecycle.state_of(partition) != lifecycle.ERROR_FAILED or not partition.errors:
        return False
    return bool(set(partition.agent_ids) & down) or not all(lost_marker in error for error in partition.errors)
