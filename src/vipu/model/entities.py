"""The entities vipu manages: agents, clusters, allocations and partitions.

Plain data, no I/O. The store persists them, the services change them, the API edge converts
them to and from protobuf messages.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum

from vipu.model.errors import InvalidArgument
from vipu.model.hardware import NO_CAPABILITIES_SAID, Cable, Capability, Component, MachineCondition
from vipu.model.times import expected_end, utc_text

IPUS_PER_MACHINE = 4

# Every id (partition, agent, cluster, allocation, user): 1 to 63 of these, the first a letter or
# digit, matched whole (a trailing line break is not part of an id).
ID_MAX_LENGTH = 63
_ID_PATTERN = re.compile(rf"[A-Za-z0-9][A-Za-z0-9._:-]{{0,{ID_MAX_LENGTH - 1}}}")
QUOTED_MAX = 40


def quoted(value: str) -> str:
    """`value` quoted for a message, shortened when long: errors must stay one short line."""
    if len(value) <= QUOTED_MAX:
        return repr(value)
    return f"{value[:QUOTED_MAX]!r}... ({len(value)} characters)"


def shown(value: str) -> str:
    """An id as a message names it: as it is when it is of the grammar (so at most ID_MAX_LENGTH
    plain characters), else quoted and shortened, as nothing of that id can exist."""
    return value if _ID_PATTERN.fullmatch(value) else quoted(value)


def check_id(kind: str, value: str) -> str:
    """Return `value` if it is a usable id for an entity of `kind`, else raise InvalidArgument."""
    if not _ID_PATTERN.fullmatch(value or ""):
        raise InvalidArgument(
            f"invalid {kind} id {quoted(value or '')}: use 1 to {ID_MAX_LENGTH} letters, digits, '.', '_', ':' or '-', "
            "starting with a letter or digit"
        )
    return value


_GCD_FILE_SUFFIX = re.compile(r"_gcd[0-9]+\Z")


def check_partition_id(value: str) -> str:
    """An id, and not one ending in `_gcd` and a number: partition P's GCD files are named
    P_gcdN_ipuof.conf, so a partition with such an id would take another's file (or lose its own)."""
    check_id("partition", value)
    suffix = _GCD_FILE_SUFFIX.search(value)
    if suffix is not None:
        owner = value[: suffix.start()]
        raise InvalidArgument(f"invalid partition id {quoted(value)}: it may not end in _gcd and a number, which names "
                              f"the IPUoF file of a GCD of partition {quoted(owner)}")
    return value


def natural_key(value: str) -> tuple[int | str, ...]:
    """Sorts ag2 before ag10, as people count."""
    return tuple(int(part) if part.isdigit() else part for part in re.split(r"(\d+)", value))


class AgentStatus(str, Enum):
    UP = "Up"
    DOWN = "Down"


class IldTopology(str, Enum):
    """How the IPU-Machines of one IPU-Link domain are cabled."""

    MESH = "mesh"
    TORUS = "torus"


class GwTopology(str, Enum):
    """How IPU-Link domains are joined by GW-Links."""

    LOOPED = "looped"


class ReadyState(str, Enum):
    PENDING = "PENDING"
    ACTIVE = "ACTIVE"
    REMOVED = "REMOVED"
    ERROR = "ERROR"


class OperationState(str, Enum):
    IDLE = "IDLE"
    CREATING = "CREATING"
    REMOVING = "REMOVING"
    RESETTING = "RESETTING"
    FAILED = "FAILED"


class IpuLinkRouting(str, Enum):
    DNC = "DNC"
    SWNC = "SWNC"
    BTNC = "BTNC"
    RINGSWNC = "RINGSWNC"


class GwRouting(str, Enum):
    DEFAULT = "DEFAULT"  # a single IPU-Link segment: no GW routing
    RING = "RING"
    SWRING = "SWRING"


