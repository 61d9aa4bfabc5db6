"""vipu against a real controller and real agents: partitions from request to release."""

from __future__ import annotations

import json
import urllib.request
from datetime import timedelta

import grpc
import pytest

from tests.functional.harness import failed_line, pairs, rows, wait_until
from tests.functional.test_queue import Waiter
from vipu.api.protos import admin_pb2, admin_pb2_grpc, vipuuser_pb2, vipuuser_pb2_grpc


def test_a_partition_is_created_listed_shown_reset_and_removed(registered_pod):
    pod = registered_pod
    created = pod.user("create", "partition", "p1", "--size", "4")
    assert (created.code, created.out, created.err) == (0, "create partition (p1): success.\n", "")
    config = json.loads((pod.ipuof_dir / "p1_ipuof.conf").read_text())
    assert config["attributes"]["Partition Id"] == "p1" and config["attributes"]["GCD Id"] == "0"
    machine = pod.rack.machines[0]
    assert [(d["ip"], d["server_port"], d["device_id"], d["routing_id"]) for d in config["devices"]] == [
        (machine.ipuof_host, machine.ipuof_port, i, i) for i in range(4)
    ]
    assert rows(pod.user("list", "partitions").out) == [["p1", "cl0", "1", "DEFAULT", "DNC", "4", "1", "ACTIVE"]]
    shown = pod.user("get", "partition", "p1")
    fields = pairs(shown.out)
    assert (fields["State"], fields["Operation"], fields["Allocation"], fields["Size"]) == ("ACTIVE", "IDLE", "alloc-1", "4")
    assert fields["Auto-reset Retries"] == "0/3"  # none used yet, of the three a lost agent may cost
    assert fields["Last Auto-reset"] == "-"
    assert [row[2:4] for row in rows(shown.out)] == [["ag1", str(i)] for i in range(4)]

    assert pod.user("reset", "partition", "p1").out == "reset partition (p1): success.\n"
    assert pod.held("m01") == {"p1": [0, 1, 2, 3]}

    assert pod.user("remove", "partition", "p1").out == "remove partition (p1): success.\n"
    assert not (pod.ipuof_dir / "p1_ipuof.conf").exists()
    assert pod.held("m01") == {}
    assert rows(pod.user("list", "partitions").out) == []


def test_the_ipus_of_a_partition_are_configured_on_its_agents_and_shown_by_get_agent(registered_pod):
    pod = registered_pod
    assert pod.user("create", "partition", "small", "--size", "2").code == 0
    assert pod.user("create", "partition", "big", "--size", "16").code == 0
    assert pod.held_anywhere("small") == ["m01"]
    assert pod.held_anywhere("big") == ["m05", "m06", "m07", "m08"]  # large partitions fill from the top
    assert pod.held("m01") == {"small": [0, 1]}
    ipus = rows(pod.admin("get", "agent", "ag1").out)
    assert [(r[0], r[2], r[3]) for r in ipus] == [("0", "small", "ACTIVE"), ("1", "small", "ACTIVE"),
                                                  ("2", "-", "free"), ("3", "-", "free")]
    assert [r[2] for r in rows(pod.admin("get", "agent", "ag6").out)] == ["big"] * 4
    attrs = pod.admin("get", "agent", "ag6", "--json")
    assert [u["routing_id"] for u in json.loads(attrs.out)["ipus"]] == [4, 5, 6, 7]


