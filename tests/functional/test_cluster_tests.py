"""vipu-admin test cluster against real agents whose rack carries the faults."""

from __future__ import annotations

import json
import re

from tests.functional.harness import failed_line, pairs, rows
from vipu.backends.sim import faults
from vipu.model.topology import LinkKind


def results(out: str) -> dict[str, tuple[str, list[str]]]:
    """Test type -> (passed column, summary lines) from the results table."""
    assert out.startswith("Showing test results for cluster cl0\n"), out
    table: dict[str, tuple[str, list[str]]] = {}
    current = None
    for test, _, passed, summary in rows(out):
        if test:
            current = test
            table[test] = (passed, [summary])
        else:
            table[current][1].append(summary)
    return table


def test_a_healthy_rack_passes_every_test_with_the_seeds_counts(registered_pod):
    """cl0 is an 8-machine single-domain mesh, the cluster of seed 002's example."""
    result = registered_pod.admin("test", "cluster", "cl0")
    assert (result.code, result.err) == (0, "")  # piped: no progress, the seed's table alone
    assert results(result.out) == {
        "Sync-Link": ("14/14", ["Sync Link test passed"]),
        "Cabling": ("28/28", ["All cables connected as expected"]),
        "IPU-Link": ("156/156", ["All Links Passed"]),
        "Traffic": ("3/3", ["Traffic test passed"]),
        "GW-Link": ("0/0", ["GW Link test skipped"]),
        "Version": ("6/6", ["All component versions are consistent"]),
    }
    pfc = registered_pod.admin("test", "cluster", "cl0", "--pfc-settings")
    assert results(pfc.out) == {"PFC-settings": ("8/8", ["All PFC settings as expected"])}
    scripted = json.loads(registered_pod.admin("test", "cluster", "--status", "--json").out)  # pure JSON
    assert scripted["cluster_id"] == "cl0"
    assert [(r["test"], r["status"], r["passed"]) for r in scripted["results"]] == [("PFC-settings", "passed", 8)]


def test_on_a_terminal_each_test_is_shown_as_it_ends_then_the_table(registered_pod):
    code, seen = registered_pod.admin_on_terminal("test", "cluster", "cl0")
    assert code == 0, seen
    lines = [line.strip() for line in seen.splitlines() if line.strip()]
    table = lines.index("Showing test results for cluster cl0")
    ended = [line.split(":")[0] for line in lines[:table] if re.match(r"^[\w-]+: (passed|failed|skipped) \(", line)]
    assert ended == ["Sync-Link", "Cabling", "IPU-Link", "Traffic", "GW-Link", "Version"], seen
    assert "Sync-Link: passed (14/14, " in seen and results("\n".join(lines[table:]) + "\n")["Traffic"][0] == "3/3"


def test_every_fault_class_fails_its_test_with_the_seeds_lines(registered_pod):
    pod = registered_pod
    pod.edit_rack(lambda r: (
        faults.break_link(r, "m01", "6", LinkKind.SYNC),
        faults.unplug(r, "m02", LinkKind.IPULINK, 5),
        faults.set_version(r, "m08", "agent", "1.5.1"),
        faults.set_pfc_classes(r, "m05", "eth1", [0, 2]),
    ))
    result = pod.admin("test", "cluster", "cl0")
    assert result.err == "test cluster (cl0): failed: Some tests failed.\n" and result.code == 1
    scripted = pod.admin("test", "cluster", "cl0", "--versions", "--json")
    assert scripted.code == 1 and scripted.err == "test cluster (cl0): failed: Some tests failed.\n"
    assert [(r["test"], r["passed"], r["total"]) for r in json.loads(scripted.out)["results"]] == [("Version", 5, 6)]
    table = results(result.out)
    assert table["Sync-Link"] == ("13/14", ["Failed Sync Links:", "ag1:6 <--> 2:ag2"])
    assert table["Cabling"] == ("27/28", ["ag2:5 [IPU-Link] <--> ag3:1 [IPU-Link] (failed)"])
    reason = "Test did not run because of an earlier dependency test failure"
    assert table["IPU-Link"] == ("0/0", ["Test skipped", f"{reason} (Cabling)"])
    assert table["Traffic"] == ("0/0", ["Test skipped", f"{reason} (Sync-Link)"])
    assert table["GW-Link"] == ("0/0", ["Test skipped", f"{reason} (Cabling)"])
    assert table["Version"][0] == "5/6" and table["Version"][1][-1] == "ag8-Agent: 1.5.1"
    assert "PFC-settings" not in table  # not part of the default suite
    pfc = pod.admin("test", "cluster", "cl0", "--pfc-settings")
    assert pfc.code == 1 and results(pfc.out)["PFC-settings"] == (
        "7/8", ["PFC settings not as expected:", "ag5: {eth1: pfc classes: got [0, 2], expected [0 1 2 3 4 5 6 7]}"])

    # One option alone forces its test; two keep the dependencies between them.
    forced = results(pod.admin("test", "cluster", "cl0", "--ipulink").out)
    assert forced["IPU-Link"][1][:2] == ["Links that did not train:", "ag2:5 <--> 1:ag3"]
    pair = pod.admin("test", "cluster", "cl0", "--ipulink", "--cabling")
    assert pair.code == 1 and results(pair.out)["IPU-Link"] == ("0/0", ["Test skipped", f"{reason} (Cabling)"])


