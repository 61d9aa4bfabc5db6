"""The store: every entity of the controller, in SQLite (default) or PostgreSQL.

Services open one transaction per use case (`with store.transaction() as tx:`), read and change
entities through it, and everything commits together or not at all. Rows never leave this
module: the transaction speaks in `vipu.model` entities.

On SQLite, write transactions start with BEGIN IMMEDIATE, so a read-check-write sequence (is
this IPU free? take it) cannot interleave with another writer; reads use a separate engine and
never block writers (WAL). On PostgreSQL the unique constraints in `schema` catch a lost race,
which surfaces as `Conflict` for the service to retry.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import sqlite3
import threading
import time
import typing
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import lru_cache
from pathlib import Path

from sqlalchemy import (
    Integer,
    String,
    Table,
    and_,
    bindparam,
    cast,
    create_engine,
    delete,
    event,
    insert,
    select,
    text,
    update,
)
from sqlalchemy.engine import Connection, Engine, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, IntegrityError, OperationalError
from sqlalchemy.orm import Session, sessionmaker

from vipu.model import lifecycle, queue
from vipu.model.clustertests import CableVerdict, CableVerdicts, Outcome, RunState, Status, TestRun, TestType
from vipu.model.entities import (
    Agent,
    AgentStatus,
    Allocation,
    Cluster,
    GwRouting,
    GwTopology,
    IldTopology,
    IpuInfo,
    IpuLinkRouting,
    MachineInventory,
    OperationState,
    Partition,
    PartitionRequest,
    PlacedIpu,
    ReadyState,
    Role,
    SyncType,
    User,
)
from vipu.model.errors import (
    AlreadyExists,
    ConcurrentUpdate,
    InvalidArgument,
    Unavailable,
    VipuError,
)
from vipu.store.schema import (
    MIGRATIONS,
    SCHEMA_VERSION,
    AgentRow,
    AllocationAgentRow,
    AllocationRow,
    Base,
    CableVerdictsRow,
    ClusterAgentRow,
    ClusterRow,
    ClusterTestRunRow,
    LeaseRow,
    MetaRow,
    PartitionIpuRow,
    PartitionRequestRow,
    PartitionRow,
    UserAllocationRow,
    UserRow,
)

log = logging.getLogger(__name__)

LAST_TEST_RUN = "last"
# What a committed write changed, besides partitions, as `Store.on_commit` is told.
CONFIGURATION_CHANGED, USERS_CHANGED, TESTS_CHANGED = "configuration", "users", "tests"
# The longest a statement may wait or run, on either database: it bounds how long a write holds
# the write turn (`Store.transaction`, `Store.write`), so no writer waits without a deadline.
STATEMENT_DEADLINE_SECONDS = 30
GENERATION_KEY = "configuration_generation"
PARTITIONS = typing.cast(Table, PartitionRow.__table__)  # declared as a FromClause
IPUS = typing.cast(Table, PartitionIpuRow.__table__)
REQUESTS = typing.cast(Table, PartitionRequestRow.__table__)

# The partition statements, built once: building and keying a statement costs more than running it.
ONE_PARTITION = select(PARTITIONS).where(PARTITIONS.c.id == bindparam("id"))
IPUS_OF_PARTITION = select(IPUS).where(IPUS.c.partition_id == bindparam("id")).order_by(IPUS.c.routing_id)
IPUS_OF_PARTITIONS = (select(IPUS).where(IPUS.c.partition_id.in_(bindparam("ids", expanding=True)))
                      .order_by(IPUS.c.partition_id, IPUS.c.routing_id))
IPUS_IN_ALLOCATION = (select(IPUS.c.agent_id, IPUS.c.ipu_index).join(PARTITIONS, PARTITIONS.c.id == IPUS.c.partition_id)
                      .where(PARTITIONS.c.allocation_id == bindparam("allocation")))
NEW_PARTITION = insert(PARTITIONS)
NEW_IPUS = insert(IPUS)
PARTITION_STATE = select(PARTITIONS.c.ready_state, PARTITIONS.c.operation_state).where(PARTITIONS.c.id == bindparam("id"))
CONFIGURATION_GENERATION = select(MetaRow.value).where(MetaRow.key == GENERATION_KEY)
# PostgreSQL advisory locks ("vipu" and a number): held while a store is initialised; held shared
# by every fenced write transaction and exclusively by a replica taking the lease over.
INITIALISATION_LOCK = 0x76697075_00
LEADERSHIP_LOCK = 0x76697075_01
# The fence of a write transaction on PostgreSQL in one round trip. A VOLATILE function reads with
# a fresh snapshot, taken after the lock is granted, so a takeover it waited for is seen.
HOLDS_LEASE_FUNCTION = f"""
CREATE OR REPLACE FUNCTION vipu_holds_lease(lease_name text, lease_holder text, lease_term integer) RETURNS boolean
LANGUAGE plpgsql VOLATILE AS $$
BEGIN
    PERFORM pg_advisory_xact_lock_shared({LEADERSHIP_LOCK});
    RETURN EXISTS (SELECT 1 FROM leases WHERE name = lease_name AND holder = lease_holder AND term = lease_term);