def test_a_multi_gcd_partition_gets_one_configuration_file_per_gcd(registered_pod):
    pod = registered_pod
    assert pod.user("create", "partition", "mg", "--size", "8", "--num-gcds", "2").code == 0
    files = sorted(p.name for p in pod.ipuof_dir.iterdir())
    assert files == ["mg_gcd0_ipuof.conf", "mg_gcd1_ipuof.conf"]
    second = json.loads((pod.ipuof_dir / "mg_gcd1_ipuof.conf").read_text())
    assert second["attributes"]["GCD Id"] == "1" and [d["routing_id"] for d in second["devices"]] == [0, 1, 2, 3]
    assert second["devices"][0]["server_port"] == pod.rack.machines[1].ipuof_port

    shown = pod.user("get", "partition", "mg", "--ipu-configs", "--gcd", "1")
    header, _, body = shown.out.partition("\n")
    assert header == "IPUoF configuration of partition mg, GCD 1:"
    assert json.loads(body) == second
    both = pod.user("get", "partition", "mg", "--ipu-configs")
    assert both.out.count("IPUoF configuration of partition mg") == 2
    scripted = json.loads(pod.user("get", "partition", "mg", "--ipu-configs", "--json").out)  # pure JSON
    assert [g["gcd"] for g in scripted] == [0, 1] and scripted[1]["ipuof_config"] == second
    assert json.loads(pod.user("get", "partition", "mg", "--ipu-configs", "--gcd", "1", "--json").out) == [
        {"gcd": 1, "ipuof_config": second}]
    failed_line(pod.user("get", "partition", "mg", "--ipu-configs", "--gcd", "2"), "get partition", "mg", "GCDs 0 to 1, not 2")
    assert pod.user("remove", "partition", "mg").code == 0
    assert list(pod.ipuof_dir.iterdir()) == []


def test_the_ipuof_directory_can_be_chosen_per_command(registered_pod, tmp_path):
    pod = registered_pod
    assert pod.user("create", "partition", "p1", "--size", "1", "--ipuof-dir", str(tmp_path / "mine")).code == 0
    assert [p.name for p in (tmp_path / "mine").iterdir()] == ["p1_ipuof.conf"]
    assert pod.user("remove", "partition", "p1", "--ipuof-dir", str(tmp_path / "mine")).code == 0
    assert list((tmp_path / "mine").iterdir()) == []


def test_an_unwritable_ipuof_directory_leaves_no_partition_behind(registered_pod, tmp_path):
    pod = registered_pod
    blocker = tmp_path / "a-file"
    blocker.write_text("not a directory")
    before = pod.snapshot()
    failed_line(pod.user("create", "partition", "p1", "--size", "4", "--ipuof-dir", str(blocker / "sub")),
                "create partition", "p1", "cannot write its IPUoF configuration to")
    assert pod.snapshot() == before


def test_json_output_of_every_list_and_get(registered_pod):
    pod = registered_pod
    assert pod.user("create", "partition", "p1", "--size", "8", "--num-gcds", "2").code == 0
    listing = json.loads(pod.user("list", "partitions", "--json").out)
    assert listing["partitions"][0]["spec"]["num_gcds"] == 2 and len(listing["partitions"][0]["spec"]["ipus"]) == 8
    detail = json.loads(pod.user("get", "partition", "p1", "--json").out)
    assert detail["status"]["ready_state"] == "PS_ACTIVE" and detail["partition"]["id"] == "p1"
    assert json.loads(pod.user("list", "allocations", "--json").out)["allocations"][0]["spec"]["agent_ids"][0] == "ag1"
    attrs = json.loads(pod.user("list", "ipu-attrs", "--json").out)
    assert len(attrs["entries"]) == 8 and attrs["entries"][0]["ipu_attributes"]["0"]["attributes"]["board type"] == "M2000"
    for command in (["list", "agents"], ["list", "clusters"], ["list", "allocations"], ["get", "cluster", "cl0"],
                    ["get", "allocation", "alloc-1"], ["get", "agent", "ag1"]):
        assert json.loads(pod.admin(*command, "--json").out)


def test_allocations_and_ipu_attributes_as_users_see_them(registered_pod):
    pod = registered_pod
    assert rows(pod.user("list", "allocations").out) == [["alloc-1", " ".join(f"ag{n}" for n in range(1, 9))]]
    attrs = pod.user("list", "ipu-attrs", "--agents", "ag2")
    table = rows(attrs.out)
    assert table[0][:2] == ["ag2", "0"] and ["", "", "board type", "M2000"] in table
    assert table[0][2:] == ["board ipu index", "0"]
    failed_line(pod.user("list", "ipu-attrs", "--agents", "ag99"), "list ipu-attrs", None, "agent ag99 does not exist")


