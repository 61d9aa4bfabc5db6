"""Accounts: the teams that share a pod, what each may hold (its quota), what it may borrow, and
the order in which their waiting requests start (fair share).

An account has users and, per allocation, a quota: IPUs it is guaranteed (its *entitlement*) and,
optionally, limits by shape ("at most 2 partitions of 64 IPUs or more", "at most 128 IPUs in
partitions of 16 or more"). A quota set without an allocation holds in each allocation that has
none of its own. Where no account has a quota, an allocation is shared as before: first come,
first served with backfill.

Within an allocation its owner keeps to these rules (`Quotas.verdict`):

- a partition of an account starts if the account's IPUs with it stay within its quota;
- or, for an account in a *cohort* (a name: a flat group, so no cycle can be made of cohorts), if
  the cohort's IPUs with it stay within the sum of its members' quotas: it *borrows* idle quota of
  the others. It may not borrow while a member that reclaimed quota from it still waits (`barred_by`):
  so a partition reclaimed from a borrower is not re-admitted on borrowed quota while the lender
  waits, and no preemption cycle can form;
- limits by shape are never borrowed;
- an account with no quota in an allocation where others have one is held to nothing but room, and
  is entitled to nothing: its requests start after every entitled account's (fair share);
- a quota lowered below what an account holds takes effect as its partitions end: nothing is
  evicted for it.

When a member waits within its own quota and borrowers stand in its way, the owner *reclaims*:
`reclaim` chooses the fewest IPUs of preemptible partitions (a field their users set) of
borrowing accounts that make room, never taking a borrower below its own quota; they are told,
and removed after a grace period unless the room came meanwhile.

Fair share (`FairShare`) orders waiting requests of different accounts: each account's usage is
its IPU-seconds decayed with a half-life (Slurm's classic decayed usage), and the account that
has used least against its entitlement (usage share / entitled share) goes first; within an
account, first come first served.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from vipu.model.entities import check_id
from vipu.model.errors import InvalidArgument, NotFound, PermissionDenied

SAME = "same"  # an account map's word for "the front-end's name is the account's"
EVERY_ALLOCATION = ""  # the key of a quota that holds in each allocation without one of its own
DEFAULT_HALF_LIFE_SECONDS = 7 * 86_400.0  # how fast usage is forgotten, as Slurm's PriorityDecayHalfLife default
RECLAIM_CHECKS = 4096  # sets of partitions `reclaim` weighs at most before it settles for the best found
RECLAIM_SETS = 20_000  # sets of one count `reclaim` lists at most (those of more partitions are not weighed)
T = TypeVar("T")
_LIMIT = re.compile(r"\A(\d+)\+:(partitions|ipus)=(\d+)\Z")


@dataclass(frozen=True)
class ShapeLimit:
    """At most `partitions` partitions, or at most `ipus` IPUs in partitions, of `min_size` IPUs or more."""

    min_size: int
    partitions: int = 0  # 0: no limit on their number
    ipus: int = 0  # 0: no limit on their IPUs

    @classmethod
    def parse(cls, text: str) -> ShapeLimit:
        """`64+:partitions=2` or `16+:ipus=128`; InvalidArgument naming the form otherwise."""
        match = _LIMIT.match(text.strip())
        if match is None or int(match.group(1)) < 1 or int(match.group(3)) < 1:
            raise InvalidArgument(f"a shape limit is SIZE+:partitions=N or SIZE+:ipus=N (N above 0), as 64+:partitions=2, "
                                  f"not {text!r}")
        size, what, count = int(match.group(1)), match.group(2), int(match.group(3))
        return cls(size, partitions=count) if what == "partitions" else cls(size, ipus=count)

    def spec(self) -> str:
        return f"{self.min_size}+:" + (f"partitions={self.partitions}" if self.partitions else f"ipus={self.ipus}")

    def describe(self) -> str:
        if self.partitions:
            return f"at most {self.partitions} partition{'s' if self.partitions != 1 else ''} of {self.min_size} IPUs or more"
        return f"at most {self.ipus} IPUs in partitions of {self.min_size} or more"

    def applies(self, size: int) -> bool:
        return size >= self.min_size


@dataclass(frozen=True)
class Quota:
    ipus: int  # guaranteed, and what the account is entitled to in fair share
    limits: tuple[ShapeLimit, ...] = ()

    def spec(self) -> str:
        """As an operator gives it and listings show it: `32 16+:partitions=1`."""
        return " ".join([str(self.ipus), *(limit.spec() for limit in self.limits)])


@dataclass(frozen=True)
class Account:
    name: str
    users: tuple[str, ...] = ()
    cohort: str = ""  # accounts of one cohort lend each other idle quota
    quotas: Mapping[str, Quota] = field(default_factory=dict)  # by allocation; EVERY_ALLOCATION: in each without one
    created: float = 0.0

    def quota_in(self, allocation_id: str) -> Quota | None:
        return self.quotas.get(allocation_id, self.quotas.get(EVERY_ALLOCATION))

    def admits(self, user_id: str, unrestricted: bool) -> bool:
        """Whether a user may make partitions on this account: one of its users, or an administrator, or anyone in open mode."""
        return unrestricted or not user_id or user_id in self.users


@dataclass(frozen=True)
class AccountMap:
    """How a front-end's own name for a team (a Slurm account, a Kubernetes namespace) becomes a
    vipu account: `same` (the name as it is), pairs `slurm-a=ml-a,slurm-b=ml-b`, and, among the
    pairs, `*=same` or `*=ACCOUNT` for every other name; "" maps nothing (the partition names no
    account, and its user's only account is used, if any)."""

    pairs: Mapping[str, str] = field(default_factory=dict)
    otherwise: str = ""  # for a name not paired: SAME, an account, or "" (none)

    @classmethod
    def parse(cls, text: str, what: str = "an account map") -> AccountMap:
        text = text.strip()
        if not text:
            return cls()
        if text == SAME:
            return cls({}, SAME)
        pairs: dict[str, str] = {}
        otherwise = ""
        for item in (part.strip() for part in text.split(",") if part.strip()):
            name, equals, account = (piece.strip() for piece in item.partition("="))
            if not equals or not name or not account:
                raise InvalidArgument(f"{what} is 'same' or NAME=ACCOUNT pairs (and *=same or *=ACCOUNT), not {text!r}")
            if account != SAME:
                try:
                    check_id("account", account)
                except InvalidArgument as bad:
                    raise InvalidArgument(f"{what}: {bad.message}") from None
            if name == "*":
                otherwise = account
            else:
                pairs[name] = account
        return cls(pairs, otherwise)

    def of(self, name: str) -> str:
        """The vipu account of a front-end's name; "" for none."""
        account = self.pairs.get(name, self.otherwise) if name else ""
        return name if account == SAME else account


NO_ACCOUNTS = AccountMap()


def check_account(account: Account) -> None:
    """InvalidArgument naming what is wrong with an account as given."""
    check_id("account", account.name)
    if account.cohort:
        check_id("cohort", account.cohort)
    for user in account.users:
        check_id("user", user)
    for allocation_id, quota in account.quotas.items():
        if quota.ipus < 0:
            raise InvalidArgument(f"a quota is a number of IPUs, 0 or more, not {quota.ipus}")
        sizes = [limit.min_size for limit in quota.limits]
        if len(set(sizes)) != len(sizes):
            raise InvalidArgument("one shape limit per size: " + ", ".join(limit.spec() for limit in quota.limits))
        if allocation_id:
            check_id("allocation", allocation_id)


def account_of(accounts: Mapping[str, Account], named: str, user_id: str, unrestricted: bool) -> Account | None:
    """The account a user's request is made on: the one it names (NotFound if none is of that
    name, PermissionDenied if the user is not one of its), or
    the user's only account; None where it names none and the user is in none or in several (the
    caller decides whether that is allowed: `unaccounted`)."""
    if named:
        account = accounts.get(named)
        if account is None:
            raise NotFound(f"account {named} does not exist (vipu-admin list accounts)")
        if not account.admits(user_id, unrestricted):
            raise PermissionDenied(f"user {user_id} is not a user of account {named}: its users are "
                                  f"{', '.join(account.users) or 'none yet'}")
        return account
    mine = [account for account in accounts.values() if user_id and user_id in account.users]
    return mine[0] if len(mine) == 1 else None


def shared_by_quotas(accounts: Mapping[str, Account], allocation_id: str) -> bool:
    """Whether some account has a quota in the allocation: else nothing there is limited, and its
    queue is first come, first served."""
    return any(account.quota_in(allocation_id) is not None for account in accounts.values())


def unaccounted(accounts: Mapping[str, Account], user_id: str, allocation_id: str) -> str:
    """Why a request naming no account may not be made in an allocation that is shared by quotas
    (`shared_by_quotas`); "" if it may."""
    if not shared_by_quotas(accounts, allocation_id):
        return ""
    mine = sorted(account.name for account in accounts.values() if user_id and user_id in account.users)
    if len(mine) > 1:
        return f"user {user_id} is in accounts {', '.join(mine)}: name the one to use (--account)"
    who = f"user {user_id} is in no account" if user_id else "no account is named"
    return f"allocation {allocation_id} is shared by quotas and {who}: name one (--account; vipu-admin list accounts)"


@dataclass(frozen=True)
class AccountUse:
    """What an account holds in an allocation now, and where fair share puts it there."""

    allocation_id: str
    ipus: int
    partitions: int
    borrowed: int  # IPUs beyond its own quota
    waiting: int  # its requests waiting
    used_share: float  # of the allocation's decayed usage
    entitled_share: float  # its quota's part of the allocation's quotas

    def share_text(self) -> str:
        """As listings show it: `0.53 of 0.50` (used of entitled)."""
        return f"{self.used_share:.2f} of {self.entitled_share:.2f}"


@dataclass(frozen=True)
class AccountLine:
    """One line of a listing of accounts: an account in an allocation where it has a quota, holds
    or waits (or, in none, the account alone), what the CLI and the dashboard show alike."""

    account: Account
    use: AccountUse | None
    quota: Quota | None

    @property
    def quota_text(self) -> str:
        return self.quota.spec() if self.quota is not None else "-"

    @property
    def over(self) -> bool:
        """It holds more than its quota: borrowing, or a quota lowered under what it holds."""
        return self.quota is not None and self.use is not None and self.use.ipus > self.quota.ipus

    @property
    def filled(self) -> int:
        """The per cent of its quota it holds, up to 100 (100 with IPUs and no quota to hold them against)."""
        ipus = self.use.ipus if self.use is not None else 0
        if self.quota is None or not self.quota.ipus:
            return 100 if ipus else 0
        return min(100, round(100 * ipus / self.quota.ipus))


def account_lines(account: Account, uses: Iterable[AccountUse]) -> list[AccountLine]:
    """An account's lines in a listing: one per allocation it has a use in, with the quota it has there."""
    listed = [AccountLine(account, use, account.quota_in(use.allocation_id)) for use in uses]
    return listed or [AccountLine(account, None, account.quotas.get(EVERY_ALLOCATION))]


@dataclass
class Holding:
    """What an account holds in an allocation: its partitions' sizes."""

    sizes: list[int] = field(default_factory=list)

    @property
    def ipus(self) -> int:
        return sum(self.sizes)

    def within(self, limit: ShapeLimit) -> tuple[int, int]:
        """Its partitions, and their IPUs, of the limit's size or more."""
        counted = [size for size in self.sizes if limit.applies(size)]
        return len(counted), sum(counted)


@dataclass(frozen=True)
class Verdict:
    allowed: bool
    borrows: int = 0  # IPUs beyond its own quota it would hold with this partition
    reason: str = ""  # why not, or how it borrows


class Quotas:
    """The quotas of an allocation's accounts, and what each holds there: what an owner asks
    before a partition of an account starts."""

    def __init__(self, accounts: Mapping[str, Account], allocation_id: str, holdings: Mapping[str, Holding]):
        self.accounts = accounts
        self.allocation_id = allocation_id
        self.holdings: dict[str, Holding] = {name: Holding(list(h.sizes)) for name, h in holdings.items()}
        self.quotas = {name: quota for name, account in accounts.items() if (quota := account.quota_in(allocation_id)) is not None}

    @classmethod
    def of(cls, accounts: Mapping[str, Account], allocation_id: str, partitions: Iterable[tuple[str, int]]) -> Quotas:
        """From (account, size) of each partition held."""
        holdings: dict[str, Holding] = {}
        for account, size in partitions:
            if account:
                holdings.setdefault(account, Holding()).sizes.append(size)
        return cls(accounts, allocation_id, holdings)

    def holding(self, account: str) -> Holding:
        return self.holdings.get(account, Holding())

    def cohort_of(self, account: str) -> list[str]:
        """The accounts with a quota here in its cohort, itself among them (only itself outside a cohort)."""
        found = self.accounts.get(account)
        cohort = found.cohort if found is not None else ""
        if not cohort:
            return [account]
        return [name for name, a in self.accounts.items() if a.cohort == cohort and name in self.quotas]

    def within_own(self, account: str, size: int) -> bool:
        """Whether a partition of `size` IPUs fits its own quota, limits by shape included (borrowing nothing)."""
        verdict = self.verdict(account, size)
        return account in self.quotas and verdict.allowed and not verdict.borrows

    def verdict(self, account: str, size: int, barred_by: Iterable[str] = ()) -> Verdict:
        """Whether a partition of `size` IPUs of `account` may start now by its quota (room apart);
        `barred_by`, the accounts that reclaimed quota from it and still wait: it borrows nothing meanwhile."""
        quota = self.quotas.get(account)
        if quota is None:
            return Verdict(True)
        holding = self.holding(account)
        for limit in quota.limits:
            if limit.applies(size):
                count, ipus = holding.within(limit)
                if (limit.partitions and count + 1 > limit.partitions) or (limit.ipus and ipus + size > limit.ipus):
                    return Verdict(False, reason=f"account {account} is at its limit of {limit.describe()} in allocation "
                                                 f"{self.allocation_id}: it holds {count} ({ipus} IPUs)")
        if holding.ipus + size <= quota.ipus:
            return Verdict(True)
        at_quota = (f"account {account} holds {holding.ipus} of its quota of {quota.ipus} IPUs in allocation {self.allocation_id}"
                    f" and asks for {size}")
        cohort = self.cohort_of(account)
        if len(cohort) == 1:
            return Verdict(False, reason=at_quota)
        waiting = sorted(set(barred_by) - {account})
        if waiting:
            return Verdict(False, reason=f"{at_quota}; it may not borrow while {', '.join(waiting)}, which reclaimed "
                                         f"{'its' if len(waiting) == 1 else 'their'} quota from it, "
                                         f"wait{'s' if len(waiting) == 1 else ''}")
        lent = sum(self.quotas[name].ipus for name in cohort)
        used = sum(self.holding(name).ipus for name in cohort)
        if used + size > lent:
            return Verdict(False, reason=f"{at_quota}; its cohort {self.accounts[account].cohort} holds {used} of its "
                                         f"{lent} IPUs of quota, so nothing is idle to borrow")
        borrows = holding.ipus + size - quota.ipus
        return Verdict(True, borrows, f"account {account} borrows {borrows} IPUs of its cohort's idle quota")

    def take(self, account: str, size: int) -> None:
        if account:
            self.holdings.setdefault(account, Holding()).sizes.append(size)

    def give_back(self, account: str, size: int) -> None:
        """Undo the last `take` of this size (a start the queue only supposed)."""
        if account:
            sizes = self.holdings[account].sizes
            del sizes[len(sizes) - 1 - sizes[::-1].index(size)]

    def borrowing(self, account: str) -> int:
        """IPUs it holds beyond its own quota (0 without one)."""
        quota = self.quotas.get(account)
        return max(0, self.holding(account).ipus - quota.ipus) if quota is not None else 0

    def entitled_share(self, account: str) -> float:
        """Its quota's part of all the quotas here: what fair share holds it to (0 without a quota)."""
        total = sum(quota.ipus for quota in self.quotas.values())
        quota = self.quotas.get(account)
        return quota.ipus / total if quota is not None and total else 0.0


class FairShare:
    """Each account's usage, in IPU-seconds decayed with a half-life: an IPU-second `half_life`
    seconds ago counts half. It keeps the usage of partitions that ended, decayed to its last
    reading (`at`); what partitions still running used is added when asked (`usage`), from their
    start. A clock that goes back neither adds nor forgets anything until it passes the last
    reading again; one that jumps ahead decays as if that time had passed (it has, by the clock
    every start and end is read by)."""

    def __init__(self, half_life: float = DEFAULT_HALF_LIFE_SECONDS, at: float = 0.0):
        if not (half_life > 0 and math.isfinite(half_life)):
            raise InvalidArgument(f"a fair-share half-life is a positive number of seconds, not {half_life}")
        self.half_life = half_life
        self.at = at
        self.ended: dict[str, float] = {}  # account -> decayed usage of its partitions that ended, as of `at`

    def _decay(self, seconds: float) -> float:
        return float(0.5 ** (max(0.0, seconds) / self.half_life))

    def _used(self, ipus: float, start: float, end: float, now: float) -> float:
        """IPUs held from `start` to `end`, decayed to `now`: the integral of ipus x 2^-((now - t) / half-life)."""
        if end <= start:
            return 0.0
        return float(ipus * (self._decay(now - end) - self._decay(now - start)) * self.half_life / math.log(2))

    def advance(self, now: float) -> None:
        """Decay the usage of ended partitions to `now` (nothing if the clock went back)."""
        if now <= self.at:
            return
        factor = self._decay(now - self.at)
        for account in self.ended:
            self.ended[account] *= factor
        self.at = now

    def record(self, account: str, ipus: float, start: float, end: float) -> None:
        """A partition that ended: its usage from `start` to `end`, counted from then on."""
        if not account:
            return
        self.advance(end)
        self.ended[account] = self.ended.get(account, 0.0) + self._used(ipus, start, min(end, self.at), self.at)

    def usage(self, now: float, running: Iterable[tuple[str, int, float]]) -> dict[str, float]:
        """Each account's decayed usage at `now`: its ended partitions' and its running ones'
        (account, IPUs, start), as of the later of `now` and the last reading."""
        self.advance(now)
        used = dict(self.ended)
        for account, ipus, start in running:
            if account:
                used[account] = used.get(account, 0.0) + self._used(ipus, min(start, self.at), self.at, self.at)
        return used


def used_share(usage: Mapping[str, float], account: str) -> float:
    """An account's part of all the decayed usage (0 when nothing was used)."""
    total = sum(usage.values())
    return usage.get(account, 0.0) / total if total > 0 else 0.0


def standing(usage: Mapping[str, float], account: str, entitled: float) -> float:
    """How far ahead of its entitlement an account has used: its share of all usage over its
    entitled share (the lower goes first; infinite without an entitlement once it used anything)."""
    used = used_share(usage, account)
    if entitled <= 0:
        return math.inf if used > 0 else 1e300
    return used / entitled


def fair_order(requests: Sequence[T], account_of: Callable[[T], str], standing: Callable[[str], float]) -> list[T]:
    """The requests (in arrival order) in the order fair share starts them: by their account's
    standing, lowest first, and in arrival order within an account (and between equals)."""
    rank = {name: standing(name) for name in {account_of(r) for r in requests}}
    return [r for _, r in sorted(enumerate(requests), key=lambda item: (rank[account_of(item[1])], item[0]))]


@dataclass(frozen=True)
class Candidate:
    """A partition a reclaim may evict: preemptible, of a borrowing account of the cohort."""

    partition_id: str
    account: str
    size: int


def reclaim(candidates: Sequence[Candidate], quotas: Quotas, frees: Callable[[frozenset[str]], bool],
            checks: int = RECLAIM_CHECKS) -> tuple[str, ...] | None:
    """The partitions whose removal makes room (`frees(ids)`) with the fewest IPUs evicted (then
    the fewest partitions), never taking an account below its own quota; None if no such set
    exists (or none among the first `checks` weighed, or among sets of up to RECLAIM_SETS of a count)."""
    over = {name: quotas.borrowing(name) for name in {c.account for c in candidates}}
    usable = sorted((c for c in candidates if 0 < c.size <= over[c.account]), key=lambda c: (c.size, c.partition_id))
    best: tuple[int, int, tuple[str, ...]] | None = None
    weighed = 0
    for count in range(1, len(usable) + 1):
        if best is not None and count > best[1] and sum(c.size for c in usable[:count]) > best[0]:
            break  # more partitions can only evict more IPUs than the best found
        if math.comb(len(usable), count) > RECLAIM_SETS:
            break
        combos = sorted(itertools.combinations(usable, count), key=lambda combo: sum(c.size for c in combo))
        for combo in combos:
            ipus = sum(c.size for c in combo)
            if best is not None and (ipus, count) >= best[:2]:
                break
            taken: dict[str, int] = {}
            for c in combo:
                taken[c.account] = taken.get(c.account, 0) + c.size
            if any(taken[name] > over[name] for name in taken):
                continue  # it would take an account below its own quota
            weighed += 1
            if frees(frozenset(c.partition_id for c in combo)):
                best = (ipus, count, tuple(sorted(c.partition_id for c in combo)))
                break
            if weighed >= checks:
                return best[2] if best else None
    return best[2] if best else None