class SyncType(str, Enum):
    GS2_DEFAULT = "GS2_DEFAULT"  # "c2-compatible"
    GS2_INDEPENDENT_RAILS = "GS2_INDEPENDENT_RAILS"
    POD_NATIVE_DEFAULT = "POD_NATIVE_DEFAULT"
    POD_NATIVE_REPLICATED_PIPELINE = "POD_NATIVE_REPLICATED_PIPELINE"


class Role(str, Enum):
    ADMIN = "admin"
    USER = "user"


@dataclass
class User:
    id: str
    role: Role = Role.USER
    allocation_ids: tuple[str, ...] = ()


@dataclass(frozen=True)
class Access:
    """Who is asking, and which allocations they may use.

    `allocations` None means every allocation: an administrator, or anyone in open mode (whose
    `user_id` is empty).
    """

    user_id: str = ""
    allocations: frozenset[str] | None = None

    @property
    def unrestricted(self) -> bool:
        return self.allocations is None

    def may_use(self, allocation_id: str) -> bool:
        return self.allocations is None or allocation_id in self.allocations


OPEN_ACCESS = Access()


@dataclass
class IpuInfo:
    index: int
    chip_id: str
    attributes: dict[str, str] = field(default_factory=dict)


@dataclass
class MachineInventory:
    """What an agent reports about its IPU-Machine."""

    serial: str
    platform: str = ""
    manufacturer: str = ""
    board_part_number: str = ""
    versions: dict[str, str] = field(default_factory=dict)
    backend: str = ""
    backend_version: str = ""
    ipuof_host: str = ""
    ipuof_port: int = 0
    rdma_port: int = 0
    ipus: list[IpuInfo] = field(default_factory=list)
    exporter_port: int = 0
    ipu_arch_id: int = 0
    capabilities: tuple[str, ...] = NO_CAPABILITIES_SAID  # the `Capability` values its agent offers
    cables: tuple[Cable, ...] = ()  # each chassis port's cable, as the machine's BMC names it
    components: tuple[Component, ...] = ()  # the BMC's inventory: system, chassis, managers, firmware
    condition: MachineCondition = field(default_factory=MachineCondition)  # power and health at the last look

    def has(self, capability: Capability) -> bool:
        return capability.value in self.capabilities


REASON_MAX = 200  # an operator's reason (a drain's, a reservation's), as refusals and listings show it


def checked_reason(reason: str, what: str) -> str:
    """An operator's reason for `what` ("a drain", "a reservation") as people will read it,
    stripped; InvalidArgument if it cannot be."""
    reason = reason.strip()
    if not reason:
        raise InvalidArgument(f"{what} needs a reason (--reason), which operators and the users it keeps off are shown")
    if len(reason) > REASON_MAX or not reason.isprintable():
        raise InvalidArgument(f"{what}'s reason is one line of at most {REASON_MAX} printable characters")
    return reason


def operator_name(by: str) -> str:
    """Who did what an operator does (drained a machine, made a reservation), as people read it:
    "an administrator" in open mode, which knows no user."""
    return by or "an administrator"


@dataclass(frozen=True)
class Drain:
    """An operator's word that a machine is to be emptied (for a repair, say): no partition is
    placed on it, relocatable ones move off while idle, the others are left to finish. It stands
    until the operator resumes the machine, across restarts and changes of leader."""

    reason: str
    by: str  # the operator who drained it
    since: float  # seconds since the epoch
    deadline: float = 0.0  # when partitions still there are removed (seconds since the epoch); 0: they are left to finish

    @property
    def operator(self) -> str:
        return operator_name(self.by)

    def describe(self) -> str:
        """How a refusal or a partition's status says it: `draining for cable repair (by admin since 2026-12-06 05:30:00 UTC)`."""
        return f"draining for {self.reason} (by {self.operator} since {utc_text(self.since)})"

    def listing(self, left: Sequence[str]) -> str:
        """How a listing of machines says it, given the partitions `left` on the machine:
        `DRAINING (p1 left): cable repair, by admin since ...`, and `DRAINED: ...` once none is."""
        state = f"{drain_state(left)} ({', '.join(left)} left)" if left else drain_state(left)
        removed = f"; what is left is removed at {utc_text(self.deadline)}" if self.deadline and left else ""
        return f"{state}: {self.reason}, by {self.operator} since {utc_text(self.since)}{removed}"

    def fate(self, relocatable: bool) -> str:
        """What becomes of a partition still on the machine, as its user is told."""
        removed = f"it is removed at {utc_text(self.deadline)}" if self.deadline else ""
        if relocatable:
            return "it moves elsewhere once no client is attached" + (f", or {removed}" if removed else "")
        return removed or "it is left to finish there"