def test_bad_requests_are_refused_in_one_line_and_change_nothing(registered_pod):
    pod = registered_pod
    assert pod.user("create", "partition", "p1", "--size", "16").code == 0
    before = pod.snapshot()
    refusals = [
        (["create", "partition", "p2", "--size", "3"], "partition size must be a power of two, not 3"),
        (["create", "partition", "p2", "--size", "0"], "partition size must be a power of two, not 0"),
        (["create", "partition", "p2", "--size", "64"], "larger than the cluster's 32 IPUs"),
        (["create", "partition", "p2", "--size", "32"], "no free 32-IPU run in allocation alloc-1: 16 of 32 IPUs are free, "
                                                        "the largest free run is 16 IPUs (ag1-ag4); it fits when p1 is removed"),
        (["create", "partition", "p1", "--size", "4"], "partition p1 already exists"),
        (["create", "partition", "p2", "--size", "4", "--allocation", "nope"], "allocation nope does not exist"),
        (["create", "partition", "p2", "--size", "4", "--cluster", "nope"], "cluster nope does not exist"),
        (["create", "partition", "p2", "--size", "4", "--num-gcds", "3"], "number of GCDs must be a power of two"),
        (["create", "partition", "bad/id", "--size", "4"], "invalid partition id"),
        (["create", "partition", "p2", "--size", "8", "--ipulink-routing", "ringswnc"],
         "RINGSWNC routing needs a partition that takes whole IPU-Link domains of a torus cluster, and this one is a mesh"),
        (["create", "partition", "p2", "--size", "4", "--reconfigurable", "--sync-type", "pod-native-default"], "c2-compatible"),
        (["remove", "partition", "nope"], "partition nope does not exist"),
        (["reset", "partition", "nope"], "partition nope does not exist"),
        (["get", "partition", "nope"], "partition nope does not exist"),
    ]
    for args, reason in refusals:
        subject = args[2] if args[0] != "list" else None
        failed_line(pod.user(*args), f"{args[0]} {args[1]}", subject, reason)
    for args in (["create", "partition", "p2", "--size", "-4"], ["create", "partition", "p2"],
                 ["create", "partition", "p2", "--size", "4", "--allocation", "a", "--cluster", "c"], ["create", "tree"]):
        usage = pod.user(*args)
        assert usage.code == 2 and len(usage.err.splitlines()) == 1 and "Traceback" not in usage.err, usage.err
    assert pod.snapshot() == before


def test_no_partition_without_an_allocation(pod):
    pod.register(allocation="")
    failed_line(pod.user("create", "partition", "p1", "--size", "4"), "create partition", "p1",
                "there is no allocation to create partitions in")


def test_partitions_never_span_allocations(pod):
    pod.register(allocation="")
    api = pod.admin_api
    api.CreateAllocation(admin_pb2.CreateAllocationRequest(id="a1", cluster_id="cl0", agent_ids=["ag1", "ag2"]))
    api.CreateAllocation(admin_pb2.CreateAllocationRequest(id="a2", cluster_id="cl0", agent_ids=["ag3", "ag4"]))
    assert pod.user("create", "partition", "p1", "--size", "8", "--allocation", "a2").code == 0
    assert pod.held_anywhere("p1") == ["m03", "m04"]
    failed_line(pod.user("create", "partition", "p2", "--size", "16"), "create partition", "p2",
                "no allocation can hold a partition of 16 IPUs as asked (allocation a1 has 8 IPUs (2 machines): a partition of "
                "16 IPUs never fits in it; allocation a2 has 8 IPUs (2 machines): a partition of 16 IPUs never fits in it)")
    assert rows(pod.user("list", "partitions", "--allocation", "a2").out)[0][0] == "p1"
    assert rows(pod.user("list", "partitions", "--allocation", "a1").out) == []


def test_the_server_version(registered_pod):
    assert registered_pod.user("--server-version").lines == ["version: 0.1.0", f"host: 127.0.0.1:{registered_pod.user_port}"]


