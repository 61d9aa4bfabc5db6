"""Allocations: consecutive machines of one cluster, made available for partitions.

Creating one is a change of the configuration; from then on its owner (`vipu.controller.core`)
decides everything about its partitions and queue, and so it is the owner that removes it:
requests cancelled, partitions removed (with `force`), the allocation deleted, and the owner gone.
"""

from __future__ import annotations

import builtins

from vipu.controller.core.commands import START_SECONDS, ApplyTemplate, CloseAllocation, CompactAllocation
from vipu.controller.core.owners import Owners
from vipu.controller.core.placing import check_request
from vipu.controller.core.turns import TurnEngine
from vipu.model import lifecycle
from vipu.model.compaction import Report
from vipu.model.entities import OPEN_ACCESS, Access, Allocation, Partition, PartitionRequest, check_id, shown
from vipu.model.errors import AlreadyExists, InvalidArgument, NotFound, OutcomeUnknown
from vipu.model.placement import check_allocation_machines, choose_allocation_machines
from vipu.model.templates import Template
from vipu.store.store import Store

# How long a removal may take once under way: a forced removal removes every partition, whose
# agent calls are each bounded by the agent timeout, all at once.
REMOVAL_SECONDS = 300.0
# How long a template may take once under way: its creates at once, and should one fail, the
# removals of the others, each bounded by the agent timeout.
TEMPLATE_SECONDS = 300.0


class AllocationService:
    def __init__(self, store: Store, owners: Owners):
        self.store = store
        self.owners = owners

    def create(self, allocation_id: str, cluster_id: str, agent_ids: tuple[str, ...] = (), size: int = 0) -> Allocation:
        check_id("allocation", allocation_id)
        if bool(agent_ids) == bool(size):
            raise InvalidArgument("give either the allocation's agents or its size in IPUs")
        with self.store.transaction() as tx:
            if tx.get_allocation(allocation_id) is not None:
                raise AlreadyExists(f"allocation {allocation_id} already exists")
            cluster = tx.get_cluster(cluster_id)
            if cluster is None:
                raise NotFound(f"cluster {shown(cluster_id)} does not exist")
            taken = {a: alloc for a, alloc in tx.allocation_of_agents().items() if a in cluster.agent_ids}
            if agent_ids:
                check_allocation_machines(cluster.id, cluster.agent_ids, taken, tuple(agent_ids))
                chosen = tuple(agent_ids)
            else:
                chosen = choose_allocation_machines(cluster.agent_ids, set(taken), size)
            allocation = Allocation(allocation_id, cluster.id, chosen)
            tx.add_allocation(allocation)
        return allocation

    def list(self) -> list[tuple[Allocation, list[str]]]:
        return [(s.allocation, sorted(s.partitions)) for s in self.owners.snapshots()]

    def get(self, allocation_id: str) -> tuple[Allocation, builtins.list[str]]:
        owner = self._owner(allocation_id)
        return owner.snapshot.allocation, sorted(owner.snapshot.partitions)

    def compact(self, allocation_id: str, dry_run: bool = True, asked_by: str = "") -> Report:
        """Plan the moves of relocatable partitions that free the largest shape now broken up, and
        carry them out unless `dry_run` (`vipu.model.compaction`); what was planned and done."""
        command = CompactAllocation(dry_run=dry_run, why=asked_by)
        self._owner(allocation_id).submit(command)
        return command.reply.wait(START_SECONDS, f"the compaction of allocation {allocation_id}")

    def apply_template(self, allocation_id: str, template: Template, prefix: str = "", dry_run: bool = False, account: str = "",
                       access: Access = OPEN_ACCESS) -> builtins.list[Partition]:
        """Make a template's partitions in an allocation (on `account`), all or none (`ApplyTemplate`);
        with `dry_run`, only say where they would go. The partitions as made, or as they would be."""
        ids = template.partition_ids(prefix)
        requests = [PartitionRequest(partition_id, size, account=account) for partition_id, size in zip(ids, template.sizes, strict=True)]
        for request in requests:
            check_request(request)
        owner = self._owner(allocation_id)
        claimed: builtins.list[str] = []
        try:
            for request in [] if dry_run else requests:  # no create elsewhere takes one of its ids meanwhile
                if self.owners.claim_id(request.id) is not None:
                    raise AlreadyExists(f"template {template.name}: partition {request.id} already exists; nothing was made")
                claimed.append(request.id)
                self.owners.offering(request.id, allocation_id)
            command = ApplyTemplate(template=template.name, requests=requests, access=access, dry_run=dry_run)
            owner.submit(command)
            made = command.reply.wait(START_SECONDS, f"template {template.name} in allocation {allocation_id}", TEMPLATE_SECONDS)
        except OutcomeUnknown as unknown:
            raise OutcomeUnknown(f"{unknown.message}; template {template.name} may be there in part or whole: `vipu list partitions` "
                                 f"shows which of {ids[0]}..{ids[-1]} are") from None
        finally:
            for partition_id in claimed:
                self.owners.release_claim(partition_id)
        return [lifecycle.copy(partition) for partition in made]

    def remove(self, allocation_id: str, force: bool = False) -> builtins.list[str]:
        """Remove an allocation; with `force`, its partitions first. The requests waiting in it are
        cancelled. What else was removed."""
        command = CloseAllocation(force=force)
        self._owner(allocation_id).submit(command)
        return command.reply.wait(START_SECONDS, f"the removal of allocation {allocation_id}", REMOVAL_SECONDS)

    def _owner(self, allocation_id: str) -> TurnEngine:
        owner = self.owners.owner(allocation_id)
        if owner is None:
            raise NotFound(f"allocation {shown(allocation_id)} does not exist")
        return owner
