"""Accounts' rules by property (hypothesis), on real placement: a pass over a queue keeps every
account to its quota but for borrowing it was allowed, and lends nothing to a borrower that a
waiting lender reclaimed from (so a reclaimed partition is not re-admitted on borrowed quota
meanwhile: no preemption cycle), a reclaim evicts no more than the fewest IPUs that make room and never takes a borrower
below its own quota, and one is found whenever evicting what may be evicted makes room; with the
rules of fair share's decayed usage."""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vipu.model import queue
from vipu.model.accounts import (
    Account,
    Candidate,
    FairShare,
    Quota,
    Quotas,
    ShapeLimit,
    fair_order,
    reclaim,
    shared_by_quotas,
    standing,
)
from vipu.model.entities import IldTopology
from vipu.model.errors import InvalidArgument
from vipu.model.placement import choose_held_shape, try_place
from vipu.model.topology import ClusterLayout

MACHINES = 4
LAYOUT = ClusterLayout([f"ag{i}" for i in range(1, MACHINES + 1)], IldTopology.MESH)
ALLOWED = set(LAYOUT.agent_ids)
NAMES = ("ml-a", "ml-b", "ml-c")


@dataclass(frozen=True)
class Job:
    name: str
    account: str
    size: int


def place(job: Job, used):
    return try_place(LAYOUT, ALLOWED, used, job.size)


def hold(job: Job, used, started):
    return choose_held_shape(LAYOUT, ALLOWED, used, job.size)


accounts_strategy = st.builds(
    lambda quotas, cohorts, limit: {
        name: Account(name, (), cohort, {"": Quota(quota, (ShapeLimit(8, partitions=1),) if limit and name == "ml-a" else ())})
        for name, quota, cohort in zip(NAMES, quotas, cohorts, strict=True)},
    st.lists(st.sampled_from([0, 2, 4, 8]), min_size=3, max_size=3),
    st.lists(st.sampled_from(["", "c1"]), min_size=3, max_size=3),
    st.booleans())
holding_strategy = st.lists(st.tuples(st.sampled_from(NAMES), st.sampled_from([1, 2, 4])), max_size=5)
queue_strategy = st.lists(st.tuples(st.sampled_from(NAMES), st.sampled_from([1, 2, 4, 8])), min_size=1, max_size=8)


def used_by(holding: list[tuple[str, int]]):
    """The holdings placed one after the other on the pod (those that do not fit are left out)."""
    used: dict[str, set[int]] = {}
    placed = []
    for n, (account, size) in enumerate(holding):
        placement = try_place(LAYOUT, ALLOWED, used, size)
        if placement is None:
            continue
        for ipu in placement.ipus:
            used.setdefault(ipu.agent_id, set()).add(ipu.index)
        placed.append((f"h{n}", account, size, frozenset((ipu.agent_id, ipu.index) for ipu in placement.ipus)))
    return used, placed