@pytest.mark.parametrize("topology, size, routing", [("torus", 32, "RINGSWNC"), ("mesh", 32, "SWNC")])
def test_a_whole_domain_partition_uses_the_loop_back_links_only_in_a_torus(pod, topology, size, routing):
    pod.register(topology=admin_pb2.ILD_TOPOLOGY_TORUS if topology == "torus" else admin_pb2.ILD_TOPOLOGY_MESH)
    assert pod.user("create", "partition", "whole", "--size", str(size)).code == 0
    assert rows(pod.user("list", "partitions").out)[0][4] == routing
    top = pod.settings("m08", "whole")
    expected = [1, 2, 3, 4, 5, 6, 7, 8] if topology == "torus" else [1, 2, 3, 4]
    assert [link.port for link in top.ipulinks] == expected
    assert {link.peer_serial for link in top.ipulinks if link.port > 4} <= {pod.rack.machines[0].serial}


def requests_of(pod, method: str) -> float:
    """How many calls of a user API method the controller has answered (its metrics)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{pod.metrics_port}/metrics", timeout=5).read().decode()
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith("vipu_requests_total{") and f'method="{method}"' in line)


def test_the_create_reply_carries_the_ipuof_configuration_and_the_cli_makes_one_call(registered_pod):
    pod = registered_pod
    api = vipuuser_pb2_grpc.UserServiceStub(pod._channel(pod.user_port))
    request = vipuuser_pb2.CreatePartitionRequest(requirements=vipuuser_pb2.PartitionRequirements(id="p1", size=8, num_gcds=2))
    created = api.CreatePartition(request, timeout=60)
    asked = api.GetPartitionIpuofConfig(vipuuser_pb2.GetPartitionIpuofConfigRequest(partition_id="p1"), timeout=60)
    assert created.HasField("ipuof_config") and created.ipuof_config == asked.ipuof_config
    assert len(created.ipuof_config.gcd_configs) == 2

    asked_before, created_before = requests_of(pod, "GetPartitionIpuofConfig"), requests_of(pod, "CreatePartition")
    assert pod.user("create", "partition", "p2", "--size", "4").code == 0
    assert requests_of(pod, "GetPartitionIpuofConfig") == asked_before
    assert requests_of(pod, "CreatePartition") == created_before + 1
    assert json.loads((pod.ipuof_dir / "p2_ipuof.conf").read_text())["attributes"]["Partition Id"] == "p2"


def test_list_capacity_shows_the_room_placement_sees(registered_pod):
    """Free and used IPUs per allocation, the largest partition that fits and how many of a size fit side by side."""
    pod = registered_pod
    empty = json.loads(pod.user("list", "capacity", "--size", "8", "--json").out)
    assert empty["allocations"][0] | {"blocked": ""} == {
        "allocation_id": "alloc-1", "cluster_id": "cl0", "total_ipus": 32, "used_ipus": 0, "free_ipus": 32,
        "fitting": 4, "largest": 32, "blocked": "", "down_ipus": 0, "held_ipus": 0, "held_for": "", "draining_ipus": 0,
        "reserved_ipus": 0}
    assert pod.user("create", "partition", "small", "--size", "2").code == 0
    assert pod.user("create", "partition", "big", "--size", "16").code == 0  # m05-m08, leaving m02-m04 a run of three
    table = rows(pod.user("list", "capacity", "--size", "8").out)
    assert table == [["alloc-1", "cl0", "32", "18", "14", "8", "1", "-"]]
    pairs_fit = json.loads(pod.admin("list", "capacity", "--size", "2", "--json").out)
    assert (pairs_fit["fitting"], pairs_fit["largest"]) == (7, 8)  # the rest of m01, and m02-m04 in twos
    failed_line(pod.user("list", "capacity", "--size", "6"), "list capacity", None, "partition size must be a power of two, not 6.")


def test_an_index_places_a_reconfigurable_partition_at_that_run_of_its_allocation(registered_pod):
    """vipu create partition --index I: the I-th run of SIZE IPUs of the allocation, machines in order."""
    pod = registered_pod
    assert pod.user("create", "partition", "r4", "--size", "4", "--reconfigurable", "--index", "2").code == 0
    assert pod.held_anywhere("r4") == ["m03"]
    placed = pod.user("create", "partition", "r2", "--size", "2", "--reconfigurable", "--index", "1",
                      "--sync-type", "pod-native-default")  # the vendor's rule: with an index, c2-compatible all the same
    assert placed.code == 0, placed.err
    assert pod.held("m01") == {"r2": [2, 3]}
    assert pairs(pod.user("get", "partition", "r2").out)["Sync Type"] == "c2-compatible"
    failed_line(pod.user("create", "partition", "again", "--size", "4", "--reconfigurable", "--index", "2"),
                "create partition", "again", "no free 4-IPU run in allocation alloc-1: 26 of 32 IPUs are free, the largest free run is "
                                             "16 IPUs (ag5-ag8); it fits when r4 is removed")
    failed_line(pod.user("create", "partition", "far", "--size", "8", "--reconfigurable", "--index", "4"),
                "create partition", "far", "allocation alloc-1 has 4 place(s) for a partition of 8 IPUs (indices 0 to 3), not index 4")
    failed_line(pod.user("create", "partition", "plain", "--size", "4", "--index", "0"),
                "create partition", "plain", "an index places a reconfigurable partition; ask for one (--reconfigurable)")
    assert sorted(r[0] for r in rows(pod.user("list", "partitions").out)) == ["r2", "r4"]


def test_ids_are_matched_whole_and_a_long_one_is_refused_in_a_short_line(registered_pod):
    """`p1` followed by a line break is not `p1`; a 100,000-character id gets INVALID_ARGUMENT with
    its reason, not RESOURCE_EXHAUSTED from a refusal too long to send."""
    api = vipuuser_pb2_grpc.UserServiceStub(registered_pod._channel(registered_pod.user_port))
    for partition_id in ("p1\n", "x" * 100_000):
        with pytest.raises(grpc.RpcError) as refused:
            api.CreatePartition(vipuuser_pb2.CreatePartitionRequest(
                requirements=vipuuser_pb2.PartitionRequirements(id=partition_id, size=1)), timeout=10)
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert refused.value.details().startswith("invalid partition id ") and len(refused.value.details()) < 300
    admin = admin_pb2_grpc.AdminServiceStub(registered_pod._channel(registered_pod.admin_port))
    shortened = "'" + "y" * 40 + "'... (100000 characters)"
    for kind, look_up in (("partition", lambda i: api.GetPartitionStatus(vipuuser_pb2.GetPartitionStatusRequest(partition_id=i))),
                          ("allocation", lambda i: api.ListPartitions(vipuuser_pb2.ListPartitionsRequest(allocation_id=i))),
                          ("agent", lambda i: admin.GetAgent(admin_pb2.GetRequest(id=i))),
                          ("cluster", lambda i: admin.GetCluster(admin_pb2.GetRequest(id=i)))):
        for missing_id, named in (("y" * 100_000, shortened), ("p1\n", "'p1\\n'"), ("q1", "q1")):
            with pytest.raises(grpc.RpcError) as missing:
                look_up(missing_id)
            assert missing.value.code() == grpc.StatusCode.NOT_FOUND
            assert missing.value.details() == f"{kind} {named} does not exist"
    assert rows(registered_pod.user("list", "partitions").out) == []


def test_a_partition_id_that_would_take_another_partitions_ipuof_file_is_refused(registered_pod):
    pod = registered_pod
    assert pod.user("create", "partition", "q", "--size", "2", "--num-gcds", "2").code == 0
    failed_line(pod.user("create", "partition", "q_gcd0", "--size", "1"), "create partition", "q_gcd0",
                "it may not end in _gcd and a number, which names the IPUoF file of a GCD of partition 'q'")
    assert sorted(p.name for p in pod.ipuof_dir.iterdir()) == ["q_gcd0_ipuof.conf", "q_gcd1_ipuof.conf"]


def test_a_forced_removal_by_the_administrator_deletes_the_ipuof_files_of_what_it_removed(registered_pod):
    pod = registered_pod
    assert pod.user("create", "partition", "one", "--size", "1").code == 0
    assert pod.user("create", "partition", "two", "--size", "2", "--num-gcds", "2").code == 0
    assert len(list(pod.ipuof_dir.iterdir())) == 3
    removed = pod.admin("remove", "allocation", "alloc-1", "--force")
    assert removed.code == 0 and "partition one" in removed.out and "partition two" in removed.out
    assert list(pod.ipuof_dir.iterdir()) == []


def test_a_partition_consents_to_be_moved_shows_when_it_is_expected_to_end_and_its_user_changes_the_consent(registered_pod):
    pod = registered_pod
    created = pod.user("create", "partition", "p1", "--size", "4", "--may-move", "--expected-duration", "1h")
    assert (created.code, created.out, created.err) == (0, "create partition (p1): success.\n", "")
    api = vipuuser_pb2_grpc.UserServiceStub(pod._channel(pod.user_port))
    [listed] = api.ListPartitions(vipuuser_pb2.ListPartitionsRequest()).partitions
    assert (listed.status.may_move, listed.status.expected_seconds) == (True, 3600)
    end = (listed.created.ToDatetime() + timedelta(hours=1)).strftime("%Y-%m-%d %H:%M:%S UTC")
    fields = pairs(pod.user("get", "partition", "p1").out)
    assert (fields["May move"], fields["Expected end"]) == ("yes", f"{end} (1h after its start)")

    assert pod.user("update", "partition", "p1", "--no-may-move").out == "update partition (p1): success.\n"
    assert pairs(pod.user("get", "partition", "p1").out)["May move"] == "no"
    assert api.GetPartitionStatus(vipuuser_pb2.GetPartitionStatusRequest(partition_id="p1")).status.may_move is False
    assert pod.user("update", "partition", "p1", "--may-move").out == "update partition (p1): success.\n"
    assert pod.user("update", "partition", "p1", "--may-move").code == 0  # asking for what is so: nothing to do

    before = pod.snapshot()
    failed_line(pod.user("update", "partition", "nosuch", "--may-move"), "update partition", "nosuch", "partition nosuch does not exist")
    for bad in (("update", "partition", "p1"), ("create", "partition", "p2", "--size", "4", "--expected-duration", "2"),
                ("create", "partition", "p2", "--size", "4", "--expected-duration", "0s")):
        refused = pod.user(*bad)
        assert refused.code == 2 and refused.out == "" and len(refused.err.splitlines()) == 1, refused
    with pytest.raises(grpc.RpcError) as nothing_asked:
        api.UpdatePartition(vipuuser_pb2.UpdatePartitionRequest(partition_id="p1"))
    assert nothing_asked.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "nothing to change" in nothing_asked.value.details()
    assert pod.snapshot() == before
    assert pairs(pod.user("get", "partition", "p1").out)["May move"] == "yes"

    assert pod.user("create", "partition", "plain", "--size", "4").code == 0
    fields = pairs(pod.user("get", "partition", "plain").out)
    assert (fields["May move"], fields["Expected end"]) == ("no", "-")


def test_a_waiting_request_keeps_its_consent_and_expected_duration_for_its_partition(registered_pod):
    pod = registered_pod
    assert pod.user("create", "partition", "full", "--size", "32").code == 0
    waiter = Waiter(pod, "later", "--size", "4", "--timeout", "60", "--may-move", "--expected-duration", "30m")
    wait_until(lambda: [r[1] for r in rows(pod.user("list", "requests").out)] == ["later"], what="later to wait")
    assert pod.user("remove", "partition", "full").code == 0
    assert waiter.result().code == 0
    fields = pairs(pod.user("get", "partition", "later").out)
    assert fields["May move"] == "yes" and fields["Expected end"].endswith(" UTC (30m after its start)")
