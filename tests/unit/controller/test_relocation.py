"""Relocation: a relocatable partition moves, keeping its id, off machines that fail it (test_services' pod)."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor

import pytest

from vipu import failpoints
from vipu.controller.usecases.requests import Waiting
from vipu.model.entities import MAX_AUTO_RESETS, OperationState, PartitionRequest, ReadyState
from vipu.model.errors import HardwareFailure, NoRoom

NOTE = re.compile(r"^moved from (\S+) to (\S+) on \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC: (.*)$")


def moved(pod, partition_id: str) -> tuple[str, str, str]:
    """(from where, to where, why) of the partition's last move."""
    found = NOTE.match(pod.partitions.get(partition_id).relocation)
    assert found, pod.partitions.get(partition_id).relocation
    return found.group(1), found.group(2), found.group(3)


def test_a_relocatable_partition_whose_machine_fails_to_apply_it_moves_at_create(pod):
    pod.fault("m01", "IPU 2 failed")
    partition = pod.partitions.create(PartitionRequest("p1", 4, relocatable=True))
    assert (partition.ready_state, partition.agent_ids) == (ReadyState.ACTIVE, ["ag2"])
    assert moved(pod, "p1") == ("ag1", "ag2", "agent ag1: m01: IPU 2 failed")
    assert pod.held_anywhere("p1") == ["ag2"] and pod.partitions.get("p1").errors == []
    status = pod.partitions.get("p1")
    assert (status.relocatable, status.auto_reset_count) == (True, 0)  # a move at create is no automatic reset


def test_a_partition_keeps_off_the_machines_that_failed_it_even_after_the_controller_restarts(pod):
    pod.fault("m01", "IPU 2 failed")
    assert pod.partitions.create(PartitionRequest("p1", 4, relocatable=True)).agent_ids == ["ag2"]
    assert pod.partitions.get("p1").failed_on == ("ag1",)
    pod.heal()  # m01 answers well again: free, first in order, and still the machine that failed p1
    restarted = pod.restarted().partitions  # a controller started again on the same store
    pod.fault("m02", "IPU 1 failed")
    with pytest.raises(HardwareFailure, match="agent ag2: m02: IPU 1 failed"):
        restarted.reset("p1")
    assert restarted.relocate("p1").agent_ids == ["ag3"]  # not back onto ag1
    assert restarted.get("p1").failed_on == ("ag1", "ag2")
    assert restarted.get("p1").relocation.startswith("moved from ag2 to ag3 on ")


def test_a_relocatable_create_with_nowhere_else_to_go_leaves_nothing_unless_kept(pod):
    pod.partitions.create(PartitionRequest("rest", 16, explicit_ipus=tuple((0, 16 + i) for i in range(16)), cluster_id="cl0"))
    pod.partitions.create(PartitionRequest("mid", 8, explicit_ipus=tuple((0, 8 + i) for i in range(8)), cluster_id="cl0"))
    pod.fault("m01", "IPU 2 failed")  # p1 fits only on ag1-ag2, which fails
    with pytest.raises(HardwareFailure, match=r"^partition p1 could not be created and was not kept: agent ag1: m01: IPU 2 failed$"):
        pod.partitions.create(PartitionRequest("p1", 8, relocatable=True))
    assert pod.held_anywhere("p1") == [] and "p1" not in [p.id for p in pod.partitions.list()]
    with pytest.raises(HardwareFailure, match=r"^partition p1 is in ERROR: agent ag1: m01: IPU 2 failed$"):
        pod.partitions.create(PartitionRequest("p1", 8, relocatable=True), keep_on_error=True)
    assert pod.partitions.get("p1").ready_state is ReadyState.ERROR


