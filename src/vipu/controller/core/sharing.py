"""An owner's accounts (`vipu.model.accounts`): which account a request is made on, whether its
quota lets it start, the fair-share order of the queue, and the reclaim of borrowed quota.

The accounts are configuration (the store's cache, read without a query); what each holds is the
owner's own state (its partitions' accounts and sizes), so quotas are decided in the owner's turn
like room is, one thing at a time. A reclaim is two of the owner's writes: a notice on each
partition chosen (`reclaim_at`, `reclaim_notice`, which its user reads in its status, the Slurm
job in its comment and the IPUJob in its PartitionDraining condition), and, at the notice's
deadline, the partition's removal, if the request it was reclaimed for still waits within its own
quota and the borrower still borrows that much (else the notice is withdrawn). Both are in the
store, so a restart or a new leader carries a reclaim on; which request it was for, and the bar on
the borrowers' borrowing while it waits, are kept in memory only (a new owner evicts for any
account of the cohort waiting within its own quota, and lets the borrowers borrow again).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence, Set
from dataclasses import dataclass

from vipu.controller.core import operations
from vipu.controller.core.effects import Body, Operation
from vipu.controller.core.state import REMOVAL_RETRY_SECONDS
from vipu.controller.core.steps import Steps
from vipu.controller.core.turns import OPERATIONS_LIMIT, TurnEngine
from vipu.model import lifecycle
from vipu.model.accounts import (
    DEFAULT_HALF_LIFE_SECONDS,
    Account,
    Candidate,
    FairShare,
    Quotas,
    account_of,
    fair_order,
    reclaim,
    shared_by_quotas,
    standing,
    unaccounted,
    used_share,
)
from vipu.model.entities import Access, Partition, PartitionRequest
from vipu.model.errors import InvalidArgument, NoRoom, Unavailable, VipuError
from vipu.model.placement import Placement, Shape, Used, shifted
from vipu.model.queue import WaitingRequest
from vipu.model.times import utc_text
from vipu.model.usage import UsageRecord

log = logging.getLogger("vipu.controller.core")

@dataclass(frozen=True)
class SharingPolicy:
    """How a controller shares its pod between accounts: how fast usage is forgotten, and how long
    a borrower is given between a reclaim's notice and its partition's removal."""

    half_life: float = DEFAULT_HALF_LIFE_SECONDS
    reclaim_grace: float = 60.0


@dataclass(frozen=True)
class Ordering:
    """A queue in fair-share order: what each request's account says of it (its quota, or where
    fair share puts it), and the requests its quota holds back (they start nothing and hold nothing)."""

    requests: list[WaitingRequest]
    clauses: Mapping[str, str]
    blocked: Set[str]


DEFAULT_SHARING = SharingPolicy()


def fair_share_of(records: Iterable[UsageRecord], policy: SharingPolicy, now: float) -> FairShare:
    """An allocation's decayed usage as its usage records say (those of partitions that ended)."""
    usage = FairShare(policy.half_life)
    for record in sorted(records, key=lambda r: r.ended):
        if record.ended > record.started:
            usage.record(record.account, record.ipu_seconds / (record.ended - record.started), record.started, min(record.ended, now))
    usage.advance(now)
    return usage


def usage_since(policy: SharingPolicy, now: float) -> float:
    """How far back usage records still count in fair share: where their weight falls below a millionth."""
    return now - 20 * policy.half_life


