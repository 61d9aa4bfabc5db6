"""Accounts (`vipu.model.accounts`) and usage (`vipu.model.usage`): an administrator makes,
changes and removes accounts, which are configuration; each allocation's owner reads them at each
decision and is told to pass over its queue again when they change. What each account holds and
waits for is read from the owners' snapshots; what it used, from the usage records the removals
wrote and the partitions running now."""

from __future__ import annotations

import builtins
import logging
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from vipu.controller.core.commands import AccountsChanged
from vipu.controller.core.owners import Owners
from vipu.controller.core.sharing import SharingPolicy, fair_share_of, usage_since
from vipu.model.accounts import Account, AccountUse, Quotas, check_account, used_share
from vipu.model.entities import Partition, shown
from vipu.model.errors import Conflict, InvalidArgument, NotFound, VipuError
from vipu.model.usage import FOLD_AFTER_SECONDS, UsageRecord, UsageRow, report
from vipu.store.store import Store

log = logging.getLogger(__name__)
# What an update may set: its users, its cohort, all its quotas; or the quotas it gives, each in its
# allocation, leaving the others ("quota"); or none in the allocations it names ("no_quota").
FIELDS = ("users", "cohort", "quotas", "quota", "no_quota")
FOLD_BATCH = 10_000  # usage records folded in one transaction


@dataclass(frozen=True)
class Standing:
    """One allocation as a listing of accounts reads it: the partitions on accounts, the accounts of
    the requests waiting (one each), the quotas there and each account's decayed usage."""

    allocation_id: str
    held: builtins.list[Partition]
    waiting: builtins.list[str]
    quotas: Quotas
    usage: Mapping[str, float]


@dataclass(frozen=True)
class AccountView:
    account: Account
    use: tuple[AccountUse, ...]