def test_a_relocatable_partition_whose_agent_goes_down_moves_at_the_next_health_pass_and_the_old_machine_is_cleared(pod):
    pod.partitions.create(PartitionRequest("p1", 8, relocatable=True))  # ag1-ag2
    pod.partitions.create(PartitionRequest("plain", 4))  # ag3, not relocatable
    pod.gateway.unreachable.add(pod.address("ag2"))
    pod.health.check_all()
    partition = pod.partitions.get("p1")
    assert (partition.ready_state, partition.operation_state) == (ReadyState.ACTIVE, OperationState.IDLE)
    assert "ag2" not in partition.agent_ids and partition.auto_reset_count == 1
    source, target, why = moved(pod, "p1")
    assert (source, why) == ("ag1-ag2", "agent ag2 is down: unreachable (connection refused)")
    assert target == "-".join(partition.agent_ids[::len(partition.agent_ids) - 1])
    assert pod.held_anywhere("p1") == sorted(["ag2", *partition.agent_ids])  # ag2, away, still holds the old settings
    pod.gateway.unreachable.clear()  # it returns: the health pass clears them
    pod.health.check_all()
    assert pod.held_anywhere("p1") == partition.agent_ids and pod.partitions.get("p1").agent_ids == partition.agent_ids


def test_a_partition_not_relocatable_keeps_its_ipus_and_waits_for_its_machine(pod):
    pod.partitions.create(PartitionRequest("p1", 4))
    pod.gateway.unreachable.add(pod.address("ag1"))
    pod.health.check_all()
    assert (pod.partitions.get("p1").ready_state, pod.partitions.get("p1").agent_ids) == (ReadyState.ERROR, ["ag1"])
    assert pod.partitions.get("p1").relocation == ""


def test_relocation_on_demand_moves_any_partition_off_its_own_machines_and_keeps_its_key(pod):
    partition = pod.partitions.create(PartitionRequest("p1", 4))
    again = pod.partitions.relocate("p1")
    assert again.agent_ids == ["ag2"] and again.attach_key == partition.attach_key
    assert moved(pod, "p1") == ("ag1", "ag2", "asked for")
    assert pod.held_anywhere("p1") == ["ag2"]


def test_a_relocatable_partition_with_no_room_elsewhere_stays_in_error_until_there_is(pod):
    pod.partitions.create(PartitionRequest("p1", 4, relocatable=True))  # ag1
    pod.partitions.create(PartitionRequest("rest", 16, explicit_ipus=tuple((0, 16 + i) for i in range(16)), cluster_id="cl0"))
    pod.partitions.create(PartitionRequest("mid", 8, explicit_ipus=tuple((0, 8 + i) for i in range(8)), cluster_id="cl0"))
    pod.partitions.create(PartitionRequest("one", 4))  # ag2
    pod.gateway.unreachable.add(pod.address("ag1"))
    pod.health.check_all()
    assert pod.partitions.get("p1").ready_state is ReadyState.ERROR
    with pytest.raises(NoRoom, match=r"^no free 4-IPU run in allocation a1 without ag1: all 28 of its IPUs are in use; "
                                     r"it fits when mid, one or rest is removed$"):
        pod.partitions.relocate("p1")
    pod.partitions.remove("one")
    pod.health.check_all()
    assert (pod.partitions.get("p1").ready_state, pod.partitions.get("p1").agent_ids) == (ReadyState.ACTIVE, ["ag2"])


def test_automatic_moves_stop_when_the_automatic_reset_retries_are_spent(pod):
    pod.partitions.create(PartitionRequest("p1", 4, relocatable=True))
    for attempt in range(1, MAX_AUTO_RESETS + 2):
        where = pod.partitions.get("p1").agent_ids[0]
        pod.gateway.unreachable = {pod.address(where)}
        pod.health.check_all()
        partition = pod.partitions.get("p1")
        if attempt <= MAX_AUTO_RESETS:
            assert (partition.ready_state, partition.auto_reset_count) == (ReadyState.ACTIVE, attempt)
            assert partition.agent_ids != [where]
        else:
            assert (partition.ready_state, partition.agent_ids) == (ReadyState.ERROR, [where])