class Sharing:
    """The owner's part that keeps to its allocation's accounts, on the engine's state."""

    def __init__(self, engine: TurnEngine, steps: Steps):
        self.engine = engine
        self.steps = steps
        self.state = engine.state
        self.id = engine.id

    @property
    def policy(self) -> SharingPolicy:
        return getattr(self.engine.owners, "sharing", DEFAULT_SHARING)

    def accounts(self) -> Mapping[str, Account]:
        return self.engine.owners.store.configuration().accounts

    def quotas(self, accounts: Mapping[str, Account] | None = None) -> Quotas | None:
        """The quotas here and what each account holds; None where no account has one here (the
        allocation is shared first come, first served, as before)."""
        accounts = self.accounts() if accounts is None else accounts
        if not shared_by_quotas(accounts, self.id):
            return None
        return Quotas.of(accounts, self.id, ((p.account, p.size) for p in self.state.partitions.values()))

    def assign(self, request: PartitionRequest, access: Access) -> None:
        """Make the request on the account it names or on its user's only one; refused in one
        line where it may not be (an account that does not exist or is not the user's, or none
        where the allocation is shared by quotas)."""
        accounts = self.accounts()
        if not accounts and not request.account:
            return
        account = account_of(accounts, request.account, access.user_id, access.unrestricted)
        if account is not None:
            request.account = account.name
            return
        why = unaccounted(accounts, access.user_id, self.id)
        if why:
            raise InvalidArgument(why)

    def lenders_waiting(self, quotas: Quotas) -> set[str]:
        """The accounts with a request waiting that fits their own quota: those a reclaim may be for."""
        return {r.request.account for r in self.state.queue if r.request.account and quotas.within_own(r.request.account, r.size)}

    def barring(self, account: str) -> set[str]:
        """The accounts whose requests that reclaimed quota from `account` still wait: it borrows
        nothing meanwhile, so that what was reclaimed is not lent back before they start."""
        state = self.state
        return {lender for request_id, (lender, borrowers, _) in state.reclaimed_for.items()
                if account in borrowers and state.queue.get(request_id) is not None}

    def refuse_over_quota(self, request: PartitionRequest) -> None:
        """NoRoom (so that it may wait) if its account's quota does not let it start now."""
        quotas = self.quotas()
        if quotas is None or not request.account:
            return
        verdict = quotas.verdict(request.account, request.size, self.barring(request.account))
        if not verdict.allowed:
            raise NoRoom(verdict.reason)

    # The queue's pass

    def usage(self, now: float) -> dict[str, float]:
        return self.state.usage.usage(now, ((p.account, p.size, UsageRecord.of(p, now).started)
                                            for p in self.state.partitions.values() if p.account))

    def order(self, quotas: Quotas, now: float) -> Ordering:
        """The waiting requests in fair-share order, with what their accounts say of each."""
        usage = self.usage(now)
        standings = {name: standing(usage, name, quotas.entitled_share(name)) for name in {r.request.account for r in self.state.queue}}
        ordered = fair_order(list(self.state.queue), lambda r: r.request.account, standings.__getitem__)
        barred = {name: self.barring(name) for name in standings}
        first_of_standing: dict[float, int] = {}  # the order is by standing: those ahead of a standing are those before its first
        for position, request in enumerate(ordered):
            first_of_standing.setdefault(standings[request.request.account], position)
        clauses: dict[str, str] = {}
        blocked: set[str] = set()
        for request in ordered:
            account = request.request.account
            if not account:
                continue
            verdict = quotas.verdict(account, request.size, barred[account])
            if not verdict.allowed:
                clauses[request.partition_id] = f"waits for its account's quota: {verdict.reason}"
                blocked.add(request.partition_id)
                continue
            ahead = first_of_standing[standings[account]]
            if ahead:
                used, entitled = used_share(usage, account), quotas.entitled_share(account)
                clauses[request.partition_id] = (f"account {account} is over its share: {used:.2f} used of {entitled:.2f}; "
                                                 f"{ahead} request{'s' if ahead != 1 else ''} of accounts further under their share "
                                                 f"go{'es' if ahead == 1 else ''} first")
        return Ordering(ordered, clauses, blocked)

    def allowance(self, quotas: Quotas) -> Callable[[WaitingRequest, Sequence[tuple[WaitingRequest, Placement]]], bool]:
        """What the pass asks of each request before it may start (`vipu.model.queue.admit`'s
        `allowed`): its account's quota, counting what the pass started ahead of it. `started`
        grows as the pass goes, but for a start the pass only supposes (one more at its end, not
        there at the next call): `quotas` follows it, taking what is new and giving back what went."""
        counted: list[WaitingRequest] = []

        def allowed(request: WaitingRequest, started: Sequence[tuple[WaitingRequest, Placement]]) -> bool:
            while counted and (len(counted) > len(started) or started[len(counted) - 1][0] is not counted[-1]):
                gone = counted.pop()
                quotas.give_back(gone.request.account, gone.size)
            for earlier, _ in started[len(counted):]:
                quotas.take(earlier.request.account, earlier.size)
                counted.append(earlier)
            account = request.request.account
            return not account or quotas.verdict(account, request.size, self.barring(account)).allowed

        return allowed

    def reclaim_for(self, waiting: Iterable[WaitingRequest], quotas: Quotas, place: Callable[[WaitingRequest, Used], Placement | None],
                    used: Used, first: WaitingRequest | None, held: Shape) -> None:
        """For the first request (in fair-share order) that waits within its own quota while borrowers
        of its cohort stand in its way, give notice to the fewest IPUs of preemptible borrowed
        partitions whose removal makes it room (`vipu.model.accounts.reclaim`), room outside the
        IPUs held for the queue's first unless it is that first; one reclaim at a time."""
        state = self.state
        for request_id in [r for r, (_, _, chosen) in state.reclaimed_for.items() if not chosen and state.queue.get(r) is None]:
            del state.reclaimed_for[request_id]  # carried out, and its request started or went: its bar is lifted
        if state.reclaiming:
            return
        for request in waiting:
            account = request.request.account
            if not account or not quotas.within_own(account, request.size):
                continue
            cohort = set(quotas.cohort_of(account)) - {account}
            candidates = [Candidate(p.id, p.account, p.size) for p in state.partitions.values()
                          if p.preemptible and p.account in cohort and quotas.borrowing(p.account) > 0
                          and p.id not in self.engine.on_partition and lifecycle.state_of(p) == lifecycle.ACTIVE_IDLE]
            if not candidates:
                continue

            around = used if request is first or not held else shifted(used, on=held)

            def frees(ids: frozenset[str], request: WaitingRequest = request, around: Used = around) -> bool:
                freed = {agent: set(indices) for agent, indices in around.items()}
                for partition_id in ids:
                    for ipu in state.partitions[partition_id].ipus:
                        freed.get(ipu.agent_id, set()).discard(ipu.index)
                return place(request, freed) is not None

            chosen = reclaim(candidates, quotas, frees)
            if not chosen:
                continue
            if len(self.engine.under_way) + len(chosen) > OPERATIONS_LIMIT:
                log.warning("allocation %s: the reclaim for %s waits: too many operations are under way", self.id, request.partition_id)
                return
            partitions = [state.partitions[p] for p in chosen]
            state.reclaimed_for[request.partition_id] = (account, frozenset(p.account for p in partitions), frozenset(chosen))
            self._notice(partitions, request, time.time() + self.policy.reclaim_grace)
            return

    def _notice(self, partitions: list[Partition], request: WaitingRequest, at: float) -> None:
        account = request.request.account
        notice = (f"reclaimed for account {account}, whose partition {request.partition_id} waits within its quota: "
                  f"removed at {utc_text(at)} unless room comes first")
        log.warning("allocation %s: %s reclaimed for account %s (%s waits)", self.id, ", ".join(p.id for p in partitions), account,
                    request.partition_id)
        for partition in partitions:
            self.engine.start(Operation("reclaiming", self._noting(partition, at, notice), partition_id=partition.id, system=True))

    def _noting(self, partition: Partition, at: float, notice: str) -> Body:
        after = lifecycle.copy(partition)
        after.reclaim_at, after.reclaim_notice = at, notice
        try:
            yield self.steps.partition_write(lambda tx: tx.set_reclaim(lifecycle.copy(partition), at, notice), partition, after,
                                             partition.id)
        except VipuError as refused:
            log.warning("partition %s: its reclaim notice was not recorded: %s", partition.id, refused.message)

    # At a notice's deadline

    def reclaims_due(self) -> None:
        """At each noticed partition's deadline, remove it if it is still needed (`_kept_because`
        says nothing), else withdraw its notice, saying why."""
        state, now = self.state, time.time()
        if not state.reclaiming:
            return
        quotas = self.quotas()
        evicting: dict[str, int] = {}  # IPUs of each account this round evicts
        for partition_id, at in list(state.reclaiming.items()):
            partition = state.partitions.get(partition_id)
            if (partition is None or at > now or partition_id in self.engine.on_partition
                    or now < state.removals_after.get(partition_id, 0.0)):
                continue
            kept = ("its allocation is no longer shared by quotas" if quotas is None
                    else self._kept_because(partition, quotas, evicting.get(partition.account, 0)))
            still = not kept
            if still:
                evicting[partition.account] = evicting.get(partition.account, 0) + partition.size
            self._settled(partition_id, withdrawn=not still)
            body = self._evicting(partition) if still else self._withdrawing(partition, kept)
            try:
                self.engine.start(Operation("removing" if still else "reclaiming", body, partition_id=partition_id, system=True))
            except Unavailable as busy:
                log.warning("partition %s: its reclaim waits: %s", partition_id, busy.message)
                return
            state.removals_after[partition_id] = now + REMOVAL_RETRY_SECONDS

    def _settled(self, partition_id: str, withdrawn: bool) -> None:
        """A noticed partition's reclaim is decided: it is no longer the reclaim's. A reclaim
        withdrawn lifts the bar on its borrowers' borrowing at once; one carried out keeps it until
        its request leaves the queue (`reclaim_for` forgets it then)."""
        state = self.state
        for request_id, (lender, borrowers, chosen) in list(state.reclaimed_for.items()):
            if partition_id in chosen:
                if withdrawn:
                    del state.reclaimed_for[request_id]
                else:
                    state.reclaimed_for[request_id] = (lender, borrowers, chosen - {partition_id})

    def _kept_because(self, partition: Partition, quotas: Quotas, evicting: int) -> str:
        """Why a partition noticed for a reclaim stays after all ("" if it goes now): it goes while
        the request it was reclaimed for still waits within its own quota (any account of its
        cohort's, for a reclaim a restarted owner found in the store), and its account still
        borrows at least its IPUs besides those this round evicts (it goes no lower than its quota)."""
        state = self.state
        if quotas.borrowing(partition.account) - evicting < partition.size:
            return f"account {partition.account} no longer borrows its {partition.size} IPUs"
        found = next(((r, lender) for r, (lender, _, chosen) in state.reclaimed_for.items() if partition.id in chosen), None)
        if found is not None:
            request_id, lender = found
            waiting = state.queue.get(request_id)
            if waiting is None:
                return f"the request of partition {request_id} it was reclaimed for waits no more"
            return "" if quotas.within_own(lender, waiting.size) else f"account {lender}'s quota no longer has room for {request_id}"
        cohort = set(quotas.cohort_of(partition.account)) - {partition.account}
        return "" if self.lenders_waiting(quotas) & cohort else "no account of its cohort waits within its own quota"

    def _evicting(self, partition: Partition) -> Body:
        log.warning("partition %s is removed: %s", partition.id, partition.reclaim_notice)
        return operations.quietly(operations.remove(self.steps, partition, force=True), partition.id, "the removal by a reclaim")

    def _withdrawing(self, partition: Partition, why: str) -> Body:
        log.info("partition %s: its reclaim is withdrawn: %s", partition.id, why)
        return self._noting(partition, 0.0, "")
