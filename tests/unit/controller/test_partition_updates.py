"""A partition's consent to be moved while attached (`may_move`) and its expected duration: set at
create (and kept by a request that waits), changed later by its owner through the allocation's
owner as a compare-and-set, over test_services' pod of simulated machines."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from datetime import timedelta

import pytest

from tests.unit.controller.test_requests import wait
from vipu import failpoints
from vipu.controller.usecases.requests import Waiting
from vipu.model.entities import Access, PartitionRequest, ReadyState
from vipu.model.errors import Conflict, InvalidArgument, NoRoom, NotFound, PermissionDenied

ALICE = Access("alice", frozenset({"a1"}))
BOB = Access("bob", frozenset({"a1"}))
CAROL = Access("carol", frozenset())
ADMINISTRATOR = Access("root")


def stored(pod, partition_id: str):
    with pod.store.reading() as tx:
        return tx.get_partition(partition_id)


def test_both_are_set_at_create_and_its_owner_changes_may_move_as_committed(pod):
    created = pod.partitions.create(PartitionRequest("p1", 4, may_move=False, expected_seconds=3600), ALICE)
    assert (created.may_move, created.expected_seconds) == (False, 3600)
    assert created.expected_end == created.created + timedelta(hours=1)
    updated = pod.partitions.update("p1", may_move=True, access=ALICE)
    assert updated.may_move and pod.partitions.get("p1").may_move and stored(pod, "p1").may_move
    assert (updated.ready_state, updated.expected_seconds, updated.ipus) == (ReadyState.ACTIVE, 3600, created.ipus)
    assert pod.held_anywhere("p1") == ["ag1"]  # nothing was configured again
    assert pod.partitions.update("p1", may_move=True, access=ALICE).may_move  # asking for what is so changes nothing
    assert not pod.partitions.update("p1", may_move=False, access=ALICE).may_move
    assert not stored(pod, "p1").may_move
    pod.partitions.update("p1", may_move=True, access=ALICE)
    restarted = pod.restarted()
    assert (restarted.partitions.get("p1").may_move, restarted.partitions.get("p1").expected_seconds) == (True, 3600)


def test_a_partition_without_them_may_not_move_and_has_no_expected_end(pod):
    created = pod.partitions.create(PartitionRequest("p1", 4))
    assert (created.may_move, created.expected_seconds, created.expected_end) == (False, 0, None)


def test_only_its_owner_or_an_administrator_changes_it_and_every_refusal_changes_nothing(pod):
    pod.partitions.create(PartitionRequest("p1", 4), ALICE)
    with pytest.raises(PermissionDenied, match="partition p1 belongs to user alice; only its owner or an administrator changes it"):
        pod.partitions.update("p1", may_move=True, access=BOB)
    with pytest.raises(NotFound, match="partition p1 does not exist"):  # another tenant's, as if it did not exist
        pod.partitions.update("p1", may_move=True, access=CAROL)
    with pytest.raises(NotFound, match="partition nosuch does not exist"):
        pod.partitions.update("nosuch", may_move=True, access=ALICE)
    with pytest.raises(InvalidArgument, match="nothing to change of partition p1 was asked"):
        pod.partitions.update("p1", access=ALICE)
    assert not pod.partitions.get("p1").may_move and not stored(pod, "p1").may_move
    assert pod.partitions.update("p1", may_move=True, access=ADMINISTRATOR).may_move


def test_a_change_waits_for_the_operation_under_way_and_is_not_undone_by_it(pod):
    pod.partitions.create(PartitionRequest("p1", 4))
    clearing = failpoints.arm("agent.clear", "pause")  # the reset's first agent call stalls
    try:
        with ThreadPoolExecutor(2) as pool:
            resetting = pool.submit(pod.partitions.reset, "p1")
            assert clearing.reached.wait(10)
            updating = pool.submit(pod.partitions.update, "p1", True)
            with pytest.raises(TimeoutError):
                updating.result(0.3)  # behind the reset, which holds the partition
            assert not stored(pod, "p1").may_move
            clearing.released.set()
            assert resetting.result(10).ready_state is ReadyState.ACTIVE
            assert updating.result(10).may_move
    finally:
        failpoints.disarm()
    assert pod.partitions.get("p1").may_move and stored(pod, "p1").may_move


def test_a_change_the_store_refuses_is_read_again_from_the_store(pod):
    created = pod.partitions.create(PartitionRequest("p1", 4))
    with pod.store.transaction() as tx:  # a change its owner never saw (say, a deposed leader's)
        tx.transition(created, "remove")
    with pytest.raises(Conflict, match="partition p1 is ACTIVE/REMOVING, not ACTIVE/IDLE as 'update' expected"):
        pod.partitions.update("p1", may_move=True)
    assert not stored(pod, "p1").may_move and not pod.partitions.get("p1").may_move


def test_a_waiting_request_keeps_both_for_the_partition_it_becomes(pod):
    pod.partitions.create(PartitionRequest("big", 32))
    queued = pod.requests.create(PartitionRequest("p1", 4, may_move=True, expected_seconds=600), wait_seconds=60)
    assert isinstance(queued, Waiting)
    assert (queued.request.request.may_move, queued.request.request.expected_seconds) == (True, 600)
    with pod.store.reading() as tx:
        [waiting] = tx.list_requests()
    assert (waiting.request.may_move, waiting.request.expected_seconds) == (True, 600)
    pod.partitions.remove("big")
    started = wait(pod.requests, "p1")
    assert (started.ready_state, started.may_move, started.expected_seconds) == (ReadyState.ACTIVE, True, 600)
    assert started.expected_end == started.created + timedelta(minutes=10)  # from its start, not from its request
    assert (stored(pod, "p1").may_move, stored(pod, "p1").expected_seconds) == (True, 600)


def test_an_expected_duration_the_api_cannot_carry_is_refused(pod):
    with pytest.raises(InvalidArgument, match=r"an expected duration is 0 \(unknown\) to 4294967295 s, not -1 s"):
        pod.partitions.create(PartitionRequest("p1", 4, expected_seconds=-1))
    assert pod.partitions.list() == []


def test_the_size_mix_counts_a_valid_request_once_and_a_restarted_owner_starts_from_what_the_allocation_holds(pod):
    def counted(services) -> dict[int, int]:
        return {size: round(count) for size, count in services.owners.owner("a1").state.mix.seen}

    with pytest.raises(InvalidArgument):
        pod.partitions.create(PartitionRequest("odd", 3))
    assert counted(pod.services) == {}  # a request found invalid says nothing of the workload
    pod.partitions.create(PartitionRequest("p1", 16))
    pod.partitions.create(PartitionRequest("p2", 4))
    for _ in range(3):  # 12 IPUs are free: refused for room, and asked again by a client retrying
        with pytest.raises(NoRoom, match=r"^no free 16-IPU run in allocation a1: 12 of 32 IPUs are free"):
            pod.partitions.create(PartitionRequest("big", 16))
    assert counted(pod.services) == {4: 1, 16: 2}
    assert isinstance(pod.requests.create(PartitionRequest("big", 16), wait_seconds=60), Waiting)  # counted already
    pod.requests.cancel("big")
    with pytest.raises(NoRoom):  # refused before, then waiting: asked anew now, and counted anew
        pod.partitions.create(PartitionRequest("big", 16))
    assert counted(pod.services) == {4: 1, 16: 3}
    assert counted(pod.restarted()) == {4: 1, 16: 1}  # the partitions held; the refused request is gone
