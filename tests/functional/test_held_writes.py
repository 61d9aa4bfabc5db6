"""A real controller on a real PostgreSQL whose writes another connection holds back with a table
lock, as a busy group commit or a slow disk does: nothing is shown before it is committed, and a
disruptive cluster test never runs beside a partition being made.

The test holds `LOCK TABLE partitions IN EXCLUSIVE MODE` in a connection of its own: reads go on,
every write of a partition waits. It knows the controller's write waits by PostgreSQL's own view
of the locks (`pg_locks`), never by a sleep. A failpoint (`VIPU_FAILPOINTS`) slows the agents'
apply, so that the lock can be taken again between a create's first commit and its last.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import psycopg
import pytest

from tests.functional.harness import Pod, failed_line, wait_until
from vipu.api.protos import vipuuser_pb2 as pb
from vipu.api.protos import vipuuser_pb2_grpc as pb_grpc

pytestmark = [pytest.mark.postgres, pytest.mark.functional]

LOOKS = 20  # how many times a state held back is read while it is held back


@pytest.fixture
def held_pod(tmp_path, postgres, monkeypatch):
    monkeypatch.setenv("VIPU_FAILPOINTS", "agent.apply=delay(1.5)")  # time to take the lock again before a create's last write
    database = postgres.create_database()
    pod = Pod(tmp_path, machines=4, db_url=postgres.url(database)).start()
    pod.register()
    yield pod
    pod.stop()
    postgres.drop_database(database)


def plain_url(pod: Pod) -> str:
    return pod.db_url.replace("postgresql+psycopg://", "postgresql://")


@contextlib.contextmanager
def partitions_locked(pod: Pod) -> Iterator[psycopg.Connection]:
    """Every write of a partition waits while this is held; reads go on."""
    with psycopg.connect(plain_url(pod)) as connection:
        connection.execute("LOCK TABLE partitions IN EXCLUSIVE MODE")
        yield connection
        connection.rollback()  # the lock goes with the transaction


def controller_waits_for_the_lock(pod: Pod) -> bool:
    with psycopg.connect(plain_url(pod), autocommit=True) as connection:
        waiting = connection.execute("SELECT count(*) FROM pg_locks l JOIN pg_class c ON c.oid = l.relation "
                                     "WHERE c.relname = 'partitions' AND NOT l.granted").fetchone()
    return bool(waiting and waiting[0])


def state_of(api, partition_id: str) -> tuple[int, int] | None:
    found = [p for p in api.ListPartitions(pb.ListPartitionsRequest(), timeout=10).partitions if p.id == partition_id]
    return (found[0].status.ready_state, found[0].status.operation_state) if found else None


def machines_of(api, partition_id: str) -> list[str]:
    found = [p for p in api.ListPartitions(pb.ListPartitionsRequest(), timeout=10).partitions if p.id == partition_id]
    return sorted({ipu.agent_id for ipu in found[0].spec.ipus})


def create(api, partition_id: str, size: int = 4):
    return api.CreatePartition(pb.CreatePartitionRequest(requirements=pb.PartitionRequirements(id=partition_id, size=size)),
                               timeout=60)


def test_a_create_held_back_is_never_shown_active_before_its_last_write_commits(held_pod):
    pod = held_pod
    api = pb_grpc.UserServiceStub(pod._channel(pod.user_port))
    with ThreadPoolExecutor(1) as pool:
        with partitions_locked(pod):  # its first write, (PENDING, CREATING), waits
            creating = pool.submit(create, api, "p1")
            wait_until(lambda: controller_waits_for_the_lock(pod), what="the create's first write to wait")
            for _ in range(LOOKS):
                assert state_of(api, "p1") is None  # nothing of it is committed: nothing is shown
        wait_until(lambda: state_of(api, "p1") is not None, what="the create's first write")
        assert state_of(api, "p1") == (pb.PS_PENDING, pb.POS_CREATING)
        with partitions_locked(pod):  # taken while its agents apply it: its last write, (ACTIVE, IDLE), waits
            wait_until(lambda: controller_waits_for_the_lock(pod), what="the create's last write to wait")
            for _ in range(LOOKS):
                assert state_of(api, "p1") == (pb.PS_PENDING, pb.POS_CREATING)  # configured, but not committed so
                assert not creating.done()
        assert creating.result(timeout=60).partition_id == "p1"
    assert state_of(api, "p1") == (pb.PS_ACTIVE, pb.POS_IDLE)


def test_a_disruptive_test_asked_while_a_create_is_held_back_is_refused_and_never_runs_beside_it(held_pod):
    pod = held_pod
    api = pb_grpc.UserServiceStub(pod._channel(pod.user_port))
    with ThreadPoolExecutor(2) as pool:
        with partitions_locked(pod):
            creating = pool.submit(create, api, "p1")
            wait_until(lambda: controller_waits_for_the_lock(pod), what="the create's first write to wait")
            testing = pool.submit(pod.admin, "test", "cluster", "cl0", "--sync")
            time.sleep(0.5)  # not a synchronisation: time for the test's claim to be asked while the create is held
            assert not testing.done()  # it waits behind the create, for the owner's answer
        assert creating.result(timeout=60).partition_id == "p1"
        failed_line(testing.result(timeout=120), "test cluster", "cl0", "cluster cl0 has partitions (p1)")
    status = pod.admin("test", "cluster", "--status")
    assert status.code != 0 and "No cluster test has run" in status.err  # the Sync-Link test never ran
    assert state_of(api, "p1") == (pb.PS_ACTIVE, pb.POS_IDLE)


def test_a_move_held_back_is_shown_on_its_old_ipus_until_it_commits(held_pod):
    pod = held_pod
    api = pb_grpc.UserServiceStub(pod._channel(pod.user_port))
    create(api, "p1")
    before = machines_of(api, "p1")
    config_before = api.GetPartitionIpuofConfig(pb.GetPartitionIpuofConfigRequest(partition_id="p1"), timeout=10)
    with ThreadPoolExecutor(1) as pool:
        with partitions_locked(pod):  # its 'relocate', with its new IPUs, waits
            moving = pool.submit(api.ResetPartition, pb.ResetPartitionRequest(partition_id="p1", relocate=True), timeout=60)
            wait_until(lambda: controller_waits_for_the_lock(pod), what="the move's write to wait")
            for _ in range(LOOKS):
                assert machines_of(api, "p1") == before
                assert state_of(api, "p1") == (pb.PS_ACTIVE, pb.POS_IDLE)
                config = api.GetPartitionIpuofConfig(pb.GetPartitionIpuofConfigRequest(partition_id="p1"), timeout=10)
                assert config == config_before  # clients are given the devices it still has
        moving.result(timeout=60)
    after = machines_of(api, "p1")
    assert after != before and not set(after) & set(before)
    assert state_of(api, "p1") == (pb.PS_ACTIVE, pb.POS_IDLE)
