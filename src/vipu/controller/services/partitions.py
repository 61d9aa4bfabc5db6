"""Partitions: create, inspect, reset and remove, and configure their agents.

Creating a partition is two steps. One store transaction checks the request, places it (pure
`vipu.model.placement`) and records it PENDING/CREATING, so its IPUs are taken before any agent
is touched. Then the settings go to every agent concerned, in parallel. If all succeed the
partition becomes ACTIVE; if any fails, what was applied is cleared again and the partition is
left in ERROR with each agent's reason, holding its IPUs until it is reset or removed. An ERROR
partition is never configured on any agent; the reconciler clears what an unreachable agent
still held once it answers again.
"""

from __future__ import annotations

import builtins
import logging
import threading
from dataclasses import dataclass

from vipu.controller.services.hardware import Hardware
from vipu.model.configuration import (
    IPUOF_SERVER_VERSION_KEY,
    GcdConfig,
    agent_settings,
    gcd_configs,
)
from vipu.model.entities import (
    OPEN_ACCESS,
    Access,
    Agent,
    Allocation,
    Cluster,
    OperationState,
    Partition,
    PartitionRequest,
    ReadyState,
    SyncType,
    check_id,
)
from vipu.model.errors import (
    AlreadyExists,
    ConcurrentUpdate,
    Conflict,
    HardwareFailure,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    Unavailable,
    VipuError,
)
from vipu.model.placement import place_partition
from vipu.model.topology import ClusterLayout
from vipu.store.store import Store, Transaction

log = logging.getLogger(__name__)

BUSY = (OperationState.CREATING, OperationState.REMOVING, OperationState.RESETTING)
PLACEMENT_ATTEMPTS = 3


@dataclass
class IpuAttributes:
    agent_id: str
    ipus: dict[int, dict[str, str]]


