"""The controller really configures the agents, and a failing agent never leaves a partition half-applied."""

from __future__ import annotations

import json
import signal
import time

from tests.functional.harness import failed_line, pairs, rows, wait_until
from vipu.api.protos import admin_pb2
from vipu.api.protos import vipuuser_pb2 as pb
from vipu.api.protos import vipuuser_pb2_grpc as pb_grpc
from vipu.backends.sim import faults


def test_a_missing_cable_fails_the_create_leaving_nothing_and_saying_why(pod):
    pod.register(topology=admin_pb2.ILD_TOPOLOGY_TORUS)
    pod.unplug("m08", 5)
    result = pod.user("create", "partition", "ring", "--size", "32")
    failed_line(result, "create partition", "ring", "partition ring could not be created and was not kept: "
                "agent ag1: m01: IPU-Link port 1 has no cable (expected one to m08:5); "
                "agent ag8: m08: IPU-Link port 5 has no cable (expected one to m01:1)")
    assert pod.held_anywhere("ring") == []
    assert rows(pod.user("list", "partitions").out) == []
    failed_line(pod.user("get", "partition", "ring"), "get partition", "ring", "partition ring does not exist")
    pod.wipe_rack_only()
    assert pod.user("create", "partition", "ring", "--size", "32").code == 0  # its IPUs were free at once


def test_a_create_kept_on_error_is_in_error_with_the_agents_reasons(pod):
    pod.register(topology=admin_pb2.ILD_TOPOLOGY_TORUS)
    pod.unplug("m08", 5)
    result = pod.user("create", "partition", "ring", "--size", "32", "--keep-on-error")
    failed_line(result, "create partition", "ring", "partition ring is in ERROR: agent ag1: m01: IPU-Link port 1 has no cable "
                "(expected one to m08:5); agent ag8: m08: IPU-Link port 5 has no cable (expected one to m01:1)")
    assert pod.held_anywhere("ring") == []
    assert not (pod.ipuof_dir / "ring_ipuof.conf").exists()
    status = pairs(pod.user("get", "partition", "ring").out)
    assert (status["State"], status["Operation"]) == ("ERROR", "FAILED")
    assert "m08: IPU-Link port 5 has no cable" in pod.user("get", "partition", "ring").out
    assert rows(pod.user("list", "partitions").out)[0][-1] == "ERROR"
    # An ERROR partition keeps its IPUs until it is reset or removed, and has no IPUoF configuration.
    failed_line(pod.user("create", "partition", "other", "--size", "4"), "create partition", "other",
                "all 32 of its IPUs are in use; it fits when ring is removed")
    failed_line(pod.user("get", "partition", "ring", "--ipu-configs"), "get partition", "ring", "ring is ERROR")

    pod.wipe_rack_only()
    assert pod.user("reset", "partition", "ring").code == 0
    assert pod.held_anywhere("ring") == [m.name for m in pod.rack.machines]
    assert pairs(pod.user("get", "partition", "ring").out)["State"] == "ACTIVE"


def test_a_configuration_fault_on_one_machine_is_undone_on_the_others(pod):
    pod.register()
    pod.fault("m06", "IPU 1 failed its link training")
    failed_line(pod.user("create", "partition", "p1", "--size", "16"), "create partition", "p1",
                "agent ag6: m06: IPU 1 failed its link training")
    assert pod.held_anywhere("p1") == []  # m05, m07 and m08 applied it, and were cleared again
    failed_line(pod.user("remove", "partition", "p1"), "remove partition", "p1", "partition p1 does not exist")
    pod.wipe_rack_only()  # the machine is repaired
    assert pod.user("create", "partition", "p2", "--size", "16").code == 0
    assert pod.held_anywhere("p2") == ["m05", "m06", "m07", "m08"]


def test_an_agent_that_stops_answering_is_shown_down_and_blocks_its_partitions(pod):
    pod.register()
    assert pod.user("create", "partition", "p1", "--size", "4").code == 0
    pod.stop_agent("m01")
    pod.wait_for_status("ag1", "Down")
    assert "unreachable" in pairs(pod.admin("get", "agent", "ag1").out)["Last Error"]
    failed_line(pod.user("remove", "partition", "p1"), "remove partition", "p1", "agent ag1: unreachable")
    assert pod.user("remove", "partition", "p1", "--force").code == 0
    pod.start_agent("m01")
    pod.wait_for_status("ag1", "Up")


