"""A store write that fails in the middle of an operation (a full disk, a database gone away) is
reported as temporary, and leaves a state that the next health pass completes: nothing stuck in
an operation, nothing an agent holds that the store forgot. On SQLite and PostgreSQL.

The failure is injected where the store applies the write, by a failpoint of the transition
(`vipu.failpoints`), as a full disk would refuse it; how the store reads the database's own
errors is tested in tests/unit/store.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from vipu import failpoints
from vipu.model.entities import OperationState, PartitionRequest, ReadyState
from vipu.model.errors import NotFound, Unavailable

DISK_FULL = "database or disk is full"


@pytest.fixture
def pod(pod_on_store):
    return pod_on_store


@contextmanager
def failing(transition: str) -> Iterator[failpoints.Failpoint]:
    """Make the store refuse every write of that transition of a partition, as a full disk would."""
    point = failpoints.arm(f"store.partition.{transition}", f"fail(the store could not record the change: {DISK_FULL})")
    try:
        yield point
    finally:
        failpoints.disarm()


def state(pod, partition_id):
    partition = pod.partitions.get(partition_id)
    return partition.ready_state, partition.operation_state


def test_a_create_whose_last_write_fails_is_unavailable_and_completed_by_the_next_pass(pod):
    with failing("configured") as failed, pytest.raises(Unavailable, match=f"could not record the change: {DISK_FULL}"):
        pod.partitions.create(PartitionRequest("p1", 8))
    assert failed.hits == 1
    assert state(pod, "p1") == (ReadyState.PENDING, OperationState.CREATING)
    pod.health.check_all()
    assert state(pod, "p1") == (ReadyState.ACTIVE, OperationState.IDLE)
    assert pod.held_anywhere("p1") == ["ag1", "ag2"]


def test_a_create_whose_first_write_fails_changes_nothing(pod):
    with failing("create"), pytest.raises(Unavailable):
        pod.partitions.create(PartitionRequest("p1", 8))
    with pytest.raises(NotFound):
        pod.partitions.get("p1")
    assert pod.held_anywhere("p1") == []
    assert pod.partitions.create(PartitionRequest("p1", 8)).agent_ids == ["ag1", "ag2"]


def test_a_reset_whose_last_write_fails_is_completed_by_the_next_pass(pod):
    pod.partitions.create(PartitionRequest("p1", 8))
    with failing("configured"), pytest.raises(Unavailable, match=DISK_FULL):
        pod.partitions.reset("p1")
    assert state(pod, "p1") == (ReadyState.PENDING, OperationState.RESETTING)
    pod.health.check_all()
    assert state(pod, "p1") == (ReadyState.ACTIVE, OperationState.IDLE)
    assert pod.held_anywhere("p1") == ["ag1", "ag2"]


def test_a_remove_whose_last_write_fails_is_completed_by_the_next_pass(pod):
    pod.partitions.create(PartitionRequest("p1", 8))
    with failing("removed"), pytest.raises(Unavailable, match=DISK_FULL):
        pod.partitions.remove("p1")
    assert state(pod, "p1") == (ReadyState.ACTIVE, OperationState.REMOVING)
    assert pod.held_anywhere("p1") == []  # cleared already: the store still says where it was
    pod.health.check_all()
    with pytest.raises(NotFound):
        pod.partitions.get("p1")
    assert pod.partitions.create(PartitionRequest("p2", 8)).agent_ids == ["ag1", "ag2"]


def test_a_remove_whose_first_write_fails_changes_nothing(pod):
    pod.partitions.create(PartitionRequest("p1", 8))
    with failing("remove"), pytest.raises(Unavailable, match=DISK_FULL):
        pod.partitions.remove("p1", force=True)
    assert state(pod, "p1") == (ReadyState.ACTIVE, OperationState.IDLE)
    assert pod.held_anywhere("p1") == ["ag1", "ag2"]


def test_a_failing_agent_and_a_failing_store_together_leave_nothing_stuck(pod):
    pod.fault("m02", "IPU-Link training failed on IPU 3")
    with failing("abandon"), pytest.raises(Unavailable, match=DISK_FULL):
        pod.partitions.create(PartitionRequest("p1", 8))  # cannot even forget the failed partition
    assert pod.held_anywhere("p1") == []
    pod.heal()
    pod.health.check_all()  # the interrupted create is tried again, and now succeeds
    assert state(pod, "p1") == (ReadyState.ACTIVE, OperationState.IDLE)
