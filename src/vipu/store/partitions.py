"""Partitions in the store: their rows and IPUs, and the life cycle's transitions as compare-and-sets.

Reading (when a controller starts to serve, or re-reads one row it lost a compare-and-set on) goes
through SQLAlchemy Core. Writing is the hot path (four transitions per partition made and
removed), so those statements are plain SQL run on the driver's connection under the
transaction's, prepared once per database: SQLAlchemy would cost ten times the statements
themselves. `schema` holds the tables and their constraints; a lost race on the unique IPU index
is ConcurrentUpdate.
"""

from __future__ import annotations

import json
import re
import time
import typing
from datetime import UTC, datetime

from sqlalchemy import Table, bindparam, select

from vipu import failpoints
from vipu.model import lifecycle
from vipu.model.entities import (
    GwRouting,
    IpuLinkRouting,
    OperationState,
    Partition,
    PlacedIpu,
    ReadyState,
    SyncType,
)
from vipu.model.errors import ConcurrentUpdate, Conflict, Unavailable
from vipu.model.usage import UsageRecord
from vipu.store.engines import first_line, is_integrity_error
from vipu.store.schema import PartitionIpuRow, PartitionRow
from vipu.store.transactions import TransactionBase

PARTITIONS = typing.cast(Table, PartitionRow.__table__)  # declared as a FromClause
IPUS = typing.cast(Table, PartitionIpuRow.__table__)
IPUS_IN_ALLOCATION = (select(IPUS.c.agent_id, IPUS.c.ipu_index).join(PARTITIONS, PARTITIONS.c.id == IPUS.c.partition_id)
                      .where(PARTITIONS.c.allocation_id == bindparam("allocation")))
IPUS_OF_PARTITIONS = (select(IPUS).where(IPUS.c.partition_id.in_(bindparam("ids", expanding=True)))
                      .order_by(IPUS.c.partition_id, IPUS.c.routing_id))

_COLUMNS = ("id", "cluster_id", "allocation_id", "size", "num_gcds", "num_replicas", "reconfigurable", "sync_type", "ipulink_routing",
            "gw_routing", "num_segments", "ready_state", "operation_state", "errors", "disable_auto_reset", "auto_reset_count",
            "owner", "attach_key", "relocatable", "relocation", "failed_on", "placement_note", "may_move", "expected_seconds",
            "reservation", "account", "preemptible", "reclaim_at", "reclaim_notice", "labels", "created_at")
_JSON_COLUMNS = {"errors", "failed_on", "labels"}
_IPU_COLUMNS = ("partition_id", "routing_id", "agent_id", "ipu_index", "ild", "topology_id", "segment", "gcd")


class _Sql:
    """One statement as each database's driver takes it: written with `:name` parameters (sqlite3's
    style), turned into psycopg's `%(name)s`, JSON parameters cast for PostgreSQL."""

    def __init__(self, sql: str):
        self.sqlite = sql
        postgres = re.sub(r":(\w+)", lambda m: f"CAST(%({m.group(1)})s AS JSON)" if m.group(1) in _JSON_COLUMNS or
                          m.group(1).startswith("json_") else f"%({m.group(1)})s", sql)
        self.postgres = postgres

    def text(self, is_sqlite: bool) -> str:
        return self.sqlite if is_sqlite else self.postgres


INSERT_PARTITION = _Sql(f"INSERT INTO partitions ({', '.join(_COLUMNS)}) VALUES ({', '.join(':' + c for c in _COLUMNS)})")
INSERT_IPU = _Sql(f"INSERT INTO partition_ipus ({', '.join(_IPU_COLUMNS)}) VALUES ({', '.join(':' + c for c in _IPU_COLUMNS)})")
IN_STATE = "id = :partition AND ready_state = :ready AND operation_state = :operation"
DELETE_IN_STATE = _Sql(f"DELETE FROM partitions WHERE {IN_STATE}")
DELETE_IPUS = _Sql("DELETE FROM partition_ipus WHERE partition_id = :partition")
INSERT_USAGE = _Sql("INSERT INTO usage_records (partition_id, allocation_id, account, user_id, size, started, ended, ipu_seconds) "
                    "VALUES (:partition_id, :allocation_id, :account, :user_id, :size, :started, :ended, :ipu_seconds)")
