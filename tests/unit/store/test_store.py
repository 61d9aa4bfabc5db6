"""The store, on SQLite and on a real PostgreSQL: entities round-trip, invariants hold under races."""

from __future__ import annotations

import dataclasses
import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import event
from sqlalchemy.exc import DBAPIError

from vipu import failpoints
from vipu.model.entities import (
    Agent,
    AgentStatus,
    Allocation,
    Cluster,
    GwRouting,
    GwTopology,
    IldTopology,
    IpuInfo,
    IpuLinkRouting,
    MachineInventory,
    OperationState,
    Partition,
    PartitionRequest,
    PlacedIpu,
    ReadyState,
    SyncType,
)
from vipu.model.errors import AlreadyExists, ConcurrentUpdate, Conflict, NotFound, OutcomeUnknown, Unavailable, VipuError
from vipu.model.queue import WaitingRequest
from vipu.model.reservations import Reservation
from vipu.model.telemetry import LogLine
from vipu.store.schema import SCHEMA_VERSION
from vipu.store.store import STATEMENT_DEADLINE_SECONDS, Store, normalise_url


def agent(n: int) -> Agent:
    inventory = MachineInventory(
        serial=f"S{n}", platform="IPU-M2000", versions={"agent": "0.1.0"},
        ipus=[IpuInfo(i, f"chip{n}.{i}", {"clock": "1330MHz"}) for i in range(4)], ipuof_port=50000 + n,
    )
    return Agent(f"ag{n}", "127.0.0.1", 18000 + n, inventory)


def partition(pid: str, agent_id: str, indices=(0, 1, 2, 3)) -> Partition:
    ipus = [PlacedIpu(agent_id, i, 0, i, 0, r, 0) for r, i in enumerate(indices)]
    return Partition(
        id=pid, cluster_id="cl0", allocation_id="a1", size=len(ipus), num_gcds=1, num_replicas=1, reconfigurable=False,
        sync_type=SyncType.POD_NATIVE_DEFAULT, ipulink_routing=IpuLinkRouting.DNC, gw_routing=GwRouting.DEFAULT,
        num_segments=1, ipus=ipus,
    )


