"""Waiting for room with the real CLIs against a real controller and agents: `--wait`, the queue's
listing and reasons, cancel, timeout, a restart of the controller under a waiting client, and
vendor clients' immediate refusal."""

from __future__ import annotations

import os
import subprocess

import grpc
import pytest

from tests.functional.harness import BIN, Pod, Result, failed_line, rows, wait_until
from vipu.api.protos import vipuuser_pb2, vipuuser_pb2_grpc

pytestmark = pytest.mark.functional


class Waiter:
    """`vipu create partition ... --wait` running in the background, as a user's terminal would."""

    def __init__(self, pod: Pod, partition_id: str, *args: str):
        env = {**os.environ, "VIPU_IPUOF_DIR": str(pod.ipuof_dir)}
        env.pop("VIPU_CLI_API_HOST", None)
        self.partition_id = partition_id
        self.process = subprocess.Popen(
            [str(BIN / "vipu"), "-H", "127.0.0.1", "--api-port", str(pod.user_port), "--api-timeout", "10",
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
    failed_line(pod.user("create", "partition", "first", "--size", "1"), "create partition", "first",
                "partition first already waits for room in allocation alloc-1")

    assert pod.user("remove", "partition", "full").code == 0
    started = first.result()
    assert (started.code, started.out, started.err) == (0, "create partition (first): success.\n", "")
    assert (pod.ipuof_dir / "first_ipuof.conf").exists() and pod.held_anywhere("first") == ["m01"]
    assert second.still_waiting()
    wait_until(lambda: queued(pod)[0][:2] == ["1", "second"] and "it fits when first is removed" in queued(pod)[0][5],
               what="second's new reason")

    cancelled = pod.user("remove", "request", "second")
    assert cancelled.out == "remove request (second): success.\n"
    failed_line(second.result(), "create partition", "second", "the request of partition second was cancelled")
    assert queued(pod) == [] and not (pod.ipuof_dir / "second_ipuof.conf").exists()


def test_a_request_gives_up_at_its_timeout_saying_why_and_leaves_nothing(pod):
    pod.register(machines=2)
    assert pod.user("create", "partition", "full", "--size", "8").code == 0
    before = pod.snapshot()
    failed_line(Waiter(pod, "late", "--size", "8", "--timeout", "1").result(), "create partition", "late",
                "no room for partition late after waiting 1 s: first in the queue, ag1-ag2 held for it; "
                "no free 8-IPU run in allocation alloc-1: all 8 of its IPUs are in use; it fits when full is removed")
    assert queued(pod) == [] and pod.snapshot() == before


def test_bad_waits_are_refused_in_one_line(pod):
    pod.register(machines=2)
    for args, reason in [(["--size", "4", "--timeout", "5"], "--timeout needs --wait"),
                         (["--size", "4", "--wait", "--timeout", "0"], "Invalid value for '--timeout'")]:
        usage = pod.user("create", "partition", "p", *args)
        assert usage.code == 2 and reason in usage.err and len(usage.err.splitlines()) == 1, usage.err
    failed_line(pod.user("remove", "request", "nope"), "remove request", "nope", "no request of partition nope waits")
    failed_line(pod.user("create", "partition", "p", "--size", "16", "--wait"), "create partition", "p",
                "partition size 16 is larger than the cluster's 8 IPUs")
    assert queued(pod) == []


def test_vendor_clients_are_refused_at_once_while_others_wait(pod):
    pod.register(machines=2)
    assert pod.user("create", "partition", "full", "--size", "8").code == 0
    waiter = Waiter(pod, "waits", "--size", "4", "--timeout", "60")
    wait_until(lambda: len(queued(pod)) == 1, what="the request to wait")
    vendor = vipuuser_pb2_grpc.UserServiceStub(pod._channel(pod.user_port))
    request = vipuuser_pb2.CreatePartitionRequest(requirements=vipuuser_pb2.PartitionRequirements(id="vendor", size=1))
    with pytest.raises(grpc.RpcError) as refused:
        vendor.CreatePartition(request)
    assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
    assert refused.value.details().startswith("no free IPU in allocation alloc-1")
    assert pod.user("remove", "partition", "full").code == 0
    assert waiter.result().code == 0


def test_a_waiting_client_survives_a_restart_of_the_controller_and_its_request_the_restart(pod):
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
