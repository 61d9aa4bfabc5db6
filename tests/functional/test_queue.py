"""Waiting for room, and moving off failed machines, with the real CLIs against a real controller and
agents (one module, so that they share its pod): `--wait`, the queue's listing and reasons, cancel,
timeout, a restart of the controller under a waiting client, vendor clients' immediate refusal;
a relocatable partition moving off a killed agent and off a machine whose apply fails, keeping its
id, and an IPUoF run on its moved devices."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
from datetime import UTC, datetime

import grpc
import pytest

from tests.functional.harness import BIN, Pod, Result, failed_line, pairs, rows, wait_until
from tests.functional.test_ipuof import ipuof
from vipu.api.protos import vipuuser_pb2, vipuuser_pb2_grpc

pytestmark = pytest.mark.functional


class Waiter:
    """`vipu create partition ... --wait` running in the background, as a user's terminal would."""

    def __init__(self, pod: Pod, partition_id: str, *args: str):
        env = {**os.environ, "VIPU_IPUOF_DIR": str(pod.ipuof_dir)}
        env.pop("VIPU_CLI_API_HOST", None)
        self.partition_id = partition_id
        self.process = subprocess.Popen(
            # SIGINT as a terminal's command has it: a test worker may ignore it, and its children with it
            ["env", "--default-signal=INT", str(BIN / "vipu"), "-H", "127.0.0.1", "--api-port", str(pod.user_port), "--api-timeout", "10",
             "create", "partition", partition_id, "--wait", *args],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, cwd=pod.directory)

    def result(self, timeout: float = 60) -> Result:
        out, err = self.process.communicate(timeout=timeout)
        return Result(self.process.returncode, out, err)

    def still_waiting(self) -> bool:
        return self.process.poll() is None


def queued(pod: Pod, program: str = "vipu") -> list[list[str]]:
    listed = pod.user("list", "requests") if program == "vipu" else pod.admin("list", "requests")
    assert listed.code == 0, listed.err
    return [[row[0], row[1], row[2], row[3], row[4], row[6]] for row in rows(listed.out)]  # all but the time


def test_requests_wait_in_order_with_their_reasons_and_start_as_room_appears(pod):
    pod.register(machines=2)  # alloc-1: 8 IPUs
    assert pod.user("create", "partition", "full", "--size", "8").code == 0
    asked = datetime.now(UTC).replace(microsecond=0)
    refused = pod.user("create", "partition", "now", "--size", "4")
    failed_line(refused, "create partition", "now",
                "no free 4-IPU run in allocation alloc-1: all 8 of its IPUs are in use; it fits when full is removed")
    first = Waiter(pod, "first", "--size", "4", "--timeout", "60")
    wait_until(lambda: len(queued(pod)) == 1, what="first to wait")
    second = Waiter(pod, "second", "--size", "8", "--timeout", "60")
    wait_until(lambda: len(queued(pod)) == 2, what="second to wait")
    expected = [
        ["1", "first", "alloc-1", "4", "-", "first in the queue, ag1 held for it; no free 4-IPU run in allocation alloc-1: "
                                            "all 8 of its IPUs are in use; it fits when full is removed"],
        ["2", "second", "alloc-1", "8", "-", "number 2 in the queue, behind first (4 IPUs); no free 8-IPU run in allocation "
                                             "alloc-1: all 8 of its IPUs are in use; the IPUs it could take are held for first, "
                                             "first in the queue"],
    ]
    assert queued(pod) == expected
    assert queued(pod, "vipu-admin") == expected
    since = [datetime.strptime(row[5], "%Y-%m-%d %H:%M:%S UTC").replace(tzinfo=UTC) for row in rows(pod.user("list", "requests").out)]
    assert asked <= since[0] <= since[1] <= datetime.now(UTC), since  # "Waiting Since": when each came, in order
    failed_line(pod.user("create", "partition", "first", "--size", "1"), "create partition", "first",
                "partition first already waits for room in allocation alloc-1")
    vendor = vipuuser_pb2_grpc.UserServiceStub(pod._channel(pod.user_port))  # a client of the published API: refused at once
    with pytest.raises(grpc.RpcError) as refused:
        vendor.CreatePartition(vipuuser_pb2.CreatePartitionRequest(requirements=vipuuser_pb2.PartitionRequirements(id="v", size=1)))
    assert (refused.value.code(), refused.value.details()) == (
        grpc.StatusCode.FAILED_PRECONDITION,
        "no free IPU in allocation alloc-1: all 8 of its IPUs are in use; it fits when full is removed")

    assert pod.user("remove", "partition", "full").code == 0
    started = first.result()
    assert (started.code, started.out, started.err) == (0, "create partition (first): success.\n", "")
    assert (pod.ipuof_dir / "first_ipuof.conf").exists() and pod.held_anywhere("first") == ["m01"]
    assert second.still_waiting()
    wait_until(lambda: queued(pod)[0][:2] == ["1", "second"] and "it fits when first is removed" in queued(pod)[0][5],
               what="second's new reason")

    cancelled = pod.admin("remove", "request", "second")  # an administrator cancels anyone's
    assert cancelled.out == "remove request (second): success.\n"
    failed_line(second.result(), "create partition", "second", "the request of partition second was cancelled")
    assert queued(pod) == [] and not (pod.ipuof_dir / "second_ipuof.conf").exists()