@settings(max_examples=150, deadline=None)
@given(accounts_strategy, holding_strategy, queue_strategy, st.frozensets(st.sampled_from(NAMES), max_size=2))
def test_a_pass_keeps_each_account_to_its_quota_and_a_reclaimed_borrower_borrows_nothing(accounts, holding, waiting, reclaimed):
    used, placed = used_by(holding)
    quotas = Quotas.of(accounts, "a1", [(account, size) for _, account, size, _ in placed])
    jobs = [Job(f"j{n}", account, size) for n, (account, size) in enumerate(waiting)]
    barred_by = {name: {"ml-c"} for name in reclaimed}  # ml-c waits, having reclaimed quota from these
    held = {name: quotas.holding(name).ipus for name in NAMES}

    def allowed(job: Job, started) -> bool:
        """The quota rule counted afresh from what is held and what `started` holds (the pass may suppose a start)."""
        reference = Quotas.of(accounts, "a1", [(account, size) for _, account, size, _ in placed])
        for earlier, _ in started:
            reference.take(earlier.account, earlier.size)
        return reference.verdict(job.account, job.size, barred_by.get(job.account, set())).allowed

    admission = queue.admit(jobs, used, place, hold, allowed=allowed)
    for job, _ in admission.started:  # each start checked again, by hand, against what was held just before it
        quota = accounts[job.account].quotas[""]
        cohort = [n for n in NAMES if accounts[job.account].cohort and accounts[n].cohort == accounts[job.account].cohort]
        within_own = held[job.account] + job.size <= quota.ipus
        for limit in quota.limits:
            if job.size >= limit.min_size:
                assert sum(1 for j, _ in admission.started if j.account == job.account and j.size >= limit.min_size and
                           int(j.name[1:]) < int(job.name[1:])) + sum(1 for _, a, s, _ in placed if a == job.account and
                                                                      s >= limit.min_size) < limit.partitions
        if not within_own:
            assert len(cohort) > 1, f"{job} started over its quota with no cohort to borrow from"
            assert sum(held[n] for n in cohort) + job.size <= sum(accounts[n].quotas[""].ipus for n in cohort), "lent more than idle"
            assert job.account not in reclaimed or job.account == "ml-c", f"{job} borrowed while a lender that reclaimed from it waited"
        held[job.account] += job.size
    assert admission.first is None or allowed(admission.first, admission.started)  # what is held for is allowed to start


def brute_force(candidates: list[Candidate], quotas: Quotas, frees) -> tuple[int, int] | None:
    """The fewest IPUs (then partitions) of any set of the candidates that frees the room, keeping
    every account at its own quota or above: what `reclaim` must match."""
    best = None
    for count in range(1, len(candidates) + 1):
        for combo in itertools.combinations(candidates, count):
            taken: dict[str, int] = {}
            for c in combo:
                taken[c.account] = taken.get(c.account, 0) + c.size
            if any(taken[a] > quotas.borrowing(a) for a in taken) or not frees(frozenset(c.partition_id for c in combo)):
                continue
            found = (sum(c.size for c in combo), count)
            best = found if best is None or found < best else best
    return best


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["ml-a", "ml-b"]), st.sampled_from([1, 1, 2, 2, 4]), st.booleans()), min_size=1,
                max_size=14),
       st.sampled_from([0, 0, 2, 4, 8]), st.sampled_from([0, 0, 2, 4, 8]), st.sampled_from([2, 4, 8]))
def test_a_reclaim_evicts_the_fewest_ipus_that_make_room_and_no_borrower_goes_below_its_quota(holding, quota_a, quota_b, asked):
    accounts = {"ml-a": Account("ml-a", (), "c1", {"": Quota(quota_a)}), "ml-b": Account("ml-b", (), "c1", {"": Quota(quota_b)}),
                "ml-c": Account("ml-c", (), "c1", {"": Quota(16)})}
    used, placed = used_by([(account, size) for account, size, _ in holding])
    preemptible = {f"h{n}" for n, (_, _, flag) in enumerate(holding) if flag}
    quotas = Quotas.of(accounts, "a1", [(account, size) for _, account, size, _ in placed])
    candidates = [Candidate(pid, account, size) for pid, account, size, _ in placed
                  if pid in preemptible and quotas.borrowing(account) > 0]
    ipus_of = {pid: ipus for pid, _, _, ipus in placed}

    def frees(ids: frozenset[str]) -> bool:
        freed = {agent: set(indices) for agent, indices in used.items()}
        for pid in ids:
            for agent, index in ipus_of[pid]:
                freed[agent].discard(index)
        return try_place(LAYOUT, ALLOWED, freed, asked) is not None

    if frees(frozenset()):
        return  # room already: nothing to reclaim
    chosen = reclaim(candidates, quotas, frees)
    expected = brute_force(candidates, quotas, frees)
    if expected is None:
        assert chosen is None
        return
    assert chosen is not None, "evicting what may be evicted makes room, but no reclaim was found"
    assert frees(frozenset(chosen))
    assert (sum(c.size for c in candidates if c.partition_id in chosen), len(chosen)) == expected
    for account in ("ml-a", "ml-b"):
        evicted = sum(c.size for c in candidates if c.partition_id in chosen and c.account == account)
        assert quotas.holding(account).ipus - evicted >= quotas.quotas[account].ipus or not evicted


