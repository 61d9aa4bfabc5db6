"""Allocations: consecutive machines of one cluster, made available for partitions."""

from __future__ import annotations

import builtins

from vipu.controller.services.partitions import PartitionService
from vipu.controller.services.requests import RequestService
from vipu.model.entities import Allocation, check_id, shown
from vipu.model.errors import AlreadyExists, Conflict, InvalidArgument, NotFound
from vipu.model.placement import check_allocation_machines, choose_allocation_machines
from vipu.store.store import Store


class AllocationService:
    def __init__(self, store: Store, partitions: PartitionService, requests: RequestService):
        self.store = store
        self.partitions = partitions
        self.requests = requests

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
        with self.store.reading() as tx:
            partitions = tx.list_partitions()
            return [(a, [p.id for p in partitions if p.allocation_id == a.id]) for a in tx.list_allocations()]

    def get(self, allocation_id: str) -> tuple[Allocation, builtins.list[str]]:
        with self.store.reading() as tx:
            allocation = tx.get_allocation(allocation_id)
            if allocation is None:
                raise NotFound(f"allocation {shown(allocation_id)} does not exist")
            return allocation, [p.id for p in tx.list_partitions(allocation_id=allocation_id)]

    def remove(self, allocation_id: str, force: bool = False) -> builtins.list[str]:
        """Remove an allocation; with `force`, its partitions first. The requests waiting in it are
        cancelled. What else was removed."""
        allocation, partition_ids = self.get(allocation_id)
        if partition_ids and not force:
            raise Conflict(
                f"allocation {allocation_id} holds {len(partition_ids)} partition(s) ({', '.join(partition_ids)}); "
                "remove them first, or use --force to remove them with it"
            )
        with self.partitions.queue.closing(allocation_id):  # no request starts to wait in it meanwhile
            removed = [f"request of partition {partition_id}"
                       for partition_id in self.requests.cancel_all(allocation_id, f"allocation {allocation_id} is removed")]
            for partition_id in partition_ids:
                self.partitions.remove(partition_id, force=True)
                removed.append(f"partition {partition_id}")
            with self.store.transaction() as tx:
                tx.delete_allocation(allocation.id)
        return removed
