"""Reservations (`vipu.model.reservations`) in the store: a row each until it is removed.

Their allocation's owner is their only writer, with plain statements on the driver's connection
as its other writes are, so a reservation is committed in the turn that decides it; a reservation
whose end has passed is left in its row until it is removed (the listing says it is over).
"""

from __future__ import annotations

import json
import typing

from sqlalchemy import Row, Table, select

from vipu.model.errors import AlreadyExists, ConcurrentUpdate, NotFound
from vipu.model.reservations import Reservation
from vipu.store.partitions import PartitionRepository, _Sql
from vipu.store.schema import ReservationRow

RESERVATIONS = typing.cast(Table, ReservationRow.__table__)
_COLUMNS = ("name", "allocation_id", "ipus", "starts_at", "ends_at", "reason", "maintenance", "users", "made_by", "created", "accounts")
INSERT_RESERVATION = _Sql(f"INSERT INTO reservations ({', '.join(_COLUMNS)}) VALUES "
                          "(:name, :allocation_id, :json_ipus, :starts_at, :ends_at, :reason, :maintenance, :json_users, :made_by, "
                          ":created, :json_accounts)")
DELETE_RESERVATION = _Sql("DELETE FROM reservations WHERE name = :name AND allocation_id = :allocation_id")


def _reservation(row: Row[typing.Any]) -> Reservation:
    return Reservation(row.name, row.allocation_id, frozenset((agent, index) for agent, index in row.ipus), float(row.starts_at),
                       float(row.ends_at), row.reason, bool(row.maintenance), tuple(row.users or ()), row.made_by, float(row.created),
                       tuple(row.accounts or ()))


class ReservationRepository(PartitionRepository):
    """The reservations' rows."""

    def list_reservations(self, allocation_id: str | None = None) -> list[Reservation]:
        """Every reservation (of one allocation), by name."""
        statement = select(RESERVATIONS).order_by(RESERVATIONS.c.name)
        if allocation_id is not None:
            statement = statement.where(RESERVATIONS.c.allocation_id == allocation_id)
        return [_reservation(row) for row in self.connection.execute(statement)]

    def add_reservation(self, reservation: Reservation) -> None:
        """Record a new reservation; AlreadyExists if one of its name is there."""
        values = {"name": reservation.name, "allocation_id": reservation.allocation_id,
                  "json_ipus": json.dumps([list(ipu) for ipu in sorted(reservation.ipus)]), "starts_at": reservation.start,
                  "ends_at": reservation.end, "reason": reservation.reason, "maintenance": reservation.maintenance,
                  "json_users": json.dumps(list(reservation.users)), "made_by": reservation.by, "created": reservation.created,
                  "json_accounts": json.dumps(list(reservation.accounts))}
        try:
            self._run(INSERT_RESERVATION, values)
        except ConcurrentUpdate:  # its name taken (in another allocation, say), or its allocation gone, meanwhile
            raise AlreadyExists(f"reservation {reservation.name} already exists, or its allocation was removed") from None

    def delete_reservation(self, reservation: Reservation) -> None:
        """Remove a reservation of the allocation; NotFound if it is not there."""
        gone = self._run(DELETE_RESERVATION, {"name": reservation.name, "allocation_id": reservation.allocation_id}).changed
        if gone != 1:
            raise NotFound(f"reservation {reservation.name} does not exist")