def test_a_request_gives_up_at_its_timeout_saying_why_and_bad_waits_are_refused_all_leaving_nothing(pod):
    pod.register(machines=2)
    assert pod.user("create", "partition", "full", "--size", "8").code == 0
    before = pod.snapshot()
    for args, reason in [(["--size", "4", "--timeout", "5"], "--timeout needs --wait"),
                         (["--size", "4", "--wait", "--timeout", "0"], "Invalid value for '--timeout'")]:
        usage = pod.user("create", "partition", "p", *args)
        assert usage.code == 2 and reason in usage.err and len(usage.err.splitlines()) == 1, usage.err
    failed_line(pod.user("remove", "request", "nope"), "remove request", "nope", "no request of partition nope waits")
    failed_line(pod.user("create", "partition", "p", "--size", "16", "--wait"), "create partition", "p",
                "partition size 16 is larger than the cluster's 8 IPUs")
    failed_line(Waiter(pod, "late", "--size", "8", "--timeout", "1").result(), "create partition", "late",
                "no room for partition late after waiting 1 s: first in the queue, ag1-ag2 held for it; "
                "no free 8-IPU run in allocation alloc-1: all 8 of its IPUs are in use; it fits when full is removed")
    assert queued(pod) == [] and pod.snapshot() == before


@pytest.mark.parametrize("ending", [signal.SIGTERM, signal.SIGHUP, signal.SIGINT])
def test_a_waiting_command_ended_by_a_signal_withdraws_its_request_and_leaves_no_partition(pod, ending):
    """`timeout`, a closed terminal or SSH session and a batch system's kill end a command with
    TERM or HUP, Ctrl-C with INT: each withdraws the request, so no partition is made for nobody."""
    pod.register(machines=2)
    assert pod.user("create", "partition", "full", "--size", "8").code == 0
    waiter = Waiter(pod, "gone", "--size", "4", "--timeout", "60")
    wait_until(lambda: len(queued(pod)) == 1, what="the request to wait")
    waiter.process.send_signal(ending)
    ended = waiter.result(timeout=30)
    assert ended.code == 128 + ending, ended.err
    assert queued(pod) == []
    assert pod.user("remove", "partition", "full").code == 0
    assert rows(pod.user("list", "partitions").out) == [] and pod.held_anywhere("gone") == []


def test_a_request_whose_waiter_vanished_is_withdrawn_at_its_lease_and_leaves_no_partition(pod):
    """A waiter killed outright (SIGKILL, a lost machine) withdraws nothing itself: the controller
    withdraws a request nobody has asked after for its lease."""
    pod.stop_server()
    pod.start_server("--request-lease", "5")
    try:
        pod.register(machines=2)
        assert pod.user("create", "partition", "full", "--size", "8").code == 0
        waiter = Waiter(pod, "vanished", "--size", "4", "--timeout", "600")
        wait_until(lambda: len(queued(pod)) == 1, what="the request to wait")
        waiter.process.kill()
        waiter.result()
        wait_until(lambda: queued(pod) == [], timeout=30, what="the controller to withdraw the request")
        assert "the request of partition vanished was withdrawn: nobody asked after it for 5 s" in pod.logged("was withdrawn")
        assert pod.user("remove", "partition", "full").code == 0
        assert rows(pod.user("list", "partitions").out) == [] and pod.held_anywhere("vanished") == []
    finally:
        pod.stop_server()
        pod.start_server()