def drain_state(left: Sequence[str]) -> str:
    """A drained machine's state, by the partitions `left` on it: DRAINING while any is, then DRAINED."""
    return "DRAINING" if left else "DRAINED"


@dataclass
class Agent:
    id: str
    host: str
    port: int
    inventory: MachineInventory
    status: AgentStatus = AgentStatus.UP
    discovery_mode: str = "Manual"
    last_error: str = ""
    drain: Drain | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def answering(self) -> bool:
        """Whether its machine's fabric answered at the last look: Up, or Down only for a capability
        of its machine that fails (its BMC), which leaves its partitions, links and placement as
        they were."""
        problems = self.inventory.condition.problems
        return self.status is AgentStatus.UP or (bool(problems) and self.last_error == "; ".join(problems))


@dataclass
class Cluster:
    id: str
    agent_ids: tuple[str, ...]
    topology: IldTopology = IldTopology.MESH
    num_ilds: int = 1
    gw_topology: GwTopology | None = None


@dataclass
class Allocation:
    id: str
    cluster_id: str
    agent_ids: tuple[str, ...]


@dataclass(frozen=True)
class PlacedIpu:
    """One IPU of a partition: where it is in the cluster and what it is in the partition."""

    agent_id: str
    index: int  # on its machine
    ild: int  # IPU-Link domain in the cluster
    topology_id: int  # IPU within its IPU-Link domain
    segment: int  # IPU-Link segment in the partition
    routing_id: int  # IPU within the partition
    gcd: int


@dataclass
class PartitionRequest:
    """What a caller asks for; None means "the controller chooses"."""

    id: str
    size: int
    allocation_id: str = ""
    cluster_id: str = ""
    num_gcds: int = 1
    num_replicas: int = 0
    reconfigurable: bool = False
    sync_type: SyncType | None = None
    ipulink_routing: IpuLinkRouting | None = None
    gw_routing: GwRouting | None = None
    num_segments: int = 0
    explicit_ipus: tuple[tuple[int, int], ...] = ()  # (ild, topology_id) pairs
    index: int | None = None  # a reconfigurable partition's place: the index-th run of `size` IPUs of its allocation
    disable_auto_reset: bool = False
    relocatable: bool = False
    may_move: bool = False  # its owner consents to planned moves while IPUoF clients are attached
    expected_seconds: int = 0  # how long it is expected to run from its start; 0: unknown
    reservation: str = ""  # the reservation it is to be made in (`vipu.model.reservations`), if any
    account: str = ""  # the account it is made on (`vipu.model.accounts`); "": none, or its user's only one
    preemptible: bool = False  # its user lets it be reclaimed when it runs on quota borrowed from another account
    labels: dict[str, str] = field(default_factory=dict)  # the workload it is for, as its front-end says (WORKLOAD_LABELS)


MAX_AUTO_RESETS = 3  # automatic resets of an ERROR partition before it is left to its user


def new_attach_key() -> str:
    """A partition's IPUoF attach key: 128 random bits."""
    return secrets.token_urlsafe(16)


# What a front-end may say of the workload a partition runs, for the telemetry that attributes its
# IPUs (`Partition.labels`): the IPUJob and its namespace (Kubernetes), the job (Slurm).
WORKLOAD_LABELS = ("ipujob", "namespace", "slurm_job")
MAX_LABEL_VALUE = 253  # a Kubernetes object's name is at most this long