END
$$"""
HOLDS_LEASE = text("SELECT vipu_holds_lease(:name, :holder, :term)")


def _in_state():
    """The condition of a compare-and-set: the partition, in the state its transition expects."""
    return and_(PARTITIONS.c.id == bindparam("partition"), PARTITIONS.c.ready_state == bindparam("ready"),
                PARTITIONS.c.operation_state == bindparam("operation"))


@lru_cache(maxsize=8)
def _partition_update(columns: tuple[str, ...]):
    """UPDATE of the named columns of one partition, only while it is in the expected state."""
    return update(PARTITIONS).where(_in_state()).values({c: bindparam(f"new_{c}") for c in columns})


DELETE_PARTITION_IN_STATE = delete(PARTITIONS).where(_in_state())
DELETE_IPUS_OF_PARTITION = delete(IPUS).where(IPUS.c.partition_id == bindparam("partition"))
# A waiting request is the row of its arrival number and partition id: a request that has gone is not there.
THE_REQUEST = and_(REQUESTS.c.sequence == bindparam("arrival"), REQUESTS.c.partition_id == bindparam("request"))
DELETE_REQUEST = delete(REQUESTS).where(THE_REQUEST)
REQUEST_OF_PARTITION = select(REQUESTS.c.sequence).where(REQUESTS.c.partition_id == bindparam("request"))
HOLD_FOR_REQUEST = update(REQUESTS).where(THE_REQUEST).values(held=bindparam("new_held"))


def _first_line(error: DBAPIError) -> str:
    """What the database said, without SQLAlchemy's statement and background link."""
    return (str(error.orig).splitlines() or ["no reason given"])[0]


def _set_wal_mode(cursor, deadline_seconds: float = 30.0) -> None:
    """Put a SQLite database in WAL mode. Replicas opening a new database at once can find it
    locked: SQLite answers a change of journal mode at once rather than through the busy handler,
    so it is tried again until the deadline."""
    deadline = time.monotonic() + deadline_seconds
    while True:
        try:
            cursor.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as error:
            if "locked" not in str(error) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def normalise_url(url: str) -> str:
    """Accept `postgresql://...` as operators write it; use the psycopg 3 driver for it."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix):]
    if "://" not in url:  # a bare path means a SQLite file
        return f"sqlite:///{Path(url).expanduser().resolve()}"
    return url


def _inventory_to_json(inventory: MachineInventory) -> dict:
    return dataclasses.asdict(inventory)


def _inventory_from_json(data: dict) -> MachineInventory:
    data = dict(data)
    data["ipus"] = [IpuInfo(**ipu) for ipu in data.get("ipus", [])]
    return MachineInventory(**data)


def _agent(row: AgentRow) -> Agent:
    return Agent(
        id=row.id,
        host=row.host,
        port=row.port,
        inventory=_inventory_from_json(row.inventory),
        status=AgentStatus(row.status),
        discovery_mode=row.discovery_mode,
        last_error=row.last_error or "",
    )


def _cluster(row: ClusterRow) -> Cluster:
    return Cluster(
        id=row.id,
        agent_ids=tuple(m.agent_id for m in row.members),
        topology=IldTopology(row.topology),
        num_ilds=row.num_ilds,
        gw_topology=GwTopology(row.gw_topology) if row.gw_topology else None,
    )


def _allocation(row: AllocationRow) -> Allocation:
    return Allocation(id=row.id, cluster_id=row.cluster_id, agent_ids=tuple(m.agent_id for m in row.members))


def _copy(entity):
    """A copy of a cached entity a caller may change, or None."""
    return dataclasses.replace(entity) if entity is not None else None


def _placed(row) -> PlacedIpu:
    return PlacedIpu(row.agent_id, row.ipu_index, row.ild, row.topology_id, row.segment, row.routing_id, row.gcd)


def _partition(row, ipus: list[PlacedIpu]) -> Partition:
    return Partition(
        id=row.id,
        cluster_id=row.cluster_id,
        allocation_id=row.allocation_id,
        size=row.size,
        num_gcds=row.num_gcds,
        num_replicas=row.num_replicas,
        reconfigurable=row.reconfigurable,
        sync_type=SyncType(row.sync_type),
        ipulink_routing=IpuLinkRouting(row.ipulink_routing),
        gw_routing=GwRouting(row.gw_routing),
        num_segments=row.num_segments,
        ipus=ipus,
        ready_state=ReadyState(row.ready_state),
        operation_state=OperationState(row.operation_state),
        errors=list(row.errors or []),
        disable_auto_reset=row.disable_auto_reset,
        auto_reset_count=row.auto_reset_count,
        last_auto_reset=_utc(row.last_auto_reset_at),
        owner=row.owner or "",
        created=_utc(row.created_at),
        attach_key=row.attach_key or "",
        relocatable=bool(row.relocatable),
        relocation=row.relocation or "",
        failed_on=tuple(row.failed_on or ()),
    )


def _requirements_to_json(request: PartitionRequest) -> dict:
    fields = dataclasses.asdict(request)
    for name in ("sync_type", "ipulink_routing", "gw_routing"):
        fields[name] = fields[name].value if fields[name] is not None else None
    fields["explicit_ipus"] = [list(ipu) for ipu in request.explicit_ipus]
    return fields


def _requirements_from_json(data: dict) -> PartitionRequest:
    fields = dict(data)
    for name, kind in (("sync_type", SyncType), ("ipulink_routing", IpuLinkRouting), ("gw_routing", GwRouting)):
        fields[name] = kind(fields[name]) if fields.get(name) is not None else None
    fields["explicit_ipus"] = tuple(tuple(ipu) for ipu in fields.get("explicit_ipus", ()))
    return PartitionRequest(**fields)


def _waiting(row) -> queue.WaitingRequest:
    return queue.WaitingRequest(
        request=_requirements_from_json(row.requirements),
        allocation_id=row.allocation_id,
        owner=row.owner or "",
        since=typing.cast(datetime, _utc(row.since)),
        deadline=typing.cast(datetime, _utc(row.deadline)),
        keep_on_error=row.keep_on_error,
        sequence=row.sequence,
        held=frozenset((agent, index) for agent, index in row.held or ()),
    )


def _utc(moment: datetime | None) -> datetime | None:
    """A stored moment as an aware UTC datetime (SQLite gives it back without its zone)."""
    if moment is None:
        return None
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


@dataclass(frozen=True)
class Credential:
    """A user's access key as stored: a salted hash, and a version that changes on every rotation."""

    salt: bytes
    digest: bytes
    version: int


