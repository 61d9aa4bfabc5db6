"""Draining machines for a repair, on the real services (the agents' gateway is the test double of
`test_services`): nothing is placed on a draining machine, relocatable partitions move off, others
are left to finish, and the drain is stored."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime

import pytest

from vipu import failpoints
from vipu.backends.sim.rack import load_rack, save_rack
from vipu.client.admin import by_time
from vipu.model import clustertests as ct
from vipu.model.entities import Drain, OperationState, PartitionRequest, ReadyState
from vipu.model.errors import Conflict, InvalidArgument, NoRoom, NotFound
from vipu.model.times import utc_text


def test_a_drained_machine_gets_no_new_partition_and_the_refusal_names_the_drain(pod):
    views = pod.agents.drain(["ag1", "ag2", "ag3", "ag4", "ag5", "ag6", "ag7"], "cable repair", "admin")
    assert [(v.agent.id, v.agent.drain.reason, v.agent.drain.by, v.draining_partitions) for v in views][:1] == [
        ("ag1", "cable repair", "admin", ())]
    assert pod.partitions.create(PartitionRequest("p1", 4)).agent_ids == ["ag8"]
    with pytest.raises(NoRoom, match=r"without its machines that are draining \(agent ag1 is draining for cable repair "
                                     r"\(by admin since .* UTC\); agent ag2 is draining"):
        pod.partitions.create(PartitionRequest("p2", 4))
    with pytest.raises(NoRoom, match="while its machines that are draining are left out"):  # named IPUs too
        pod.partitions.create(PartitionRequest("named", 4, explicit_ipus=tuple((0, i) for i in range(4)), cluster_id="cl0"))
    pod.agents.resume(["ag1"])
    assert pod.partitions.create(PartitionRequest("p2", 4)).agent_ids == ["ag1"]


def test_a_drain_moves_relocatable_partitions_off_and_leaves_the_others_running(pod):
    kept = pod.partitions.create(PartitionRequest("kept", 2))
    moving = pod.partitions.create(PartitionRequest("moving", 2, relocatable=True))
    assert kept.agent_ids == moving.agent_ids == ["ag1"]
    key = moving.attach_key
    [view] = pod.agents.drain(["ag1"], "fan replacement", "admin")
    assert view.draining_partitions == ("kept",)  # the relocatable one has moved by the time the drain is answered
    moved = pod.partitions.get("moving")
    assert moved.ready_state is ReadyState.ACTIVE and moved.agent_ids != ["ag1"] and moved.attach_key == key
    assert "draining for fan replacement" in moved.relocation
    assert pod.held_anywhere("moving") == moved.agent_ids
    assert pod.partitions.get("kept").ready_state is ReadyState.ACTIVE and pod.held_anywhere("kept") == ["ag1"]
    [notice] = pod.partitions.get("kept").drain_notices  # its user is told
    assert notice.startswith("agent ag1 is draining for fan replacement (by admin since ") and notice.endswith("it is left to finish there")
    assert [p.drain_notices for p in pod.partitions.list() if p.id == "kept"] == [(notice,)]
    assert pod.partitions.get("moving").drain_notices == ()
    pod.partitions.remove("kept")
    [view] = pod.agents.list()[:1]
    assert (view.agent.id, view.draining_partitions) == ("ag1", ())  # drained


def test_no_grant_from_the_queue_lands_on_a_draining_machine(pod):
    for n in range(1, 9):
        assert pod.partitions.create(PartitionRequest(f"full{n}", 4)).agent_ids == [f"ag{n}"]
    pod.agents.drain(["ag1"], "repair", "admin")
    pod.partitions.remove("full1")
    waiting = pod.requests.create(PartitionRequest("waits", 4), wait_seconds=600)  # ag1 is free, and draining
    assert waiting.position == 1
    assert "in allocation a1 without its machines that are draining (agent ag1 is draining for repair (by admin" in waiting.reason
    pod.partitions.remove("full5")
    assert pod.owners.wait_quiet(30)
    assert pod.partitions.get("waits").agent_ids == ["ag5"]


def test_a_drain_is_stored_and_a_restarted_controller_keeps_it(pod):
    pod.agents.drain(["ag1"], "repair", "admin")
    services = pod.restarted()
    assert services.agents.get("ag1").agent.drain.reason == "repair"
    assert services.partitions.create(PartitionRequest("p1", 4)).agent_ids == ["ag2"]


def test_bad_drains_and_resumes_are_refused_in_one_line_and_change_nothing(pod):
    with pytest.raises(InvalidArgument, match="a drain needs a reason"):
        pod.agents.drain(["ag1"], "  ", "admin")
    with pytest.raises(InvalidArgument, match="one line"):
        pod.agents.drain(["ag1"], "two\nlines", "admin")
    with pytest.raises(NotFound, match="agent nope does not exist"):
        pod.agents.drain(["ag1", "nope"], "repair", "admin")
    with pytest.raises(Conflict, match="agent ag2 is not drained: nothing to resume"):
        pod.agents.resume(["ag2"])
    assert all(view.agent.drain is None for view in pod.agents.list())  # the refused drain of ag1 and nope changed nothing
    pod.agents.drain(["ag1"], "repair", "alice")
    assert pod.agents.drain(["ag1"], "repair", "bob")[0].agent.drain.by == "alice"  # the same drain again changes nothing
    with pytest.raises(Conflict, match=r"agent ag1 is already draining for repair \(by alice since .*\); resume it first"):
        pod.agents.drain(["ag1"], "another reason", "bob")
    with pytest.raises(Conflict, match="agent ag2 is not drained"):
        pod.agents.resume(["ag1", "ag2"])
    assert pod.agents.get("ag1").agent.drain is not None  # all or none


def test_a_partition_left_on_a_machine_past_its_drains_deadline_is_removed_and_its_user_told_when(pod):
    pod.partitions.create(PartitionRequest("late", 4))
    elsewhere = pod.partitions.create(PartitionRequest("elsewhere", 4))
    with pytest.raises(InvalidArgument, match="a drain's deadline"):
        pod.agents.drain(["ag1"], "repair", "admin", deadline=time.time() - 1)
    deadline = time.time() + 1.0
    [view] = pod.agents.drain(["ag1"], "repair", "admin", deadline=deadline)
    assert view.draining_partitions == ("late",) and view.agent.drain.deadline == deadline
    [notice] = pod.partitions.get("late").drain_notices
    assert notice.endswith(f"it is removed at {utc_text(deadline)}")
    removed_by = time.monotonic() + 30
    while pod.held_anywhere("late") or "late" in {p.id for p in pod.partitions.list()}:  # removed by the owner's timer, no command
        assert time.monotonic() < removed_by, "the partition left past the drain's deadline was not removed"
        time.sleep(0.05)
    assert time.time() >= deadline
    assert pod.partitions.get("elsewhere").agent_ids == elsewhere.agent_ids  # nothing else is touched
    assert pod.agents.get("ag1").draining_partitions == ()


def test_a_drains_deadline_is_given_as_a_time_from_now_or_a_date_and_time():
    assert by_time("2h", now=1000.0) == 1000.0 + 7200
    assert by_time("2026-12-07T08:00") == datetime(2026, 12, 7, 8, 0, tzinfo=UTC).timestamp()
    assert by_time("") == 0.0
    with pytest.raises(InvalidArgument, match="neither a time from now"):
        by_time("soon")


def test_an_owner_the_word_of_a_drain_missed_takes_it_from_the_store_at_the_next_health_pass(pod):
    pod.partitions.create(PartitionRequest("made", 4))  # the allocation's owner is made, from the store as it is now
    pod.partitions.remove("made")
    with pod.store.transaction() as tx:  # drained as a use case drains, its word to the owner lost
        tx.set_drain("ag1", Drain("repair", "admin", time.time()))
    assert pod.partitions.create(PartitionRequest("before", 4)).agent_ids == ["ag1"]  # the owner does not know yet
    pod.partitions.remove("before")
    pod.health.check_all()
    assert "ag1" not in pod.partitions.create(PartitionRequest("after", 4)).agent_ids


def test_capacity_counts_no_room_on_a_draining_machine_and_says_how_many_free_ipus_are_there(pod):
    for n in range(1, 9):
        pod.partitions.create(PartitionRequest(f"p{n}", 4))
    pod.partitions.remove("p1")  # ag1 is the one machine free
    [before] = pod.partitions.capacity(size=4)
    assert (before.free_ipus, before.fitting, before.largest, before.draining_ipus) == (4, 1, 4, 0)
    pod.agents.drain(["ag1"], "repair", "admin")
    [during] = pod.partitions.capacity(size=4)
    assert (during.free_ipus, during.fitting, during.largest, during.draining_ipus) == (4, 0, 0, 4)


def test_a_controller_stopped_in_the_middle_of_a_drains_move_is_restarted_and_finishes_the_drain(pod):
    pod.partitions.create(PartitionRequest("kept", 2))
    moving = pod.partitions.create(PartitionRequest("moving", 2, relocatable=True))
    assert moving.agent_ids == ["ag1"]
    applying = failpoints.arm("agent.apply", "pause")  # the move's configuration at its new place stalls
    try:
        with ThreadPoolExecutor(1) as pool:
            draining = pool.submit(pod.agents.drain, ["ag1"], "cable repair", "admin")
            assert applying.reached.wait(10)
            services = pod.restarted()  # the controller stops with the move half done: its new IPUs written, not configured
            failpoints.disarm("agent.apply")
            draining.result(60)  # its wait for the moves ends with the owners that stopped (it is told, not hung)
    finally:
        failpoints.disarm()
    services.health.check_all()  # the restarted controller's first pass finishes what the old one left
    deadline = time.monotonic() + 30
    while (moved := services.partitions.get("moving")).operation_state is not OperationState.IDLE:
        assert time.monotonic() < deadline, f"the move was not finished: {moved.operation_state.value}"
        time.sleep(0.05)
    assert moved.ready_state is ReadyState.ACTIVE and "ag1" not in moved.agent_ids
    assert pod.held_anywhere("moving") == moved.agent_ids  # configured where the store says, and nowhere else
    assert services.agents.get("ag1").draining_partitions == ("kept",) and services.agents.get("ag1").agent.drain is not None


def without_step_durations(pod) -> None:
    rack = load_rack(pod.rack_path)
    rack.time_scale = 0  # the tests' steps without their simulated durations
    save_rack(rack, pod.rack_path)


def test_drained_machines_are_tested_alone_while_partitions_run_elsewhere_and_stay_out_of_use_until_the_test_ends(pod):
    without_step_durations(pod)
    assert pod.partitions.create(PartitionRequest("running", 4)).agent_ids == ["ag1"]
    with pytest.raises(Conflict, match=r"has partitions \(running\); .* or drain the machines to test and test them alone"):
        pod.clustertests.start("cl0", set(), wait=True)
    with pytest.raises(Conflict, match=r"^a test of some machines alone needs them drained: agent ag3 is not drained "
                                       r"\(vipu-admin drain agent ag3 --reason \.\.\.\); agent ag4 is not drained"):
        pod.clustertests.start("cl0", set(), wait=True, machines=("ag3", "ag4"))
    with pytest.raises(InvalidArgument, match=r"^nope is not in cluster cl0$"):
        pod.clustertests.start("cl0", set(), wait=True, machines=("ag3", "nope"))
    pod.agents.drain(["ag1"], "repair", "admin")
    with pytest.raises(Conflict, match=r"agent ag1 is still draining \(running left\)"):
        pod.clustertests.start("cl0", set(), wait=True, machines=("ag1",))
    pod.agents.resume(["ag1"])
    assert not pod.clustertests.testing("cl0") and pod.owners._tests == {}  # the refused runs left nothing behind
    assert pod.owners.owner("a1").snapshot.claimed == {}

    pod.agents.drain(["ag3", "ag4", "ag5", "ag6"], "cable repair", "admin")
    pod.gateway.step_may_go.clear()
    pod.clustertests.start("cl0", set(), wait=False, machines=("ag6", "ag3", "ag4", "ag5"))
    assert pod.gateway.diagnosing.wait(10)
    assert pod.owners.owner("a1").snapshot.test == ""  # the other machines are not the test's
    assert pod.owners.owner("a1").snapshot.claimed == dict.fromkeys(("ag3", "ag4", "ag5", "ag6"), "cluster cl0")
    pod.agents.resume(["ag3", "ag4", "ag5", "ag6"])  # resumed mid-test: still the test's until it ends
    assert [room.fitting for room in pod.partitions.capacity(4)] == [3]  # ag2, ag7 and ag8
    made = [pod.partitions.create(PartitionRequest(f"elsewhere{n}", 4)).agent_ids for n in range(3)]
    assert sorted(a for ids in made for a in ids) == ["ag2", "ag7", "ag8"]
    with pytest.raises(NoRoom, match=r"without its machines that are under test \(agent ag3 is under test \(cluster cl0\) until the "
                                     r"test ends"):
        pod.partitions.create(PartitionRequest("waits", 4))
    running = pod.clustertests._thread
    pod.gateway.step_may_go.set()
    running.join(30)
    run = pod.clustertests.status()
    assert run.state is ct.RunState.FINISHED
    assert {o.test: (o.status.value, o.passed, o.total, o.summary[-1]) for o in run.outcomes} == {
        ct.TestType.SYNC: ("passed", 6, 6, "Test of ag3, ag4, ag5, ag6"),  # the cables between them only
        ct.TestType.CABLING: ("passed", 12, 12, "Test of ag3, ag4, ag5, ag6"),
        ct.TestType.IPULINK: ("passed", 76, 76, "Test of ag3, ag4, ag5, ag6"),
        ct.TestType.TRAFFIC: ("passed", 1, 1, "Test of ag3, ag4, ag5, ag6"),
        ct.TestType.GWLINK: ("passed", 0, 0, "Test of ag3, ag4, ag5, ag6"),
        ct.TestType.VERSION: ("passed", 6, 6, "Test of ag3, ag4, ag5, ag6")}
    assert pod.partitions.get("running").ready_state is ReadyState.ACTIVE
    assert pod.partitions.create(PartitionRequest("after", 4)).agent_ids == ["ag3"]  # the test over, they are placed on again


def test_a_traffic_test_of_machines_no_window_lies_within_passes_with_nothing_run_and_says_so(pod):
    without_step_durations(pod)
    pod.agents.drain(["ag3", "ag4"], "cable repair", "admin")
    pod.clustertests.start("cl0", {ct.TestType.TRAFFIC}, wait=True, machines=("ag3", "ag4"))
    [outcome] = pod.clustertests.status().outcomes
    assert (outcome.status, outcome.total, outcome.summary) == (ct.Status.PASSED, 0, [
        "Traffic test skipped: no window (4 machines in a row of a domain) lies wholly within ag3, ag4", "Test of ag3, ag4"])


def test_an_owner_made_as_a_test_of_drained_machines_claims_them_starts_held_by_it_and_the_claim_goes_on(pod):
    """An owner made while the claim is under way (after a restart of the owners, a rebuild, or an
    allocation first asked for) starts with the machines claimed: the claim is its own, not another's."""
    without_step_durations(pod)
    pod.agents.drain(["ag5", "ag6"], "cable repair", "admin")
    pod.owners.test_starts("cl0", "cluster cl0", ("ag5", "ag6"))  # the claim has begun ...
    pod.services.owners.load()  # ... and the owners are made again meanwhile
    assert pod.owners.owner("a1").snapshot.claimed == {"ag5": "cluster cl0", "ag6": "cluster cl0"}
    pod.clustertests.start("cl0", {ct.TestType.SYNC}, wait=True, machines=("ag5", "ag6"))
    [outcome] = pod.clustertests.status().outcomes
    assert (outcome.status, outcome.total, outcome.summary[-1]) == (ct.Status.PASSED, 2, "Test of ag5, ag6")
    assert pod.owners.owner("a1").snapshot.claimed == {} and pod.owners._tests == {}  # given back at the run's end


def test_a_test_of_drained_machines_refused_in_one_allocation_holds_none_in_another(pod):
    pod.allocations.remove("a1")
    pod.allocations.create("a1", "cl0", agent_ids=("ag1", "ag2", "ag3", "ag4"))
    pod.allocations.create("a2", "cl0", agent_ids=("ag5", "ag6", "ag7", "ag8"))
    pod.agents.drain(["ag3", "ag4"], "cable repair", "admin")
    with pytest.raises(Conflict, match=r"agent ag5 is not drained"):
        pod.clustertests.start("cl0", {ct.TestType.SYNC}, wait=True, machines=("ag3", "ag4", "ag5"))
    assert pod.owners.wait_quiet(10)  # the give-back is put in each owner's inbox, not waited for
    assert [pod.owners.owner(a).snapshot.claimed for a in ("a1", "a2")] == [{}, {}] and pod.owners._tests == {}