def test_the_published_reset_with_relocatable_moves_only_a_partition_that_machines_failed(pod):
    pod.partitions.create(PartitionRequest("p1", 4))  # ag1
    for name, size, first in (("p2", 4, 4), ("p3", 8, 8), ("p4", 16, 16)):  # the allocation is full
        pod.partitions.create(PartitionRequest(name, size, explicit_ipus=tuple((0, first + i) for i in range(size)), cluster_id="cl0"))
    healthy = pod.partitions.relocate("p1", only_off_failed=True)  # no machine failed it: reset in place, though there is no room
    assert (healthy.ready_state, healthy.agent_ids, healthy.relocation) == (ReadyState.ACTIVE, ["ag1"], "")
    assert pod.held_anywhere("p1") == ["ag1"]
    pod.gateway.unreachable.add(pod.address("ag1"))
    pod.health.check_all()  # not relocatable: it waits in ERROR for its machine
    pod.partitions.remove("p2")
    moved_off = pod.partitions.relocate("p1", only_off_failed=True)
    assert (moved_off.ready_state, moved_off.agent_ids) == (ReadyState.ACTIVE, ["ag2"])
    assert moved(pod, "p1")[:2] == ("ag1", "ag2")


def test_a_move_keeps_the_old_ipus_taken_until_its_old_machine_is_cleared(pod):
    """A create racing the clear of a moved partition's old machine is placed elsewhere, never on
    settings still there."""
    pod.partitions.create(PartitionRequest("p1", 4))  # ag1
    clearing = failpoints.arm("agent.clear", "pause")  # the move's clear of its old machine stalls
    try:
        with ThreadPoolExecutor(1) as pool:
            moving = pool.submit(pod.partitions.relocate, "p1")
            assert clearing.reached.wait(10)
            racer = pod.partitions.create(PartitionRequest("q", 4))  # while ag1 still holds p1's old settings
            clearing.released.set()
            assert moving.result(timeout=10).agent_ids == ["ag2"]
    finally:
        failpoints.disarm()
    assert (racer.ready_state, racer.agent_ids) == (ReadyState.ACTIVE, ["ag3"])
    assert pod.partitions.create(PartitionRequest("r", 4)).agent_ids == ["ag1"]  # cleared: free again
    assert pod.held_anywhere("p1") == ["ag2"] and pod.held("ag1") == {"r"}


def test_a_partition_never_moves_to_a_machine_that_is_down(pod):
    pod.partitions.create(PartitionRequest("p1", 4))  # ag1
    pod.gateway.unreachable.add(pod.address("ag2"))
    pod.health.check_all()  # ag2 is down; p1 is not on it
    assert pod.partitions.relocate("p1").agent_ids == ["ag3"]
    assert moved(pod, "p1")[:2] == ("ag1", "ag3")


def test_a_move_onto_ipus_held_for_the_first_waiting_request_has_the_shape_held_for_it_chosen_afresh(pod):
    pod.partitions.create(PartitionRequest("p1", 4))  # ag1
    pod.partitions.create(PartitionRequest("rest", 16, explicit_ipus=tuple((0, 16 + i) for i in range(16)), cluster_id="cl0"))
    pod.partitions.create(PartitionRequest("mid", 8, explicit_ipus=tuple((0, 8 + i) for i in range(8)), cluster_id="cl0"))
    assert isinstance(pod.requests.create(PartitionRequest("big", 8), wait_seconds=60), Waiting)
    held = pod.owners.owner("a1").snapshot.queue.held
    assert {agent for agent, _ in held} == {"ag1", "ag2"}
    assert pod.partitions.relocate("p1").agent_ids == ["ag2"]  # nothing else is free
    assert pod.owners.wait_quiet(10)
    again = pod.owners.owner("a1").snapshot.queue.held
    # Chosen afresh around the move: ag1-ag2, now blocked by p1 alone, is still the shape the fewest
    # partitions block (ag3-ag4 is too, by mid, but with all 8 of its IPUs in use); and recorded.
    assert {agent for agent, _ in again} == {"ag1", "ag2"}
    with pod.store.reading() as tx:
        assert tx.list_requests()[0].held == again


def machines(first: int, count: int, **fields) -> dict:
    """The fields of a request that names the IPUs of `count` machines from agent number `first`."""
    return {"explicit_ipus": tuple((0, 4 * (first - 1) + i) for i in range(4 * count)), "cluster_id": "cl0", **fields}


def broken_up_around_pc(pod):
    """pa on ag1, pc (relocatable) on ag3-ag4, pd on ag8: 16 IPUs are free (ag2, ag5-ag7) but no four
    free machines are neighbours until pc moves to ag6-ag7. pc's machines ag3 and ag4, and pc."""
    pod.partitions.create(PartitionRequest("pa", 4, **machines(1, 1)))
    pc = pod.partitions.create(PartitionRequest("pc", 8, **machines(3, 2, relocatable=True)))
    pod.partitions.create(PartitionRequest("pd", 4, **machines(8, 1)))
    return pod.gateway.machine(*pod.address("ag3")), pod.gateway.machine(*pod.address("ag4")), pc


