"""Partitions: create, inspect, reset and remove, and configure their agents.

Every change of a partition's state is a transition of `vipu.model.lifecycle`, written to the
store as a compare-and-set and then to the ledger, the serving controller's in-memory copy that
reads and placement use. One operation at a time holds a partition (`holds`).

Creating a partition places it against the ledger, under its allocation's lock, and records it
PENDING/CREATING in the store, so its IPUs are taken before any agent is touched. Then the
settings go to every agent concerned, in parallel. If all succeed the partition becomes ACTIVE;
if any fails, what was applied is cleared again and the partition is abandoned (its IPUs free at
once), or kept in ERROR with each agent's reason when the caller asked for that. An ERROR
partition is never configured on any agent; the reconciler clears what an unreachable agent
still held once it answers again. An operation whose last store write failed is finished by the
next health pass (`finish_interrupted`).
"""

from __future__ import annotations

import builtins
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import UTC, datetime

from vipu.controller.services import relocation
from vipu.controller.services.changes import ChangeFeed
from vipu.controller.services.hardware import Hardware
from vipu.controller.services.holds import FINISHING, Capacity, PartitionHolds
from vipu.controller.services.ledger import Ledger
from vipu.controller.services.waiting import WaitingRequests
from vipu.model import lifecycle
from vipu.model.configuration import (
    IPUOF_SERVER_VERSION_KEY,
    GcdConfig,
    agent_settings,
    gcd_configs,
)
from vipu.model.entities import (
    IPUS_PER_MACHINE,
    OPEN_ACCESS,
    Access,
    Agent,
    AgentStatus,
    Allocation,
    Cluster,
    OperationState,
    Partition,
    PartitionRequest,
    ReadyState,
    SyncType,
    check_partition_id,
    new_attach_key,
    shown,
)
from vipu.model.errors import (
    AlreadyExists,
    ConcurrentUpdate,
    Conflict,
    HardwareFailure,
    InvalidArgument,
    NoRoom,
    NotFound,
    PermissionDenied,
    Unavailable,
    VipuError,
)
from vipu.model.placement import Occupancy, Placement, count_fitting, is_power_of_two, largest_fitting, place_partition
from vipu.model.topology import ClusterLayout
from vipu.store.store import Store, Transaction

log = logging.getLogger(__name__)

PLACEMENT_ATTEMPTS = 3
# How long a forced remove waits for the operation under way on its partition: that operation's
# agent calls are each bounded by the agent timeout.
FORCED_REMOVE_WAIT_SECONDS = 60.0
# Partition operations under way at once; past that a request waits OPERATION_WAIT_SECONDS for
# room, then is refused as temporarily unavailable rather than queued for ever.
MAX_OPERATIONS = 64
OPERATION_WAIT_SECONDS = 5.0


@dataclass
class IpuAttributes:
    agent_id: str
    ipus: dict[int, dict[str, str]]


@dataclass(frozen=True)
class AllocationRoom:
    """What `PartitionService.capacity` reports of one allocation."""

    allocation_id: str
    cluster_id: str
    total_ipus: int
    used_ipus: int
    fitting: int
    largest: int
    blocked: str = ""
    down_ipus: int = 0  # of the free IPUs, those on machines that are down
    held_ipus: int = 0  # of the free IPUs, those held for the first waiting request, `held_for`
    held_for: str = ""

    @property
    def free_ipus(self) -> int:
        return self.total_ipus - self.used_ipus