STATE_OF = _Sql("SELECT ready_state, operation_state FROM partitions WHERE id = :partition")
_UPDATES: dict[tuple[str, ...], _Sql] = {}


def _update(columns: tuple[str, ...]) -> _Sql:
    """UPDATE of the named columns of one partition, only while it is in the expected state."""
    statement = _UPDATES.get(columns)
    if statement is None:
        assignments = ", ".join(f"{c} = :json_new_{c}" if c in _JSON_COLUMNS else f"{c} = :new_{c}" for c in columns)
        statement = _UPDATES[columns] = _Sql(f"UPDATE partitions SET {assignments} WHERE {IN_STATE}")
    return statement


def _moment(moment: datetime, is_sqlite: bool) -> datetime | str:
    """A moment as the driver stores it: SQLite keeps SQLAlchemy's text form of UTC, PostgreSQL the moment."""
    return moment.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f") if is_sqlite else moment


def _utc(moment: datetime | None) -> datetime | None:
    """A stored moment as an aware UTC datetime (SQLite gives it back without its zone)."""
    if moment is None:
        return None
    return moment.replace(tzinfo=UTC) if moment.tzinfo is None else moment.astimezone(UTC)


def _placed(row) -> PlacedIpu:
    return PlacedIpu(row.agent_id, row.ipu_index, row.ild, row.topology_id, row.segment, row.routing_id, row.gcd)


def _partition(row, ipus: list[PlacedIpu]) -> Partition:
    return Partition(
        id=row.id, cluster_id=row.cluster_id, allocation_id=row.allocation_id, size=row.size, num_gcds=row.num_gcds,
        num_replicas=row.num_replicas, reconfigurable=row.reconfigurable, sync_type=SyncType(row.sync_type),
        ipulink_routing=IpuLinkRouting(row.ipulink_routing), gw_routing=GwRouting(row.gw_routing), num_segments=row.num_segments,
        ipus=ipus, ready_state=ReadyState(row.ready_state), operation_state=OperationState(row.operation_state),
        errors=list(row.errors or []), disable_auto_reset=row.disable_auto_reset, auto_reset_count=row.auto_reset_count,
        last_auto_reset=_utc(row.last_auto_reset_at), owner=row.owner or "", created=_utc(row.created_at),
        power_cycled=_utc(row.power_cycled_at), compacted=_utc(row.compacted_at),
        attach_key=row.attach_key or "", relocatable=bool(row.relocatable), relocation=row.relocation or "",
        failed_on=tuple(row.failed_on or ()), placement_note=row.placement_note or "", may_move=bool(row.may_move),
        expected_seconds=int(row.expected_seconds or 0), reservation=row.reservation or "", account=row.account or "",
        preemptible=bool(row.preemptible), reclaim_at=float(row.reclaim_at or 0.0), reclaim_notice=row.reclaim_notice or "",
        labels=dict(row.labels or {}),
    )


class _Outcome(typing.NamedTuple):
    changed: int
    row_id: int | None
    first: tuple | None