def test_a_waiting_request_outlives_a_restart_of_the_controller_and_its_client_goes_on_waiting(pod):
    pod.register(machines=2)
    assert pod.user("create", "partition", "full", "--size", "8").code == 0
    waiter = Waiter(pod, "patient", "--size", "8", "--timeout", "120")
    wait_until(lambda: len(queued(pod)) == 1, what="the request to wait")
    pod.stop_server()
    pod.start_server()
    assert [row[:2] for row in queued(pod)] == [["1", "patient"]]  # the queue was in the store
    assert waiter.still_waiting()
    assert pod.user("remove", "partition", "full").code == 0
    assert waiter.result().code == 0
    assert pod.held_anywhere("patient") == ["m01", "m02"]


# Relocation

MOVED = re.compile(r"^moved from (\S+) to (\S+) on \S+ \S+ UTC: (.*)$")


def reaching_the_controller(pod) -> dict[str, str]:
    """What vipu-ipuof needs to read a partition's configuration again from vipu-server."""
    return {"VIPU_CLI_API_HOST": "127.0.0.1", "VIPU_CLI_API_PORT": str(pod.user_port)}


def devices(pod, partition_id: str) -> list[tuple[str, int]]:
    """Where the partition's IPUoF file says its devices are: (IPUoF end-point, device id)."""
    document = json.loads((pod.ipuof_dir / f"{partition_id}_ipuof.conf").read_text())
    return [(f"{d['ip']}:{d['server_port']}", d["device_id"]) for d in document["devices"]]


def endpoint(pod, machine: str) -> str:
    found = pod.rack.machine(machine)
    return f"{found.ipuof_host}:{found.ipuof_port}"


def test_a_relocatable_partition_moves_off_a_killed_agent_and_its_ipuof_run_follows_it(pod):
    pod.register(machines=4)
    assert pod.user("create", "partition", "mover", "--size", "4", "--relocatable").code == 0
    assert pod.user("create", "partition", "stays", "--size", "4").code == 0  # not relocatable: m02
    assert devices(pod, "mover") == [(endpoint(pod, "m01"), i) for i in range(4)]
    assert ipuof(pod, "--partition", "mover").code == 0

    pod.stop_agent("m01")  # its machine is gone
    shown = wait_until(lambda: (fields := pairs(pod.user("get", "partition", "mover").out))["State"] == "ACTIVE"
                       and fields["Relocated"] != "-" and fields, timeout=30, what="mover to move")
    source, target, why = MOVED.match(shown["Relocated"]).groups()
    assert (source, target) == ("ag1", "ag3") and why.startswith("agent ag1 is down: ")
    assert (shown["Relocatable"], shown["Auto-reset Retries"]) == ("yes", "1/3")
    assert [m for m in ("m02", "m03", "m04") if "mover" in pod.held(m)] == ["m03"]  # m01's agent is gone

    ran = ipuof(pod, "--partition", "mover", env=reaching_the_controller(pod))
    assert (ran.code, ran.out) == (0, "run (mover): success. 4 IPUs in 1 GCD(s) ran the test program; its IPUoF files were "
                                      "out of date (it moved) and are rewritten.\n"), ran.err
    assert devices(pod, "mover") == [(endpoint(pod, "m03"), i) for i in range(4)]
    assert ipuof(pod, "--partition", "mover").out == "run (mover): success. 4 IPUs in 1 GCD(s) ran the test program.\n"

    pod.start_agent("m01")  # back: the old settings it kept are cleared, the partition stays where it went
    pod.wait_for_agent("m01")
    wait_until(lambda: pod.held("m01") == {}, what="m01 to be cleared")
    assert pod.held_anywhere("mover") == ["m03"]