def _user(row: UserRow) -> User:
    return User(row.id, Role(row.role), tuple(g.allocation_id for g in row.grants))


@dataclass(frozen=True)
class Lease:
    """A lease as the store holds it; `remaining` is in seconds by the database's clock (negative: expired)."""

    name: str
    holder: str
    address: str
    term: int
    remaining: float


@dataclass(frozen=True)
class Fence:
    """The lease a controller must still hold for its writes to commit."""

    name: str
    holder: str
    term: int


@dataclass(frozen=True)
class Configuration:
    """Agents, clusters and allocations (by id, in id order) as of one configuration generation."""

    generation: int
    agents: dict[str, Agent]
    clusters: dict[str, Cluster]
    allocations: dict[str, Allocation]

    @classmethod
    def load(cls, session: Session, generation: int) -> Configuration:
        def rows(kind):
            return session.scalars(select(kind).order_by(kind.id))

        return cls(
            generation,
            {r.id: _agent(r) for r in rows(AgentRow)},
            {r.id: _cluster(r) for r in rows(ClusterRow)},
            {r.id: _allocation(r) for r in rows(AllocationRow)},
        )


class ConfigurationCache:
    """The slow-changing entities, kept between transactions.

    Every partition operation needs the agents, the cluster and the allocations, and they change
    rarely. The store keeps a generation counter that every transaction changing them increments;
    a transaction reads the counter (one small query) and reuses the entities loaded at that
    generation, so several controllers on one database never see each other's stale copies.

    A controller that serves is the store's only writer (replicas standing by write nothing), so
    once it says so (`own`) the cache trusts itself: it counts the changes this process commits
    and reads nothing, not even the counter, until one of them empties it.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._latest: Configuration | None = None
        self._owned = False
        self._commits = 0  # configuration changes committed by this process while it owns the store

    def own(self, owned: bool) -> None:
        with self._lock:
            self._owned, self._latest = owned, None
            self._commits += 1

    def changed(self) -> None:
        """A transaction of this process that changed the configuration has committed."""
        with self._lock:
            self._commits += 1
            self._latest = None

    def current(self, transaction: Transaction) -> Configuration:
        latest = self._latest
        if self._owned:
            if latest is not None:
                return latest
            commits = self._commits
            loaded = Configuration.load(transaction.session, commits)
            with self._lock:  # kept only if no change committed while it was read
                if self._owned and self._commits == commits:
                    self._latest = loaded
            return loaded
        generation = int(transaction.connection.execute(CONFIGURATION_GENERATION).scalar_one())
        if latest is not None and latest.generation == generation:
            return latest
        loaded = Configuration.load(transaction.session, generation)
        with self._lock:
            if not self._owned and (self._latest is None or self._latest.generation <= generation):
                self._latest = loaded
        return loaded


class Transaction:
    """One unit of work on the store, speaking in domain entities.

    It opens its database connection only when a statement needs one, and an ORM session on
    that connection only for the entities written through the ORM: the partitions, the hot path,
    are plain statements, and a unit of work that the configuration cache serves touches no
    database at all.
    """

    def __init__(self, engine: Engine, cache: ConfigurationCache, on_commit: Callable[[frozenset[str]], None] | None = None):
        self._engine = engine
        self._cache = cache
        self._on_commit = on_commit
        self._connection: Connection | None = None
        self._session: Session | None = None
        self._seen: Configuration | None = None
        self._changed_configuration = False
        self._changed: set[str] = set()  # what Store.on_commit is told of

    @property
    def connection(self) -> Connection:
        if self._connection is None:
            connection = self._engine.connect()
            try:
                connection.begin()
            except BaseException:
                connection.close()
                raise
            self._connection = connection
        return self._connection

    @property
    def session(self) -> Session:
        if self._session is None:
            self._session = Session(bind=self.connection, expire_on_commit=False)
        return self._session

    def _commit(self) -> None:
        if self._session is not None:
            self._session.flush()
        if self._connection is not None:
            self._connection.commit()
        if self._changed_configuration:
            self._cache.changed()

    def _tell_committed(self) -> None:
        """Tell `Store.on_commit` what this transaction, now committed, changed. The write stands
        whatever the hook does, so its failure is logged, never raised in the writer."""
        if self._changed and self._on_commit is not None:
            try:
                self._on_commit(frozenset(self._changed))
            except Exception:
                log.exception("telling of a committed change failed")

    def _close(self) -> None:
        """Release the session and the connection; what was not committed is rolled back."""
        if self._session is not None:
            self._session.close()
        if self._connection is not None:
            self._connection.close()

    # Agents, clusters and allocations: served from the configuration cache

    def _configuration(self) -> Configuration:
        """This transaction's view of the slow-changing entities: the shared cache's, or, once
        the transaction has changed them itself, its own reading of them."""
        if self._seen is None:
            self._seen = Configuration.load(self.session, -1) if self._changed_configuration else self._cache.current(self)
        return self._seen

    def _configuration_changes(self) -> None:
        """Record that this transaction changes agents, clusters or allocations (for every cache)."""
        self._seen = None
        self._changed.add(CONFIGURATION_CHANGED)
        if not self._changed_configuration:
            self._changed_configuration = True
            self.connection.execute(
                update(MetaRow).where(MetaRow.key == GENERATION_KEY).values(value=cast(cast(MetaRow.value, Integer) + 1, String))
            )

    def get_agent(self, agent_id: str) -> Agent | None:
        return _copy(self._configuration().agents.get(agent_id))

    def list_agents(self) -> list[Agent]:
        return [_copy(a) for a in self._configuration().agents.values()]

    def add_agent(self, agent: Agent) -> None:
        self._configuration_changes()
        if self.session.get(AgentRow, agent.id) is not None:
            raise AlreadyExists(f"agent {agent.id} already exists")
        self.session.add(
            AgentRow(
                id=agent.id,
                host=agent.host,
                port=agent.port,
                status=agent.status.value,
                discovery_mode=agent.discovery_mode,
                last_error=agent.last_error,
                inventory=_inventory_to_json(agent.inventory),
            )
        )
        self._flush(f"agent {agent.id} already exists")

    def update_agent(self, agent: Agent) -> None:
        self._configuration_changes()
        row = self.session.get(AgentRow, agent.id)
        if row is None:
            return
        row.status = agent.status.value
        row.last_error = agent.last_error[:1024]
        row.inventory = _inventory_to_json(agent.inventory)

    def delete_agent(self, agent_id: str) -> None:
        self._configuration_changes()
        self.session.execute(delete(AgentRow).where(AgentRow.id == agent_id))

    def agent_with_address(self, host: str, port: int) -> Agent | None:
        return next((a for a in self.list_agents() if (a.host, a.port) == (host, port)), None)

    def get_cluster(self, cluster_id: str) -> Cluster | None:
        return _copy(self._configuration().clusters.get(cluster_id))

    def list_clusters(self) -> list[Cluster]:
        return [_copy(c) for c in self._configuration().clusters.values()]

    def cluster_of_agents(self) -> dict[str, str]:
        return {a: c.id for c in self.list_clusters() for a in c.agent_ids}

    def add_cluster(self, cluster: Cluster) -> None:
        self._configuration_changes()
        if self.session.get(ClusterRow, cluster.id) is not None:
            raise AlreadyExists(f"cluster {cluster.id} already exists")
        self.session.add(
            ClusterRow(
                id=cluster.id,
                topology=cluster.topology.value,
                num_ilds=cluster.num_ilds,
                gw_topology=cluster.gw_topology.value if cluster.gw_topology else None,
                members=[ClusterAgentRow(position=i, agent_id=a) for i, a in enumerate(cluster.agent_ids)],
            )
        )
        self._flush(f"cluster {cluster.id} or one of its agents is taken by a concurrent change")

    def delete_cluster(self, cluster_id: str) -> None:
        self._configuration_changes()
        row = self.session.get(ClusterRow, cluster_id)
        if row is not None:
            self.session.delete(row)
            self.session.flush()

    def get_allocation(self, allocation_id: str) -> Allocation | None:
        return _copy(self._configuration().allocations.get(allocation_id))

    def list_allocations(self, cluster_id: str | None = None) -> list[Allocation]:
        return [_copy(a) for a in self._configuration().allocations.values() if cluster_id is None or a.cluster_id == cluster_id]

    def allocation_of_agents(self) -> dict[str, str]:
        return {a: alloc.id for alloc in self.list_allocations() for a in alloc.agent_ids}

    def add_allocation(self, allocation: Allocation) -> None:
        self._configuration_changes()
        if self.session.get(AllocationRow, allocation.id) is not None:
            raise AlreadyExists(f"allocation {allocation.id} already exists")
        self.session.add(
            AllocationRow(
                id=allocation.id,
                cluster_id=allocation.cluster_id,
                members=[AllocationAgentRow(position=i, agent_id=a) for i, a in enumerate(allocation.agent_ids)],
            )
        )
        self._flush(f"allocation {allocation.id} or one of its machines is taken by a concurrent change")

    def delete_allocation(self, allocation_id: str) -> None:
        self._configuration_changes()
        row = self.session.get(AllocationRow, allocation_id)
        if row is not None:
            self.session.delete(row)
            self.session.flush()

    # Partitions: SQLAlchemy Core rather than the ORM, as they are the hot path

    def get_partition(self, partition_id: str) -> Partition | None:
        connection = self.connection
        row = connection.execute(ONE_PARTITION, {"id": partition_id}).first()
        if row is None:
            return None
        return _partition(row, [_placed(i) for i in connection.execute(IPUS_OF_PARTITION, {"id": partition_id})])

    def list_partitions(self, allocation_id: str | None = None, cluster_id: str | None = None) -> list[Partition]:
        conditions = []
        if allocation_id is not None:
            conditions.append(PARTITIONS.c.allocation_id == allocation_id)
        if cluster_id is not None:
            conditions.append(PARTITIONS.c.cluster_id == cluster_id)
        return self._partitions(*conditions)

    def partitions_on_agent(self, agent_id: str) -> list[Partition]:
        return self._partitions(PARTITIONS.c.id.in_(select(IPUS.c.partition_id).where(IPUS.c.agent_id == agent_id)))

    def _partitions(self, *conditions) -> list[Partition]:
        """The partitions meeting all `conditions`, in id order, each with its IPUs in routing order."""
        connection = self.connection
        rows = connection.execute(select(PARTITIONS).where(*conditions).order_by(PARTITIONS.c.id)).all()
        if not rows:
            return []
        ipus: dict[str, list[PlacedIpu]] = {row.id: [] for row in rows}
        for i in connection.execute(IPUS_OF_PARTITIONS, {"ids": list(ipus)}):
            ipus[i.partition_id].append(_placed(i))
        return [_partition(row, ipus[row.id]) for row in rows]

    def used_ipus(self, allocation_id: str) -> dict[str, set[int]]:
        """The IPUs taken in an allocation's machines, by agent: those of its partitions, since a
        machine belongs to one allocation at a time (found from the partitions, not the machines)."""
        used: dict[str, set[int]] = {}
        for agent_id, index in self.connection.execute(IPUS_IN_ALLOCATION, {"allocation": allocation_id}):
            used.setdefault(agent_id, set()).add(index)
        return used

    def add_partition(self, partition: Partition) -> None:
        """Record a new partition by the life cycle's 'create'; its id and IPUs must be free (a lost
        race is ConcurrentUpdate)."""
        created = lifecycle.target(partition.id, "create", lifecycle.ABSENT)
        if (state := lifecycle.state_of(partition)) != created:
            raise ValueError(f"a new partition is {lifecycle.named(created)}, not {lifecycle.named(state)}")
        connection = self.connection
        try:
            connection.execute(NEW_PARTITION, dict(
                id=partition.id,
                cluster_id=partition.cluster_id,
                allocation_id=partition.allocation_id,
                size=partition.size,
                num_gcds=partition.num_gcds,
                num_replicas=partition.num_replicas,
                reconfigurable=partition.reconfigurable,
                sync_type=partition.sync_type.value,
                ipulink_routing=partition.ipulink_routing.value,
                gw_routing=partition.gw_routing.value,
                num_segments=partition.num_segments,
                ready_state=partition.ready_state.value,
                operation_state=partition.operation_state.value,
                errors=list(partition.errors),
                disable_auto_reset=partition.disable_auto_reset,
                auto_reset_count=partition.auto_reset_count,
                owner=partition.owner,
                attach_key=partition.attach_key,
                relocatable=partition.relocatable,
                relocation=partition.relocation,
                failed_on=list(partition.failed_on),
                **({"created_at": partition.created} if partition.created is not None else {}),
            ))
            self._add_ipus(partition.id, partition.ipus)
        except IntegrityError as error:
            raise ConcurrentUpdate(f"partition {partition.id} or the IPUs chosen for it were taken by a concurrent request") from error

    def _add_ipus(self, partition_id: str, ipus: list[PlacedIpu]) -> None:
        self.connection.execute(NEW_IPUS, [
            {"partition_id": partition_id, "routing_id": i.routing_id, "agent_id": i.agent_id, "ipu_index": i.index,
             "ild": i.ild, "topology_id": i.topology_id, "segment": i.segment, "gcd": i.gcd}
            for i in ipus
        ])

    def transition(self, partition: Partition, name: str, errors: list[str] | None = None,
                   auto_reset_count: int | None = None, ipus: list[PlacedIpu] | None = None,
                   relocation: str | None = None, failed_on: tuple[str, ...] | None = None) -> lifecycle.State | None:
        """Apply the life cycle's transition `name` to a partition, as a compare-and-set on the state
        it was read in; the partition object follows. Refused with a `Conflict` naming both states
        when the table has no such move or another operation changed the partition meanwhile.
        `ipus` replaces its IPUs in the same statement group ('relocate'; taken ones are a lost race,
        ConcurrentUpdate), `relocation` records where it went and why, and `failed_on` the machines
        it keeps off from then on. Returns the state it went to (`lifecycle.ABSENT` when it is gone)."""
        source = lifecycle.state_of(partition)
        target = lifecycle.target(partition.id, name, source)
        expected = {"partition": partition.id, "ready": source[0].value, "operation": source[1].value}
        connection = self.connection
        if target is lifecycle.ABSENT:
            changed = connection.execute(DELETE_PARTITION_IN_STATE, expected).rowcount
        else:
            values: dict = {"ready_state": target[0].value, "operation_state": target[1].value}
            if errors is not None:
                values["errors"] = list(errors)
            if auto_reset_count is not None:
                values["auto_reset_count"] = auto_reset_count
                values["last_auto_reset_at"] = datetime.now(UTC)
            if relocation is not None:
                values["relocation"] = relocation
            if failed_on is not None:
                values["failed_on"] = list(failed_on)
            parameters = {f"new_{column}": value for column, value in values.items()}
            changed = connection.execute(_partition_update(tuple(values)), {**expected, **parameters}).rowcount
        if changed != 1:
            row = connection.execute(PARTITION_STATE, {"id": partition.id}).first()
            found = None if row is None else (ReadyState(row.ready_state), OperationState(row.operation_state))
            raise lifecycle.moved_meanwhile(partition.id, name, source, found)
        if ipus is not None:
            connection.execute(DELETE_IPUS_OF_PARTITION, {"partition": partition.id})
            try:
                with connection.begin_nested():
                    self._add_ipus(partition.id, ipus)
            except IntegrityError as error:
                raise ConcurrentUpdate(f"the IPUs chosen for partition {partition.id} were taken by a concurrent request") from error
        if target is not lifecycle.ABSENT:
            partition.ready_state, partition.operation_state = target
            if errors is not None:
                partition.errors = list(errors)
            if auto_reset_count is not None:
                partition.auto_reset_count = auto_reset_count
                partition.last_auto_reset = values["last_auto_reset_at"]
            if ipus is not None:
                partition.ipus = list(ipus)
            if relocation is not None:
                partition.relocation = relocation
            if failed_on is not None:
                partition.failed_on = tuple(failed_on)
        return target

    # Requests waiting for room (vipu.model.queue): plain statements, like the partitions

    def list_requests(self) -> list[queue.WaitingRequest]:
        """Every waiting request, in arrival order."""
        return [_waiting(row) for row in self.connection.execute(select(REQUESTS).order_by(REQUESTS.c.sequence))]

    def add_request(self, request: queue.WaitingRequest) -> None:
        """Record a request by its life cycle's 'enqueue'; it gets its arrival number. A request of
        that partition id found waiting is refused by the life cycle (a `Conflict`); one that
        appears meanwhile is a lost race (ConcurrentUpdate)."""
        found = self.connection.execute(REQUEST_OF_PARTITION, {"request": request.partition_id}).first()
        queue.target(request.partition_id, "enqueue", queue.ABSENT if found is None else queue.WAITING)
        try:
            with self.connection.begin_nested():
                inserted = self.connection.execute(insert(REQUESTS).values(
                    partition_id=request.partition_id, allocation_id=request.allocation_id, owner=request.owner,
                    requirements=_requirements_to_json(request.request), keep_on_error=request.keep_on_error,
                    since=request.since, deadline=request.deadline, held=[list(ipu) for ipu in sorted(request.held)]))
        except IntegrityError as error:
            raise ConcurrentUpdate(f"a request for partition {request.partition_id} is already waiting, or its allocation "
                                   "went, by a concurrent change") from error
        request.sequence = typing.cast(tuple, inserted.inserted_primary_key)[0]

    def end_request(self, request: queue.WaitingRequest, transition: str) -> None:
        """Apply 'grant', 'cancel' or 'expire': the request stops waiting, as a compare-and-set on its
        arrival number: the row deleted, it was WAITING; none, it no longer waits (another change
        ended it meanwhile), and the life cycle refuses the transition with a `Conflict`."""
        gone = self.connection.execute(DELETE_REQUEST, {"arrival": request.sequence, "request": request.partition_id})
        queue.target(request.partition_id, transition, queue.WAITING if gone.rowcount == 1 else queue.ABSENT)

    def hold_for(self, request: queue.WaitingRequest, held: frozenset[tuple[str, int]]) -> None:
        """Record the IPUs held for a request while it is first; nothing if it no longer waits."""
        self.connection.execute(HOLD_FOR_REQUEST, {"arrival": request.sequence, "request": request.partition_id,
                                                   "new_held": [list(ipu) for ipu in sorted(held)]})

    def get_user(self, user_id: str) -> User | None:
        row = self.session.get(UserRow, user_id)
        return _user(row) if row else None

    def list_users(self) -> list[User]:
        return [_user(r) for r in self.session.scalars(select(UserRow).order_by(UserRow.id))]

    def get_credential(self, user_id: str) -> Credential | None:
        row = self.session.get(UserRow, user_id)
        return Credential(row.key_salt, row.key_hash, row.key_version) if row else None

    def add_user(self, user: User, credential: Credential) -> None:
        self._changed.add(USERS_CHANGED)
        if self.session.get(UserRow, user.id) is not None:
            raise AlreadyExists(f"user {user.id} already exists")
        self.session.add(UserRow(
            id=user.id, role=user.role.value, key_salt=credential.salt, key_hash=credential.digest,
            key_version=credential.version, grants=[UserAllocationRow(allocation_id=a) for a in user.allocation_ids],
        ))
        self._flush(f"user {user.id} already exists")

    def set_user_allocations(self, user_id: str, allocation_ids: tuple[str, ...]) -> None:
        self._changed.add(USERS_CHANGED)
        row = self.session.get_one(UserRow, user_id)
        row.grants = [UserAllocationRow(allocation_id=a) for a in sorted(set(allocation_ids))]
        self.session.flush()

    def set_credential(self, user_id: str, credential: Credential) -> None:
        self._changed.add(USERS_CHANGED)
        row = self.session.get_one(UserRow, user_id)
        row.key_salt, row.key_hash, row.key_version = credential.salt, credential.digest, credential.version

    def delete_user(self, user_id: str) -> None:
        self._changed.add(USERS_CHANGED)
        row = self.session.get(UserRow, user_id)
        if row is not None:
            self.session.delete(row)
            self.session.flush()

    # Cluster tests

    def get_test_run(self) -> TestRun | None:
        row = self.session.get(ClusterTestRunRow, LAST_TEST_RUN)
        if row is None:
            return None
        outcomes = [
            Outcome(TestType(o["test"]), Status(o["status"]), o["passed"], o["total"], list(o["summary"]), o["duration"],
                    {key: list(lines) for key, lines in o.get("cables", {}).items()})  # runs saved before cables were kept have none
            for o in row.outcomes
        ]
        return TestRun(row.cluster_id, RunState(row.state), [TestType(t) for t in row.tests], outcomes)

    def save_test_run(self, run: TestRun) -> None:
        self._changed.add(TESTS_CHANGED)
        row = self.session.get(ClusterTestRunRow, LAST_TEST_RUN)
        if row is None:
            row = ClusterTestRunRow(key=LAST_TEST_RUN)
            self.session.add(row)
        row.cluster_id = run.cluster_id
        row.state = run.state.value
        row.tests = [t.value for t in run.tests]
        row.outcomes = [
            {"test": o.test.value, "status": o.status.value, "passed": o.passed, "total": o.total,
             "summary": list(o.summary), "duration": o.duration, "cables": o.cable_failures}
            for o in run.outcomes
        ]

    def get_cable_verdicts(self, cluster_id: str) -> CableVerdicts | None:
        row = self.session.get(CableVerdictsRow, cluster_id)
        if row is None:
            return None
        return CableVerdicts(RunState(row.run_state),
                             {key: (CableVerdict(cable["verdict"]), tuple(cable["lines"])) for key, cable in row.cables.items()})

    def save_cable_verdicts(self, cluster_id: str, verdicts: CableVerdicts) -> None:
        self._changed.add(TESTS_CHANGED)
        row = self.session.get(CableVerdictsRow, cluster_id)
        if row is None:
            row = CableVerdictsRow(cluster_id=cluster_id)
            self.session.add(row)
        row.run_state = verdicts.run_state.value
        row.cables = {key: {"verdict": verdict.value, "lines": list(lines)} for key, (verdict, lines) in verdicts.cables.items()}

    def _flush(self, conflict_message: str) -> None:
        try:
            self.session.flush()
        except IntegrityError as error:
            raise ConcurrentUpdate(conflict_message) from error


T = typing.TypeVar("T")


class _GroupedWrite:
    """One caller's part of a group commit: its work, then its result or its error."""

    def __init__(self, work: Callable[[Transaction], typing.Any]):
        self.work = work
        self.result: typing.Any = None
        self.error: BaseException | None = None
        self.finished = False

    def run(self, tx: Transaction) -> None:
        try:
            self.result = self.work(tx)
        except Exception as error:  # noqa: BLE001 - raised in its own caller, by `write`
            self.error = error