class AccountService:
    def __init__(self, store: Store, owners: Owners):
        self.store = store
        self.owners = owners
        self.policy: SharingPolicy = owners.sharing

    def create(self, account: Account) -> AccountView:
        account = replace(account, created=time.time())
        self._check(account)
        with self.store.transaction() as tx:
            tx.add_account(account)
        self._tell_owners()
        return self.get(account.name)

    def update(self, account: Account, fields: Iterable[str]) -> AccountView:
        """Set the fields named (`FIELDS`) as `account` has them, in one transaction. A quota lowered
        below what the account holds takes effect as its partitions end: nothing is evicted for it."""
        named = list(dict.fromkeys(fields))
        unknown = [f for f in named if f not in FIELDS]
        if unknown or not named:
            raise InvalidArgument(f"an account's fields are {', '.join(FIELDS)}; name one or more to change, not "
                                  f"{', '.join(unknown) or 'none'}")
        with self.store.transaction() as tx:
            current = tx.configuration().accounts.get(account.name)
            if current is None:
                raise NotFound(f"account {shown(account.name)} does not exist")
            quotas = dict(current.quotas)
            if "quota" in named:
                quotas.update(account.quotas)
            if "no_quota" in named:
                for allocation_id in account.quotas:
                    if quotas.pop(allocation_id, None) is None:
                        where = f"allocation {allocation_id}" if allocation_id else "every allocation"
                        raise NotFound(f"account {account.name} has no quota for {where}")
            changed = replace(current, **{f: getattr(account, f) for f in named if f in ("users", "cohort", "quotas")})
            if "quota" in named or "no_quota" in named:
                changed = replace(changed, quotas=quotas)
            self._check(changed, tx.configuration().allocations.keys())
            tx.update_account(changed)
        self._tell_owners()
        return self.get(account.name)

    def remove(self, name: str) -> None:
        """Remove an account that holds no partition and has no request waiting (one line naming
        them otherwise: nothing is evicted or cancelled for it)."""
        if name not in self.store.configuration().accounts:
            raise NotFound(f"account {shown(name)} does not exist")
        partitions, waiting = self._holdings(name)
        if partitions or waiting:
            held = [f"{len(partitions)} partition{'s' if len(partitions) != 1 else ''} ({', '.join(sorted(partitions)[:5])}"
                    f"{', ...' if len(partitions) > 5 else ''})"] if partitions else []
            held += [f"{len(waiting)} waiting request{'s' if len(waiting) != 1 else ''}"] if waiting else []
            raise Conflict(f"account {name} holds {' and '.join(held)}: remove them first (its usage records stay)")
        with self.store.transaction() as tx:
            tx.delete_account(name)
        self._tell_owners()

    def list(self) -> builtins.list[AccountView]:
        accounts = self.store.configuration().accounts
        standings = self._standings(accounts)
        return [self._view(account, standings) for account in accounts.values()]

    def get(self, name: str) -> AccountView:
        accounts = self.store.configuration().accounts
        if name not in accounts:
            raise NotFound(f"account {shown(name)} does not exist")
        return self._view(accounts[name], self._standings(accounts))

    def report(self, by: str, since: float, until: float, allocation_id: str = "") -> builtins.list[UsageRow]:
        """IPU-seconds used between `since` and `until` by account or by user: the usage records
        and the partitions running now, counted up to now."""
        now = time.time()
        with self.store.reading() as tx:
            records = tx.usage_records(since, until, allocation_id or None)
        return report(records + self._running(now, allocation_id), by, since, until)

    def run(self, stop: threading.Event, every: float = 3600.0) -> None:
        """Fold old usage records every `every` seconds until `stop` is set."""
        while not stop.wait(every):
            try:
                self.fold()
            except VipuError as error:
                log.warning("usage records were not folded: %s", error.message)

    def fold(self, now: float | None = None) -> int:
        """Fold the usage records of partitions that ended over FOLD_AFTER_SECONDS ago into days, a
        transaction per FOLD_BATCH of them (the first fold of a busy month reads no more at once);
        how many were folded."""
        before = (time.time() if now is None else now) - FOLD_AFTER_SECONDS
        folded = 0
        while True:
            with self.store.transaction() as tx:
                done = tx.fold_usage(before, FOLD_BATCH)
            folded += done
            if done < FOLD_BATCH:
                return folded

    def _check(self, account: Account, allocations: Iterable[str] | None = None) -> None:
        check_account(account)
        known = set(self.store.configuration().allocations if allocations is None else allocations)
        for allocation_id in account.quotas:
            if allocation_id and allocation_id not in known:
                raise NotFound(f"allocation {shown(allocation_id)} does not exist")

    def _running(self, now: float, allocation_id: str = "") -> builtins.list[UsageRecord]:
        return [UsageRecord.of(partition, now) for owner in self._owners(allocation_id) for partition in owner.snapshot.partitions.values()]

    def _owners(self, allocation_id: str = "") -> builtins.list:
        found = []
        for allocation in self.store.configuration().allocations.values():
            if allocation_id and allocation.id != allocation_id:
                continue
            owner = self.owners.owner(allocation.id)
            if owner is not None:
                found.append(owner)
        return found

    def _holdings(self, name: str) -> tuple[builtins.list[str], builtins.list[str]]:
        partitions, waiting = [], []
        for owner in self._owners():
            snapshot = owner.snapshot
            partitions += [p.id for p in snapshot.partitions.values() if p.account == name]
            waiting += [r.partition_id for r in snapshot.queue.requests if r.request.account == name]
        return partitions, waiting

    def _standings(self, accounts: Mapping[str, Account]) -> builtins.list[Standing]:
        """Each allocation as its owner last committed it, with its quotas and decayed usage, read
        once for every account a listing shows."""
        now = time.time()
        standings = []
        for owner in self._owners():
            snapshot = owner.snapshot
            allocation_id = snapshot.allocation.id
            held = [p for p in snapshot.partitions.values() if p.account]
            with self.store.reading() as tx:
                records = tx.usage_records(usage_since(self.policy, now), now, allocation_id)
            usage = fair_share_of(records, self.policy, now).usage(now, ((p.account, p.size, UsageRecord.of(p, now).started)
                                                                         for p in held))
            standings.append(Standing(allocation_id, held, [r.request.account for r in snapshot.queue.requests],
                                      Quotas.of(accounts, allocation_id, ((p.account, p.size) for p in held)), usage))
        return standings

    @staticmethod
    def _view(account: Account, standings: Iterable[Standing]) -> AccountView:
        uses = []
        for s in standings:
            mine = [p for p in s.held if p.account == account.name]
            waiting = s.waiting.count(account.name)
            if account.quota_in(s.allocation_id) is None and not mine and not waiting:
                continue
            uses.append(AccountUse(s.allocation_id, sum(p.size for p in mine), len(mine), s.quotas.borrowing(account.name), waiting,
                                   used_share(s.usage, account.name), s.quotas.entitled_share(account.name)))
        return AccountView(account, tuple(uses))

    def _tell_owners(self) -> None:
        """Each owner passes over its queue again under the accounts as they are now (it reads them
        at each decision anyway: this makes a raised quota start what it lets start at once)."""
        for owner in self._owners():
            try:
                owner.submit(AccountsChanged(), always=True)
            except VipuError as error:
                log.warning("allocation %s: its queue is passed over again at its next change: %s", owner.id, error.message)

