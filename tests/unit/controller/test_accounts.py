"""Accounts on the real services (the agents' gateway is the test double of `test_services`): a
quota holds an account's partitions and its requests wait for it, a cohort lends idle quota and
takes it back by reclaiming preemptible partitions after a notice, the queue starts the account
furthest under its share first and says so, and every partition's use is recorded on its account."""

from __future__ import annotations

import time

import pytest

from tests.unit.controller.test_reservations import until
from vipu.controller.core.sharing import SharingPolicy
from vipu.model.accounts import Account, Quota, ShapeLimit
from vipu.model.entities import Access, PartitionRequest, ReadyState
from vipu.model.errors import Conflict, InvalidArgument, NoRoom, NotFound, PermissionDenied

ALICE = Access("alice", frozenset({"a1"}))
BOB = Access("bob", frozenset({"a1"}))
CAROL = Access("carol", frozenset({"a1"}))


def account(name: str, users: tuple[str, ...], ipus: int | None, cohort: str = "", limits: tuple[str, ...] = ()) -> Account:
    quotas = {} if ipus is None else {"": Quota(ipus, tuple(ShapeLimit.parse(limit) for limit in limits))}
    return Account(name, users, cohort, quotas)


def reason(pod, partition_id: str) -> str:
    return pod.owners.owner("a1").snapshot.queue.seen(pod.owners.owner("a1").snapshot.queue.get(partition_id)).reason


def reclaim_noticed(pod) -> None:
    """Accounts ml-a (alice) and ml-b (bob) of 16 IPUs each in one cohort; alice holds 16 IPUs of
    her own and 16 borrowed in `lent`, preemptible; bob's `back` of 16 waits, and `lent` is
    noticed for a reclaim."""
    pod.services.accounts.create(account("ml-a", ("alice",), 16, cohort="research"))
    pod.services.accounts.create(account("ml-b", ("bob",), 16, cohort="research"))
    pod.partitions.create(PartitionRequest("own", 16), ALICE)
    pod.partitions.create(PartitionRequest("lent", 16, preemptible=True), ALICE)
    pod.requests.create(PartitionRequest("back", 16), BOB, wait_seconds=600, detached=True)
    until(lambda: pod.owners.owner("a1").snapshot.partitions["lent"].reclaim_at > 0, "no reclaim was noticed")


def test_a_quota_holds_an_account_and_a_request_over_it_waits_for_it(pod):
    pod.services.accounts.create(account("ml-a", ("alice",), 8, limits=("8+:partitions=1",)))
    assert pod.partitions.create(PartitionRequest("p1", 8), ALICE).account == "ml-a"  # her only account, by default
    with pytest.raises(NoRoom, match="account ml-a is at its limit of at most 1 partition of 8 IPUs or more in allocation a1"):
        pod.partitions.create(PartitionRequest("p2", 8), ALICE)
    with pytest.raises(NoRoom, match="account ml-a holds 8 of its quota of 8 IPUs in allocation a1 and asks for 4"):
        pod.partitions.create(PartitionRequest("p3", 4), ALICE)
    waiting = pod.requests.create(PartitionRequest("p3", 4), ALICE, wait_seconds=600, detached=True)
    assert "waits for its account's quota: account ml-a holds 8 of its quota of 8 IPUs" in waiting.reason
    assert pod.owners.owner("a1").snapshot.queue.held == frozenset()  # held back by its quota, it holds nothing
    pod.partitions.remove("p1", ALICE)
    until(lambda: pod.partitions.get("p3", ALICE).ready_state is ReadyState.ACTIVE, "the request did not start within its quota")