def test_a_compaction_move_of_a_partition_with_a_client_at_one_machine_fences_none(pod):
    ag3, ag4, pc = broken_up_around_pc(pod)
    ag4.ipuof_attach("pc", 0, "", pc.attach_key, session="client-at-ag4")
    fencing = failpoints.arm("agent.fence", "fail(no fence call was to be made)")
    try:
        report = pod.allocations.compact("a1", dry_run=False)
    finally:
        failpoints.disarm("agent.fence")
    assert fencing.hits == 0  # the look at every machine found the client before any fence was asked for
    assert [move.partition_id for move in report.plan.moves] == ["pc"] and report.moved == ()
    assert report.stopped == "partition pc did not move: partition pc has 1 IPUoF client(s) attached at agent ag4"
    assert pod.partitions.get("pc").agent_ids == ["ag3", "ag4"]
    assert [a.fenced_until for a in ag3.attachments(["pc"])] == [0.0]  # looked at first: nothing was fenced


def test_a_client_attaching_while_a_move_fences_lifts_the_fences_made_at_the_partitions_other_machines(pod):
    ag3, ag4, pc = broken_up_around_pc(pod)
    fencing = failpoints.arm("agent.fence", "pause")  # every fence call stalls, after the look found no client
    try:
        with ThreadPoolExecutor(1) as pool:
            compacting = pool.submit(pod.allocations.compact, "a1", False)
            assert fencing.reached.wait(10)
            ag4.ipuof_attach("pc", 0, "", pc.attach_key, session="client-at-ag4")
            fencing.released.set()
            report = compacting.result(timeout=30)
    finally:
        failpoints.disarm("agent.fence")
    assert report.stopped == "partition pc did not move: partition pc has 1 IPUoF client(s) attached at agent ag4"
    assert pod.partitions.get("pc").agent_ids == ["ag3", "ag4"]
    # ag3 was fenced before ag4's client was found: its fence is lifted at once, not left to lapse.
    assert [a.fenced_until for a in ag3.attachments(["pc"])] == [0.0]
    ag3.ipuof_attach("pc", 0, "", pc.attach_key, session="client-at-ag3")  # raises while a fence stands


def test_a_reset_that_re_places_a_partition_keeps_off_the_machines_that_failed_it(pod):
    pod.fault("m01", "IPU 2 failed")
    assert pod.partitions.create(PartitionRequest("p1", 4, relocatable=True)).agent_ids == ["ag2"]
    pod.heal()  # ag1 answers well again: free, and first in order, but it failed p1
    pod.partitions.create(PartitionRequest("q", 4, **machines(4, 1)))
    pod.partitions.create(PartitionRequest("r", 16, **machines(5, 4)))
    # ag1 and ag3 are free around p1: moving it to either frees 8 IPUs together; ag3 is not one that failed it.
    reset = pod.partitions.reset("p1")
    assert (reset.ready_state, reset.agent_ids) == (ReadyState.ACTIVE, ["ag3"])
    assert "reset where it leaves a larger shape free" in reset.relocation


def test_a_move_whose_look_for_attached_clients_gets_no_answer_fences_nothing_and_leaves_the_partition(pod):
    ag3, _, _ = broken_up_around_pc(pod)
    looking = failpoints.arm("agent.attachments", "fail(agent ag4 did not answer)")
    fencing = failpoints.arm("agent.fence", "fail(no fence call was to be made)")
    try:
        report = pod.allocations.compact("a1", dry_run=False)
    finally:
        failpoints.disarm()
    assert looking.hits >= 1 and fencing.hits == 0  # not knowing who is attached, it fences nothing
    assert report.moved == () and "did not answer" in report.stopped
    assert pod.partitions.get("pc").agent_ids == ["ag3", "ag4"] and pod.held_anywhere("pc") == ["ag3", "ag4"]
    assert [a.fenced_until for a in ag3.attachments(["pc"])] == [0.0]
