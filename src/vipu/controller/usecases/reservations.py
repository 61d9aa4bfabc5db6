"""Reservations (`vipu.model.reservations`): an administrator makes and removes them, through the
owner of their allocation, which alone decides what is placed on its IPUs; anyone lists those of
the allocations they may use, as the owners last committed them."""

from __future__ import annotations

import builtins
import math
import typing
from dataclasses import dataclass

from vipu.controller.core.commands import START_SECONDS, Reserve, Unreserve
from vipu.controller.core.owners import Owners
from vipu.model.entities import OPEN_ACCESS, Access, shown
from vipu.model.errors import AlreadyExists, InvalidArgument, NotFound
from vipu.model.reservations import Reservation, in_use
from vipu.store.store import Store


@dataclass(frozen=True)
class ReservationView:
    reservation: Reservation
    ipus_in_use: int  # of its IPUs, those partitions hold now


class ReservationService:
    def __init__(self, store: Store, owners: Owners):
        self.store = store
        self.owners = owners

    def create(self, name: str, start: float, end: float, reason: str, by: str = "", *, agent_ids: tuple[str, ...] = (),
               size: int = 0, allocation_id: str = "", maintenance: bool = False, users: tuple[str, ...] = (),
               accounts: tuple[str, ...] = ()) -> ReservationView:
        """Reserve the named machines (whole, of one allocation), or `size` IPUs of an allocation
        (the only one, if there is one), from `start` (one past is now) to `end`, seconds since
        the epoch: a maintenance window, or for `users` and `accounts`. All checked by the allocation's owner
        against its other reservations; nothing is written if it is refused."""
        if not (math.isfinite(start) and math.isfinite(end)):
            raise InvalidArgument("a reservation's start and end are times (seconds since the epoch)")
        if bool(agent_ids) == bool(size):
            raise InvalidArgument("reserve machines (--agents) or a number of IPUs (--size), one of the two")
        if self.find(name) is not None:
            raise AlreadyExists(f"reservation {name} already exists")
        allocation_id = self._allocation_of(agent_ids, allocation_id)
        command = Reserve(name=name, start=start, end=end, reason=reason.strip(), by=by, maintenance=maintenance,
                          users=tuple(dict.fromkeys(u.strip() for u in users if u.strip())),
                          accounts=tuple(dict.fromkeys(a.strip() for a in accounts if a.strip())),
                          agent_ids=tuple(dict.fromkeys(agent_ids)), size=size)
        reservation = self._ask(allocation_id, command, f"the reservation {name}")
        return self._view(reservation)

    def remove(self, name: str) -> Reservation:
        """Remove a reservation (one over, or one to come or under way: a maintenance window's
        machines resume at once)."""
        found = self.find(name)
        if found is None:
            raise NotFound(f"reservation {shown(name)} does not exist")
        return self._ask(found.allocation_id, Unreserve(name=name), f"the removal of reservation {name}")

    def list(self, allocation_id: str = "", access: Access = OPEN_ACCESS) -> builtins.list[ReservationView]:
        """The reservations of the allocations the caller may use (of one, if named), by start."""
        views = []
        for allocation in self.store.configuration().allocations.values():
            if (allocation_id and allocation.id != allocation_id) or not access.may_use(allocation.id):
                continue
            owner = self.owners.owner(allocation.id)
            if owner is not None:
                snapshot = owner.snapshot
                views += [ReservationView(r, in_use(r, snapshot.used)) for r in snapshot.reservations.values()]
        return sorted(views, key=lambda view: (view.reservation.start, view.reservation.name))

    def find(self, name: str) -> Reservation | None:
        """The reservation of that name, in whichever allocation it is; None if there is none."""
        return next((view.reservation for view in self.list() if view.reservation.name == name), None)

    def _view(self, reservation: Reservation) -> ReservationView:
        owner = self.owners.owner(reservation.allocation_id)
        return ReservationView(reservation, in_use(reservation, owner.snapshot.used) if owner is not None else 0)

    def _allocation_of(self, agent_ids: tuple[str, ...], allocation_id: str) -> str:
        """The allocation a reservation is made in: that of the machines named (one for them all),
        or the one named, or the only one there is."""
        configuration = self.store.configuration()
        if agent_ids:
            allocations = {}
            for agent_id in agent_ids:
                if agent_id not in configuration.agents:
                    raise NotFound(f"agent {shown(agent_id)} does not exist")
                holder = configuration.allocation_of(agent_id)
                if not holder:
                    raise InvalidArgument(f"agent {agent_id} is in no allocation: no partition is placed on it to keep off")
                allocations[holder] = agent_id
            if len(allocations) > 1:
                raise InvalidArgument(f"a reservation's machines are of one allocation; these are of {', '.join(sorted(allocations))}")
            (found,) = allocations
            if allocation_id and allocation_id != found:
                raise InvalidArgument(f"the machines named are in allocation {found}, not {allocation_id}")
            return found
        if allocation_id:
            if allocation_id not in configuration.allocations:
                raise NotFound(f"allocation {shown(allocation_id)} does not exist")
            return allocation_id
        if len(configuration.allocations) != 1:
            raise InvalidArgument(f"name the allocation to reserve IPUs of (--allocation): there are {len(configuration.allocations)}")
        return next(iter(configuration.allocations))

    def _ask(self, allocation_id: str, command: Reserve | Unreserve, what: str) -> Reservation:
        owner = self.owners.owner(allocation_id)
        if owner is None:
            raise NotFound(f"allocation {shown(allocation_id)} does not exist")
        owner.submit(command)
        return typing.cast(Reservation, command.reply.wait(START_SECONDS, what))