def test_who_has_no_account_is_refused_in_one_line_where_quotas_share_the_allocation(pod):
    pod.partitions.create(PartitionRequest("before", 4), CAROL)  # no account has a quota yet: as before
    pod.services.accounts.create(account("ml-a", ("alice", "bob"), 16))
    pod.services.accounts.create(account("ml-b", ("bob",), 16))
    with pytest.raises(InvalidArgument, match=r"allocation a1 is shared by quotas and user carol is in no account: name one"):
        pod.partitions.create(PartitionRequest("p1", 4), CAROL)
    with pytest.raises(InvalidArgument, match="user bob is in accounts ml-a, ml-b: name the one to use"):
        pod.partitions.create(PartitionRequest("p1", 4), BOB)
    with pytest.raises(PermissionDenied, match="user alice is not a user of account ml-b"):
        pod.partitions.create(PartitionRequest("p1", 4, account="ml-b"), ALICE)
    with pytest.raises(NotFound, match="account ml-z does not exist"):
        pod.partitions.create(PartitionRequest("p1", 4, account="ml-z"), ALICE)
    assert pod.partitions.create(PartitionRequest("p1", 4, account="ml-b"), BOB).account == "ml-b"
    assert sorted(p.id for p in pod.partitions.list()) == ["before", "p1"]  # the refusals made nothing


def test_a_cohort_lends_idle_quota_but_not_to_a_borrower_a_waiting_lender_reclaimed_from(pod):
    pod.owners.sharing = SharingPolicy(reclaim_grace=3600.0)
    pod.services.accounts.create(account("ml-a", ("alice",), 8, cohort="research"))
    pod.services.accounts.create(account("ml-b", ("bob",), 24, cohort="research"))
    pod.partitions.create(PartitionRequest("own", 8), ALICE)
    assert pod.partitions.create(PartitionRequest("lent", 16, preemptible=True), ALICE).account == "ml-a"  # ml-b's idle quota
    [use] = next(v for v in pod.services.accounts.list() if v.account.name == "ml-a").use
    assert (use.ipus, use.borrowed) == (24, 16)
    pod.requests.create(PartitionRequest("back", 16), BOB, wait_seconds=600, detached=True)  # within its own quota, no room
    until(lambda: pod.owners.owner("a1").snapshot.partitions["lent"].reclaim_at > 0, "no reclaim was noticed")
    with pytest.raises(NoRoom, match="it may not borrow while ml-b, which reclaimed its quota from it, waits"):
        pod.partitions.create(PartitionRequest("more", 4), ALICE)  # room for it, but not on ml-b's quota now
    pod.services.accounts.create(account("ml-c", ("carol",), 0))
    with pytest.raises(NoRoom, match="account ml-c holds 0 of its quota of 0 IPUs in allocation a1 and asks for 4"):
        pod.partitions.create(PartitionRequest("none", 4), CAROL)  # no cohort: nothing to borrow


def test_a_lender_that_waits_reclaims_the_fewest_preemptible_ipus_after_a_notice(pod):
    pod.owners.sharing = SharingPolicy(reclaim_grace=1.0)
    pod.services.accounts.create(account("ml-a", ("alice",), 8, cohort="research"))
    pod.services.accounts.create(account("ml-b", ("bob",), 24, cohort="research"))
    pod.partitions.create(PartitionRequest("own", 8), ALICE)
    for n, size in enumerate((4, 8, 4, 8)):  # 24 IPUs borrowed from ml-b, in four partitions
        pod.partitions.create(PartitionRequest(f"lent{n}", size, preemptible=n != 3), ALICE)
    waiting = pod.requests.create(PartitionRequest("back", 8), BOB, wait_seconds=600, detached=True)
    assert waiting.position == 1
    until(lambda: any(p.reclaim_notice for p in pod.owners.owner("a1").snapshot.partitions.values()), "no reclaim was noticed")
    noticed = sorted(p.id for p in pod.owners.owner("a1").snapshot.partitions.values() if p.reclaim_at)
    assert noticed == ["lent1"]  # one partition of 8 IPUs frees 8 (not two of 4 on two machines, nor the one not preemptible)
    assert "reclaimed for account ml-b, whose partition back waits within its quota" in pod.partitions.get("lent1", ALICE).drain_notices[0]
    until(lambda: pod.owners.owner("a1").snapshot.partitions.get("back") is not None, "the reclaim did not make room for the lender")
    assert pod.owners.owner("a1").snapshot.partitions.get("lent1") is None
    assert {"lent0", "lent2", "lent3"} <= set(pod.owners.owner("a1").snapshot.partitions)