def test_a_forced_remove_at_a_hung_agent_says_so_and_no_create_meets_the_settings_it_left(pod):
    pod.stop_server()
    pod.start_server("--health-interval", "3600")  # no health pass clears the machine meanwhile: only the controller's own asking does
    pod.register()
    assert pod.user("create", "partition", "p1", "--size", "4").code == 0
    [machine] = pod.held_anywhere("p1")
    agent_id = f"ag{int(machine[1:])}"
    agent = pod.agents[next(g for g in pod.agent_groups if machine in g)[0]]
    agent.send_signal(signal.SIGSTOP)  # hung: it takes calls and answers none
    try:
        removed = pod.user("remove", "partition", "p1", "--force")
        created = pod.user("create", "partition", "p2", "--size", "4")  # at once: never sent onto those settings
        whole = pod.user("create", "partition", "whole", "--size", "32")  # needs the kept-out IPUs: says what it waits for
    finally:
        agent.send_signal(signal.SIGCONT)
    assert removed.code == 0, removed.err
    assert f"warning: agent(s) {agent_id} did not confirm the clear" in removed.err
    assert created.code == 0, created.err
    assert pod.held_anywhere("p2") not in ([], [machine])
    failed_line(whole, "create partition", "whole", f"it fits when p2 is removed and {agent_id} confirms it cleared p1 (removed "
                                                    "while it did not answer; asked again until it does")
    assert "p1 is removed" not in whole.err  # p1 is gone: no removal frees its IPUs, the machine's answer does
    # Asked again once it answers: no health pass (an hour away) and no restart of the controller.
    wait_until(lambda: pod.held_anywhere("p1") == [], what="the controller to clear the forgotten partition once the agent answers")
    assert pod.user("remove", "partition", "p2").code == 0
    wait_until(lambda: pod.user("create", "partition", "whole", "--size", "32").code == 0,
               what="the cleared machine's IPUs to be free again")


def test_the_machines_of_a_partition_are_configured_and_cleared_together(pod):
    pod.register(topology=admin_pb2.ILD_TOPOLOGY_TORUS)
    delay = 2.0  # each machine's apply and clear; one after another, eight of them would take 16 s
    pod.edit_rack(lambda rack: [faults.slow_down(rack, m.name, int(delay * 1000)) for m in rack.machines])
    api = pb_grpc.UserServiceStub(pod._channel(pod.user_port))
    began = time.monotonic()
    api.CreatePartition(pb.CreatePartitionRequest(requirements=pb.PartitionRequirements(id="wide", size=32)), timeout=30)
    created = time.monotonic()
    api.RemovePartition(pb.RemovePartitionRequest(partition_id="wide"), timeout=30)
    removed = time.monotonic()
    assert created - began < 4 * delay, f"the create took {created - began:.2f} s"
    assert removed - created < 4 * delay, f"the remove took {removed - created:.2f} s"
    assert pod.held_anywhere("wide") == []


def test_a_machine_powered_off_is_left_out_of_placement_and_capacity_and_a_refusal_says_so(pod):
    pod.stop_server()
    pod.start_server()  # health passes as often as the pod's controller has them (a test before may have slowed them)
    pod.register(topology=admin_pb2.ILD_TOPOLOGY_TORUS)
    assert pod.admin("power", "off", "agent", "ag1").code == 0
    pod.wait_for_status("ag1", "Down")
    assert pairs(pod.admin("get", "agent", "ag1").out)["Last Error"] == "m01 is powered off"
    for n in range(7):  # the seven machines that are on take one each, none placed on ag1 to fail there
        created = pod.user("create", "partition", f"p{n}", "--size", "4")
        assert created.code == 0, created.err
    assert sorted(p for m in pod.rack.machines[1:] for p in pod.held(m.name)) == [f"p{n}" for n in range(7)]
    room = json.loads(pod.user("list", "capacity", "--size", "4", "--json").out)["allocations"][0]
    assert (room["free_ipus"], room["down_ipus"], room["fitting"], room["largest"]) == (4, 4, 0, 0), room  # free, and down
    failed_line(pod.user("create", "partition", "p7", "--size", "4"), "create partition", "p7",
                "no free 4-IPU run in allocation alloc-1 without its machines that are down (agent ag1 is down: m01 is powered off)")
    assert pod.admin("power", "on", "agent", "ag1").code == 0
    pod.wait_for_status("ag1", "Up")
    created = pod.user("create", "partition", "p7", "--size", "4")
    assert created.code == 0, created.err
    assert pod.held_anywhere("p7") == ["m01"]