def checked_url(url: str) -> tuple[str, bool]:
    """A store URL as SQLAlchemy takes it, and whether it names SQLite, whose file's directory is
    made; InvalidArgument for a URL that names no store vipu supports."""
    url = normalise_url(url)
    try:
        parsed = make_url(url)
    except ArgumentError as error:
        raise InvalidArgument(f"cannot understand the store URL {url!r}") from error
    if parsed.get_backend_name() not in ("sqlite", "postgresql"):
        raise InvalidArgument(f"unsupported store {parsed.get_backend_name()!r}: use sqlite:///PATH or postgresql://...")
    is_sqlite = parsed.get_backend_name() == "sqlite"
    if is_sqlite and parsed.database not in (None, "", ":memory:"):
        try:
            Path(parsed.database).parent.mkdir(parents=True, exist_ok=True)
        except OSError as error:
            raise Unavailable(f"cannot create the directory of the store {parsed.database}: {error.strerror}") from error
    return url, is_sqlite


class Store:
    """Opens the database named by a URL and hands out transactions on it."""

    def __init__(self, url: str):
        self.url, self.is_sqlite = checked_url(url)
        self._write_engine = self._engine(immediate=True)
        self._read_engine = self._engine(immediate=False) if self.is_sqlite else self._write_engine
        # SQLite takes one writer at a time; waiting in-process is fair and fast, where its own
        # busy handler sleeps in steps of up to 100 ms.
        self._write_turn = threading.Lock() if self.is_sqlite else contextlib.nullcontext()
        # Grouped writes (`write`) take turns; on SQLite, with the other writers.
        self._group_turn = self._write_turn if self.is_sqlite else threading.Lock()
        self._pending_lock = threading.Lock()
        self._pending: list[_GroupedWrite] = []
        self._cache = ConfigurationCache()
        self._fence: Fence | None = None
        # The database's clock, so that controllers on several hosts agree on when a lease ends.
        self._clock = text("SELECT (julianday('now') - 2440587.5) * 86400.0" if self.is_sqlite
                           else "SELECT extract(epoch from clock_timestamp())::float8")
        self._writes = sessionmaker(self._write_engine, expire_on_commit=False)
        self._reads = sessionmaker(self._read_engine, expire_on_commit=False)
        # Told, after each write transaction has committed, what it changed besides partitions (those
        # the ledger reports): CONFIGURATION_CHANGED, USERS_CHANGED, TESTS_CHANGED. Live views hang on it.
        self.on_commit: Callable[[frozenset[str]], None] | None = None
        self._initialise()

    def _engine(self, immediate: bool) -> Engine:
        if not self.is_sqlite:
            # No statement, lock wait included, outlasts the deadline: a wedged database makes a
            # write fail as Unavailable instead of holding the write turn, and every writer behind it.
            return create_engine(self.url, pool_pre_ping=True, pool_size=10, max_overflow=20,
                                 connect_args={"options": f"-c statement_timeout={STATEMENT_DEADLINE_SECONDS * 1000}"})
        engine = create_engine(self.url, connect_args={"check_same_thread": False, "timeout": STATEMENT_DEADLINE_SECONDS})

        @event.listens_for(engine, "connect")
        def _configure(dbapi_connection, _record):
            dbapi_connection.isolation_level = None  # let SQLAlchemy's begin event issue BEGIN
            cursor = dbapi_connection.cursor()
            _set_wal_mode(cursor)
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute(f"PRAGMA busy_timeout={STATEMENT_DEADLINE_SECONDS * 1000}")
            cursor.close()

        @event.listens_for(engine, "begin")
        def _begin(connection):
            connection.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

        return engine

    def _initialise(self) -> None:
        """Create the tables, or bring an older store up to this version; once, when replicas start together."""
        try:
            with self._writes.begin() as session:
                if not self.is_sqlite:  # SQLite's BEGIN IMMEDIATE already keeps other initialisers out
                    session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": INITIALISATION_LOCK})
                Base.metadata.create_all(session.connection())
                if not self.is_sqlite:
                    session.execute(text(HOLDS_LEASE_FUNCTION))
                self._settle_schema(session)
        except OperationalError as error:
            raise Unavailable(f"cannot open the store at {self.describe()}: {_first_line(error)}") from error

    def _settle_schema(self, session: Session) -> None:
        if session.get(MetaRow, GENERATION_KEY) is None:
            session.add(MetaRow(key=GENERATION_KEY, value="0"))
        row = session.get(MetaRow, "schema_version")
        if row is None:
            session.add(MetaRow(key="schema_version", value=str(SCHEMA_VERSION)))
        elif int(row.value) > SCHEMA_VERSION:
            raise VipuError(
                f"the store at {self.describe()} has schema version {row.value}, newer than this "
                f"vipu-server's {SCHEMA_VERSION}; upgrade vipu-server"
            )
        elif int(row.value) < SCHEMA_VERSION:
            for version in range(int(row.value) + 1, SCHEMA_VERSION + 1):
                for step in MIGRATIONS.get(version, ()):
                    if isinstance(step, str):
                        session.execute(text(step))
                    else:
                        step(session)
            row.value = str(SCHEMA_VERSION)

    def describe(self) -> str:
        return make_url(self.url).render_as_string(hide_password=True)

    @contextmanager
    def transaction(self) -> Iterator[Transaction]:
        """A read-write unit of work: commits on success, rolls back on any exception.

        Once `fence` is set, a transaction first checks that the lease is still held in the same
        term, so a controller that lost its leadership can change nothing, even with a request
        already under way. On PostgreSQL the transaction holds an advisory lock shared until it
        commits, which a replica taking the lease over must hold exclusively: a write that
        passed the check commits before the takeover, and none can pass it after. (Locking the
        lease row would do the same, but writes to the row and the WAL in every transaction: it
        halved throughput.) SQLite runs one write transaction at a time anyway.
        """
        with self._write_turn, self._writing() as tx:
            yield tx

    @contextmanager
    def _writing(self) -> Iterator[Transaction]:
        """A fenced write transaction, committed if the block ends normally; the caller holds the turn."""
        tx = Transaction(self._write_engine, self._cache, self.on_commit)
        try:
            if self._fence is not None:
                self._check_fence(tx.connection, self._fence)
            yield tx
            tx._commit()
        except (IntegrityError, OperationalError) as error:
            raise self._refusal(error) from error
        finally:
            tx._close()
        tx._tell_committed()

    def _refusal(self, error: IntegrityError | OperationalError) -> VipuError:
        """What the caller of a write the database refused is told."""
        if isinstance(error, IntegrityError):
            return ConcurrentUpdate("a concurrent change conflicted with this one; try again")
        # The disk is full, the database went away, ...
        return Unavailable(f"the store at {self.describe()} could not record the change: {_first_line(error)}")

    def write(self, work: Callable[[Transaction], T]) -> T:
        """Run `work` in a write transaction shared with the writes that arrive while another
        commits: one commit for the group (group commit), each caller answered only after it.

        The thread whose turn comes commits every write waiting by then; each runs under a
        savepoint of its own, so one that fails (a refused transition, a lost race) is rolled back
        alone and raises in its own caller. If the commit fails, every write of the group fails
        with it. `work` may be run by another thread: it must only use the transaction, with
        plain statements (the partitions), not the ORM session.
        """
        mine = _GroupedWrite(work)
        with self._pending_lock:
            self._pending.append(mine)
        with self._group_turn:
            if not mine.finished:  # else an earlier turn committed it with its own group
                with self._pending_lock:
                    group, self._pending = self._pending, []
                self._commit_group(group)
        if isinstance(mine.error, IntegrityError | OperationalError):
            raise self._refusal(mine.error) from mine.error
        if mine.error is not None:
            raise mine.error
        return typing.cast(T, mine.result)

    def _commit_group(self, group: list[_GroupedWrite]) -> None:
        committed = False
        try:
            with self._writing() as tx:
                if len(group) == 1:
                    group[0].run(tx)
                    if group[0].error is not None:
                        raise group[0].error  # rolls the transaction back
                else:
                    for write in group:
                        savepoint = tx.connection.begin_nested()
                        write.run(tx)
                        if write.error is None:
                            savepoint.commit()
                        else:
                            savepoint.rollback()
            committed = True
        except Exception as error:  # noqa: BLE001 - it is raised in every caller whose write it undid
            for write in group:
                if write.error is None:
                    write.error = error
        finally:
            for write in group:
                if not committed and write.error is None:  # the committing thread was interrupted
                    write.error = Unavailable("the store write was interrupted; try again")
                write.finished = True

    def own(self, owned: bool = True) -> None:
        """Say whether this process serves, and so is the store's only writer (see ConfigurationCache)."""
        self._cache.own(owned)

    # Leases: one leader among the controllers sharing this store

    def claim_lease(self, name: str, holder: str, address: str, seconds: float) -> Lease | None:
        """Take the lease if it is free or has expired, or renew it if `holder` has it; the lease as it now stands.

        The row is locked while it is decided, so two claimants never both win; the loser gets
        the winner's lease back.
        """
        try:
            with self._lease_write() as session:
                now = session.execute(self._clock).scalar_one()
                row = session.execute(select(LeaseRow).where(LeaseRow.name == name).with_for_update()).scalar_one_or_none()
                if row is None:
                    row = LeaseRow(name=name, holder=holder, address=address, term=1, expires=now + seconds)
                    session.add(row)
                elif row.holder == holder:
                    row.expires = now + seconds
                elif row.expires <= now:
                    if not self.is_sqlite:  # wait for the writes the last holder has under way (see transaction)
                        session.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": LEADERSHIP_LOCK})
                    row.holder, row.address, row.term, row.expires = holder, address, row.term + 1, now + seconds
                return Lease(row.name, row.holder, row.address, row.term, row.expires - now)
        except IntegrityError:  # another claimant inserted the first row meanwhile
            return self.read_lease(name)

    def read_lease(self, name: str) -> Lease | None:
        with self._reads() as session, session.begin():
            now = session.execute(self._clock).scalar_one()
            row = session.get(LeaseRow, name)
            return None if row is None else Lease(row.name, row.holder, row.address, row.term, row.expires - now)

    def release_lease(self, name: str, holder: str) -> None:
        """End `holder`'s lease now, so another claimant need not wait for it to expire."""
        with self._lease_write() as session:
            now = session.execute(self._clock).scalar_one()
            session.execute(update(LeaseRow).where(LeaseRow.name == name, LeaseRow.holder == holder).values(expires=now))

    @contextmanager
    def _lease_write(self) -> Iterator[Session]:
        """A write transaction on the lease, unfenced; an unreachable database is `Unavailable`."""
        try:
            with self._write_turn, self._writes() as session, session.begin():
                yield session
        except OperationalError as error:
            raise Unavailable(f"cannot reach the store at {self.describe()}: {_first_line(error)}") from error

    def fence(self, lease: Lease) -> None:
        """From now on, commit writes only while `lease` is held in its present term."""
        self._fence = Fence(lease.name, lease.holder, lease.term)

    def _check_fence(self, connection: Connection, fence: Fence) -> None:
        if self.is_sqlite:
            current = connection.execute(select(LeaseRow.holder, LeaseRow.term).where(LeaseRow.name == fence.name)).one_or_none()
            held = current is not None and tuple(current) == (fence.holder, fence.term)
        else:
            held = connection.execute(HOLDS_LEASE, {"name": fence.name, "holder": fence.holder, "term": fence.term}).scalar_one()
        if not held:
            raise Unavailable("this vipu-server is no longer the leader; another replica has taken over")

    @contextmanager
    def reading(self) -> Iterator[Transaction]:
        """A read-only unit of work that never blocks writers."""
        tx = Transaction(self._read_engine, self._cache)
        try:
            yield tx
        finally:
            tx._close()

    def close(self) -> None:
        self._write_engine.dispose()
        if self._read_engine is not self._write_engine:
            self._read_engine.dispose()