def test_erroring_links_and_a_wrong_port_show_in_traffic_and_cabling(registered_pod):
    pod = registered_pod
    pod.edit_rack(lambda r: (faults.set_errors(r, "m02", "5", 327), faults.set_errors(r, "m02", "ipu1:4C", 521),
                             faults.cross(r, "m07", LinkKind.IPULINK, 5, "m07", 6)))
    traffic = results(pod.admin("test", "cluster", "cl0", "--traffic").out)["Traffic"]
    assert traffic[0] == "1/3"
    assert traffic[1][:4] == ["Traffic test failed", "Errors encountered in traffic test 1",
                              "ag3:1 <--> ag2:5: 327 link errors", "ag2:ipu1:4C <--> 4C:ipu3:ag2: 521 link errors"]
    cabling = results(pod.admin("test", "cluster", "cl0", "--cabling").out)["Cabling"]
    assert cabling == ("26/28", ["Cables not connected as expected:",
                                 "ag7 (IPU-Cluster Port 5) <--> ag8 (IPU-Cluster Port 1) (connected to wrong port)",
                                 "ag7 (IPU-Cluster Port 6) <--> ag8 (IPU-Cluster Port 2) (connected to wrong port)"])


def test_a_machine_that_does_not_answer(registered_pod):
    pod = registered_pod
    pod.edit_rack(lambda r: faults.silence(r, "m03"))
    pod.wait_for_status("ag3", "Down")
    table = results(pod.admin("test", "cluster", "cl0", "--versions").out)
    assert table["Version"] == ("0/6", ["Components with mismatched versions found:", "ag3: does not answer"])
    failed_line(pod.user("create", "partition", "p1", "--size", "32"), "create partition", "p1",
                "no room for a partition of 32 IPUs in allocation alloc-1 while its machines that are down are left out (agent ag3 is "
                "down: unreachable")


def test_asynchronous_runs_and_what_a_running_test_forbids(registered_pod):
    pod = registered_pod
    pod.edit_rack(lambda r: setattr(r, "time_scale", 0.15))  # its steps take 11 s or more: time for five commands under load
    started = pod.admin("test", "cluster", "cl0", "--start")
    assert (started.code, started.out, started.err) == (0, "", "")  # silent, as in seed 002
    failed_line(pod.admin("test", "cluster", "--status"), "test cluster", "status",
                "No results available. Test in cluster cl0 is in progress.")
    failed_line(pod.user("create", "partition", "p1", "--size", "4"), "create partition", "p1", "cluster cl0 is under test")
    failed_line(pod.admin("remove", "cluster", "cl0", "--force"), "remove cluster", "cl0", "cluster cl0 is under test")
    failed_line(pod.admin("test", "cluster", "cl0", "--versions"), "test cluster", "cl0", "only one cluster test runs at a time")
    stopped = pod.admin("test", "cluster", "--stop")
    assert (stopped.code, stopped.out, stopped.err) == (0, "", "")
    failed_line(pod.admin("test", "cluster", "--status"), "test cluster", "status",
                "No results available. Last test in cluster cl0 was stopped.")
    failed_line(pod.admin("test", "cluster", "--stop"), "test cluster", "stop", "No cluster test is in progress")
    assert pod.user("create", "partition", "p1", "--size", "4").code == 0

    failed_line(pod.admin("test", "cluster", "cl0"), "test cluster", "cl0", "cluster cl0 has partitions (p1)")
    assert pod.admin("test", "cluster", "cl0", "--versions").code == 0  # harmless tests still run
    assert pod.user("remove", "partition", "p1").code == 0