class PartitionService:
    def __init__(self, store: Store, hardware: Hardware, under_test: set[str]):
        self.store = store
        self.hardware = hardware
        self.under_test = under_test  # clusters a cluster test is running on, kept by ClusterTestService
        self._placing = threading.Lock()

    # Reading

    def list(self, allocation_id: str = "", access: Access = OPEN_ACCESS) -> list[Partition]:
        with self.store.reading() as tx:
            if allocation_id:
                self._allocation(tx, allocation_id, access)
            partitions = tx.list_partitions(allocation_id=allocation_id or None)
        return [p for p in partitions if access.may_use(p.allocation_id)]

    def get(self, partition_id: str, access: Access = OPEN_ACCESS) -> Partition:
        with self.store.reading() as tx:
            return self._partition(tx, partition_id, access)

    def ipuof_config(self, partition_id: str, gcd: int | None = None,
                     access: Access = OPEN_ACCESS) -> tuple[Partition, builtins.list[GcdConfig], str]:
        """The partition, the IPUoF configuration of one GCD or all, and the IPUoF server version."""
        with self.store.reading() as tx:
            partition = self._partition(tx, partition_id, access)
            inventories = {a: self._agent(tx, a).inventory for a in partition.agent_ids}
        if partition.ready_state is not ReadyState.ACTIVE:
            raise Conflict(f"partition {partition_id} is {partition.ready_state.value}, so it has no usable IPUoF configuration")
        gcds = gcd_configs(partition, inventories)
        if gcd is not None:
            if not 0 <= gcd < partition.num_gcds:
                raise InvalidArgument(f"partition {partition_id} has GCDs 0 to {partition.num_gcds - 1}, not {gcd}")
            gcds = [gcds[gcd]]
        return partition, gcds, self._ipuof_version(inventories.values())

    def ipuof_versions(self, partitions: builtins.list[Partition]) -> dict[str, str]:
        """The IPUoF server version serving each partition, by partition id."""
        with self.store.reading() as tx:
            inventories = {a.id: a.inventory for a in tx.list_agents()}
        return {p.id: self._ipuof_version(inventories[a] for a in p.agent_ids[:1]) for p in partitions}

    @staticmethod
    def _ipuof_version(inventories) -> str:
        return next((inv.versions.get(IPUOF_SERVER_VERSION_KEY, "") for inv in inventories), "")

    def allocations(self, access: Access = OPEN_ACCESS) -> builtins.list[Allocation]:
        with self.store.reading() as tx:
            return [a for a in tx.list_allocations() if access.may_use(a.id)]

    def ipu_attributes(self, agent_ids: builtins.list[str], access: Access = OPEN_ACCESS) -> builtins.list[IpuAttributes]:
        with self.store.reading() as tx:
            if access.unrestricted:
                visible = {a.id for a in tx.list_agents()}
            else:
                visible = {a for alloc in tx.list_allocations() if access.may_use(alloc.id) for a in alloc.agent_ids}
            unknown = [a for a in agent_ids if a not in visible]
            if unknown:
                raise NotFound(f"agent {unknown[0]} does not exist")
            chosen = agent_ids or sorted(visible)
            agents = [self._agent(tx, a) for a in chosen]
        return [IpuAttributes(a.id, {i.index: dict(i.attributes) for i in a.inventory.ipus}) for a in agents]

    # Changing

    def create(self, request: PartitionRequest, access: Access = OPEN_ACCESS) -> Partition:
        self._check_request(request)
        for attempt in range(PLACEMENT_ATTEMPTS):
            try:
                with self._placing, self.store.transaction() as tx:
                    if tx.get_partition(request.id) is not None:
                        raise AlreadyExists(f"partition {request.id} already exists")
                    partition, layout = self._place(tx, request, access)
                    tx.add_partition(partition)
                    agents = {a: self._agent(tx, a) for a in partition.agent_ids}
                break
            except ConcurrentUpdate:
                # Another controller took the IPUs between our read and our write: place again.
                if attempt == PLACEMENT_ATTEMPTS - 1:
                    raise
        log.info("partition %s placed on %s", partition.id, ", ".join(partition.agent_ids))
        return self._configure(partition, layout, agents)

    def reset(self, partition_id: str, access: Access = OPEN_ACCESS, automatic: bool = False) -> Partition:
        """Clear and configure the partition again; `automatic` counts it as an automatic reset."""
        with self.store.transaction() as tx:
            partition = self._partition(tx, partition_id, access)
            self._refuse_if_busy(partition)
            count = partition.auto_reset_count + 1 if automatic else None
            tx.set_partition_state(partition.id, ReadyState.PENDING, OperationState.RESETTING, auto_reset_count=count)
            if count is not None:  # automatic
                partition.auto_reset_count = count
            layout, agents = self._where(tx, partition)
        with self.hardware.locks.hold(agents):
            failures = self.hardware.clear(agents.values(), partition.id)
        if failures:
            raise self._fail(partition, failures, f"cannot reset partition {partition.id}")
        return self._configure(partition, layout, agents)

    def remove(self, partition_id: str, force: bool = False, access: Access = OPEN_ACCESS) -> None:
        with self.store.transaction() as tx:
            partition = self._partition(tx, partition_id, access)
            if not access.unrestricted and partition.owner and partition.owner != access.user_id:
                raise PermissionDenied(
                    f"partition {partition_id} belongs to user {partition.owner}; only its owner or an administrator removes it"
                )
            if not force:
                self._refuse_if_busy(partition)
            tx.set_partition_state(partition.id, partition.ready_state, OperationState.REMOVING)
            agents = {a: self._agent(tx, a) for a in partition.agent_ids}
        with self.hardware.locks.hold(agents):
            failures = self.hardware.clear(agents.values(), partition.id)
        if failures and not force:
            raise self._fail(partition, failures, f"cannot remove partition {partition.id}",
                             hint="; remove it with --force to forget it anyway")
        for agent_id, error in failures.items():
            log.warning("partition %s forgotten while agent %s still may hold it: %s", partition.id, agent_id, error.message)
        with self.store.transaction() as tx:
            tx.delete_partition(partition.id)
        log.info("partition %s removed", partition.id)

    def finish_interrupted(self) -> None:
        """After a restart: complete the operations a stopped controller left half-done."""
        with self.store.reading() as tx:
            stale = [p for p in tx.list_partitions() if p.operation_state in BUSY]
        for partition in stale:
            interrupted = partition.operation_state
            try:
                if interrupted is OperationState.REMOVING:
                    self.remove(partition.id, force=True)
                else:
                    with self.store.reading() as tx:
                        layout, agents = self._where(tx, partition)
                    self._configure(partition, layout, agents)
                log.info("finished the interrupted %s of partition %s", interrupted.value.lower(), partition.id)
            except VipuError as error:
                log.warning("partition %s: %s", partition.id, error.message)

    # Helpers

    def _configure(self, partition: Partition, layout: ClusterLayout, agents: dict[str, Agent]) -> Partition:
        settings = agent_settings(partition, layout, {a.id: a.inventory.serial for a in agents.values()})
        with self.hardware.locks.hold(agents):
            failures = self.hardware.apply(agents, settings)
            if failures:
                applied = [agents[a] for a in settings if a not in failures]
                for agent_id, error in self.hardware.clear(applied, partition.id).items():
                    log.warning("could not undo partition %s on agent %s: %s", partition.id, agent_id, error.message)
                raise self._fail(partition, failures, f"partition {partition.id} is in ERROR")
            with self.store.transaction() as tx:
                tx.set_partition_state(partition.id, ReadyState.ACTIVE, OperationState.IDLE, errors=[])
        partition.ready_state, partition.operation_state, partition.errors = ReadyState.ACTIVE, OperationState.IDLE, []
        log.info("partition %s is ACTIVE", partition.id)
        return partition

    def _fail(self, partition: Partition, failures: dict[str, VipuError], summary: str, hint: str = "") -> VipuError:
        """Record the agents' reasons on the partition (now ERROR); the error to raise, `summary: reasons`."""
        reasons = [f"agent {agent_id}: {error.message}" for agent_id, error in sorted(failures.items())]
        with self.store.transaction() as tx:
            tx.set_partition_state(partition.id, ReadyState.ERROR, OperationState.FAILED, errors=reasons)
        partition.ready_state, partition.operation_state, partition.errors = ReadyState.ERROR, OperationState.FAILED, reasons
        family = Unavailable if all(e.temporary for e in failures.values()) else HardwareFailure
        log.warning("partition %s: %s", partition.id, "; ".join(reasons))
        return family(f"{summary}: {'; '.join(reasons)}{hint}")

    @staticmethod
    def _refuse_if_busy(partition: Partition) -> None:
        if partition.operation_state in BUSY:
            raise Conflict(f"partition {partition.id} is busy ({partition.operation_state.value.lower()})")

    @staticmethod
    def _check_request(request: PartitionRequest) -> None:
        check_id("partition", request.id)
        if request.size <= 0:
            raise InvalidArgument(f"partition size must be a power of two, not {request.size}")
        if request.num_replicas and (request.num_replicas % request.num_gcds or request.size % request.num_replicas):
            raise InvalidArgument(
                f"{request.num_replicas} replicas do not divide evenly into {request.num_gcds} GCD(s) "
                f"of a partition of {request.size} IPUs"
            )
        if request.reconfigurable and request.sync_type not in (None, SyncType.GS2_DEFAULT):
            raise InvalidArgument("a reconfigurable partition supports only the c2-compatible sync type")
        if request.explicit_ipus and not request.cluster_id:
            raise InvalidArgument("naming the IPUs of a partition needs its cluster id too")

    def _place(self, tx: Transaction, request: PartitionRequest, access: Access) -> tuple[Partition, ClusterLayout]:
        if request.allocation_id:
            candidates = [self._allocation(tx, request.allocation_id, access)]
            if request.cluster_id and candidates[0].cluster_id != request.cluster_id:
                raise InvalidArgument(f"allocation {request.allocation_id} is not in cluster {request.cluster_id}")
        elif request.cluster_id:
            if tx.get_cluster(request.cluster_id) is None:
                raise NotFound(f"cluster {request.cluster_id} does not exist")
            candidates = [a for a in tx.list_allocations(request.cluster_id) if access.may_use(a.id)]
        else:
            candidates = [a for a in tx.list_allocations() if access.may_use(a.id)]
        if not candidates:
            where = f"cluster {request.cluster_id}" if request.cluster_id else "this controller"
            if not access.unrestricted:
                raise Conflict(f"no allocation in {where} is given to user {access.user_id}; an administrator gives one with "
                               "'vipu-admin update user --give'")
            raise Conflict(f"there is no allocation to create partitions in, in {where}; an administrator creates one with "
                           "'vipu-admin create allocation'")

        refusals: list[Conflict] = []
        for allocation in candidates:
            if allocation.cluster_id in self.under_test:
                refusals.append(Conflict(f"cluster {allocation.cluster_id} is under test; "
                                         "no partition can be created in it until the test ends"))
                continue
            layout = ClusterLayout.of(self._cluster(tx, allocation.cluster_id))
            try:
                placement = place_partition(
                    layout,
                    set(allocation.agent_ids),
                    tx.used_ipus(allocation.id),
                    request.size,
                    num_gcds=request.num_gcds,
                    num_segments=request.num_segments,
                    ipulink_routing=request.ipulink_routing,
                    gw_routing=request.gw_routing,
                    explicit=request.explicit_ipus,
                    where=f"allocation {allocation.id}",
                )
            except Conflict as refusal:
                refusals.append(refusal)
                continue
            sync = request.sync_type or (SyncType.GS2_DEFAULT if request.reconfigurable else SyncType.POD_NATIVE_DEFAULT)
            partition = Partition(
                id=request.id,
                cluster_id=allocation.cluster_id,
                allocation_id=allocation.id,
                size=request.size,
                num_gcds=request.num_gcds,
                num_replicas=request.num_replicas or request.num_gcds,
                reconfigurable=request.reconfigurable,
                sync_type=sync,
                ipulink_routing=placement.ipulink_routing,
                gw_routing=placement.gw_routing,
                num_segments=placement.num_segments,
                ipus=list(placement.ipus),
                disable_auto_reset=request.disable_auto_reset,
                owner=access.user_id,
            )
            return partition, layout
        if len(refusals) == 1:
            raise refusals[0]
        raise Conflict(f"no allocation has room for a partition of {request.size} IPUs ({'; '.join(r.message for r in refusals)})")

    @staticmethod
    def _where(tx: Transaction, partition: Partition) -> tuple[ClusterLayout, dict[str, Agent]]:
        layout = ClusterLayout.of(PartitionService._cluster(tx, partition.cluster_id))
        return layout, {a: PartitionService._agent(tx, a) for a in partition.agent_ids}

    @staticmethod
    def _agent(tx: Transaction, agent_id: str) -> Agent:
        """An agent a partition or allocation names, which the store's foreign keys keep while they exist."""
        agent = tx.get_agent(agent_id)
        if agent is None:
            raise NotFound(f"agent {agent_id} does not exist")
        return agent

    @staticmethod
    def _cluster(tx: Transaction, cluster_id: str) -> Cluster:
        """The cluster an allocation or partition is in, which the store's foreign keys keep while they exist."""
        cluster = tx.get_cluster(cluster_id)
        if cluster is None:
            raise NotFound(f"cluster {cluster_id} does not exist")
        return cluster

    @staticmethod
    def _allocation(tx: Transaction, allocation_id: str, access: Access) -> Allocation:
        allocation = tx.get_allocation(allocation_id)
        if allocation is None:
            raise NotFound(f"allocation {allocation_id} does not exist")
        if not access.may_use(allocation_id):
            raise PermissionDenied(f"allocation {allocation_id} is not given to user {access.user_id}")
        return allocation

    @staticmethod
    def _partition(tx: Transaction, partition_id: str, access: Access) -> Partition:
        partition = tx.get_partition(partition_id)
        if partition is None:
            raise NotFound(f"partition {partition_id} does not exist")
        if not access.may_use(partition.allocation_id):
            raise PermissionDenied(
                f"partition {partition_id} is in allocation {partition.allocation_id}, which is not given to user {access.user_id}"
            )
        return partition
