"""Partitions: create, inspect, change, reset, move and remove, as users and the integrations ask.

Reads come from the snapshots the allocations' owners publish (`vipu.controller.core.snapshot`),
without a lock and without the store: what they show is committed. Changes are commands to the
owner of the partition's allocation, which decides them one at a time (`vipu.controller.core`);
a create is offered to each allocation it may go in, in order, until one places it. A create
claims its partition id first, so that no two allocations make the same id.
"""

from __future__ import annotations

import builtins
import dataclasses
import time
from dataclasses import dataclass

from vipu.controller.core.commands import (
    START_SECONDS,
    Command,
    CreatePartition,
    RelocatePartition,
    RemovePartition,
    ResetPartition,
    UpdatePartition,
)
from vipu.controller.core.owners import CLAIMED, Owners
from vipu.controller.core.placing import check_request
from vipu.controller.core.snapshot import AllocationSnapshot, Waiting
from vipu.controller.usecases.reservations import ReservationService
from vipu.model import lifecycle
from vipu.model.configuration import IPUOF_SERVER_VERSION_KEY, GcdConfig, gcd_configs
from vipu.model.entities import IPUS_PER_MACHINE, OPEN_ACCESS, Access, Allocation, Partition, PartitionRequest, ReadyState, shown
from vipu.model.errors import AlreadyExists, Conflict, InvalidArgument, NoRoom, NotFound, PermissionDenied, VipuError
from vipu.model.placement import count_fitting, is_power_of_two, largest_fitting, shifted
from vipu.model.topology import agent_ilds
from vipu.store.configuration import Configuration
from vipu.store.store import Store

# How long a forced remove waits for the operation under way on its partition: that operation's
# agent calls are each bounded by the agent timeout.
FORCED_REMOVE_WAIT_SECONDS = 60.0


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
    draining_ipus: int = 0  # of the free IPUs, those on machines being drained (and not down)
    reserved_ipus: int = 0  # of the free IPUs, those of reservations for others under way (on machines up, not drained)
    held_ipus: int = 0  # of the free IPUs, those held for the first waiting request, `held_for`
    held_for: str = ""

    @property
    def free_ipus(self) -> int:
        return self.total_ipus - self.used_ipus


Created = tuple[Partition, list[GcdConfig], str]