def test_a_reclaim_under_way_is_carried_on_by_a_restarted_controller(pod):
    pod.owners.sharing = SharingPolicy(reclaim_grace=2.0)
    reclaim_noticed(pod)
    services = pod.restarted()  # its notice and deadline are stored: the new owner removes it when due
    kept = services.partitions.get("lent", ALICE)
    assert "reclaimed for account ml-b" in kept.drain_notices[0]
    until(lambda: services.owners.owner("a1").snapshot.partitions.get("back") is not None, "the restarted owner did not go on")
    assert "lent" not in services.owners.owner("a1").snapshot.partitions and "own" in services.owners.owner("a1").snapshot.partitions


def test_the_queue_starts_the_account_furthest_under_its_share_first(pod):
    pod.services.accounts.create(account("ml-a", ("alice",), 32))
    pod.services.accounts.create(account("ml-b", ("bob",), 32))
    pod.partitions.create(PartitionRequest("a-big", 16), ALICE)
    pod.partitions.create(PartitionRequest("b-small", 4), BOB)
    time.sleep(0.3)  # usage accrues: ml-a has used four times ml-b's, against equal entitlements
    pod.partitions.create(PartitionRequest("b-rest", 8), BOB)
    pod.partitions.create(PartitionRequest("b-last", 4), BOB)  # the pod is full
    first = pod.requests.create(PartitionRequest("a-next", 4), ALICE, wait_seconds=600, detached=True)
    second = pod.requests.create(PartitionRequest("b-next", 4), BOB, wait_seconds=600, detached=True)
    assert (first.position, second.position) == (1, 2)  # in arrival order
    pod.partitions.remove("b-last", BOB)  # room for one of them: ml-b's, though it came second
    until(lambda: pod.owners.owner("a1").snapshot.partitions.get("b-next") is not None, "ml-b's request did not start")
    assert pod.owners.owner("a1").snapshot.queue.get("a-next") is not None


def test_the_reason_of_a_request_behind_by_fair_share_names_the_shares(pod):
    pod.services.accounts.create(account("ml-a", ("alice",), 32))
    pod.services.accounts.create(account("ml-b", ("bob",), 32))
    pod.partitions.create(PartitionRequest("a-big", 16), ALICE)
    pod.partitions.create(PartitionRequest("b-small", 8), BOB)
    time.sleep(0.3)
    pod.partitions.create(PartitionRequest("filler", 8), BOB)  # the pod is full
    pod.requests.create(PartitionRequest("a-wait", 4), ALICE, wait_seconds=600, detached=True)
    pod.requests.create(PartitionRequest("b-wait", 4), BOB, wait_seconds=600, detached=True)
    until(lambda: "over its share" in reason(pod, "a-wait"), "the reason does not name the shares")
    assert reason(pod, "a-wait").startswith("number 2 in fair-share order, behind b-wait (4 IPUs); account ml-a is over its "
                                            "share: 0.6")  # about two thirds of the use, against half
    assert "of 0.50; 1 request of accounts further under their share goes first" in reason(pod, "a-wait")
    assert reason(pod, "b-wait").startswith("first in fair-share order")