def test_the_volcano_case_a_reclaim_of_16_evicts_16_not_18():
    """Volcano's reclaim of 16 once evicted 18: here a lender's 16 IPUs (a machine pair) come from
    the one 16-IPU borrowed partition, not from a 16 and the 2-IPU one beside it."""
    layout = ClusterLayout([f"ag{i}" for i in range(1, 9)], IldTopology.MESH)
    allowed = set(layout.agent_ids)
    accounts = {"lender": Account("lender", (), "c1", {"": Quota(16)}), "borrower": Account("borrower", (), "c1", {"": Quota(0)}),
                "rest": Account("rest", (), "", {"": Quota(0)})}
    used: dict[str, set[int]] = {}
    placed = {}
    for pid, account, size in (("big", "borrower", 16), ("small", "borrower", 2), ("other", "rest", 4), ("fill", "rest", 8),
                               ("pad", "rest", 2)):
        placement = try_place(layout, allowed, used, size)
        for ipu in placement.ipus:
            used.setdefault(ipu.agent_id, set()).add(ipu.index)
        placed[pid] = (account, size, {(ipu.agent_id, ipu.index) for ipu in placement.ipus})
    quotas = Quotas.of(accounts, "a1", [(a, s) for a, s, _ in placed.values()])

    def frees(ids):
        freed = {agent: set(indices) for agent, indices in used.items()}
        for pid in ids:
            for agent, index in placed[pid][2]:
                freed[agent].discard(index)
        return try_place(layout, allowed, freed, 16) is not None

    chosen = reclaim([Candidate("big", "borrower", 16), Candidate("small", "borrower", 2)], quotas, frees)
    assert chosen == ("big",)


def test_fair_share_orders_by_usage_against_entitlement_and_fifo_within_an_account():
    usage = {"ml-a": 300.0, "ml-b": 100.0}
    shares = {"ml-a": 0.5, "ml-b": 0.5}
    jobs = [Job("a1", "ml-a", 4), Job("b1", "ml-b", 4), Job("a2", "ml-a", 1), Job("b2", "ml-b", 1)]
    ordered = fair_order(jobs, lambda job: job.account, lambda name: standing(usage, name, shares[name]))
    assert [job.name for job in ordered] == ["b1", "b2", "a1", "a2"]
    assert standing(usage, "ml-a", 0.5) == pytest.approx(1.5) and standing(usage, "ml-b", 0.5) == pytest.approx(0.5)
    assert standing(usage, "ml-c", 0.0) > standing(usage, "ml-a", 0.5)  # no entitlement: after every entitled account


def test_decayed_usage_halves_each_half_life_and_a_clock_that_goes_back_changes_nothing():
    share = FairShare(half_life=100.0, at=1000.0)
    share.record("ml-a", 4, 900.0, 1000.0)
    first = share.usage(1000.0, ())["ml-a"]
    assert first == pytest.approx(4 * 100 / math.log(2) * (1 - 0.5), rel=1e-9)  # 100 s of 4 IPUs, the older half-weighted
    assert share.usage(1100.0, ())["ml-a"] == pytest.approx(first / 2)
    assert share.usage(1050.0, ())["ml-a"] == pytest.approx(first / 2)  # the clock went back: nothing changes
    running = share.usage(1100.0, [("ml-b", 2, 1000.0)])
    assert running["ml-b"] == pytest.approx(2 * 100 / math.log(2) * 0.5)
    assert "ml-b" not in share.ended  # a running partition is counted when asked, not kept
    with pytest.raises(InvalidArgument, match="half-life is a positive number"):
        FairShare(half_life=0)