def test_drained_machines_are_tested_alone_and_power_cycled_without_force_while_a_partition_runs_elsewhere(registered_pod):
    pod = registered_pod
    assert pod.user("create", "partition", "p1", "--size", "4").code == 0  # on ag1
    failed_line(pod.admin("test", "cluster", "cl0"), "test cluster", "cl0",
                "cluster cl0 has partitions (p1); remove them before running tests that drive its links, or drain the machines "
                "to test and test them alone (vipu-admin test cluster --agents)")
    failed_line(pod.admin("test", "cluster", "cl0", "--agents", "ag3,ag4,ag5,ag6"), "test cluster", "cl0",
                "a test of some machines alone needs them drained: agent ag3 is not drained")
    assert pod.admin("drain", "agent", "ag3", "ag4", "ag5", "ag6", "--reason", "cable repair").code == 0

    tested = pod.admin("test", "cluster", "cl0", "--agents", "ag3,ag4,ag5,ag6")
    assert tested.code == 0, tested.err
    alone = "Test of ag3, ag4, ag5, ag6"
    assert results(tested.out) == {  # the cables between them only, and their own
        "Sync-Link": ("6/6", ["Sync Link test passed", alone]),
        "Cabling": ("12/12", ["All cables connected as expected", alone]),
        "IPU-Link": ("76/76", ["All Links Passed", alone]),
        "Traffic": ("1/1", ["Traffic test passed", alone]),
        "GW-Link": ("0/0", ["GW Link test skipped", alone]),
        "Version": ("6/6", ["All component versions are consistent", alone]),
    }
    cycled = pod.admin("power", "cycle", "agent", "ag3")  # nothing runs there: no --force needed
    assert cycled.code == 0 and "agent ag3: power On" in cycled.out, cycled.err
    assert pairs(pod.user("get", "partition", "p1").out)["State"] == "ACTIVE"

    pod.edit_rack(lambda r: setattr(r, "time_scale", 0.15))  # its steps take seconds: time to try a power action meanwhile
    assert pod.admin("test", "cluster", "cl0", "--agents", "ag3,ag4,ag5,ag6", "--start").code == 0
    failed_line(pod.admin("power", "cycle", "agent", "ag4"), "power cycle agent", "ag4",
                "agent ag4 is under test (cluster cl0): power cycle would spoil its results")
    assert pod.admin("test", "cluster", "--stop").code == 0


def test_results_of_the_last_test_survive_a_restart_of_the_controller(registered_pod):
    pod = registered_pod
    assert pod.admin("test", "cluster", "cl0", "--sync", "--versions").code == 0
    pod.stop_server()
    pod.start_server()
    status = pod.admin("test", "cluster", "--status")
    assert status.code == 0 and list(results(status.out)) == ["Sync-Link", "Version"]

    pod.edit_rack(lambda r: setattr(r, "time_scale", 0.05))
    assert pod.admin("test", "cluster", "cl0", "--start").code == 0
    pod.stop_server()
    pod.start_server()
    failed_line(pod.admin("test", "cluster", "--status"), "test cluster", "status",
                "Last test in cluster cl0 was interrupted by a restart of the controller")


def test_test_options_are_checked(registered_pod):
    pod = registered_pod
    failed_line(pod.admin("test", "cluster", "nope"), "test cluster", "nope", "cluster nope does not exist")
    usage = pod.admin("test", "cluster")
    assert usage.code == 2 and "name the cluster to test" in usage.err
    usage = pod.admin("test", "cluster", "--status", "--agents", "ag1")
    assert usage.code == 2 and "--status takes none" in usage.err
    failed_line(pod.admin("test", "cluster", "cl0", "--agents", "ag1,ag9"), "test cluster", "cl0", "ag9 is not in cluster cl0")