def test_usage_is_recorded_per_account_and_user_and_reported_over_a_window(pod):
    pod.services.accounts.create(account("ml-a", ("alice",), None))
    start = time.time()
    pod.partitions.create(PartitionRequest("p1", 8), ALICE)
    pod.partitions.create(PartitionRequest("p2", 4), BOB)
    time.sleep(0.2)
    pod.partitions.remove("p1", ALICE)
    ended = pod.services.accounts.report("account", start - 1, time.time() + 1)
    by_account = {row.key: row for row in ended}
    assert by_account["ml-a"].ipu_seconds >= 8 * 0.2 and by_account["ml-a"].partitions == 1
    assert by_account[""].partitions == 1  # bob's, on no account, still running: counted up to now
    by_user = {row.key: row.ipu_seconds for row in pod.services.accounts.report("user", start - 1, time.time() + 1)}
    assert set(by_user) == {"alice", "bob"}
    assert pod.services.accounts.report("account", start - 100, start - 50) == []  # a window before any use
    with pytest.raises(InvalidArgument, match="is after its --since"):
        pod.services.accounts.report("account", start, start - 1)


def test_an_account_that_holds_partitions_is_not_removed_and_bad_accounts_change_nothing(pod):
    pod.services.accounts.create(account("ml-a", ("alice",), 8))
    pod.partitions.create(PartitionRequest("p1", 4), ALICE)
    with pytest.raises(Conflict, match=r"account ml-a holds 1 partition \(p1\): remove them first"):
        pod.services.accounts.remove("ml-a")
    with pytest.raises(InvalidArgument, match="one shape limit per size"):
        pod.services.accounts.create(account("ml-b", (), 8, limits=("8+:partitions=1", "8+:ipus=8")))
    with pytest.raises(InvalidArgument, match="a shape limit is SIZE"):
        ShapeLimit.parse("64:partitions=2")
    with pytest.raises(NotFound, match="allocation nope does not exist"):
        pod.services.accounts.create(Account("ml-c", (), "", {"nope": Quota(8)}))
    assert [v.account.name for v in pod.services.accounts.list()] == ["ml-a"]
    pod.services.accounts.update(account("ml-a", (), 0), ["quotas"])  # below its use: nothing is evicted
    assert pod.partitions.get("p1", ALICE).ready_state is ReadyState.ACTIVE
    pod.partitions.remove("p1", ALICE)
    pod.services.accounts.remove("ml-a")
    assert pod.services.accounts.list() == []


def test_a_reservation_for_an_account_takes_its_partitions_whoever_makes_them_and_is_stored(pod):
    pod.services.accounts.create(account("ml-a", ("alice", "bob"), None))
    now = time.time()
    view = pod.partitions.reservations.create("team", now, now + 3600, "a training run", "admin", size=8, accounts=("ml-a",))
    assert view.reservation.accounts == ("ml-a",)
    made = pod.partitions.create(PartitionRequest("run", 8, reservation="team", account="ml-a"), BOB)  # not a user it names
    assert {(ipu.agent_id, ipu.index) for ipu in made.ipus} == view.reservation.ipus
    with pytest.raises(PermissionDenied, match=r"is for account ml-a, not for user carol"):
        pod.partitions.create(PartitionRequest("other", 4, reservation="team"), CAROL)
    with pytest.raises(InvalidArgument, match="invalid account id"):
        pod.partitions.reservations.create("bad", now, now + 60, "x", "admin", size=4, accounts=("bad id",))
    [kept] = pod.restarted().partitions.reservations.list()
    assert kept.reservation.accounts == ("ml-a",)


def test_a_reclaim_whose_request_found_room_meanwhile_is_withdrawn_and_evicts_nothing(pod):
    pod.owners.sharing = SharingPolicy(reclaim_grace=1.5)
    reclaim_noticed(pod)
    pod.partitions.remove("own", ALICE)  # room comes before the deadline
    until(lambda: pod.owners.owner("a1").snapshot.partitions.get("back") is not None, "the lender's request did not start")
    until(lambda: pod.owners.owner("a1").snapshot.partitions["lent"].reclaim_at == 0, "the notice was not withdrawn at its deadline")
    assert pod.partitions.get("lent", ALICE).drain_notices == ()