def test_shape_limits_and_quotas_read_and_refuse_as_an_operator_writes_them():
    limit = ShapeLimit.parse("64+:partitions=2")
    assert (limit.describe(), ShapeLimit.parse("16+:ipus=128").describe()) == (
        "at most 2 partitions of 64 IPUs or more", "at most 128 IPUs in partitions of 16 or more")
    for bad in ("64:partitions=2", "64+:partitions=0", "x+:ipus=1", "16+:gpus=2"):
        with pytest.raises(InvalidArgument, match="a shape limit is SIZE"):
            ShapeLimit.parse(bad)
    quotas = Quotas.of({"ml-a": Account("ml-a", (), "", {"": Quota(128, (ShapeLimit(16, ipus=32),))})}, "a1", [("ml-a", 16)])
    assert quotas.verdict("ml-a", 16).allowed and not quotas.verdict("ml-a", 32).allowed
    assert quotas.verdict("ml-a", 8).allowed  # under the limit's size: only the quota counts
    assert not shared_by_quotas({}, "a1") and shared_by_quotas({"ml-a": Account("ml-a", (), "", {"": Quota(8)})}, "a1")
    assert not shared_by_quotas({"ml-a": Account("ml-a", (), "", {"a2": Quota(8)})}, "a1")  # a quota in another allocation only


def test_backfill_asks_each_request_again_whether_it_may_start_after_what_started_since():
    """Two requests of one account at the front of two lines behind a first that does not fit:
    the quota lets one of them start, not both (each was allowed when its line was first looked at)."""
    layout = ClusterLayout([f"ag{i}" for i in range(1, 9)], IldTopology.MESH)
    accounts = {"ml-a": Account("ml-a", (), "", {"": Quota(2)}), "ml-b": Account("ml-b", (), "", {"": Quota(32)})}
    quotas = Quotas.of(accounts, "a1", [])
    counted = [0]

    def allowed(job: Job, started) -> bool:
        for earlier, _ in started[counted[0]:]:
            quotas.take(earlier.account, earlier.size)
        counted[0] = len(started)
        return quotas.verdict(job.account, job.size).allowed

    used = {f"ag{i}": {0} for i in range(1, 9)}  # an IPU in use on every machine: the first (16 IPUs) waits
    jobs = [Job("big", "ml-b", 16), Job("two", "ml-a", 2), Job("one", "ml-a", 1)]
    admission = queue.admit(jobs, used, lambda job, used: try_place(layout, set(layout.agent_ids), used, job.size),
                            lambda job, used, started: choose_held_shape(layout, set(layout.agent_ids), used, job.size), allowed=allowed)
    assert admission.first.name == "big"
    assert [job.name for job, _ in admission.started] == ["two"]  # 2 + 1 would be 3, over ml-a's 2


def test_an_accounts_small_request_does_not_backfill_into_the_quota_its_held_request_needs():
    """Found by the property above: with its 8-IPU request held for (no room yet) and a quota of 8,
    the account's 1-IPU request behind it would have started and left the held one over quota."""
    accounts = {"ml-a": Account("ml-a", (), "", {"": Quota(8)}), "ml-b": Account("ml-b", (), "", {"": Quota(0)}),
                "ml-c": Account("ml-c", (), "", {"": Quota(0)})}
    used, placed = used_by([("ml-b", 1), ("ml-b", 1), ("ml-b", 1), ("ml-b", 2), ("ml-b", 4)])
    quotas = Quotas.of(accounts, "a1", [(account, size) for _, account, size, _ in placed])

    def allowed(job: Job, started) -> bool:
        reference = Quotas.of(accounts, "a1", [(account, size) for _, account, size, _ in placed])
        for earlier, _ in started:
            reference.take(earlier.account, earlier.size)
        return reference.verdict(job.account, job.size, set()).allowed

    admission = queue.admit([Job("j0", "ml-a", 8), Job("j1", "ml-a", 1)], used, place, hold, allowed=allowed)
    assert admission.first == Job("j0", "ml-a", 8) and admission.started == ()
    assert quotas.holding("ml-a").ipus == 0
