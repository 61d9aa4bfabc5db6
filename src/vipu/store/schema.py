"""The tables behind the store.

The invariants that must hold even when two controllers or two requests race are written as
constraints, so the database refuses what the services' own checks might miss:

- an agent is in at most one cluster (`cluster_agents.agent_id` unique);
- a machine is in at most one allocation (`allocation_agents.agent_id` unique);
- an IPU is in at most one partition (`partition_ipus (agent_id, ipu_index)` unique);
- a partition id waits in at most one request (`partition_requests.partition_id` unique), and a
  request goes with its allocation.

The `leases` table elects one leader among controllers sharing the store (`vipu-server --ha`).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from datetime import datetime

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    LargeBinary,
    String,
    UniqueConstraint,
    func,
    inspect,
    text,
)
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, relationship

from vipu.model.entities import new_attach_key

SCHEMA_VERSION = 21  # 2: cluster_test_runs; 3: users, user_allocations, partitions.owner; 4: leases;
# 5: partitions.last_auto_reset_at; 6: partitions.attach_key; 7: partition_requests, partitions.relocatable and .relocation;
# 8: cable_verdicts; 9: partitions.failed_on; 10: partition_requests.detached; 11: the link ledger (links, link_samples,
# link_summaries, link_events, cables); 12: partitions.placement_note; 13: links.breaker and .first_seen, link_remediations;
# 14: partitions.may_move and .expected_seconds (a waiting request keeps both in its requirements' JSON);
# 15: partitions.power_cycled_at; 16: partitions.compacted_at; 17: agents.drain; 18: reservations;
# 19: partitions.reservation; 20: accounts, usage_records, partitions.account, .preemptible, .reclaim_at and .reclaim_notice,
# reservations.accounts; 21: partitions.labels, machine_log_lines


def _give_attach_keys(session: Session) -> None:
    """Partitions made before attach keys get one each; the health check then sends it to their agents."""
    for (partition_id,) in session.execute(text("SELECT id FROM partitions WHERE attach_key = ''")).all():
        session.execute(text("UPDATE partitions SET attach_key = :key WHERE id = :id"), {"key": new_attach_key(), "id": partition_id})


def _give_reservations(session: Session) -> None:
    """Partitions of a store of schema 18 made in a reservation for people under way (all their
    IPUs among its own, as only its partitions may be placed there) are recorded as made in it."""
    under_way = session.execute(text("SELECT name, ipus FROM reservations WHERE NOT maintenance AND starts_at <= :now "
                                     "AND ends_at > :now"), {"now": time.time()}).all()
    reservations = [(name, {(agent, int(index)) for agent, index in (json.loads(ipus) if isinstance(ipus, str) else ipus)})
                    for name, ipus in under_way]  # JSON, as SQLite's text or PostgreSQL's decoded value
    if not reservations:
        return
    placed: dict[str, set[tuple[str, int]]] = {}
    for partition_id, agent_id, index in session.execute(text("SELECT partition_id, agent_id, ipu_index FROM partition_ipus")).all():
        placed.setdefault(partition_id, set()).add((agent_id, index))
    for partition_id, ipus in placed.items():
        made_in = next((name for name, reserved in reservations if ipus <= reserved), None)
        if made_in is not None:
            session.execute(text("UPDATE partitions SET reservation = :name WHERE id = :id"), {"name": made_in, "id": partition_id})


def _adding(table: str, column: str, definition: str) -> Callable[[Session], None]:
    """A step that adds a column to a table unless it is there: a table newer than the store's
    version (made whole by create_all) has it already."""
    def add(session: Session) -> None:
        if column not in {found["name"] for found in inspect(session.connection()).get_columns(table)}:
            session.execute(text(f"ALTER TABLE {table} ADD COLUMN {column} {definition}"))
    return add


# What turns a store of one version into the next, beyond the tables create_all adds: SQL, or a
# step in Python where SQL would differ between SQLite and PostgreSQL.
MIGRATIONS: dict[int, list[str | Callable[[Session], None]]] = {
    3: ["ALTER TABLE partitions ADD COLUMN owner VARCHAR(64) NOT NULL DEFAULT ''"],
    5: ["ALTER TABLE partitions ADD COLUMN last_auto_reset_at TIMESTAMP WITH TIME ZONE"],
    6: ["ALTER TABLE partitions ADD COLUMN attach_key VARCHAR(64) NOT NULL DEFAULT ''", _give_attach_keys],
    7: ["ALTER TABLE partitions ADD COLUMN relocatable BOOLEAN NOT NULL DEFAULT false",
        "ALTER TABLE partitions ADD COLUMN relocation VARCHAR(512) NOT NULL DEFAULT ''"],
    9: ["ALTER TABLE partitions ADD COLUMN failed_on JSON"],
    10: [_adding("partition_requests", "detached", "BOOLEAN NOT NULL DEFAULT false")],
    12: [_adding("partitions", "placement_note", "VARCHAR(512) NOT NULL DEFAULT ''")],
    13: [_adding("links", "breaker", "VARCHAR(512) NOT NULL DEFAULT ''"),
         _adding("links", "first_seen", "DOUBLE PRECISION NOT NULL DEFAULT 0")],
    14: [_adding("partitions", "may_move", "BOOLEAN NOT NULL DEFAULT false"),
         _adding("partitions", "expected_seconds", "BIGINT NOT NULL DEFAULT 0")],
    15: [_adding("partitions", "power_cycled_at", "TIMESTAMP WITH TIME ZONE")],
    16: [_adding("partitions", "compacted_at", "TIMESTAMP WITH TIME ZONE")],
    17: [_adding("agents", "drain", "JSON")],
    19: [_adding("partitions", "reservation", "VARCHAR(64) NOT NULL DEFAULT ''"), _give_reservations],
    20: [_adding("partitions", "account", "VARCHAR(64) NOT NULL DEFAULT ''"),
         _adding("partitions", "preemptible", "BOOLEAN NOT NULL DEFAULT false"),
         _adding("partitions", "reclaim_at", "DOUBLE PRECISION NOT NULL DEFAULT 0"),
         _adding("partitions", "reclaim_notice", "VARCHAR(512) NOT NULL DEFAULT ''"), _adding("reservations", "accounts", "JSON")],
    21: [_adding("partitions", "labels", "JSON")],
}

ID = String(64)


class Base(DeclarativeBase):
    pass


class MetaRow(Base):
    __tablename__ = "vipu_meta"
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(String(256))


class AgentRow(Base):
    __tablename__ = "agents"
    id: Mapped[str] = mapped_column(ID, primary_key=True)
    host: Mapped[str] = mapped_column(String(255))
    port: Mapped[int] = mapped_column(Integer)
    status: Mapped[str] = mapped_column(String(16))
    discovery_mode: Mapped[str] = mapped_column(String(16))
    last_error: Mapped[str] = mapped_column(String(1024), default="")
    inventory: Mapped[dict] = mapped_column(JSON)
    drain: Mapped[dict | None] = mapped_column(JSON, nullable=True)  # an operator's drain: reason, by, since
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())


class ClusterRow(Base):
    __tablename__ = "clusters"
    id: Mapped[str] = mapped_column(ID, primary_key=True)
    topology: Mapped[str] = mapped_column(String(16))
    num_ilds: Mapped[int] = mapped_column(Integer)
    gw_topology: Mapped[str | None] = mapped_column(String(16), nullable=True)
    members: Mapped[list[ClusterAgentRow]] = relationship(
        order_by="ClusterAgentRow.position", cascade="all, delete-orphan", lazy="selectin"
    )


class ClusterAgentRow(Base):
    __tablename__ = "cluster_agents"
    cluster_id: Mapped[str] = mapped_column(ForeignKey("clusters.id", ondelete="CASCADE"), primary_key=True)
    position: Mapped[int] = mapped_column(Integer, primary_key=True)
    agent_id: Mapped[str] = mapped_column(ForeignKey("agents.id"), unique=True)


class AllocationRow(Base):
    __tablename__ = "allocations"
    id: Mapped[str] = mapped_column(ID, primary_key=True)
    cluster_id: Mapped[str] = mapped_column(ForeignKey("clusters.id"), index=True)
    members: Mapped[list[AllocationAgentRow]] = relationship(
        order_by="AllocationAgentRow.position", cascade="all, delete-orphan", lazy="selectin"
    )


class AllocationAgentRow(Base):
    __tablename__ = "allocation_agents"
    allocation_id: Mapped[str] = mapped_column(ForeignKey("allocations.id", ondelete="CASCADE"), primary_key=True)
    position: Mapped[int] = mapped_column(Integer, primary_key=True)
    agent_id: Mapped[str] = mapped_column(ForeignKey("agents.id"), unique=True)


class PartitionRow(Base):
    __tablename__ = "partitions"
    id: Mapped[str] = mapped_column(ID, primary_key=True)
    cluster_id: Mapped[str] = mapped_column(ForeignKey("clusters.id"), index=True)
    allocation_id: Mapped[str] = mapped_column(ForeignKey("allocations.id"), index=True)
    size: Mapped[int] = mapped_column(Integer)
    num_gcds: Mapped[int] = mapped_column(Integer)
    num_replicas: Mapped[int] = mapped_column(Integer)
    reconfigurable: Mapped[bool] = mapped_column(Boolean)
    sync_type: Mapped[str] = mapped_column(String(48))
    ipulink_routing: Mapped[str] = mapped_column(String(16))
    gw_routing: Mapped[str] = mapped_column(String(16))
    num_segments: Mapped[int] = mapped_column(Integer)
    ready_state: Mapped[str] = mapped_column(String(16), index=True)
    operation_state: Mapped[str] = mapped_column(String(16))
    errors: Mapped[list] = mapped_column(JSON, default=list)
    disable_auto_reset: Mapped[bool] = mapped_column(Boolean, default=False)
    auto_reset_count: Mapped[int] = mapped_column(Integer, default=0)
    last_auto_reset_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    power_cycled_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    compacted_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)  # its last move by compaction
    owner: Mapped[str] = mapped_column(String(64), default="", server_default="")
    attach_key: Mapped[str] = mapped_column(String(64), default="", server_default="")
    relocatable: Mapped[bool] = mapped_column(Boolean, default=False, server_default=text("false"))
    relocation: Mapped[str] = mapped_column(String(512), default="", server_default="")  # where it last moved, and why
    failed_on: Mapped[list | None] = mapped_column(JSON, nullable=True)  # the agents it was moved off, failing it
    placement_note: Mapped[str] = mapped_column(String(512), default="", server_default="")  # the unhealthy links it was placed around
    may_move: Mapped[bool] = mapped_column(Boolean, default=False, server_default=text("false"))  # moved while attached, by consent
    expected_seconds: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")  # from its start; 0: unknown
    reservation: Mapped[str] = mapped_column(ID, default="", server_default="")  # the reservation it was made in; "": none
    account: Mapped[str] = mapped_column(ID, default="", server_default="")  # the account it was made on; "": none
    preemptible: Mapped[bool] = mapped_column(Boolean, default=False, server_default=text("false"))
    reclaim_at: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")  # when a reclaim removes it; 0: none
    reclaim_notice: Mapped[str] = mapped_column(String(512), default="", server_default="")
    labels: Mapped[dict | None] = mapped_column(JSON, nullable=True)  # the workload it is for (`Partition.labels`)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    ipus: Mapped[list[PartitionIpuRow]] = relationship(
        order_by="PartitionIpuRow.routing_id", cascade="all, delete-orphan", lazy="selectin"
    )


class PartitionIpuRow(Base):
    __tablename__ = "partition_ipus"
    __table_args__ = (UniqueConstraint("agent_id", "ipu_index", name="one_partition_per_ipu"),)
    partition_id: Mapped[str] = mapped_column(ForeignKey("partitions.id", ondelete="CASCADE"), primary_key=True)
    routing_id: Mapped[int] = mapped_column(Integer, primary_key=True)
    agent_id: Mapped[str] = mapped_column(ForeignKey("agents.id"), index=True)
    ipu_index: Mapped[int] = mapped_column(Integer)
    ild: Mapped[int] = mapped_column(Integer)
    topology_id: Mapped[int] = mapped_column(Integer)
    segment: Mapped[int] = mapped_column(Integer)
    gcd: Mapped[int] = mapped_column(Integer)


class PartitionRequestRow(Base):
    """A partition request waiting for room in an allocation (`vipu.model.queue`): the row exists
    while it waits. `sequence` is its arrival order, first come first served."""

    __tablename__ = "partition_requests"
    __table_args__ = ({"sqlite_autoincrement": True},)  # an arrival number is never given twice
    sequence: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    partition_id: Mapped[str] = mapped_column(ID, unique=True)
    allocation_id: Mapped[str] = mapped_column(ForeignKey("allocations.id", ondelete="CASCADE"), index=True)
    owner: Mapped[str] = mapped_column(String(64), default="")
    requirements: Mapped[dict] = mapped_column(JSON)  # the PartitionRequest's fields
    keep_on_error: Mapped[bool] = mapped_column(Boolean, default=False)
    since: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    deadline: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    held: Mapped[list] = mapped_column(JSON, default=list)  # [[agent, index], ...] held for it while it is first
    detached: Mapped[bool] = mapped_column(Boolean, default=False)  # no waiter's lease: picked up later


class ReservationRow(Base):
    """IPUs of an allocation set aside for a time (`vipu.model.reservations`), written by its owner alone."""

    __tablename__ = "reservations"
    name: Mapped[str] = mapped_column(ID, primary_key=True)
    allocation_id: Mapped[str] = mapped_column(ForeignKey("allocations.id", ondelete="CASCADE"), index=True)
    ipus: Mapped[list[tuple[str, int]]] = mapped_column(JSON)  # [[agent, index], ...]
    starts_at: Mapped[float] = mapped_column(Float)  # seconds since the epoch
    ends_at: Mapped[float] = mapped_column(Float)
    reason: Mapped[str] = mapped_column(String(256), default="")
    maintenance: Mapped[bool] = mapped_column(Boolean, default=False)
    users: Mapped[list[str]] = mapped_column(JSON, default=list)
    made_by: Mapped[str] = mapped_column(String(64), default="")
    created: Mapped[float] = mapped_column(Float, default=0.0)
    accounts: Mapped[list[str] | None] = mapped_column(JSON, nullable=True)  # whose partitions may be made in it


class AccountRow(Base):
    """A team sharing the pod (`vipu.model.accounts`): its users, cohort and quotas."""

    __tablename__ = "accounts"
    name: Mapped[str] = mapped_column(ID, primary_key=True)
    users: Mapped[list[str]] = mapped_column(JSON, default=list)
    cohort: Mapped[str] = mapped_column(ID, default="")
    quotas: Mapped[dict] = mapped_column(JSON, default=dict)  # allocation ("": each) -> {"ipus": N, "limits": ["64+:partitions=2"]}
    created: Mapped[float] = mapped_column(Float, default=0.0)


class UsageRecordRow(Base):
    """What a partition used, written in the transaction that removes it: its IPUs from its start to
    its end, on its account and for its user (`vipu-admin report usage`). Records older than the
    ledger keeps whole are folded into one per account, user, allocation and day."""

    __tablename__ = "usage_records"
    __table_args__ = (Index("usage_records_by_end", "ended"), {"sqlite_autoincrement": True})
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    partition_id: Mapped[str] = mapped_column(ID)  # "" for a day's fold
    allocation_id: Mapped[str] = mapped_column(ID)
    account: Mapped[str] = mapped_column(ID, default="")
    user_id: Mapped[str] = mapped_column(String(64), default="")
    size: Mapped[int] = mapped_column(Integer)  # IPUs; 0 for a day's fold
    started: Mapped[float] = mapped_column(Float)  # seconds since the epoch
    ended: Mapped[float] = mapped_column(Float)
    ipu_seconds: Mapped[float] = mapped_column(Float)  # spread evenly from its start to its end


class ClusterTestRunRow(Base):
    """The last cluster test (one row), kept so its results outlive the controller."""

    __tablename__ = "cluster_test_runs"
    key: Mapped[str] = mapped_column(String(16), primary_key=True)
    cluster_id: Mapped[str] = mapped_column(ID)
    state: Mapped[str] = mapped_column(String(16))
    tests: Mapped[list] = mapped_column(JSON)
    outcomes: Mapped[list] = mapped_column(JSON)


class CableVerdictsRow(Base):
    """Each cluster's cables as its tests last judged them (`vipu.model.clustertests.CableVerdicts`),
    gone with the cluster."""

    __tablename__ = "cable_verdicts"
    cluster_id: Mapped[str] = mapped_column(ForeignKey("clusters.id", ondelete="CASCADE"), primary_key=True)
    run_state: Mapped[str] = mapped_column(String(16))
    cables: Mapped[dict] = mapped_column(JSON)  # Cable.key -> {"verdict": ..., "lines": [...]}


class UserRow(Base):
    """A user of secure mode. The access key is kept only as a salted scrypt hash."""

    __tablename__ = "users"
    id: Mapped[str] = mapped_column(ID, primary_key=True)
    role: Mapped[str] = mapped_column(String(16))
    key_salt: Mapped[bytes] = mapped_column(LargeBinary(32))
    key_hash: Mapped[bytes] = mapped_column(LargeBinary(64))
    key_version: Mapped[int] = mapped_column(Integer, default=1)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    grants: Mapped[list[UserAllocationRow]] = relationship(
        order_by="UserAllocationRow.allocation_id", cascade="all, delete-orphan", lazy="selectin"
    )


class UserAllocationRow(Base):
    __tablename__ = "user_allocations"
    user_id: Mapped[str] = mapped_column(ForeignKey("users.id", ondelete="CASCADE"), primary_key=True)
    allocation_id: Mapped[str] = mapped_column(ForeignKey("allocations.id", ondelete="CASCADE"), primary_key=True)


class LeaseRow(Base):
    """A named lease: who holds it, until when by the database's clock, and in which term.

    The term grows each time the lease changes hands, so a deposed holder can tell that it was.
    """

    __tablename__ = "leases"
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    holder: Mapped[str] = mapped_column(String(255))
    address: Mapped[str] = mapped_column(String(255))
    term: Mapped[int] = mapped_column(Integer)
    expires: Mapped[float] = mapped_column(Float)  # seconds since the epoch, by the database's clock


# The link ledger (`vipu.store.links`): not tied to the agents' rows, so that a machine's links
# keep their history when it is removed and registered again. Times are seconds since the epoch.
PLACE = String(16)


class LinkRow(Base):
    __tablename__ = "links"
    agent_id: Mapped[str] = mapped_column(ID, primary_key=True)
    place: Mapped[str] = mapped_column(PLACE, primary_key=True)
    health: Mapped[str] = mapped_column(String(16), index=True)
    reason: Mapped[str] = mapped_column(String(1024))
    changed_at: Mapped[float] = mapped_column(Float)
    cable_serial: Mapped[str] = mapped_column(String(64), default="")
    cable_since: Mapped[float] = mapped_column(Float, default=0.0)
    test_failure: Mapped[str] = mapped_column(String(1024), default="")
    last_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    last_corrected: Mapped[int] = mapped_column(BigInteger, default=0)
    last_recoveries: Mapped[int] = mapped_column(BigInteger, default=0)
    last_up: Mapped[bool] = mapped_column(Boolean, default=True)
    breaker: Mapped[str] = mapped_column(String(512), default="", server_default="")  # why a failed link is not quarantined
    first_seen: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")


class LinkRemediationRow(Base):
    """An automatic remediation of a link (reset, re-test): what the caps count."""

    __tablename__ = "link_remediations"
    __table_args__ = (Index("link_remediations_by_machine", "agent_id", "at"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    agent_id: Mapped[str] = mapped_column(ID)
    place: Mapped[str] = mapped_column(PLACE)
    at: Mapped[float] = mapped_column(Float)
    outcome: Mapped[str] = mapped_column(String(1024), default="")


class LinkSampleRow(Base):
    __tablename__ = "link_samples"
    __table_args__ = (Index("link_samples_by_link", "agent_id", "place", "at"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    agent_id: Mapped[str] = mapped_column(ID)
    place: Mapped[str] = mapped_column(PLACE)
    at: Mapped[float] = mapped_column(Float)
    corrected: Mapped[int] = mapped_column(BigInteger)
    recoveries: Mapped[int] = mapped_column(BigInteger)
    up: Mapped[bool] = mapped_column(Boolean)


class LinkSummaryRow(Base):
    __tablename__ = "link_summaries"
    agent_id: Mapped[str] = mapped_column(ID, primary_key=True)
    place: Mapped[str] = mapped_column(PLACE, primary_key=True)
    start: Mapped[float] = mapped_column(Float, primary_key=True)
    end: Mapped[float] = mapped_column(Float)
    samples: Mapped[int] = mapped_column(Integer)
    down: Mapped[int] = mapped_column(Integer)
    corrected_growth: Mapped[int] = mapped_column(BigInteger)
    recovery_growth: Mapped[int] = mapped_column(BigInteger)
    last_corrected: Mapped[int] = mapped_column(BigInteger)
    last_recoveries: Mapped[int] = mapped_column(BigInteger)


class MachineLogRow(Base):
    """A line of a machine's log as its agent shipped it (`vipu-admin logs agent`); the latest
    KEPT_MACHINE_LOG_LINES of each machine are kept."""

    __tablename__ = "machine_log_lines"
    __table_args__ = (Index("machine_log_by_agent", "agent_id", "id"),)
    # 64 bits where the database has them (SQLite's INTEGER primary key is its 64-bit row id): a pod
    # logging thousands of lines a second would use up 32 bits within weeks.
    id: Mapped[int] = mapped_column(BigInteger().with_variant(Integer, "sqlite"), primary_key=True, autoincrement=True)
    agent_id: Mapped[str] = mapped_column(ID)
    agent_incarnation: Mapped[str] = mapped_column(String(32))  # the agent's run that numbered it
    agent_sequence: Mapped[int] = mapped_column(BigInteger)  # its number at the agent: where collecting goes on from
    at: Mapped[float] = mapped_column(Float)
    source: Mapped[str] = mapped_column(String(16))
    text: Mapped[str] = mapped_column(String(1024))


class LinkEventRow(Base):
    __tablename__ = "link_events"
    __table_args__ = (Index("link_events_by_link", "agent_id", "place", "at"),)
    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    agent_id: Mapped[str] = mapped_column(ID)
    place: Mapped[str] = mapped_column(PLACE)
    at: Mapped[float] = mapped_column(Float, index=True)
    health: Mapped[str] = mapped_column(String(16))
    reason: Mapped[str] = mapped_column(String(1024))
    partitions: Mapped[list] = mapped_column(JSON, default=list)


class CableRow(Base):
    """A cable as met at one of its ends (a cable has a row for each end; moved to another port, another)."""

    __tablename__ = "cables"
    serial: Mapped[str] = mapped_column(String(64), primary_key=True)
    agent_id: Mapped[str] = mapped_column(ID, primary_key=True)
    place: Mapped[str] = mapped_column(PLACE, primary_key=True)
    vendor: Mapped[str] = mapped_column(String(64))
    model: Mapped[str] = mapped_column(String(64))
    first_seen: Mapped[float] = mapped_column(Float)
    replaced: Mapped[str] = mapped_column(String(64), default="")
