"""Requests waiting for room (`vipu.model.queue`) in the store: a row while a request waits.

Like the partitions, their writes are plain statements on the driver's connection; the request's
small life cycle is applied as a compare-and-set on its arrival number (`sequence`).
"""

from __future__ import annotations

import dataclasses
import json
import typing
from datetime import datetime

from sqlalchemy import Table, select

from vipu import failpoints
from vipu.model import queue
from vipu.model.entities import GwRouting, IpuLinkRouting, PartitionRequest, SyncType
from vipu.store.partitions import PartitionRepository, _moment, _Sql, _utc
from vipu.store.schema import PartitionRequestRow

REQUESTS = typing.cast(Table, PartitionRequestRow.__table__)
_COLUMNS = ("partition_id", "allocation_id", "owner", "requirements", "keep_on_error", "since", "deadline", "held", "detached")
INSERT_REQUEST = _Sql(f"INSERT INTO partition_requests ({', '.join(_COLUMNS)}) VALUES "
                      f"(:partition_id, :allocation_id, :owner, :json_requirements, :keep_on_error, :since, :deadline, :json_held, "
                      f":detached)")
REQUEST_OF_PARTITION = _Sql("SELECT sequence FROM partition_requests WHERE partition_id = :request")
THE_REQUEST = "sequence = :arrival AND partition_id = :request"
DELETE_REQUEST = _Sql(f"DELETE FROM partition_requests WHERE {THE_REQUEST}")
HOLD_FOR_REQUEST = _Sql(f"UPDATE partition_requests SET held = :json_held WHERE {THE_REQUEST}")


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
        request=_requirements_from_json(row.requirements), allocation_id=row.allocation_id, owner=row.owner or "",
        since=typing.cast(datetime, _utc(row.since)), deadline=typing.cast(datetime, _utc(row.deadline)),
        keep_on_error=row.keep_on_error, sequence=row.sequence, held=frozenset((agent, index) for agent, index in row.held or ()),
        detached=bool(row.detached),
    )


class RequestRepository(PartitionRepository):
    """The waiting requests' rows."""

    def list_requests(self, allocation_id: str | None = None) -> list[queue.WaitingRequest]:
        """Every waiting request (of one allocation), in arrival order."""
        statement = select(REQUESTS).order_by(REQUESTS.c.sequence)
        if allocation_id is not None:
            statement = statement.where(REQUESTS.c.allocation_id == allocation_id)
        return [_waiting(row) for row in self.connection.execute(statement)]

    def add_request(self, request: queue.WaitingRequest) -> None:
        """Record a request by its life cycle's 'enqueue'; it gets its arrival number. A request of
        that partition id found waiting is refused by the life cycle (a `Conflict`); one that
        appears meanwhile is a lost race (ConcurrentUpdate)."""
        failpoints.hit("store.request.enqueue")
        found = self._run(REQUEST_OF_PARTITION, {"request": request.partition_id}).first
        queue.target(request.partition_id, "enqueue", queue.ABSENT if found is None else queue.WAITING)
        values = {"partition_id": request.partition_id, "allocation_id": request.allocation_id, "owner": request.owner,
                  "json_requirements": json.dumps(_requirements_to_json(request.request)), "keep_on_error": request.keep_on_error,
                  "since": _moment(request.since, self.is_sqlite), "deadline": _moment(request.deadline, self.is_sqlite),
                  "json_held": json.dumps([list(ipu) for ipu in sorted(request.held)]), "detached": request.detached}
        insert = INSERT_REQUEST.text(self.is_sqlite) + ("" if self.is_sqlite else " RETURNING sequence")
        outcome = self._run(insert, values, conflict=f"a request for partition {request.partition_id} is already waiting, or its "
                                                     "allocation went, by a concurrent change")
        request.sequence = typing.cast(int, outcome.row_id if self.is_sqlite else typing.cast(tuple, outcome.first)[0])

    def end_request(self, request: queue.WaitingRequest, transition: str) -> None:
        """Apply 'grant', 'cancel' or 'expire': the request stops waiting, as a compare-and-set on its
        arrival number: the row deleted, it was WAITING; none, it no longer waits (another change
        ended it meanwhile), and the life cycle refuses the transition with a `Conflict`."""
        failpoints.hit(f"store.request.{transition}")
        gone = self._run(DELETE_REQUEST, {"arrival": request.sequence, "request": request.partition_id}).changed
        queue.target(request.partition_id, transition, queue.WAITING if gone == 1 else queue.ABSENT)

    def hold_for(self, request: queue.WaitingRequest, held: frozenset[tuple[str, int]]) -> None:
        """Record the IPUs held for a request while it is first; nothing if it no longer waits."""
        self._run(HOLD_FOR_REQUEST, {"arrival": request.sequence, "request": request.partition_id,
                                     "json_held": json.dumps([list(ipu) for ipu in sorted(held)])})