class PartitionRepository(TransactionBase):
    """The partitions' rows, read with SQLAlchemy and written with plain statements."""

    def _run(self, statement: _Sql | str, parameters: dict, many: list[dict] | None = None,
             conflict: str = "a concurrent change conflicted with this one; try again") -> _Outcome:
        """Run one statement on the driver's connection: the rows it changed, the row id it made
        and the first row it returned. The driver's errors become vipu's: a refused constraint
        ConcurrentUpdate(`conflict`), anything else Unavailable."""
        cursor = self.driver.cursor()
        try:
            sql = statement if isinstance(statement, str) else statement.text(self.is_sqlite)
            if many is not None:
                cursor.executemany(sql, many)
            else:
                cursor.execute(sql, parameters)
            first = cursor.fetchone() if cursor.description else None
            return _Outcome(cursor.rowcount, cursor.lastrowid if self.is_sqlite else None, first)
        except Exception as error:
            if is_integrity_error(error):
                raise ConcurrentUpdate(conflict) from error
            raise Unavailable(f"the store could not record the change: {first_line(error)}") from error
        finally:
            cursor.close()

    def get_partition(self, partition_id: str) -> Partition | None:
        partitions = self._partitions(PARTITIONS.c.id == partition_id)
        return partitions[0] if partitions else None

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
        failpoints.hit("store.partition.create")
        values = {
            "id": partition.id, "cluster_id": partition.cluster_id, "allocation_id": partition.allocation_id, "size": partition.size,
            "num_gcds": partition.num_gcds, "num_replicas": partition.num_replicas, "reconfigurable": partition.reconfigurable,
            "sync_type": partition.sync_type.value, "ipulink_routing": partition.ipulink_routing.value,
            "gw_routing": partition.gw_routing.value, "num_segments": partition.num_segments,
            "ready_state": partition.ready_state.value, "operation_state": partition.operation_state.value,
            "errors": json.dumps(list(partition.errors)), "disable_auto_reset": partition.disable_auto_reset,
            "auto_reset_count": partition.auto_reset_count, "owner": partition.owner, "attach_key": partition.attach_key,
            "relocatable": partition.relocatable, "relocation": partition.relocation, "failed_on": json.dumps(list(partition.failed_on)),
            "placement_note": partition.placement_note, "may_move": partition.may_move, "expected_seconds": partition.expected_seconds,
            "reservation": partition.reservation, "account": partition.account, "preemptible": partition.preemptible,
            "reclaim_at": partition.reclaim_at, "reclaim_notice": partition.reclaim_notice, "labels": json.dumps(partition.labels),
            "created_at": _moment(partition.created or datetime.now(UTC), self.is_sqlite),
        }
        taken = f"partition {partition.id} or the IPUs chosen for it were taken by a concurrent request"
        self._run(INSERT_PARTITION, values, conflict=taken)
        self._add_ipus(partition.id, partition.ipus, taken)

    def update_partition(self, partition: Partition, may_move: bool) -> None:
        """Record what its user changed of a partition (its consent to be moved while attached), as a
        compare-and-set on the state it was read in: refused with a `Conflict` naming both states
        when another operation changed it meanwhile. The partition object follows."""
        source = lifecycle.state_of(partition)
        expected = {"partition": partition.id, "ready": source[0].value, "operation": source[1].value}
        if self._run(_update(("may_move",)), {**expected, "new_may_move": may_move}).changed != 1:
            raise self._moved_meanwhile(partition.id, "update", source)
        partition.may_move = may_move

    def set_reclaim(self, partition: Partition, at: float, notice: str) -> None:
        """Record that a reclaim removes the partition at `at` (0: none does any more), and its
        notice, as a compare-and-set on the state it was read in; the partition object follows."""
        source = lifecycle.state_of(partition)
        expected = {"partition": partition.id, "ready": source[0].value, "operation": source[1].value}
        if self._run(_update(("reclaim_at", "reclaim_notice")), {**expected, "new_reclaim_at": at,
                                                                 "new_reclaim_notice": notice}).changed != 1:
            raise self._moved_meanwhile(partition.id, "reclaim", source)
        partition.reclaim_at, partition.reclaim_notice = at, notice

    def _record_usage(self, partition: Partition) -> None:
        """What a partition removed now used, from its start: its usage record, in the removal's transaction."""
        record = UsageRecord.of(partition, time.time())
        self._run(INSERT_USAGE, {"partition_id": record.partition_id, "allocation_id": record.allocation_id, "account": record.account,
                                 "user_id": record.user, "size": record.size, "started": record.started, "ended": record.ended,
                                 "ipu_seconds": record.ipu_seconds})

    def _moved_meanwhile(self, partition_id: str, change: str, expected: lifecycle.State) -> Conflict:
        """The refusal of a compare-and-set that found the partition in another state than `expected`, or gone."""
        row = self._run(STATE_OF, {"partition": partition_id}).first
        found = None if row is None else (ReadyState(row[0]), OperationState(row[1]))
        return lifecycle.moved_meanwhile(partition_id, change, expected, found)

    def _add_ipus(self, partition_id: str, ipus: list[PlacedIpu], conflict: str) -> None:
        self._run(INSERT_IPU, {}, conflict=conflict, many=[
            {"partition_id": partition_id, "routing_id": i.routing_id, "agent_id": i.agent_id, "ipu_index": i.index,
             "ild": i.ild, "topology_id": i.topology_id, "segment": i.segment, "gcd": i.gcd}
            for i in ipus
        ])

    def transition(self, partition: Partition, name: str, errors: list[str] | None = None,
                   auto_reset_count: int | None = None, ipus: list[PlacedIpu] | None = None,
                   relocation: str | None = None, failed_on: tuple[str, ...] | None = None,
                   power_cycled: datetime | None = None, compacted: datetime | None = None) -> lifecycle.State | None:
        """Apply the life cycle's transition `name` to a partition, as a compare-and-set on the state
        it was read in; the partition object follows. Refused with a `Conflict` naming both states
        when the table has no such move or another operation changed the partition meanwhile.
        `ipus` replaces its IPUs in the same statement group ('relocate'; taken ones are a lost race,
        ConcurrentUpdate), `relocation` records where it went and why, `failed_on` the machines it
        keeps off from then on, `compacted` when compaction moved it. Returns the state it went to
        (`lifecycle.ABSENT` when it is gone)."""
        source = lifecycle.state_of(partition)
        target = lifecycle.target(partition.id, name, source)
        failpoints.hit(f"store.partition.{name}")
        expected = {"partition": partition.id, "ready": source[0].value, "operation": source[1].value}
        values: dict = {}
        if target is lifecycle.ABSENT:
            changed = self._run(DELETE_IN_STATE, expected).changed
            if changed == 1:
                self._record_usage(partition)
        else:
            values = {"ready_state": target[0].value, "operation_state": target[1].value}
            if errors is not None:
                values["errors"] = json.dumps(list(errors))
            if auto_reset_count is not None:
                values["auto_reset_count"] = auto_reset_count
                values["last_auto_reset_at"] = datetime.now(UTC)
            if relocation is not None:
                values["relocation"] = relocation
            if failed_on is not None:
                values["failed_on"] = json.dumps(list(failed_on))
            if power_cycled is not None:
                values["power_cycled_at"] = power_cycled
            if compacted is not None:
                values["compacted_at"] = compacted
            parameters = {(f"json_new_{c}" if c in _JSON_COLUMNS else f"new_{c}"): (_moment(v, self.is_sqlite) if isinstance(v, datetime)
                                                                                     else v)
                          for c, v in values.items()}
            changed = self._run(_update(tuple(values)), {**expected, **parameters}).changed
        if changed != 1:
            raise self._moved_meanwhile(partition.id, name, source)
        if ipus is not None:
            self._run(DELETE_IPUS, {"partition": partition.id})
            self._add_ipus(partition.id, ipus, f"the IPUs chosen for partition {partition.id} were taken by a concurrent request")
        if target is not lifecycle.ABSENT:
            lifecycle.apply(partition, name, errors, auto_reset_count, ipus, relocation, failed_on, values.get("last_auto_reset_at"),
                            power_cycled, compacted)
        return target