class PartitionService:
    def __init__(self, store: Store, hardware: Hardware, under_test: set[str], changes: ChangeFeed | None = None):
        self.store = store
        self.hardware = hardware
        self.under_test = under_test  # clusters a cluster test is running on, kept by ClusterTestService
        self.queue = WaitingRequests()  # the requests waiting for room, which RequestService serves
        self.holds = PartitionHolds(released=self.queue.notify)  # clients waiting for a partition wait for its operation
        self.operations = Capacity("partition operations", MAX_OPERATIONS, OPERATION_WAIT_SECONDS)
        self.ledger = Ledger(changes)
        self.ledger.watch(self.queue.notify)
        self.load()

    def load(self) -> None:
        """Take every partition and waiting request from the store: at start-up, and when this
        controller takes the lead."""
        with self.store.reading() as tx:
            self.ledger.load(tx.list_partitions())
            self.queue.load(tx.list_requests())

    # Reading

    def list(self, allocation_id: str = "", access: Access = OPEN_ACCESS) -> list[Partition]:
        if allocation_id:
            with self.store.reading() as tx:
                self._allocation(tx, allocation_id, access)
        return [p for p in self.ledger.list(allocation_id or None) if access.may_use(p.allocation_id)]

    def get(self, partition_id: str, access: Access = OPEN_ACCESS) -> Partition:
        return self._partition(partition_id, access)

    def ipuof_config(self, partition_id: str, gcd: int | None = None,
                     access: Access = OPEN_ACCESS) -> tuple[Partition, builtins.list[GcdConfig], str]:
        """The partition, the IPUoF configuration of one GCD or all, and the IPUoF server version."""
        partition = self._partition(partition_id, access)
        with self.store.reading() as tx:
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

    def capacity(self, size: int = 0, allocation_id: str = "", cluster_id: str = "",
                 access: Access = OPEN_ACCESS) -> builtins.list[AllocationRoom]:
        """The room in each allocation the caller may use (or the one named, or a cluster's):
        its IPUs in use and free, how many partitions of `size` fit side by side, the largest that fits."""
        if size and not is_power_of_two(size):
            raise InvalidArgument(f"partition size must be a power of two, not {size}")
        with self.store.reading() as tx:
            if allocation_id:
                allocations = [self._allocation(tx, allocation_id, access)]
            else:
                if cluster_id and tx.get_cluster(cluster_id) is None:
                    raise NotFound(f"cluster {shown(cluster_id)} does not exist")
                allocations = [a for a in tx.list_allocations(cluster_id or None) if access.may_use(a.id)]
            layouts = {c: ClusterLayout.of(self._cluster(tx, c)) for c in {a.cluster_id for a in allocations}}
            down = {a.id: self.down_agents(tx, a.agent_ids) for a in allocations}
        rooms = []
        for allocation in allocations:
            layout, allowed = layouts[allocation.cluster_id], set(allocation.agent_ids)
            used = self.ledger.used_ipus(allocation.id)
            in_use = sum(len(ipus) for agent, ipus in used.items() if agent in allowed)
            blocked = (f"cluster {allocation.cluster_id} is under test" if allocation.cluster_id in self.under_test else "")
            held, held_for = self.queue.held(allocation.id)
            rooms.append(AllocationRoom(
                allocation.id, allocation.cluster_id, len(allowed) * IPUS_PER_MACHINE, in_use,
                fitting=0 if blocked or not size else count_fitting(layout, allowed, used, size),
                largest=0 if blocked else largest_fitting(layout, allowed, used), blocked=blocked,
                down_ipus=sum(IPUS_PER_MACHINE - len(used.get(agent, ())) for agent in down[allocation.id]),
                held_ipus=sum(1 for agent, index in held if index not in used.get(agent, ())), held_for=held_for))
        return rooms

    def ipu_attributes(self, agent_ids: builtins.list[str], access: Access = OPEN_ACCESS) -> builtins.list[IpuAttributes]:
        with self.store.reading() as tx:
            if access.unrestricted:
                visible = {a.id for a in tx.list_agents()}
            else:
                visible = {a for alloc in tx.list_allocations() if access.may_use(alloc.id) for a in alloc.agent_ids}
            unknown = [a for a in agent_ids if a not in visible]
            if unknown:
                raise NotFound(f"agent {shown(unknown[0])} does not exist")
            chosen = agent_ids or sorted(visible)
            agents = [self._agent(tx, a) for a in chosen]
        return [IpuAttributes(a.id, {i.index: dict(i.attributes) for i in a.inventory.ipus}) for a in agents]

    # Changing

    def create(self, request: PartitionRequest, access: Access = OPEN_ACCESS, keep_on_error: bool = False) -> Partition:
        """Place and configure a partition. One that fails at an agent leaves nothing behind, unless
        `keep_on_error` keeps it in ERROR, holding its IPUs, for inspection."""
        return self.create_with_ipuof(request, access, keep_on_error)[0]

    def create_with_ipuof(self, request: PartitionRequest, access: Access = OPEN_ACCESS,
                          keep_on_error: bool = False) -> tuple[Partition, builtins.list[GcdConfig], str]:
        """`create`, and the new partition's IPUoF configuration of every GCD with the IPUoF server
        version, from what the create already read (as `ipuof_config` gives them)."""
        self._check_request(request)
        taken = AlreadyExists(f"partition {request.id} already exists")
        with self.operations.admitted(), self.holds.hold(request.id, "creating", busy=taken):
            self.refuse_if_taken(request.id, access)
            for attempt in range(PLACEMENT_ATTEMPTS):
                try:
                    partition, layout, agents = self._place(request, access)
                    break
                except ConcurrentUpdate:
                    # The store holds what this controller did not know (another wrote to it): start
                    # again from what it holds.
                    if attempt == PLACEMENT_ATTEMPTS - 1:
                        raise
                    self.load()
            if request.relocatable:
                partition = self._configure_or_move(partition, layout, agents, keep_on_error)
                layout, agents = self._where(partition)
            else:
                self._configure(partition, layout, agents, on_failure="fail" if keep_on_error else "abandon")
            inventories = {a: agent.inventory for a, agent in agents.items()}
            return partition, gcd_configs(partition, inventories), self._ipuof_version(inventories.values())

    def _configure_or_move(self, partition: Partition, layout: ClusterLayout, agents: dict[str, Agent], keep_on_error: bool) -> Partition:
        """Configure a new relocatable partition; should agents fail it, move it off them. If it can
        move nowhere, it is kept in ERROR if asked, else removed, and the failure raised."""
        try:
            return self._configure(partition, layout, agents, on_failure="fail")
        except VipuError as failure:
            moved = relocation.moved_after_failure(self, partition, failure)
            if moved is not None:
                return moved
            if keep_on_error:
                raise
            current = self.ledger.get(partition.id)
            if current is None:
                raise
            self._begin_remove(current)
            self._finish_remove(current, self._where(current)[1], force=True)
            reasons = "; ".join(current.errors) or failure.message
            raise type(failure)(f"partition {partition.id} could not be created and was not kept: {reasons}") from None

    def refuse_if_taken(self, partition_id: str, access: Access = OPEN_ACCESS) -> None:
        """AlreadyExists if a partition of that id exists or a request of it waits (naming where only
        to a caller who may use that allocation); the caller holds the id."""
        if self.ledger.get(partition_id) is not None:
            raise AlreadyExists(f"partition {partition_id} already exists")
        waiting = self.queue.get(partition_id)
        if waiting is not None:
            where = f" in allocation {waiting.allocation_id}" if access.may_use(waiting.allocation_id) else ""
            raise AlreadyExists(f"partition {partition_id} already waits for room{where}")
        self.queue.forget_ending(partition_id)

    def reset(self, partition_id: str, access: Access = OPEN_ACCESS, automatic: bool = False) -> Partition:
        """Clear and configure the partition again; `automatic` counts it as an automatic reset."""
        self._partition(partition_id, access)  # first: another tenant's partition is not even found busy
        with self.operations.admitted(), self.holds.hold(partition_id, "resetting"):
            partition = self._partition(partition_id, access)
            self._refuse_if_busy(partition)
            return self._reset_in_place(partition, automatic)

    def _reset_in_place(self, partition: Partition, automatic: bool) -> Partition:
        """Reset a settled partition that the caller holds."""
        self._apply(partition, ("reset", {"auto_reset_count": partition.auto_reset_count + 1 if automatic else None}))
        layout, agents = self._where(partition)
        with self.hardware.locks.hold(agents):
            failures = self.hardware.clear(agents.values(), partition.id)
        if failures:
            raise self._fail(partition, failures, f"cannot reset partition {partition.id}", "fail")
        return self._configure(partition, layout, agents, on_failure="fail")

    def relocate(self, partition_id: str, access: Access = OPEN_ACCESS, automatic: bool = False,
                 only_off_failed: bool = False) -> Partition:
        """Move a partition to other IPUs of its allocation, off the machines that failed it, or off
        all of its own when none did (`vipu.controller.services.relocation`); `automatic` counts
        the move as an automatic reset. With `only_off_failed` (the published API's reset with
        `relocatable`), a partition that no machine failed is reset in place instead."""
        self._partition(partition_id, access)  # first: another tenant's partition is not even found busy
        with self.operations.admitted(), self.holds.hold(partition_id, "relocating"):
            partition = self._partition(partition_id, access)
            self._refuse_if_busy(partition)
            failed = relocation.failed_machines(self, partition)
            if not failed and only_off_failed:
                return self._reset_in_place(partition, automatic)
            if failed:
                why = "; ".join(partition.errors) or f"{', '.join(sorted(failed))} failed"
            else:
                why = f"asked by {access.user_id}" if access.user_id else "asked for"
            return relocation.relocate(self, partition, failed or set(partition.agent_ids), why, automatic, because_failed=bool(failed))

    def remove(self, partition_id: str, force: bool = False, access: Access = OPEN_ACCESS) -> None:
        """Clear a partition from its agents and forget it. A forced remove of a partition under
        another operation waits for that operation to end, so that once it returns no agent holds
        the partition; it also forgets one whose agents cannot be reached."""
        wait = FORCED_REMOVE_WAIT_SECONDS if force else 0.0
        self._partition(partition_id, access)  # first: another tenant's partition is not even found busy
        with self.operations.admitted(), self.holds.hold(partition_id, "removing", wait=wait):
            partition = self._partition(partition_id, access)
            if not access.unrestricted and partition.owner and partition.owner != access.user_id:
                raise PermissionDenied(
                    f"partition {partition_id} belongs to user {partition.owner}; only its owner or an administrator removes it"
                )
            if not force:
                self._refuse_if_busy(partition)
            self._begin_remove(partition)
            self._finish_remove(partition, self._where(partition)[1], force)

    def finish_interrupted(self) -> None:
        """Complete the operations that no operation of this controller owns any more: after a
        restart or a takeover, those a stopped controller left half-done; later, those whose
        last store write failed. Run at start-up and on every health pass."""
        with self.store.reading() as tx:
            stale = [p.id for p in tx.list_partitions() if lifecycle.state_of(p) in lifecycle.BUSY]
        for partition_id in stale:
            try:
                with self.holds.held_if_free(partition_id, FINISHING) as free:
                    if free:  # else its operation is under way
                        self._finish_one(partition_id)
            except VipuError as error:
                log.warning("partition %s: %s", partition_id, error.message)

    def _finish_one(self, partition_id: str) -> None:
        """Finish the interrupted operation of one partition, which the caller holds."""
        with self.store.reading() as tx:
            partition = tx.get_partition(partition_id)
        if partition is None or lifecycle.state_of(partition) not in lifecycle.BUSY:
            return  # its operation ended meanwhile
        self.ledger.record(partition)  # as the store has it: the operation's last write may have failed
        layout, agents = self._where(partition)
        interrupted = partition.operation_state
        if interrupted is OperationState.REMOVING:
            self._finish_remove(partition, agents, force=True)
        else:
            self._configure(partition, layout, agents, on_failure="abandon" if interrupted is OperationState.CREATING else "fail")
        log.info("finished the interrupted %s of partition %s", interrupted.value.lower(), partition.id)

    # Helpers

    def _begin_remove(self, partition: Partition) -> None:
        """Record that the partition is being removed. One that an interrupted create or reset left
        PENDING is failed first, as the life cycle removes only settled partitions."""
        state = lifecycle.state_of(partition)
        if state in (lifecycle.ACTIVE_REMOVING, lifecycle.ERROR_REMOVING):
            return  # a remove interrupted earlier: this one finishes it
        if state in lifecycle.BUSY:
            self._apply(partition, ("fail", {"errors": [f"its {partition.operation_state.value.lower()} was interrupted"]}),
                        ("remove", {}))
        else:
            self._apply(partition, ("remove", {}))

    def _apply(self, partition: Partition, *transitions: tuple[str, dict]) -> None:
        """Apply life-cycle transitions to a partition in one store transaction, then to the ledger.
        A refusal because the store holds another state brings the ledger's entry up to date."""
        def transit(tx: Transaction) -> bool:
            """Whether the partition is gone."""
            target = None
            for name, fields in transitions:
                target = tx.transition(partition, name, **fields)
            return target is lifecycle.ABSENT

        try:
            gone = self.store.write(transit)
        except Conflict:
            with self.store.reading() as tx:
                current = tx.get_partition(partition.id)
            if current is None:
                self.ledger.forget(partition.id)
            else:
                self.ledger.record(current)
            raise
        if gone:
            self.ledger.forget(partition.id)
        else:
            self.ledger.record(partition)

    def mark_lost(self, partition_id: str, reason: str) -> bool:
        """An ACTIVE partition one of whose agents stopped answering or lost its settings goes to
        ERROR with the reason; whether it did (not if it was not ACTIVE, or changed meanwhile)."""
        partition = self.ledger.get(partition_id)
        if partition is None or lifecycle.state_of(partition) != lifecycle.ACTIVE_IDLE:
            return False
        try:
            self._apply(partition, ("lost", {"errors": [reason]}))
        except Conflict as moved:  # an operation took it over since
            log.info("partition %s: not marked lost: %s", partition_id, moved.message)
            return False
        log.warning("partition %s goes to ERROR: %s", partition_id, reason)
        return True

    def _finish_remove(self, partition: Partition, agents: dict[str, Agent], force: bool) -> None:
        with self.hardware.locks.hold(agents):
            failures = self.hardware.clear(agents.values(), partition.id)
        if failures and not force:
            raise self._fail(partition, failures, f"cannot remove partition {partition.id}", "fail",
                             hint="; remove it with --force to forget it anyway")
        for agent_id, error in failures.items():
            log.warning("partition %s forgotten while agent %s still may hold it: %s", partition.id, agent_id, error.message)
        self._apply(partition, ("removed", {}))
        log.info("partition %s removed", partition.id)

    def _configure(self, partition: Partition, layout: ClusterLayout, agents: dict[str, Agent], on_failure: str) -> Partition:
        """Apply the partition's settings to its agents and make it ACTIVE. If any agent fails, what
        was applied is cleared again and the partition takes the transition `on_failure`
        ('abandon': it is forgotten, its IPUs free; 'fail': it stays in ERROR)."""
        settings = agent_settings(partition, layout, {a.id: a.inventory.serial for a in agents.values()})
        with self.hardware.locks.hold(agents):
            failures = self.hardware.apply(agents, settings)
            if failures:
                for agent_id, error in self.hardware.clear(agents.values(), partition.id).items():
                    if agent_id not in failures:
                        log.warning("could not undo partition %s on agent %s: %s", partition.id, agent_id, error.message)
                summary = (f"partition {partition.id} is in ERROR" if on_failure == "fail"
                           else f"partition {partition.id} could not be created and was not kept")
                raise self._fail(partition, failures, summary, on_failure)
            self._apply(partition, ("configured", {"errors": []}))
        log.info("partition %s is ACTIVE on %s", partition.id, ", ".join(partition.agent_ids))
        return partition

    def _fail(self, partition: Partition, failures: dict[str, VipuError], summary: str, transition: str,
              hint: str = "") -> VipuError:
        """Record the agents' reasons by the transition 'fail' (ERROR) or 'abandon' (gone); the error
        to raise, `summary: reasons`."""
        reasons = [f"agent {agent_id}: {error.message}" for agent_id, error in sorted(failures.items())]
        self._apply(partition, (transition, {"errors": reasons if transition == "fail" else None}))
        family = Unavailable if all(e.temporary for e in failures.values()) else HardwareFailure
        log.warning("partition %s: %s", partition.id, "; ".join(reasons))
        return family(f"{summary}: {'; '.join(reasons)}{hint}")

    @staticmethod
    def _refuse_if_busy(partition: Partition) -> None:
        if lifecycle.state_of(partition) in lifecycle.BUSY:
            raise Conflict(f"partition {partition.id} is busy ({partition.operation_state.value.lower()})")

    def configure_new(self, partition: Partition, layout: ClusterLayout, keep_on_error: bool = False) -> Partition:
        """Configure a partition just recorded PENDING/CREATING (a waiting request's, granted), as a
        create does; the caller holds it."""
        with self.store.reading() as tx:
            agents = {a: self._agent(tx, a) for a in partition.agent_ids}
        if partition.relocatable:
            return self._configure_or_move(partition, layout, agents, keep_on_error)
        return self._configure(partition, layout, agents, on_failure="fail" if keep_on_error else "abandon")

    def allocation(self, allocation_id: str, access: Access = OPEN_ACCESS) -> Allocation:
        """An allocation the caller may use; NotFound or PermissionDenied otherwise."""
        with self.store.reading() as tx:
            return self._allocation(tx, allocation_id, access)

    def allocations_for(self, request: PartitionRequest, access: Access = OPEN_ACCESS) -> builtins.list[Allocation]:
        """The allocations a request may take its IPUs from, in order; a Conflict if there are none."""
        with self.store.reading() as tx:
            return self._candidates(tx, request, access)

    @staticmethod
    def _check_request(request: PartitionRequest) -> None:
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

    def _place(self, request: PartitionRequest, access: Access) -> tuple[Partition, ClusterLayout, dict[str, Agent]]:
        """Place the partition in the first allocation it fits, against the ledger's IPUs in use
        (and those held for a request waiting there), under that allocation's lock (no other lock),
        and reserve its IPUs there; then record it in the store, outside the lock, so that its
        commit can join others (`Store.write`)."""
        with self.store.reading() as tx:
            candidates = self._candidates(tx, request, access)
            layouts = {c: ClusterLayout.of(self._cluster(tx, c)) for c in {a.cluster_id for a in candidates}}
        refusals: list[tuple[str, VipuError]] = []
        for allocation in candidates:
            if allocation.cluster_id in self.under_test:
                refusals.append((allocation.id, NoRoom(f"cluster {allocation.cluster_id} is under test; "
                                                       "no partition can be created in it until the test ends")))
                continue
            layout = layouts[allocation.cluster_id]
            with self.ledger.placing(allocation.id):
                try:
                    partition = self._fit(request, access, allocation, layout)
                except (Conflict, InvalidArgument) as refusal:
                    refusals.append((allocation.id, refusal))
                    continue
                self.ledger.reserve(partition)
            try:
                self.store.write(lambda tx: tx.add_partition(partition))  # noqa: B023 - called before the loop goes on
            except BaseException:
                self.ledger.forget(partition.id)
                raise
            with self.store.reading() as tx:
                agents = {a: self._agent(tx, a) for a in partition.agent_ids}
            return partition, layout, agents
        raise self._refusal(request, refusals)

    @staticmethod
    def _refusal(request: PartitionRequest, refusals: builtins.list[tuple[str, VipuError]]) -> VipuError:
        """One error for the refusals of every allocation tried: NoRoom naming the allocations that
        could hold the request once partitions end, if any could; else the rule (or rules) it breaks."""
        room = tuple(allocation for allocation, refusal in refusals if isinstance(refusal, NoRoom))
        if len(refusals) == 1:
            return refusals[0][1]
        messages = list(dict.fromkeys(refusal.message for _, refusal in refusals))
        if len(messages) == 1:
            return refusals[0][1]
        if room:
            return NoRoom(f"no allocation has room for a partition of {request.size} IPUs ({'; '.join(messages)})", room)
        family = type(refusals[0][1]) if all(type(r) is type(refusals[0][1]) for _, r in refusals) else Conflict
        return family(f"no allocation can hold a partition of {request.size} IPUs as asked ({'; '.join(messages)})")

    def _candidates(self, tx: Transaction, request: PartitionRequest, access: Access) -> builtins.list[Allocation]:
        """The allocations the request may take its IPUs from, in order; a Conflict if there are none."""
        if request.allocation_id:
            candidates = [self._allocation(tx, request.allocation_id, access)]
            if request.cluster_id and candidates[0].cluster_id != request.cluster_id:
                raise InvalidArgument(f"allocation {request.allocation_id} is not in cluster {request.cluster_id}")
        elif request.cluster_id:
            if tx.get_cluster(request.cluster_id) is None:
                raise NotFound(f"cluster {shown(request.cluster_id)} does not exist")
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
        return candidates

    def _fit(self, request: PartitionRequest, access: Access, allocation: Allocation, layout: ClusterLayout) -> Partition:
        """The partition placed in the allocation's free IPUs, around those held for the first request
        waiting there; NoRoom saying why it does not fit, or InvalidArgument naming the rule it breaks."""
        held, held_for = self.queue.held(allocation.id)
        placement = place_partition(
            layout,
            set(allocation.agent_ids),
            self.ledger.used_ipus(allocation.id),
            request.size,
            num_gcds=request.num_gcds,
            num_segments=request.num_segments,
            ipulink_routing=request.ipulink_routing,
            gw_routing=request.gw_routing,
            explicit=self.explicit_ipus(layout, allocation, request),
            where=f"allocation {allocation.id}",
            occupancy=Occupancy(lambda: self.ledger.holders(allocation.id), held, held_for),
        )
        return self.partition_of(request, access.user_id, allocation, placement)

    def explicit_ipus(self, layout: ClusterLayout, allocation: Allocation, request: PartitionRequest) -> tuple[tuple[int, int], ...]:
        """The (ILD, topology id) of the IPUs the request names, or of its index's place; empty if neither."""
        return request.explicit_ipus if request.index is None else self._slot(layout, allocation, request)

    @staticmethod
    def partition_of(request: PartitionRequest, owner: str, allocation: Allocation, placement: Placement) -> Partition:
        """The new partition a request makes at a placement in an allocation."""
        if request.index is not None:  # the vendor's rule: an indexed reconfigurable partition is c2-compatible, whatever was asked
            sync = SyncType.GS2_DEFAULT
        else:
            sync = request.sync_type or (SyncType.GS2_DEFAULT if request.reconfigurable else SyncType.POD_NATIVE_DEFAULT)
        return Partition(
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
            owner=owner,
            created=datetime.now(UTC),
            attach_key=new_attach_key(),
            relocatable=request.relocatable,
        )

    @staticmethod
    def _slot(layout: ClusterLayout, allocation: Allocation, request: PartitionRequest) -> tuple[tuple[int, int], ...]:
        """The (ILD, topology id) of the IPUs at the request's index: the index-th run of its size
        of the allocation's IPUs, its machines in order and each machine's IPUs in order."""
        size, index = request.size, request.index or 0
        slots = len(allocation.agent_ids) * IPUS_PER_MACHINE // size
        if index >= slots:  # never there, in the allocation named; another of the caller's may have it
            family = InvalidArgument if request.allocation_id else Conflict
            raise family(f"allocation {allocation.id} has {slots} place(s) for a partition of {size} IPUs "
                         f"(indices 0 to {slots - 1}), not index {index}")
        ipus = [(agent, i) for agent in allocation.agent_ids for i in range(IPUS_PER_MACHINE)][index * size:(index + 1) * size]
        return tuple((layout.locate(agent)[0], layout.topology_id(agent, i)) for agent, i in ipus)

    def _where(self, partition: Partition) -> tuple[ClusterLayout, dict[str, Agent]]:
        """The partition's cluster layout and agents."""
        with self.store.reading() as tx:
            layout = ClusterLayout.of(self._cluster(tx, partition.cluster_id))
            return layout, {a: self._agent(tx, a) for a in partition.agent_ids}

    @staticmethod
    def down_agents(tx: Transaction, agent_ids: Iterable[str]) -> set[str]:
        """Those of the agents the store has down: no partition is placed, moved or held IPUs on them."""
        return {a for a in agent_ids if (agent := tx.get_agent(a)) is not None and agent.status is AgentStatus.DOWN}

    @staticmethod
    def _agent(tx: Transaction, agent_id: str) -> Agent:
        """An agent a partition or allocation names, which the store's foreign keys keep while they exist."""
        agent = tx.get_agent(agent_id)
        if agent is None:
            raise NotFound(f"agent {shown(agent_id)} does not exist")
        return agent

    @staticmethod
    def _cluster(tx: Transaction, cluster_id: str) -> Cluster:
        """The cluster an allocation or partition is in, which the store's foreign keys keep while they exist."""
        cluster = tx.get_cluster(cluster_id)
        if cluster is None:
            raise NotFound(f"cluster {shown(cluster_id)} does not exist")
        return cluster

    @staticmethod
    def _allocation(tx: Transaction, allocation_id: str, access: Access) -> Allocation:
        allocation = tx.get_allocation(allocation_id)
        if allocation is None:
            raise NotFound(f"allocation {shown(allocation_id)} does not exist")
        if not access.may_use(allocation_id):
            raise PermissionDenied(f"allocation {allocation_id} is not given to user {access.user_id}")
        return allocation

    def _partition(self, partition_id: str, access: Access) -> Partition:
        """The ledger's partition, if the caller may see it: another tenant's looks like one that does
        not exist, so that its existence tells nothing."""
        partition = self.ledger.get(partition_id)
        if partition is None or not access.may_use(partition.allocation_id):
            raise NotFound(f"partition {shown(partition_id)} does not exist")
        return partition