def test_a_relocatable_partition_whose_machine_fails_to_apply_it_is_made_elsewhere(pod):
    pod.register(machines=4)
    pod.fault("m01", "IPU 2 failed")
    created = pod.user("create", "partition", "p1", "--size", "4", "--relocatable")
    assert (created.code, created.out) == (0, "create partition (p1): success.\n"), created.err
    source, target, why = MOVED.match(pairs(pod.user("get", "partition", "p1").out)["Relocated"]).groups()
    assert (source, target, why) == ("ag1", "ag2", "agent ag1: m01: IPU 2 failed")
    assert devices(pod, "p1") == [(endpoint(pod, "m02"), i) for i in range(4)]  # the files name where it is
    assert ipuof(pod, "--partition", "p1").out == "run (p1): success. 4 IPUs in 1 GCD(s) ran the test program.\n"
    plain = pod.user("create", "partition", "p2", "--size", "4", "--allocation", "alloc-1")  # not relocatable: ag1 fails it
    assert plain.code == 1 and "partition p2 could not be created and was not kept: agent ag1: m01: IPU 2 failed" in plain.err

    # Once ACTIVE, a relocatable partition whose machine fails to apply it again (a reset) goes to ERROR
    # and the next health pass moves it off that machine.
    pod.fault("m02", "IPU 1 failed")
    failed = pod.user("reset", "partition", "p1")
    assert failed.code == 1 and "agent ag2: m02: IPU 1 failed" in failed.err, failed.err
    shown = wait_until(lambda: (fields := pairs(pod.user("get", "partition", "p1").out))["State"] == "ACTIVE"
                       and "from ag2" in fields["Relocated"] and fields, timeout=30, what="p1 to move off m02")
    assert MOVED.match(shown["Relocated"]).groups() == ("ag2", "ag3", "agent ag2: m02: IPU 1 failed")
    ran = ipuof(pod, "--partition", "p1", env=reaching_the_controller(pod))
    assert (ran.code, ran.out) == (0, "run (p1): success. 4 IPUs in 1 GCD(s) ran the test program; its IPUoF files were "
                                      "out of date (it moved) and are rewritten.\n"), ran.err
    assert devices(pod, "p1") == [(endpoint(pod, "m03"), i) for i in range(4)]


def test_reset_relocate_moves_a_partition_on_demand_and_rewrites_its_files(pod):
    pod.register(machines=2)
    assert pod.user("create", "partition", "p1", "--size", "4").code == 0
    before = (pod.ipuof_dir / "p1_ipuof.conf").read_text()
    moved = pod.user("reset", "partition", "p1", "--relocate")
    assert moved.out == "reset partition (p1): success.\n", moved.err
    assert MOVED.match(pairs(pod.user("get", "partition", "p1").out)["Relocated"]).groups() == ("ag1", "ag2", "asked for")
    assert devices(pod, "p1") == [(endpoint(pod, "m02"), i) for i in range(4)]
    assert ipuof(pod, "--partition", "p1").code == 0

    (pod.ipuof_dir / "p1_ipuof.conf").write_text(before)  # a copy from before the move, which cannot be rewritten:
    (pod.ipuof_dir / ".p1_ipuof.conf.tmp").mkdir()  # where the new file would be written first is taken
    ran = ipuof(pod, "--partition", "p1", env=reaching_the_controller(pod))
    assert (ran.code, ran.out) == (0, "run (p1): success. 4 IPUs in 1 GCD(s) ran the test program; its IPUoF files are out of "
                                      "date (it moved) and could not be rewritten (Is a directory), so it ran on vipu-server's "
                                      "configuration.\n"), ran.err
    (pod.ipuof_dir / ".p1_ipuof.conf.tmp").rmdir()
    assert pod.user("create", "partition", "p2", "--size", "4").code == 0  # ag1
    refused = pod.user("reset", "partition", "p1", "--relocate")
    assert refused.code == 1 and refused.err == (
        "reset partition (p1): failed: no free 4-IPU run in allocation alloc-1 without ag2: all 4 of its IPUs are in use; "
        "it fits when p2 is removed.\n")
    assert pod.held_anywhere("p1") == ["m02"]
