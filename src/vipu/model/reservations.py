"""Reservations: IPUs of an allocation set aside for a time, for a maintenance window or for people.

A reservation sets a shape of IPUs aside (whole machines, for a maintenance window) from its start to
its end. Its allocation's owner keeps to these rules:

- before its start, a partition may be placed on those IPUs only if it is expected to end by the
  start (it gives an expected duration): the rule by which the queue backfills onto the IPUs held
  for its first request (`vipu.model.waiting.ends_in_time`);
- from its start, only partitions made in it (`--reservation NAME`, by one of its users or on one
  of its accounts) are placed there; a maintenance window takes none: its machines drain as an operator's drain
  does (`Reservation.drain`), relocatable partitions moving off and the others left to finish;
- at its end it is over, and its IPUs are free again: nothing has to be resumed.

Two reservations of one allocation never share an IPU at the same time.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Set
from dataclasses import dataclass

from vipu.model.entities import IPUS_PER_MACHINE, Drain, check_id, checked_reason, natural_key, operator_name
from vipu.model.errors import InvalidArgument
from vipu.model.placement import is_power_of_two
from vipu.model.reasons import span
from vipu.model.times import duration_text, utc_text
from vipu.model.topology import ClusterLayout
from vipu.model.waiting import ends_in_time

Ipu = tuple[str, int]  # (agent, index)
MAX_RESERVATION_SECONDS = 366 * 86_400  # how far ahead a reservation may end: a year and a day
TO_COME, UNDER_WAY, OVER = "TO COME", "UNDER WAY", "OVER"  # where a reservation stands (`Reservation.phase`)


@dataclass(frozen=True)
class Reservation:
    name: str
    allocation_id: str
    ipus: frozenset[Ipu]
    start: float  # seconds since the epoch
    end: float
    reason: str = ""
    maintenance: bool = False  # a maintenance window: its machines drain for its time, and no partition is made in it
    users: tuple[str, ...] = ()  # who may make partitions in it (a reservation for people)
    by: str = ""  # the operator who made it
    created: float = 0.0
    accounts: tuple[str, ...] = ()  # whose partitions may be made in it, whoever makes them (`vipu.model.accounts`)

    @property
    def kind(self) -> str:
        return "maintenance window" if self.maintenance else "reservation"

    @property
    def agent_ids(self) -> tuple[str, ...]:
        return tuple(sorted({agent for agent, _ in self.ipus}, key=natural_key))

    @property
    def size(self) -> int:
        return len(self.ipus)

    @property
    def operator(self) -> str:
        return operator_name(self.by)

    def started(self, now: float) -> bool:
        return self.start <= now

    def ended(self, now: float) -> bool:
        return self.end <= now

    def under_way(self, now: float) -> bool:
        return self.started(now) and not self.ended(now)

    def during(self, start: float, end: float) -> bool:
        """Whether it keeps its IPUs at some time between `start` and `end`."""
        return self.start < end and start < self.end

    def phase(self, now: float) -> str:
        """Where it stands, as listings say it: TO COME, UNDER WAY or OVER."""
        return OVER if self.ended(now) else UNDER_WAY if self.started(now) else TO_COME

    def describe(self) -> str:
        """How a refusal or a listing names it: `maintenance window mw1 (firmware update) from ... to ...`."""
        why = f" ({self.reason})" if self.reason else ""
        return f"{self.kind} {self.name}{why} from {utc_text(self.start)} to {utc_text(self.end)}"

    def closed(self, now: float) -> str:
        """Why no partition is made in it now, as a refusal or a waiting request's reason says it:
        it is over, or has not started; "" while it is under way."""
        if self.ended(now):
            return f"{self.describe()} is over"
        if not self.started(now):
            return f"{self.describe()} has not started: a partition is made in it from its start"
        return ""

    def no_room(self, why: str) -> str:
        """A request made in it that does not fit, and `why` (placement's words of its machines)."""
        return f"no room in {self.describe()}: {why}"

    def drain(self) -> Drain:
        """What a maintenance window is to its machines while it lasts: a drain, by its maker, since its start."""
        why = f": {self.reason}" if self.reason else ""
        return Drain(f"maintenance window {self.name} until {utc_text(self.end)}{why}", self.by, self.start)

    def admits(self, user_id: str, unrestricted: bool, account: str = "") -> bool:
        """Whether this user may make a partition in it (on `account`): one of its users, or a
        partition on one of its accounts, or anyone where nobody is known (open mode) or an
        administrator; nobody in a maintenance window."""
        return not self.maintenance and (unrestricted or not user_id or user_id in self.users or
                                         bool(account and account in self.accounts))

    @property
    def for_whom(self) -> str:
        """Who it is for, as a refusal names them: `alice, bob and account physics`."""
        accounts = f"account{'s' if len(self.accounts) > 1 else ''} {', '.join(self.accounts)}" if self.accounts else ""
        return " and ".join(filter(None, (", ".join(self.users), accounts)))

    def refusal(self, user_id: str, account: str = "") -> str:
        """Why a user it does not admit (`admits`) may make no partition in it."""
        if self.maintenance:
            return f"{self.describe()} is a maintenance window: no partition is made in it"
        return f"{self.describe()} is for {self.for_whom}, not for user {user_id}" + (f" on account {account}" if account else "")

    def overlaps(self, other: Reservation) -> bool:
        """Whether the two keep an IPU at the same time."""
        return self.during(other.start, other.end) and not self.ipus.isdisjoint(other.ipus)


def kept_from(reservations: Iterable[Reservation], named: str, expected_seconds: int, now: float) -> dict[Ipu, Reservation]:
    """The IPUs a request may not be placed on now, and the reservation keeping each: those of
    every reservation under way but the one it names (`named`), and of every one to come that it
    is not expected to end before."""
    kept: dict[Ipu, Reservation] = {}
    for reservation in reservations:
        if reservation.ended(now) or reservation.name == named:
            continue
        if reservation.started(now) or not ends_in_time(expected_seconds or None, reservation.start, now):
            kept.update(dict.fromkeys(reservation.ipus, reservation))
    return kept


def kept_refusal(size: int, where: str, kept: Mapping[Ipu, Reservation], used: Mapping[str, Set[int]], expected_seconds: int,
                 now: float, layout: ClusterLayout) -> str:
    """The refusal of a request of `size` IPUs that reservations alone keep off (it would fit in
    `where` on their IPUs): the free IPUs each keeps from it, and why it may not use them."""
    free = {ipu: r for ipu, r in kept.items() if ipu[1] not in used.get(ipu[0], ())}
    return f"no room for {size} IPUs in {where} but on reserved ones: {_kept_clause(free, expected_seconds, now, layout)}"


def _ipus_text(layout: ClusterLayout, ipus: Iterable[Ipu]) -> str:
    """Reserved IPUs as a clause names them: `the IPUs of ag5-ag8` (whole machines), else as `span`
    has them (`ag3 IPUs 0-1`)."""
    text = span(layout, ipus)
    return text if " IPU" in text else f"the IPUs of {text}"


def _kept_clause(kept: Mapping[Ipu, Reservation], expected_seconds: int, now: float, layout: ClusterLayout) -> str:
    """Why a request may not use these reserved IPUs, naming each reservation."""
    by_reservation: dict[Reservation, list[Ipu]] = {}
    for ipu, reservation in kept.items():
        by_reservation.setdefault(reservation, []).append(ipu)
    clauses = []
    for reservation, ipus in sorted(by_reservation.items(), key=lambda item: item[0].name):
        held = f"{_ipus_text(layout, ipus)} {'are' if len(ipus) > 1 else 'is'} kept for {reservation.describe()}"
        if reservation.started(now):
            clauses.append(held + ("" if reservation.maintenance else " (its users name it: --reservation)"))
        elif not expected_seconds:
            clauses.append(f"{held}, and with no expected duration it may not start there before")
        else:
            clauses.append(f"{held}, and it is expected to run {duration_text(expected_seconds)}, past the start")
    return "; ".join(clauses)


def outside(reservation: Reservation, agent_ids: Iterable[str]) -> dict[Ipu, Reservation]:
    """The allocation's IPUs outside the reservation: where a partition made in it may not go."""
    return {(agent, index): reservation for agent in agent_ids for index in range(IPUS_PER_MACHINE)
            if (agent, index) not in reservation.ipus}


def check_reservation(reservation: Reservation, now: float, size: int = 0) -> None:
    """InvalidArgument naming what is wrong with a reservation whatever the allocation holds (its
    IPUs apart), or with the `size` it asks for (whole machines, for a maintenance window)."""
    check_id("reservation", reservation.name)
    if size and not is_power_of_two(size):
        raise InvalidArgument(f"a reservation's size is a power of two, as a partition's is, not {size}")
    if size and reservation.maintenance and size % IPUS_PER_MACHINE:
        raise InvalidArgument(f"a maintenance window takes whole machines: a size of {IPUS_PER_MACHINE} IPUs or more, not {size}")
    checked_reason(reservation.reason, "a reservation")
    if reservation.end <= now:
        raise InvalidArgument(f"reservation {reservation.name} would end in the past ({utc_text(reservation.end)})")
    if reservation.end <= reservation.start:
        raise InvalidArgument(f"reservation {reservation.name} ends ({utc_text(reservation.end)}) before it starts "
                              f"({utc_text(reservation.start)})")
    if reservation.end > now + MAX_RESERVATION_SECONDS:
        raise InvalidArgument(f"reservation {reservation.name} ends more than {duration_text(MAX_RESERVATION_SECONDS)} ahead")
    if reservation.maintenance and (reservation.users or reservation.accounts):
        raise InvalidArgument("a maintenance window is for no user: give --maintenance or --users/--accounts, not both")
    if not reservation.maintenance and not reservation.users and not reservation.accounts:
        raise InvalidArgument("a reservation is for its users (--users U,...) or accounts (--accounts A,...), or is a maintenance "
                              "window (--maintenance)")
    for account in reservation.accounts:
        check_id("account", account)


def in_use(reservation: Reservation, used: Mapping[str, Set[int]]) -> int:
    """How many of its IPUs partitions hold now."""
    return sum(1 for agent, index in reservation.ipus if index in used.get(agent, ()))