def checked_labels(labels: Mapping[str, str]) -> dict[str, str]:
    """A partition's workload labels, or InvalidArgument in one line."""
    for key, value in labels.items():
        if key not in WORKLOAD_LABELS:
            raise InvalidArgument(f"unknown partition label {key!r:.40}: {', '.join(WORKLOAD_LABELS)}")
        if not value or len(value) > MAX_LABEL_VALUE or not value.isprintable():
            raise InvalidArgument(f"partition label {key} must be 1 to {MAX_LABEL_VALUE} printable characters")
    return dict(labels)


@dataclass
class Partition:
    id: str
    cluster_id: str
    allocation_id: str
    size: int
    num_gcds: int
    num_replicas: int
    reconfigurable: bool
    sync_type: SyncType
    ipulink_routing: IpuLinkRouting
    gw_routing: GwRouting
    num_segments: int
    ipus: list[PlacedIpu]
    ready_state: ReadyState = ReadyState.PENDING
    operation_state: OperationState = OperationState.CREATING
    errors: list[str] = field(default_factory=list)
    disable_auto_reset: bool = False
    auto_reset_count: int = 0
    last_auto_reset: datetime | None = None  # when the controller last reset it on its own, UTC
    owner: str = ""  # the user who created it; empty in open mode
    created: datetime | None = None  # when, UTC
    # What an IPUoF client must present to attach to its IPUs: in its IPUoF configuration, new for
    # every partition made, so a file kept from a removed partition opens no later one of its name.
    attach_key: str = field(default="", repr=False)
    relocatable: bool = False  # may move to other IPUs of its allocation when its machines fail
    relocation: str = ""  # where it last moved, when and why; empty if it never moved
    # The machines it was moved off because they failed it: later moves keep off them while other
    # room is left, so that it does not go back and forth between two faulty machines.
    failed_on: tuple[str, ...] = ()
    placement_note: str = ""  # the unhealthy links it was placed away from, or the suspect ones it took for want of room
    # What the link ledger says now of the unhealthy links it runs over, a line each: read from its
    # allocation's snapshot for the reader, never stored.
    link_warnings: tuple[str, ...] = ()
    drain_notices: tuple[str, ...] = ()  # the same of the machines it runs on that an operator drains, and of a reclaim
    # Its owner's consent that planned compaction moves it even while IPUoF clients are attached (a
    # relocatable partition with none attached may be moved without it); changed by its user later.
    may_move: bool = False
    expected_seconds: int = 0  # how long it is expected to run from its start (`created`); 0: unknown
    reservation: str = ""  # the reservation for people it was made in (`--reservation`); "": none
    account: str = ""  # the account it was made on (`vipu.model.accounts`); "": none
    preemptible: bool = False  # may be reclaimed while its account borrows quota (`vipu.model.accounts.reclaim`)
    labels: dict[str, str] = field(default_factory=dict)  # the workload it runs, as its front-end says (WORKLOAD_LABELS)
    # When a reclaim removes it (seconds since the epoch; 0: none is under way), and why: its user's notice.
    reclaim_at: float = 0.0
    reclaim_notice: str = ""
    # When the controller power cycled its machines because an automatic reset did not bring it back,
    # UTC: it does so once in a partition's life, then leaves it to its user.
    power_cycled: datetime | None = None
    # When compaction last moved it (or a reset re-placed it to free a larger shape), UTC: what its
    # allocation's compaction budget counts, kept so that a restart or a new leader counts it too.
    compacted: datetime | None = None

    @property
    def expected_end(self) -> datetime | None:
        """When it is expected to end, UTC; None when its duration or its start is unknown."""
        return expected_end(self.created, self.expected_seconds)

    @property
    def agent_ids(self) -> list[str]:
        """The agents holding the partition's IPUs, in routing order, each once."""
        return list(dict.fromkeys(ipu.agent_id for ipu in sorted(self.ipus, key=lambda i: i.routing_id)))

    def ipus_on(self, agent_id: str) -> list[PlacedIpu]:
        return [ipu for ipu in self.ipus if ipu.agent_id == agent_id]