class PartitionService:
    def __init__(self, store: Store, owners: Owners):
        self.store = store
        self.owners = owners
        self.reservations = ReservationService(store, owners)

    # Reading

    def list(self, allocation_id: str = "", access: Access = OPEN_ACCESS) -> builtins.list[Partition]:
        """The partitions (of one allocation) the caller may see, in id order."""
        if allocation_id:
            self.allocation(allocation_id, access)
            owner = self.owners.owner(allocation_id)
            snapshots = [owner.snapshot] if owner is not None else []
        else:
            snapshots = [s for s in self.owners.snapshots() if access.may_use(s.id)]
        return sorted((_with_notices(s, p) for s in snapshots for p in s.partitions.values()), key=lambda p: p.id)

    def get(self, partition_id: str, access: Access = OPEN_ACCESS) -> Partition:
        """The partition, if the caller may see it (a copy: snapshots are shared), with what the
        link ledger says of the links it runs over. Another tenant's looks like one that does not
        exist, so that its existence tells nothing."""
        snapshot, partition = self._partition(partition_id, access)
        partition = lifecycle.copy(partition)
        partition.link_warnings = snapshot.link_warnings(partition)
        partition.drain_notices = snapshot.drain_notices(partition)
        return partition

    def _partition(self, partition_id: str, access: Access) -> tuple[AllocationSnapshot, Partition]:
        owner = self.owners.holding(partition_id)
        snapshot = owner.snapshot if owner is not None else None
        partition = snapshot.partitions.get(partition_id) if snapshot is not None else None
        if snapshot is None or partition is None or not access.may_use(snapshot.id):
            raise NotFound(f"partition {shown(partition_id)} does not exist")
        return snapshot, partition

    def ipuof_config(self, partition_id: str, gcd: int | None = None,
                     access: Access = OPEN_ACCESS) -> tuple[Partition, builtins.list[GcdConfig], str]:
        """The partition, the IPUoF configuration of one GCD or all, and the IPUoF server version."""
        _, partition = self._partition(partition_id, access)
        if partition.ready_state is not ReadyState.ACTIVE:
            raise Conflict(f"partition {partition_id} is {partition.ready_state.value}, so it has no usable IPUoF configuration")
        partition, gcds, version = self.with_ipuof(partition)
        if gcd is not None:
            if not 0 <= gcd < partition.num_gcds:
                raise InvalidArgument(f"partition {partition_id} has GCDs 0 to {partition.num_gcds - 1}, not {gcd}")
            gcds = [gcds[gcd]]
        return partition, gcds, version

    def with_ipuof(self, partition: Partition) -> Created:
        """A partition with its IPUoF configuration of every GCD, and the IPUoF server version."""
        agents = self.store.configuration().agents
        inventories = {a: agents[a].inventory for a in partition.agent_ids}
        return partition, gcd_configs(partition, inventories), _ipuof_version(inventories.values())

    def ipuof_versions(self, partitions: builtins.list[Partition]) -> dict[str, str]:
        """The IPUoF server version serving each partition, by partition id."""
        agents = self.store.configuration().agents
        return {p.id: _ipuof_version(agents[a].inventory for a in p.agent_ids[:1] if a in agents) for p in partitions}

    def allocations(self, access: Access = OPEN_ACCESS) -> builtins.list[Allocation]:
        return [dataclasses.replace(a) for a in self.store.configuration().allocations.values() if access.may_use(a.id)]

    def agent_ilds(self) -> dict[str, int]:
        """The IPU-Link domain of each agent of a cluster, in its cluster."""
        return agent_ilds(self.store.configuration().clusters.values())

    def capacity(self, size: int = 0, allocation_id: str = "", cluster_id: str = "",
                 access: Access = OPEN_ACCESS) -> builtins.list[AllocationRoom]:
        """The room in each allocation the caller may use (or the one named, or a cluster's): its
        IPUs in use and free, how many partitions of `size` fit side by side, the largest that fits
        (off machines down, drained or under test, and off the free IPUs of reservations under way that are
        for others: only their users have them)."""
        if size and not is_power_of_two(size):
            raise InvalidArgument(f"partition size must be a power of two, not {size}")
        configuration = self.store.configuration()
        if allocation_id:
            chosen = [self._allocation(configuration, allocation_id, access).id]
        else:
            if cluster_id and cluster_id not in configuration.clusters:
                raise NotFound(f"cluster {shown(cluster_id)} does not exist")
            chosen = [a.id for a in configuration.allocations.values()
                      if access.may_use(a.id) and (not cluster_id or a.cluster_id == cluster_id)]
        rooms, now = [], time.time()
        for owner in filter(None, (self.owners.owner(a) for a in chosen)):
            s = owner.snapshot
            allowed = set(s.allocation.agent_ids) - s.down - s.draining.keys() - s.claimed.keys()  # nothing is placed on a machine
            # down, draining, or under test alone
            used = {agent: set(indices) for agent, indices in s.used.items() if agent in s.allocation.agent_ids}
            reserved = {(agent, index) for r in s.reservations.values()
                        if r.under_way(now) and not r.maintenance and not r.admits(access.user_id, access.unrestricted)
                        for agent, index in r.ipus if agent in allowed and index not in used.get(agent, ())}
            open_to_all = shifted(used, on=reserved)  # what fits for the caller: a reservation's free IPUs are its users'
            blocked = f"{s.test} is under test" if s.test else ""
            held = s.queue.held
            rooms.append(AllocationRoom(
                s.id, s.allocation.cluster_id, s.total_ipus, sum(len(ipus) for ipus in used.values()),
                fitting=0 if blocked or not size else count_fitting(s.layout, allowed, open_to_all, size),
                largest=0 if blocked else largest_fitting(s.layout, allowed, open_to_all), blocked=blocked,
                down_ipus=sum(IPUS_PER_MACHINE - len(used.get(agent, ())) for agent in s.down),
                draining_ipus=sum(IPUS_PER_MACHINE - len(used.get(agent, ())) for agent in s.draining.keys() - s.down),
                reserved_ipus=len(reserved), held_ipus=sum(1 for agent, index in held if index not in used.get(agent, ())),
                held_for=(s.queue.held_for or (s.queue.first.partition_id if s.queue.first is not None else "")) if held else ""))
        return rooms

    def ipu_attributes(self, agent_ids: builtins.list[str], access: Access = OPEN_ACCESS) -> builtins.list[IpuAttributes]:
        configuration = self.store.configuration()
        if access.unrestricted:
            visible = set(configuration.agents)
        else:
            visible = {a for alloc in configuration.allocations.values() if access.may_use(alloc.id) for a in alloc.agent_ids}
        unknown = [a for a in agent_ids if a not in visible]
        if unknown:
            raise NotFound(f"agent {shown(unknown[0])} does not exist")
        chosen = agent_ids or sorted(visible)
        return [IpuAttributes(a, {i.index: dict(i.attributes) for i in configuration.agents[a].inventory.ipus}) for a in chosen]

    # Changing

    def create(self, request: PartitionRequest, access: Access = OPEN_ACCESS, keep_on_error: bool = False) -> Partition:
        """Place and configure a partition. One that fails at an agent leaves nothing behind, unless
        `keep_on_error` keeps it in ERROR, holding its IPUs, for inspection."""
        return self.create_with_ipuof(request, access, keep_on_error)[0]

    def create_with_ipuof(self, request: PartitionRequest, access: Access = OPEN_ACCESS, keep_on_error: bool = False) -> Created:
        """`create`, and the new partition's IPUoF configuration of every GCD with the IPUoF server
        version (as `ipuof_config` gives them)."""
        created = self.create_or_queue(request, access, keep_on_error)
        assert not isinstance(created, Waiting)
        return created

    def create_or_queue(self, request: PartitionRequest, access: Access = OPEN_ACCESS, keep_on_error: bool = False,
                        wait_seconds: float = 0.0, choose: object = None, detached: bool = False) -> Created | Waiting:
        """Create the partition in the first allocation it fits; else, given `wait_seconds`, queue
        the request in the allocation `choose(allocation ids)` picks of those it could fit in (with no
        lease if `detached`: see `vipu.controller.core.queueing`)."""
        check_request(request)
        holder = self.owners.claim_id(request.id)
        if holder is not None:
            raise self._taken(request.id, holder, access)
        try:
            candidates = self.allocations_for(request, access)
            refusals: builtins.list[tuple[str, VipuError]] = []
            for allocation in candidates:
                created = self._offer(allocation.id, request, access, keep_on_error, 0.0, refusals, detached)
                if created is not None:
                    return created
            refusal = _refusal(request, refusals)
            if not wait_seconds or not isinstance(refusal, NoRoom):
                raise refusal
            fitting = refusal.allocations or tuple(a.id for a in candidates)
            open_ones = tuple(a for a in fitting if (o := self.owners.owner(a)) is not None and not o.snapshot.closing)
            if not open_ones:
                raise Conflict(f"allocation {fitting[0]} is being removed: no request waits in it")
            chosen = choose(open_ones) if callable(choose) else open_ones[0]
            queued = self._offer(chosen, request, access, keep_on_error, wait_seconds, refusals, detached)
            if queued is None:
                raise refusals[-1][1]
            return queued
        finally:
            self.owners.release_claim(request.id)

    def _offer(self, allocation_id: str, request: PartitionRequest, access: Access, keep_on_error: bool, wait_seconds: float,
               refusals: builtins.list[tuple[str, VipuError]], detached: bool = False) -> Created | Waiting | None:
        """Ask one allocation's owner to create the partition (or queue it, with `wait_seconds`); None,
        with its refusal added to `refusals`, if it places it nowhere."""
        owner = self.owners.owner(allocation_id)
        if owner is None:
            refusals.append((allocation_id, NotFound(f"allocation {shown(allocation_id)} does not exist")))
            return None
        command = CreatePartition(request=request, access=access, keep_on_error=keep_on_error, wait_seconds=wait_seconds,
                                  may_queue=bool(wait_seconds), detached=detached)
        self.owners.offering(request.id, allocation_id)
        try:
            created = self._ask(owner, command, f"the create of partition {request.id}")
        except (Conflict, InvalidArgument) as refusal:
            if command.placed:
                raise
            refusals.append((allocation_id, refusal))
            return None
        if isinstance(created, Waiting):
            return created
        return self.with_ipuof(lifecycle.copy(created))  # the owner's is shared with its snapshots

    def _taken(self, partition_id: str, holder: str, access: Access) -> VipuError:
        """AlreadyExists for an id in use: a partition's, or a waiting request's (naming where only
        to a caller who may use that allocation)."""
        owner = self.owners.owner(holder) if not holder.startswith(CLAIMED) else None
        if owner is not None and owner.snapshot.queue.get(partition_id) is not None:
            where = f" in allocation {holder}" if access.may_use(holder) else ""
            return AlreadyExists(f"partition {partition_id} already waits for room{where}")
        return AlreadyExists(f"partition {partition_id} already exists")

    def reset(self, partition_id: str, access: Access = OPEN_ACCESS, automatic: bool = False) -> Partition:
        """Clear and configure the partition again; `automatic` counts it as an automatic reset. A
        relocatable one its user resets may go where it leaves a larger shape free (`operations.reset`)."""
        snapshot, _ = self._partition(partition_id, access)
        return lifecycle.copy(self._ask_owner(snapshot.id, ResetPartition(partition_id=partition_id, access=access, automatic=automatic),
                                              f"the reset of partition {partition_id}"))

    def relocate(self, partition_id: str, access: Access = OPEN_ACCESS, automatic: bool = False,
                 only_off_failed: bool = False) -> Partition:
        """Move a partition to other IPUs of its allocation, off the machines that failed it, or off
        all of its own when none did (`vipu.controller.core.operations.relocate`); `automatic` counts the
        move as an automatic reset. With `only_off_failed` (the published API's reset with
        `relocatable`), a partition that no machine failed is reset instead (`operations.reset`)."""
        snapshot, _ = self._partition(partition_id, access)
        command = RelocatePartition(partition_id=partition_id, access=access, automatic=automatic, only_off_failed=only_off_failed)
        return lifecycle.copy(self._ask_owner(snapshot.id, command, f"the move of partition {partition_id}"))

    def update(self, partition_id: str, may_move: bool | None = None, access: Access = OPEN_ACCESS) -> Partition:
        """Change what its user may change of a partition: its consent to be moved while IPUoF clients
        are attached. Only its owner or an administrator may; InvalidArgument when nothing is asked.
        Returns the partition as committed."""
        if may_move is None:
            raise InvalidArgument(f"nothing to change of partition {shown(partition_id)} was asked: give may_move")
        snapshot, _ = self._partition(partition_id, access)
        command = UpdatePartition(partition_id=partition_id, may_move=may_move, access=access)
        return lifecycle.copy(self._ask_owner(snapshot.id, command, f"the update of partition {partition_id}"))

    def remove(self, partition_id: str, force: bool = False, access: Access = OPEN_ACCESS) -> builtins.list[str]:
        """Clear a partition from its agents and forget it. A forced remove of a partition under
        another operation waits for that operation to end (up to a minute), so that once it returns
        no agent holds the partition; it also forgets one whose agents cannot be reached, and returns
        those agents (their IPUs stay out of use until the health pass sees them cleared). A remove
        sent while the partition's create is still on its way goes to the same owner, behind it:
        the create is under way there by then (a job's end that races its start leaves nothing)."""
        owner = self.owners.holding(partition_id, in_flight=True)
        if owner is None or not access.may_use(owner.id):
            raise NotFound(f"partition {shown(partition_id)} does not exist")
        busy = f"partition {partition_id} is still busy ({owner.snapshot.busy.get(partition_id, 'under way')}) after " \
               f"{FORCED_REMOVE_WAIT_SECONDS:g} s; try again"
        uncleared = self._ask(owner, RemovePartition(partition_id=partition_id, access=access, force=force),
                              f"the removal of partition {partition_id}", FORCED_REMOVE_WAIT_SECONDS if force else START_SECONDS, busy)
        return list(uncleared or [])

    # Helpers

    def _ask_owner(self, allocation_id: str, command: Command, what: str, start_seconds: float = START_SECONDS,
                   not_started: str = ""):
        owner = self.owners.owner(allocation_id)
        if owner is None:
            raise NotFound(f"allocation {shown(allocation_id)} does not exist")
        return self._ask(owner, command, what, start_seconds, not_started)

    @staticmethod
    def _ask(owner, command: Command, what: str, start_seconds: float = START_SECONDS, not_started: str = ""):
        owner.submit(command)
        return command.reply.wait(start_seconds, what, not_started=not_started)

    def allocation(self, allocation_id: str, access: Access = OPEN_ACCESS) -> Allocation:
        """An allocation the caller may use; NotFound or PermissionDenied otherwise."""
        return dataclasses.replace(self._allocation(self.store.configuration(), allocation_id, access))

    @staticmethod
    def _allocation(configuration: Configuration, allocation_id: str, access: Access) -> Allocation:
        allocation = configuration.allocations.get(allocation_id)
        if allocation is None:
            raise NotFound(f"allocation {shown(allocation_id)} does not exist")
        if not access.may_use(allocation_id):
            raise PermissionDenied(f"allocation {allocation_id} is not given to user {access.user_id}")
        return allocation

    def allocations_for(self, request: PartitionRequest, access: Access = OPEN_ACCESS) -> builtins.list[Allocation]:
        """The allocations a request may take its IPUs from, in order; a Conflict if there are none."""
        configuration = self.store.configuration()
        if request.reservation:
            candidates = [self._allocation(configuration, self._reservation_allocation(request), access)]
        elif request.allocation_id:
            candidates = [self._allocation(configuration, request.allocation_id, access)]
            if request.cluster_id and candidates[0].cluster_id != request.cluster_id:
                raise InvalidArgument(f"allocation {request.allocation_id} is not in cluster {request.cluster_id}")
        elif request.cluster_id:
            if request.cluster_id not in configuration.clusters:
                raise NotFound(f"cluster {shown(request.cluster_id)} does not exist")
            candidates = [a for a in configuration.allocations.values() if a.cluster_id == request.cluster_id and access.may_use(a.id)]
        else:
            candidates = [a for a in configuration.allocations.values() if access.may_use(a.id)]
        if not candidates:
            where = f"cluster {request.cluster_id}" if request.cluster_id else "this controller"
            if not access.unrestricted:
                raise Conflict(f"no allocation in {where} is given to user {access.user_id}; an administrator gives one with "
                               "'vipu-admin update user --give'")
            raise Conflict(f"there is no allocation to create partitions in, in {where}; an administrator creates one with "
                           "'vipu-admin create allocation'")
        return candidates

    def _reservation_allocation(self, request: PartitionRequest) -> str:
        """The allocation of the reservation a request names (which its owner checks the request
        against); NotFound if no allocation has it."""
        reservation = self.reservations.find(request.reservation)
        if reservation is None:
            raise NotFound(f"reservation {shown(request.reservation)} does not exist")
        if request.allocation_id and request.allocation_id != reservation.allocation_id:
            raise InvalidArgument(f"reservation {reservation.name} is in allocation {reservation.allocation_id}, not "
                                  f"{request.allocation_id}")
        return reservation.allocation_id


def _ipuof_version(inventories) -> str:
    return next((inv.versions.get(IPUOF_SERVER_VERSION_KEY, "") for inv in inventories), "")


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


def _with_notices(snapshot: AllocationSnapshot, partition: Partition) -> Partition:
    """The partition as a listing shows it: a copy with its link warnings and drain notices when
    the allocation has unhealthy links or machines being drained, else the snapshot's own (shared,
    unchanged)."""
    if not snapshot.links and not snapshot.draining:
        return partition
    told = lifecycle.copy(partition)
    told.link_warnings = snapshot.link_warnings(partition)
    told.drain_notices = snapshot.drain_notices(partition)
    return told