def wait_for(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


@pytest.fixture
def store(store_url):
    store = Store(store_url)
    yield store
    store.close()


@pytest.fixture
def populated(store):
    with store.transaction() as tx:
        for n in range(1, 5):
            tx.add_agent(agent(n))
        tx.add_cluster(Cluster("cl0", ("ag1", "ag2", "ag3", "ag4"), IldTopology.TORUS, 2, GwTopology.LOOPED))
        tx.add_allocation(Allocation("a1", "cl0", ("ag1", "ag2")))
    return store


def test_entities_round_trip(populated):
    with populated.reading() as tx:
        assert tx.get_agent("ag2") == agent(2)
        assert tx.get_cluster("cl0") == Cluster("cl0", ("ag1", "ag2", "ag3", "ag4"), IldTopology.TORUS, 2, GwTopology.LOOPED)
        assert tx.get_allocation("a1").agent_ids == ("ag1", "ag2")
        assert tx.cluster_of_agents() == {f"ag{n}": "cl0" for n in range(1, 5)}
        assert tx.allocation_of_agents() == {"ag1": "a1", "ag2": "a1"}
        assert tx.agent_with_address("127.0.0.1", 18003).id == "ag3"


def test_partitions_round_trip_and_change_state(populated):
    p = partition("p1", "ag1")
    with populated.transaction() as tx:
        tx.add_partition(p)
    with populated.transaction() as tx:
        tx.transition(p, "fail", errors=["agent ag1: broken"])
    with populated.reading() as tx:
        stored = tx.get_partition("p1")
        assert stored.ipus == p.ipus
        assert (stored.ready_state, stored.operation_state, stored.errors) == (
            ReadyState.ERROR, OperationState.FAILED, ["agent ag1: broken"])
        assert tx.used_ipus("a1") == {"ag1": {0, 1, 2, 3}}
        assert [x.id for x in tx.partitions_on_agent("ag1")] == ["p1"]
        assert tx.partitions_on_agent("ag2") == []


def test_a_transition_is_a_compare_and_set_on_the_state_it_was_read_in(populated):
    with populated.transaction() as tx:
        tx.add_partition(partition("p1", "ag1"))
    with populated.reading() as tx:
        first, second = tx.get_partition("p1"), tx.get_partition("p1")  # two operations' readings
    with populated.transaction() as tx:
        tx.transition(first, "configured", errors=[])
    assert (first.ready_state, first.operation_state) == (ReadyState.ACTIVE, OperationState.IDLE)
    with pytest.raises(Conflict, match="partition p1 is ACTIVE/IDLE, not PENDING/CREATING as 'fail' expected"):
        with populated.transaction() as tx:
            tx.transition(second, "fail", errors=["late"])
    with pytest.raises(Conflict, match="partition p1 is ACTIVE/IDLE: 'removed' applies only to a partition that is"):
        with populated.transaction() as tx:
            tx.transition(first, "removed")
    with populated.reading() as tx:
        stored = tx.get_partition("p1")
        assert (stored.ready_state, stored.operation_state, stored.errors) == (ReadyState.ACTIVE, OperationState.IDLE, [])


def recorded(store: Store, outcomes: dict[str, object]):
    """A grouped write, from any thread, whose result or refusal is kept in `outcomes` under its name."""
    def write(name, work):
        try:
            outcomes[name] = store.write(work)
        except VipuError as error:
            outcomes[name] = error

    return write


def test_writes_that_arrive_while_another_commits_share_one_commit_and_fail_alone(populated):
    with populated.transaction() as tx:
        tx.add_partition(partition("taken", "ag2"))
    commits = failpoints.arm("store.commit", "delay(0)")  # counts the commits
    first_began, let_first_end = threading.Event(), threading.Event()

    def first(tx):
        first_began.set()
        assert let_first_end.wait(10)
        tx.add_partition(partition("p0", "ag1", (0,)))

    outcomes: dict[str, object] = {}
    write = recorded(populated, outcomes)

    def adding(name, agent_id, index):
        return lambda tx: tx.add_partition(partition(name, agent_id, (index,)))

    writers = [threading.Thread(target=write, args=("p0", first))]
    writers[0].start()
    assert first_began.wait(10)
    writers += [threading.Thread(target=write, args=(f"p{n}", adding(f"p{n}", "ag1", n))) for n in (1, 2, 3)]
    writers.append(threading.Thread(target=write, args=("clash", adding("clash", "ag2", 0))))  # ag2's IPU 0 is taken
    for writer in writers[1:]:
        writer.start()
    wait_for(lambda: len(populated._group._pending) == 4)
    let_first_end.set()
    for writer in writers:
        writer.join(10)
    failpoints.disarm()
    assert commits.hits == 2  # the first write's, then one for the four that waited meanwhile
    assert isinstance(outcomes.pop("clash"), ConcurrentUpdate)
    assert outcomes == {"p0": None, "p1": None, "p2": None, "p3": None}
    with populated.reading() as tx:
        assert [p.id for p in tx.list_partitions()] == ["p0", "p1", "p2", "p3", "taken"]
        assert tx.used_ipus("a1") == {"ag1": {0, 1, 2, 3}, "ag2": {0, 1, 2, 3}}


def test_a_write_that_gives_up_waiting_for_its_turn_is_withdrawn_and_never_committed_later(populated, monkeypatch):
    monkeypatch.setattr(populated._group._turn, "_seconds", 0.3)  # the statement deadline, shortened
    holding, let_go = threading.Event(), threading.Event()

    def slow(tx):  # a commit held past the deadline: a slow disk, a checkpoint
        holding.set()
        assert let_go.wait(10)
        tx.add_partition(partition("slow", "ag1", (0,)))

    outcomes: dict[str, object] = {}
    write = recorded(populated, outcomes)

    first = threading.Thread(target=write, args=("slow", slow))
    first.start()
    assert holding.wait(10)
    write("late", lambda tx: tx.add_partition(partition("late", "ag2", (0,))))  # told the store is busy
    assert isinstance(outcomes["late"], Unavailable) and not isinstance(outcomes["late"], OutcomeUnknown)
    assert not populated._group._pending  # withdrawn: no later group can commit it
    let_go.set()
    first.join(10)
    write("next", lambda tx: tx.add_partition(partition("next", "ag3", (0,))))
    assert outcomes["slow"] is None and outcomes["next"] is None
    with populated.reading() as tx:
        assert sorted(p.id for p in tx.list_partitions()) == ["next", "slow"]


def test_a_commit_whose_answer_is_lost_is_outcome_unknown_and_the_next_commit_goes_on(populated):
    failpoints.arm("store.commit.answer", "1*fail(the connection went during COMMIT)")
    try:
        with pytest.raises(OutcomeUnknown, match=r"the store's answer to the commit was lost \(the connection went during COMMIT\)"):
            populated.write(lambda tx: tx.add_partition(partition("p1", "ag1")))
    finally:
        failpoints.disarm()
    populated.write(lambda tx: tx.add_partition(partition("p2", "ag2")))
    with populated.reading() as tx:
        assert sorted(p.id for p in tx.list_partitions()) == ["p1", "p2"]  # committed, though its answer was lost


def test_the_commit_hook_is_told_after_the_commit_and_its_failure_leaves_the_write_standing(populated, caplog):
    seen = []

    def failing_hook(changed: frozenset[str]) -> None:
        with populated.reading() as tx:  # another connection: the write is committed by now
            seen.append((changed, tx.get_agent("ag9") is not None))
        raise RuntimeError("a live view's listener broke")

    populated.on_commit = failing_hook
    with populated.transaction() as tx:
        tx.add_agent(agent(9))
    assert seen == [(frozenset({"configuration"}), True)]
    assert "telling of a committed change failed" in caplog.text and "a live view's listener broke" in caplog.text
    with populated.reading() as tx:
        assert tx.get_agent("ag9") is not None


def test_no_statement_waits_past_the_stores_deadline(store):
    with store.transaction() as tx:
        if store.is_sqlite:
            waited = tx.connection.exec_driver_sql("PRAGMA busy_timeout").scalar_one()
            assert waited == STATEMENT_DEADLINE_SECONDS * 1000
        else:
            assert tx.connection.exec_driver_sql("SHOW statement_timeout").scalar_one() == f"{STATEMENT_DEADLINE_SECONDS}s"


def test_a_transaction_left_waiting_on_its_process_is_ended_by_postgresql(store_url):
    """A replica cut off mid-transaction would hold its locks for as long as its connection
    lingers; the server ends the transaction once it has waited `idle_seconds` for the next statement."""
    if store_url.startswith("sqlite"):
        pytest.skip("SQLite's transactions live in the process that holds them")
    store = Store(store_url, idle_seconds=0.2)
    try:
        with pytest.raises(DBAPIError, match="idle-in-transaction timeout"), store.transaction() as tx:
            tx.connection.exec_driver_sql("SELECT 1")
            time.sleep(1.0)  # the process waits: the server's timer runs out meanwhile
            tx.connection.exec_driver_sql("SELECT 1")
        with store.transaction() as tx:  # the store goes on, on another connection
            assert tx.connection.exec_driver_sql("SHOW idle_in_transaction_session_timeout").scalar_one() == "200ms"
    finally:
        store.close()


def test_removal_is_the_transition_to_absent_and_frees_the_ipus(populated):
    p = partition("p1", "ag1")
    with populated.transaction() as tx:
        tx.add_partition(p)
        tx.transition(p, "configured", errors=[])
        tx.transition(p, "remove")
    stale = partition("p1", "ag1")  # a reading from before the remove began
    with populated.transaction() as tx:
        tx.transition(p, "removed")
    with pytest.raises(Conflict, match="partition p1 is absent, not PENDING/CREATING"):
        with populated.transaction() as tx:
            tx.transition(stale, "abandon")
    with populated.reading() as tx:
        assert tx.get_partition("p1") is None and tx.used_ipus("a1") == {}


def test_a_new_partition_enters_by_create_only(populated):
    settled = partition("p1", "ag1")
    settled.ready_state, settled.operation_state = ReadyState.ACTIVE, OperationState.IDLE
    with pytest.raises(ValueError, match="a new partition is PENDING/CREATING, not ACTIVE/IDLE"):
        with populated.transaction() as tx:
            tx.add_partition(settled)


def test_a_failed_transaction_leaves_nothing_behind(populated):
    with pytest.raises(RuntimeError):
        with populated.transaction() as tx:
            tx.add_partition(partition("p1", "ag1"))
            raise RuntimeError("boom")
    with populated.reading() as tx:
        assert tx.get_partition("p1") is None
        assert tx.used_ipus("a1") == {}


def test_ids_are_unique(populated):
    with pytest.raises(AlreadyExists):
        with populated.transaction() as tx:
            tx.add_agent(agent(1))
    with pytest.raises(AlreadyExists):
        with populated.transaction() as tx:
            tx.add_cluster(Cluster("cl0", ()))


def test_the_database_refuses_an_agent_in_two_clusters_and_a_machine_in_two_allocations(populated):
    with pytest.raises(ConcurrentUpdate):
        with populated.transaction() as tx:
            tx.add_cluster(Cluster("cl1", ("ag4",)))
    with pytest.raises(ConcurrentUpdate):
        with populated.transaction() as tx:
            tx.add_allocation(Allocation("a2", "cl0", ("ag2", "ag3")))
    with populated.reading() as tx:
        assert tx.get_cluster("cl1") is None and tx.get_allocation("a2") is None


def test_the_database_refuses_an_ipu_in_two_partitions(populated):
    with populated.transaction() as tx:
        tx.add_partition(partition("p1", "ag1", (0, 1)))
    with pytest.raises(ConcurrentUpdate):
        with populated.transaction() as tx:
            tx.add_partition(partition("p2", "ag1", (1, 2)))
    with populated.reading() as tx:
        assert tx.get_partition("p2") is None
        assert tx.used_ipus("a1") == {"ag1": {0, 1}}


def test_racing_writers_never_share_an_ipu(populated):
    """Eight threads each try to take IPU 0 of ag1 in its own partition; exactly one wins."""
    results: list[str] = []
    start = threading.Barrier(8)

    def contend(n: int) -> None:
        start.wait()
        try:
            with populated.transaction() as tx:
                if 0 not in tx.used_ipus("a1").get("ag1", set()):
                    tx.add_partition(partition(f"p{n}", "ag1", (0,)))
            results.append("won")
        except ConcurrentUpdate:
            results.append("lost")

    threads = [threading.Thread(target=contend, args=(n,)) for n in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    with populated.reading() as tx:
        holders = [p.id for p in tx.list_partitions()]
    assert len(holders) == 1
    assert len(results) == 8


def test_deleting_a_cluster_or_allocation_removes_its_membership(populated):
    with populated.transaction() as tx:
        tx.delete_allocation("a1")
        tx.delete_cluster("cl0")
    with populated.transaction() as tx:
        tx.add_cluster(Cluster("cl1", ("ag4", "ag3")))
    with populated.reading() as tx:
        assert tx.cluster_of_agents() == {"ag4": "cl1", "ag3": "cl1"}
        assert tx.get_cluster("cl1").agent_ids == ("ag4", "ag3")


def test_agent_updates_persist(populated):
    with populated.transaction() as tx:
        changed = tx.get_agent("ag1")
        changed.status, changed.last_error = AgentStatus.DOWN, "unreachable"
        tx.update_agent(changed)
    with populated.reading() as tx:
        assert (tx.get_agent("ag1").status, tx.get_agent("ag1").last_error) == (AgentStatus.DOWN, "unreachable")


def test_state_survives_reopening_the_store(populated, store_url):
    with populated.transaction() as tx:
        tx.add_partition(partition("p1", "ag2"))
    populated.close()
    reopened = Store(store_url)
    try:
        with reopened.reading() as tx:
            assert tx.get_partition("p1").ipus == partition("p1", "ag2").ipus
            assert tx.get_allocation("a1").agent_ids == ("ag1", "ag2")
    finally:
        reopened.close()


def test_operators_write_urls_their_way():
    assert normalise_url("postgresql://u@h/db") == "postgresql+psycopg://u@h/db"
    assert normalise_url("postgres://u@h/db") == "postgresql+psycopg://u@h/db"
    assert normalise_url("/var/lib/vipu/vipu.db") == "sqlite:////var/lib/vipu/vipu.db"


def test_the_last_cluster_test_is_kept_and_replaced(store, store_url):
    from vipu.model.clustertests import Outcome, RunState, Status, TestRun, TestType

    with store.reading() as tx:
        assert tx.get_test_run() is None
    run = TestRun("cl0", RunState.FINISHED, [TestType.SYNC, TestType.CABLING],
                  [Outcome(TestType.SYNC, Status.FAILED, 12, 14, ["Failed Sync Links:", "ag1:6 <--> 2:ag2"], 0.9,
                           {"Sync-Link ag1:6 ag2:2": ["ag1:6 <--> 2:ag2"]})])  # each cable's lines are kept too
    with store.transaction() as tx:
        tx.save_test_run(run)
    store.close()
    reopened = Store(store_url)
    try:
        with reopened.reading() as tx:
            assert tx.get_test_run() == run
        with reopened.transaction() as tx:
            tx.save_test_run(TestRun("cl1", RunState.RUNNING, [TestType.VERSION]))
        with reopened.reading() as tx:
            assert tx.get_test_run() == TestRun("cl1", RunState.RUNNING, [TestType.VERSION])
    finally:
        reopened.close()


def test_each_clusters_cable_verdicts_are_kept_and_go_with_the_cluster(populated, store_url):
    from vipu.model.clustertests import CableVerdict, CableVerdicts, RunState

    verdicts = CableVerdicts(RunState.FINISHED, {"IPU-Link ag1:5 ag2:1": (CableVerdict.FAILED, ("Cabling: ag1:5 <--> ag2:1",)),
                                                 "Sync-Link ag1:6 ag2:2": (CableVerdict.PASSED, ())})
    with populated.transaction() as tx:
        assert tx.get_cable_verdicts("cl0") is None
        tx.save_cable_verdicts("cl0", CableVerdicts(RunState.RUNNING))
        tx.save_cable_verdicts("cl0", verdicts)  # replaced
    populated.close()
    reopened = Store(store_url)
    try:
        with reopened.reading() as tx:
            assert tx.get_cable_verdicts("cl0") == verdicts
        with reopened.transaction() as tx:
            tx.delete_allocation("a1")
            tx.delete_cluster("cl0")
        with reopened.reading() as tx:
            assert tx.get_cable_verdicts("cl0") is None
    finally:
        reopened.close()


def test_users_their_grants_and_credentials(populated):
    from vipu.model.entities import Role, User
    from vipu.store.store import Credential

    with populated.transaction() as tx:
        tx.add_user(User("alice", Role.USER, ("a1",)), Credential(b"s" * 16, b"h" * 32, 1))
        tx.add_user(User("root", Role.ADMIN), Credential(b"t" * 16, b"k" * 32, 1))
    with pytest.raises(AlreadyExists):
        with populated.transaction() as tx:
            tx.add_user(User("alice"), Credential(b"", b"", 1))
    with populated.transaction() as tx:
        tx.set_credential("alice", Credential(b"u" * 16, b"g" * 32, 2))
    with populated.reading() as tx:
        assert tx.get_user("alice") == User("alice", Role.USER, ("a1",))
        assert tx.get_credential("alice") == Credential(b"u" * 16, b"g" * 32, 2)
        assert [u.id for u in tx.list_users()] == ["alice", "root"]
    with populated.transaction() as tx:
        tx.delete_allocation("a1")  # a removed allocation is no longer given to anyone
    with populated.reading() as tx:
        assert tx.get_user("alice").allocation_ids == ()


def test_a_store_of_an_older_schema_is_migrated(populated, store_url):
    from sqlalchemy import text

    with populated.transaction() as tx:
        tx.add_partition(partition("p1", "ag1"))
        tx.session.execute(text("ALTER TABLE partitions DROP COLUMN owner"))
        tx.session.execute(text("ALTER TABLE partitions DROP COLUMN last_auto_reset_at"))
        tx.session.execute(text("ALTER TABLE partitions DROP COLUMN attach_key"))
        tx.session.execute(text("ALTER TABLE partitions DROP COLUMN relocatable"))
        tx.session.execute(text("ALTER TABLE partitions DROP COLUMN relocation"))
        tx.session.execute(text("ALTER TABLE partitions DROP COLUMN failed_on"))
        tx.session.execute(text("ALTER TABLE partitions DROP COLUMN placement_note"))
        tx.session.execute(text("DROP TABLE partition_requests"))
        tx.session.execute(text("UPDATE vipu_meta SET value = '2' WHERE key = 'schema_version'"))
    populated.close()
    reopened = Store(store_url)
    try:
        with reopened.reading() as tx:
            assert tx.get_partition("p1").owner == "" and tx.get_partition("p1").last_auto_reset is None
            assert len(tx.get_partition("p1").attach_key) >= 20  # a key of its own, made by the migration
            assert (tx.get_partition("p1").relocatable, tx.get_partition("p1").relocation) == (False, "")
            assert tx.get_partition("p1").failed_on == ()
            assert tx.get_partition("p1").placement_note == ""
            assert tx.list_requests() == []
            assert tx.session.execute(text("SELECT value FROM vipu_meta WHERE key = 'schema_version'")).scalar() == str(SCHEMA_VERSION)
    finally:
        reopened.close()


def test_waiting_requests_of_a_store_before_leases_are_migrated_as_waited_for(populated, store_url):
    from sqlalchemy import text

    with populated.transaction() as tx:
        tx.add_request(WaitingRequest(PartitionRequest("q1", 4), "a1", "", datetime.now(UTC), datetime.now(UTC) + timedelta(hours=1)))
        tx.session.execute(text("ALTER TABLE partition_requests DROP COLUMN detached"))
        tx.session.execute(text("UPDATE vipu_meta SET value = '9' WHERE key = 'schema_version'"))
    populated.close()
    reopened = Store(store_url)
    try:
        with reopened.reading() as tx:
            assert [(r.partition_id, r.detached) for r in tx.list_requests()] == [("q1", False)]
    finally:
        reopened.close()


def test_an_owning_controller_reads_its_configuration_from_memory_and_sees_its_own_changes(populated, store_url):
    statements = []
    event.listen(populated._read_engine, "before_cursor_execute", lambda *args: statements.append(args[2]))
    populated.own()
    with populated.reading() as tx:
        tx.list_allocations()  # loads the configuration once
    statements.clear()
    with populated.reading() as tx:
        assert [a.id for a in tx.list_allocations()] == ["a1"]
        assert tx.get_agent("ag1") == agent(1)
    assert statements == []  # not even the generation counter
    with populated.transaction() as tx:
        tx.add_allocation(Allocation("a2", "cl0", ("ag3", "ag4")))
    with populated.reading() as tx:
        assert [a.id for a in tx.list_allocations()] == ["a1", "a2"]
    with pytest.raises(AlreadyExists), populated.transaction() as tx:  # a failed transaction changes neither store nor cache
        tx.delete_allocation("a2")
        raise AlreadyExists("given up")
    with populated.reading() as tx:
        assert [a.id for a in tx.list_allocations()] == ["a1", "a2"]
    other = Store(store_url)  # a writer it was told does not exist is not seen ...
    try:
        with other.transaction() as tx:
            tx.delete_allocation("a2")
    finally:
        other.close()
    with populated.reading() as tx:
        assert [a.id for a in tx.list_allocations()] == ["a1", "a2"]
    populated.own(False)  # ... until it stops owning the store
    with populated.reading() as tx:
        assert [a.id for a in tx.list_allocations()] == ["a1"]


def test_an_agent_rewritten_by_an_owning_controller_is_taken_into_its_cache_as_a_fresh_load_would_read_it(populated):
    from vipu.model.hardware import ComponentHealth, HealthEvent, HealthLevel, MachineCondition

    populated.own()
    condition = MachineCondition("On", "Warning", (ComponentHealth("fan1", HealthLevel.WARNING, "Enabled", "slow"),),
                                 ("health: BMC slow",), (HealthEvent(3, 1.5, HealthLevel.WARNING, "fan1", "slow"),))
    with populated.transaction() as tx:  # as the health pass records a look at a machine
        changed = tx.get_agent("ag2")
        changed.status, changed.last_error = AgentStatus.DOWN, "x" * 2000
        changed.inventory = dataclasses.replace(changed.inventory, condition=condition)
        tx.update_agent(changed)
    statements = []
    event.listen(populated._read_engine, "before_cursor_execute", lambda *args: statements.append(args[2]))
    with populated.reading() as tx:
        cached = tx.get_agent("ag2")
        assert [a.id for a in tx.list_agents()] == ["ag1", "ag2", "ag3", "ag4"]
    assert statements == []  # nothing loaded again
    assert cached.last_error == "x" * 1024 and cached.inventory.condition == condition
    populated.own(False)
    with populated.reading() as tx:
        assert tx.get_agent("ag2") == cached  # the database's own reading


def test_an_agent_rewrite_overtaken_by_another_change_makes_an_owning_controller_load_its_configuration_again(populated):
    populated.own()
    with populated.transaction() as tx:
        changed = tx.get_agent("ag3")
        changed.status = AgentStatus.DOWN
        tx.update_agent(changed)
        # Another transaction's rewrite of ag3 told meanwhile: PostgreSQL's writers do not take turns, so
        # it may have committed after this one, and which of the two the database holds is not known here.
        overtaking = dataclasses.replace(changed, last_error="another look")
        populated._cache.changed({"ag3": overtaking}, read_at=populated._cache.cached().generation)
    statements = []
    event.listen(populated._read_engine, "before_cursor_execute", lambda *args: statements.append(args[2]))
    with populated.reading() as tx:
        assert tx.get_agent("ag3").status is AgentStatus.DOWN
    assert statements != []  # loaded again: the cache could not know what it had missed


def test_another_controller_on_the_same_database_sees_every_configuration_change(populated, store_url):
    other = Store(store_url)  # a second controller: its own configuration cache
    try:
        with other.reading() as tx:
            assert [a.id for a in tx.list_allocations()] == ["a1"]
            assert tx.get_agent("ag3").status is AgentStatus.UP
        with populated.transaction() as tx:
            tx.add_allocation(Allocation("a2", "cl0", ("ag3", "ag4")))
        with other.reading() as tx:
            assert [a.id for a in tx.list_allocations()] == ["a1", "a2"]
        with populated.transaction() as tx:
            changed = tx.get_agent("ag3")
            changed.status = AgentStatus.DOWN
            tx.update_agent(changed)
        with other.reading() as tx:
            assert tx.get_agent("ag3").status is AgentStatus.DOWN
        with other.transaction() as tx:
            tx.delete_allocation("a2")
            assert [a.id for a in tx.list_allocations()] == ["a1"]  # a transaction sees its own change
        with populated.reading() as tx:
            assert tx.get_allocation("a2") is None
    finally:
        other.close()


def test_entities_handed_out_are_copies_a_caller_may_change(populated):
    with populated.reading() as tx:
        tx.get_agent("ag1").status = AgentStatus.DOWN
        tx.list_clusters()[0].num_ilds = 9
    with populated.reading() as tx:
        assert tx.get_agent("ag1").status is AgentStatus.UP
        assert tx.get_cluster("cl0").num_ilds == 2


def test_one_claimant_holds_the_lease_until_it_expires_then_another_takes_it_in_a_new_term(store, store_url):
    other = Store(store_url)  # opened first: only the claims fall within the lease
    lease = 2.0
    try:
        first = store.claim_lease("lead", "a", "host-a", lease)
        assert (first.holder, first.address, first.term) == ("a", "host-a", 1) and 0 < first.remaining <= lease
        refused = other.claim_lease("lead", "b", "host-b", lease)
        assert (refused.holder, refused.term) == ("a", 1)  # b is told who leads
        assert store.claim_lease("lead", "a", "host-a", lease).term == 1  # renewing keeps the term
        wait_for(lambda: store.read_lease("lead").remaining < 0)
        taken = other.claim_lease("lead", "b", "host-b", lease)
        assert (taken.holder, taken.address, taken.term) == ("b", "host-b", 2)
        assert store.claim_lease("lead", "a", "host-a", lease).holder == "b"
    finally:
        other.close()


def test_a_released_lease_is_taken_at_once(store):
    store.claim_lease("lead", "a", "host-a", 60)
    store.release_lease("lead", "a")
    assert store.claim_lease("lead", "b", "host-b", 60).holder == "b"


def test_a_deposed_leader_can_write_nothing(populated, store_url):
    store = populated
    store.fence(store.claim_lease("lead", "a", "host-a", 0.3))
    with store.transaction() as tx:
        tx.add_partition(partition("p1", "ag1"))  # while leading, writes commit
    wait_for(lambda: store.read_lease("lead").remaining < 0)
    successor = Store(store_url)
    try:
        assert successor.claim_lease("lead", "b", "host-b", 60).holder == "b"
        with pytest.raises(Unavailable, match="no longer the leader"):
            with store.transaction() as tx:
                tx.add_partition(partition("p2", "ag2"))
        with successor.reading() as tx:
            assert [p.id for p in tx.list_partitions()] == ["p1"]
    finally:
        successor.close()


def test_racing_claimants_elect_exactly_one(store_url):
    stores = [Store(store_url) for _ in range(8)]
    start = threading.Barrier(len(stores))
    won: list[str] = []

    def claim(n: int) -> None:
        start.wait()
        if stores[n].claim_lease("lead", f"r{n}", f"host-{n}", 60).holder == f"r{n}":
            won.append(f"r{n}")

    threads = [threading.Thread(target=claim, args=(n,)) for n in range(len(stores))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    try:
        assert len(won) == 1, won
        assert stores[0].read_lease("lead").holder == won[0]
    finally:
        for store in stores:
            store.close()


def test_replicas_opening_a_new_store_at_once_initialise_it_once(store_url):
    start = threading.Barrier(6)
    opened: list[Store] = []
    failures: list[Exception] = []

    def open_store() -> None:
        start.wait()
        try:
            opened.append(Store(store_url))
        except Exception as error:  # noqa: BLE001 - collected for the assertion
            failures.append(error)

    threads = [threading.Thread(target=open_store) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    try:
        assert failures == []
        with opened[0].transaction() as tx:
            tx.add_agent(agent(1))
        with opened[-1].reading() as tx:
            assert [a.id for a in tx.list_agents()] == ["ag1"]
    finally:
        for store in opened:
            store.close()


@pytest.mark.postgres
def test_a_takeover_waits_for_the_writes_the_old_leader_has_under_way(postgres_url):
    from sqlalchemy import create_engine, text

    leader, successor = Store(postgres_url), Store(postgres_url)
    observer = create_engine(normalise_url(postgres_url))
    try:
        with leader.transaction() as tx:
            tx.add_agent(agent(1))
        leader.fence(leader.claim_lease("lead", "a", "host-a", 0.3))
        wait_for(lambda: leader.read_lease("lead").remaining < 0)
        taken: list = []
        with leader.transaction() as tx:  # passed the fence while the lease was still a's
            tx.add_agent(agent(2))
            claimant = threading.Thread(target=lambda: taken.append(successor.claim_lease("lead", "b", "host-b", 60)))
            claimant.start()

            def claimant_waits() -> bool:
                with observer.connect() as connection:
                    waiting = text("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted")
                    return connection.execute(waiting).scalar() == 1

            wait_for(claimant_waits)
            assert taken == []
        claimant.join(timeout=10)
        assert taken[0].holder == "b" and taken[0].term == 2
        with successor.reading() as tx:
            assert [a.id for a in tx.list_agents()] == ["ag1", "ag2"]  # the write under way committed before the takeover
    finally:
        observer.dispose()
        leader.close()
        successor.close()


def waiting(pid: str, size: int = 4, **fields) -> WaitingRequest:
    now = datetime.now(UTC).replace(microsecond=0)
    request = PartitionRequest(pid, size, num_gcds=2, sync_type=SyncType.GS2_DEFAULT, ipulink_routing=IpuLinkRouting.SWNC,
                               explicit_ipus=((0, 1), (0, 2)), index=None, relocatable=True)
    return WaitingRequest(request, "a1", "alice", now, now + timedelta(seconds=60), **fields)


def test_waiting_requests_round_trip_in_arrival_order_and_end_by_compare_and_set(populated):
    first, second = waiting("big", 8), waiting("small", 1, keep_on_error=True)
    with populated.transaction() as tx:
        tx.add_request(first)
        tx.add_request(second)
    assert 0 < first.sequence < second.sequence
    with populated.transaction() as tx:
        tx.hold_for(first, frozenset({("ag1", 0), ("ag1", 1)}))
    with populated.reading() as tx:
        stored = tx.list_requests()
    first.held = frozenset({("ag1", 0), ("ag1", 1)})
    assert stored == [first, second]
    with populated.transaction() as tx:
        tx.end_request(second, "cancel")
    with pytest.raises(Conflict, match="the request for partition small is no longer waiting: 'expire' does not apply"):
        with populated.transaction() as tx:
            tx.end_request(second, "expire")
    with pytest.raises(Conflict, match="the request for partition big is already waiting: 'enqueue' does not apply"):
        with populated.transaction() as tx:
            tx.add_request(waiting("big"))
    with populated.reading() as tx:
        assert [r.partition_id for r in tx.list_requests()] == ["big"]


def test_a_grant_ends_the_request_and_records_its_partition_together_or_not_at_all(populated):
    request = waiting("p1")
    with populated.transaction() as tx:
        tx.add_request(request)
        tx.add_partition(partition("taken", "ag1"))
    with pytest.raises(ConcurrentUpdate):  # its IPUs were taken meanwhile: the request still waits
        with populated.transaction() as tx:
            tx.end_request(request, "grant")
            tx.add_partition(partition("p1", "ag1"))
    with populated.reading() as tx:
        assert [r.partition_id for r in tx.list_requests()] == ["p1"] and tx.get_partition("p1") is None
    with populated.transaction() as tx:
        tx.end_request(request, "grant")
        tx.add_partition(partition("p1", "ag2"))
    with populated.reading() as tx:
        assert tx.list_requests() == [] and tx.get_partition("p1").agent_ids == ["ag2"]


def test_requests_go_with_their_allocation(populated):
    with populated.transaction() as tx:
        tx.add_request(waiting("p1"))
    with populated.transaction() as tx:
        tx.delete_allocation("a1")
    with populated.reading() as tx:
        assert tx.list_requests() == []


def test_a_relocation_replaces_the_ipus_with_its_transition(populated):
    p = partition("p1", "ag1")
    p.relocatable = True
    with populated.transaction() as tx:
        tx.add_partition(p)
        tx.add_partition(partition("other", "ag2", (0,)))
        tx.transition(p, "configured", errors=[])
    moved = [PlacedIpu("ag2", i, 0, 4 + i, 0, r, 0) for r, i in enumerate((0, 1, 2, 3))]
    with pytest.raises(ConcurrentUpdate):  # IPU 0 of ag2 is other's
        with populated.transaction() as tx:
            tx.transition(p, "relocate", ipus=moved, relocation="moved")
    with populated.reading() as tx:
        p = tx.get_partition("p1")
        assert p.agent_ids == ["ag1"] and (p.ready_state, p.relocation) == (ReadyState.ACTIVE, "")
    moved = [PlacedIpu("ag2", i, 0, 4 + i, 0, r, 0) for r, i in enumerate((1, 2, 3))] + [PlacedIpu("ag1", 0, 0, 0, 0, 3, 0)]
    compacted = datetime(2026, 11, 28, 21, 0, 5, tzinfo=UTC)
    with populated.transaction() as tx:
        tx.transition(p, "relocate", ipus=moved, relocation="moved from ag1", failed_on=("ag1",), compacted=compacted)
    with populated.reading() as tx:
        stored = tx.get_partition("p1")
    assert stored.ipus == p.ipus == moved
    assert (stored.ready_state, stored.operation_state, stored.relocatable, stored.relocation) == (
        ReadyState.PENDING, OperationState.RESETTING, True, "moved from ag1")
    assert stored.failed_on == p.failed_on == ("ag1",)
    assert stored.compacted == p.compacted == compacted  # what the compaction budget counts after a restart


def test_may_move_and_the_expected_duration_round_trip_and_may_move_changes_by_compare_and_set(populated):
    p = partition("p1", "ag1")
    p.may_move, p.expected_seconds = False, 2**32 - 1  # the longest the API carries
    with populated.transaction() as tx:
        tx.add_partition(p)
    with populated.reading() as tx:
        first, second = tx.get_partition("p1"), tx.get_partition("p1")
    assert (first.may_move, first.expected_seconds) == (False, 2**32 - 1)
    with populated.transaction() as tx:
        tx.update_partition(first, may_move=True)
    assert first.may_move and first.ready_state is ReadyState.PENDING  # its state is not touched
    with populated.transaction() as tx:
        tx.transition(first, "configured", errors=[])
    with pytest.raises(Conflict, match="partition p1 is ACTIVE/IDLE, not PENDING/CREATING as 'update' expected"):
        with populated.transaction() as tx:
            tx.update_partition(second, may_move=False)  # read before the change of state
    with populated.reading() as tx:
        stored = tx.get_partition("p1")
    assert (stored.may_move, stored.expected_seconds, stored.ready_state) == (True, 2**32 - 1, ReadyState.ACTIVE)
    with populated.transaction() as tx:
        tx.transition(stored, "remove")
        tx.transition(stored, "removed")
    with pytest.raises(Conflict, match="partition p1 is absent"):
        with populated.transaction() as tx:
            tx.update_partition(first, may_move=False)


def test_a_store_of_schema_13_gains_may_move_and_the_expected_duration(populated, store_url):
    from sqlalchemy import text

    with populated.transaction() as tx:
        tx.add_partition(partition("p1", "ag1"))
        tx.add_request(waiting("q1"))
        tx.session.execute(text("ALTER TABLE partitions DROP COLUMN may_move"))
        tx.session.execute(text("ALTER TABLE partitions DROP COLUMN expected_seconds"))
        tx.session.execute(text("ALTER TABLE partitions DROP COLUMN power_cycled_at"))
        tx.session.execute(text("ALTER TABLE partitions DROP COLUMN compacted_at"))
        tx.session.execute(text("ALTER TABLE agents DROP COLUMN drain"))
        tx.session.execute(text("DROP TABLE reservations"))
        tx.session.execute(text("ALTER TABLE partitions DROP COLUMN reservation"))
        for column in ("account", "preemptible", "reclaim_at", "reclaim_notice"):
            tx.session.execute(text(f"ALTER TABLE partitions DROP COLUMN {column}"))
        tx.session.execute(text("DROP TABLE accounts"))
        tx.session.execute(text("DROP TABLE usage_records"))
        old_requirements = '{"id": "q1", "size": 4, "allocation_id": "a1"}'  # a request's fields as version 13 wrote them
        cast = ":old" if populated.is_sqlite else "CAST(:old AS JSON)"
        tx.session.execute(text(f"UPDATE partition_requests SET requirements = {cast}"), {"old": old_requirements})
        tx.session.execute(text("UPDATE vipu_meta SET value = '13' WHERE key = 'schema_version'"))
    populated.close()
    reopened = Store(store_url)
    try:
        with reopened.reading() as tx:
            migrated = tx.get_partition("p1")
            assert (migrated.may_move, migrated.expected_seconds, migrated.expected_end, migrated.power_cycled, migrated.compacted) == (
                False, 0, None, None, None)
            [request] = tx.list_requests()
            assert (request.partition_id, request.request.may_move, request.request.expected_seconds) == ("q1", False, 0)
            assert tx.session.execute(text("SELECT value FROM vipu_meta WHERE key = 'schema_version'")).scalar() == str(SCHEMA_VERSION)
            assert tx.get_agent("ag1").drain is None  # 17: no machine was drained before drains
            assert tx.list_reservations() == []  # 18: a table of its own, made by the migration
            assert migrated.reservation == ""  # 19: made in no reservation
            assert (migrated.account, migrated.preemptible, migrated.reclaim_at) == ("", False, 0.0)  # 20: on no account
            assert tx.configuration().accounts == {} and tx.usage_records(0, 2e9) == []  # 20: tables of their own
            assert migrated.labels == {} and tx.log_lines("ag1") == []  # 21: for no workload; machine logs' table of its own
        assert SCHEMA_VERSION == 21
        p2 = partition("p2", "ag2")
        p2.may_move, p2.expected_seconds, p2.reservation, p2.account, p2.preemptible = True, 7200, "team", "ml-a", True
        with reopened.transaction() as tx:
            tx.add_partition(p2)
        with reopened.reading() as tx:
            stored = tx.get_partition("p2")
            assert (stored.may_move, stored.expected_seconds, stored.reservation, stored.account, stored.preemptible) == (
                True, 7200, "team", "ml-a", True)
    finally:
        reopened.close()


def test_a_store_of_schema_18_records_partitions_in_a_reservation_under_way_as_made_in_it(populated, store_url):
    from sqlalchemy import text

    now = time.time()
    team = Reservation("team", "a1", frozenset(("ag1", i) for i in range(4)), now - 60, now + 3600, "a run", False, ("alice",))
    window = Reservation("mw1", "a1", frozenset(("ag2", i) for i in range(4)), now - 60, now + 3600, "firmware", True)
    with populated.transaction() as tx:
        tx.add_reservation(team)
        tx.add_reservation(window)
        for made in (partition("inside", "ag1"), partition("windowed", "ag2"), partition("outside", "ag3")):
            tx.add_partition(made)
        tx.session.execute(text("ALTER TABLE partitions DROP COLUMN reservation"))
        tx.session.execute(text("UPDATE vipu_meta SET value = '18' WHERE key = 'schema_version'"))
    populated.close()
    reopened = Store(store_url)
    try:
        with reopened.reading() as tx:
            assert {p.id: p.reservation for p in tx.list_partitions()} == {"inside": "team", "windowed": "", "outside": ""}
    finally:
        reopened.close()


def test_reservations_round_trip_are_named_once_and_go_with_their_allocation(populated):
    window = Reservation("mw1", "a1", frozenset({("ag1", 0), ("ag1", 1)}), 1000.5, 2000.25, "firmware", True, (), "admin", 999.0)
    people = Reservation("train", "a1", frozenset({("ag2", 3)}), 1500.0, 2500.0, "a run", False, ("alice", "bob"), "", 999.0)
    with populated.transaction() as tx:
        tx.add_reservation(window)
        tx.add_reservation(people)
    with populated.reading() as tx:
        assert tx.list_reservations() == [window, people]
        assert tx.list_reservations("a2") == []
    with pytest.raises(AlreadyExists, match="reservation mw1 already exists"):
        with populated.transaction() as tx:
            tx.add_reservation(dataclasses.replace(window, reason="another"))
    with populated.transaction() as tx:
        tx.delete_reservation(window)
    with pytest.raises(NotFound, match="reservation mw1 does not exist"):
        with populated.transaction() as tx:
            tx.delete_reservation(window)
    with populated.transaction() as tx:
        tx.delete_allocation("a1")
    with populated.reading() as tx:
        assert tx.list_reservations() == []  # gone with its allocation


def test_a_waiting_request_keeps_may_move_and_the_expected_duration(populated):
    request = waiting("q1")
    request.request.may_move, request.request.expected_seconds = True, 5400
    with populated.transaction() as tx:
        tx.add_request(request)
    with populated.reading() as tx:
        assert tx.list_requests() == [request]


def test_a_removal_writes_a_usage_record_and_old_records_fold_by_day_a_batch_at_a_time(populated):
    from datetime import UTC, datetime, timedelta

    for n, (pid, agent_id) in enumerate([("p1", "ag1"), ("p2", "ag2"), ("p3", "ag1")]):
        made = partition(pid, agent_id)
        made.account, made.owner, made.created = "ml-a", "alice", datetime.now(UTC) - timedelta(hours=1 + n)
        with populated.transaction() as tx:
            tx.add_partition(made)
        with populated.transaction() as tx:
            stored = tx.get_partition(pid)
            tx.transition(stored, "abandon")  # a create given up: it used its IPUs all the same, and its record says so
    with populated.reading() as tx:
        records = tx.usage_records(0, 2e9)
        assert sorted(r.partition_id for r in records) == ["p1", "p2", "p3"] and {r.account for r in records} == {"ml-a"}
        assert tx.usage_totals()["ml-a"] == pytest.approx(sum(r.ipu_seconds for r in records))
        before = sum(r.ipu_seconds for r in records)
        assert before == pytest.approx(4 * 3600 * (1 + 2 + 3), rel=1e-3)
    folded = []
    for _ in range(3):
        with populated.transaction() as tx:
            folded.append(tx.fold_usage(2e9, limit=2))
    assert folded == [2, 1, 0]
    with populated.reading() as tx:
        after = tx.usage_records(0, 2e9)
    assert {r.partition_id for r in after} == {""} and sum(r.ipu_seconds for r in after) == pytest.approx(before)


def test_machine_log_lines_keep_the_latest_per_machine_and_where_collecting_goes_on_from(store, monkeypatch):
    from vipu.store import machinelogs

    monkeypatch.setattr(machinelogs, "KEPT_MACHINE_LOG_LINES", 5)
    with store.transaction() as tx:
        tx.add_log_lines("ag1", "run1", [LogLine(n, 100.0 + n, "gateway", f"line {n}") for n in range(1, 8)])
        tx.add_log_lines("ag2", "run9", [LogLine(40, 50.0, "bmc", "SEL: Warning: fan2 slow")])
    with store.transaction() as tx:
        tx.add_log_lines("ag1", "run2", [LogLine(8, 108.0, "gateway", "line 8")])
    with store.transaction() as tx:
        kept = tx.log_lines("ag1")
        assert [line.text for line in kept] == [f"line {n}" for n in range(4, 9)]  # the latest 5 of 8
        assert [line.text for line in tx.log_lines("ag1", after=kept[2].sequence)] == ["line 7", "line 8"]
        assert [line.text for line in tx.log_lines("ag1", since=107.0)] == ["line 7", "line 8"]
        assert [line.text for line in tx.log_lines("ag1", limit=2)] == ["line 7", "line 8"]  # the latest, oldest first
        assert tx.last_agent_lines() == {"ag1": ("run2", 8), "ag2": ("run9", 40)}
        assert tx.last_log_line("ag1") == kept[-1].sequence and tx.last_log_line("ag3") == 0
        assert tx.log_lines_from("ag1", 107.0) == {(107.0, "gateway", "line 7"), (108.0, "gateway", "line 8")}
        tx.forget_log_lines("ag1")
        assert tx.log_lines("ag1") == [] and len(tx.log_lines("ag2")) == 1
