"""Clusters: agents in physical order, grouped into IPU-Link domains."""

from __future__ import annotations

import builtins
from collections.abc import Callable

from vipu.controller.usecases.allocations import AllocationService
from vipu.model.entities import Cluster, check_id, shown
from vipu.model.errors import AlreadyExists, Conflict, NotFound
from vipu.model.topology import ClusterLayout
from vipu.store.store import Store


class ClusterService:
    def __init__(self, store: Store, allocations: AllocationService, testing: Callable[[str], bool] = lambda cluster_id: False):
        """`testing(cluster_id)`: whether a cluster test is running on the cluster (`ClusterTestService.busy`, before
        which an idle-time test steps aside)."""
        self.store = store
        self.allocations = allocations
        self.testing = testing

    def create(self, cluster: Cluster) -> Cluster:
        check_id("cluster", cluster.id)
        layout = ClusterLayout(cluster.agent_ids, cluster.topology, cluster.num_ilds, cluster.gw_topology)
        cluster.gw_topology = layout.gw_topology
        with self.store.transaction() as tx:
            if tx.get_cluster(cluster.id) is not None:
                raise AlreadyExists(f"cluster {cluster.id} already exists")
            membership = tx.cluster_of_agents()
            for agent_id in cluster.agent_ids:
                if tx.get_agent(agent_id) is None:
                    raise NotFound(f"agent {shown(agent_id)} does not exist")
                if agent_id in membership:
                    raise Conflict(f"agent {agent_id} is already in cluster {membership[agent_id]}")
            tx.add_cluster(cluster)
        return cluster

    def list(self) -> list[tuple[Cluster, list[str]]]:
        with self.store.reading() as tx:
            allocations = tx.list_allocations()
            return [(c, [a.id for a in allocations if a.cluster_id == c.id]) for c in tx.list_clusters()]

    def get(self, cluster_id: str) -> tuple[Cluster, builtins.list[str]]:
        with self.store.reading() as tx:
            cluster = tx.get_cluster(cluster_id)
            if cluster is None:
                raise NotFound(f"cluster {shown(cluster_id)} does not exist")
            return cluster, [a.id for a in tx.list_allocations(cluster_id)]

    def remove(self, cluster_id: str, force: bool = False) -> builtins.list[str]:
        """Remove a cluster; with `force`, its allocations and their partitions first."""
        cluster, allocation_ids = self.get(cluster_id)
        if allocation_ids and not force:  # refused before `testing`, which makes an idle-time run there step aside
            raise Conflict(
                f"cluster {cluster_id} has {len(allocation_ids)} allocation(s) ({', '.join(allocation_ids)}); "
                "remove them first, or use --force to remove them and their partitions with it"
            )
        if self.testing(cluster_id):
            raise Conflict(f"cluster {cluster_id} is under test; stop the test or wait for it to end")
        removed: builtins.list[str] = []
        for allocation_id in allocation_ids:
            removed += self.allocations.remove(allocation_id, force=True)
            removed.append(f"allocation {allocation_id}")
        with self.store.transaction() as tx:
            tx.delete_cluster(cluster.id)
        return removed
