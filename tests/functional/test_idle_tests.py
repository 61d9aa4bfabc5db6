"""Idle-time tests on a real vipu-server and agent processes (issue 32 item 5): with --idle-tests the
free machines are lent to the IPU-Link and Traffic tests, and a create that needs them takes them
back at once, answering within a second of a create's own time on the pod; the run keeps the test
it finished, saved with its cables' verdicts, and says why it stopped. The rack's time scale makes
the simulated Traffic step take 5 s, as a real one takes nearly a minute: long enough to be caught."""

from __future__ import annotations

import time

import grpc
import pytest

from tests.functional.harness import Pod, failed_line, wait_until
from vipu.api.protos import admin_pb2

pytestmark = pytest.mark.functional

ROUND_SECONDS = 3.0  # --idle-test-interval: time after a run to read its results before the next round's


def progress(pod: Pod) -> admin_pb2.ClusterTestReport | None:
    """The run under way or the last, as the dashboard follows it; None before the first."""
    try:
        return pod.admin_api.GetClusterTestProgress(admin_pb2.ListRequest(), timeout=5)
    except grpc.RpcError as error:
        if error.code() != grpc.StatusCode.FAILED_PRECONDITION:  # "No cluster test has run"
            raise
        return None


def timed_create(pod: Pod, partition_id: str) -> float:
    started = time.monotonic()
    created = pod.user("create", "partition", partition_id, "--size", "4")
    assert created.code == 0, created.err
    return time.monotonic() - started


def test_an_idle_test_gives_its_machines_back_to_a_create_within_a_second(tmp_path):
    pod = Pod(tmp_path, machines=4, time_scale=0.1).start()
    try:
        pod.register()
        baseline = timed_create(pod, "p0")
        assert pod.user("remove", "partition", "p0").code == 0
        pod.stop_server()
        pod.start_server("--idle-tests", "--idle-test-interval", str(ROUND_SECONDS))

        under_way = wait_until(lambda: (r := progress(pod)) is not None and r.state == "running" and r.running_test == "Traffic" and r,
                               timeout=ROUND_SECONDS + 10, what="an idle-time test to reach its Traffic step")
        assert [(r.test, r.status) for r in under_way.results] == [("IPU-Link", "passed")]
        failed_line(pod.admin("test", "cluster", "--status"), "test cluster", "status",
                    "An idle-time test of ag1, ag2, ag3, ag4 (free machines of allocation alloc-1, which a partition takes back "
                    "at once) in cluster cl0 is in progress")

        taking_back = timed_create(pod, "p1")  # needs one of the lent machines: every machine is lent
        assert taking_back < baseline + 1.0, (taking_back, baseline)
        assert "did not stop within" not in (pod.directory / "server.log").read_text()  # its step was cancelled, not waited out
        report = wait_until(lambda: (r := progress(pod)) is not None and r.state == "stepped-aside" and r, timeout=10,
                            what="the idle-time test to step aside")

        assert [(r.test, r.status, list(r.summary)) for r in report.results] == [
            ("IPU-Link", "passed", ["All Links Passed", "Idle-time test of ag1, ag2, ag3, ag4"]),
            ("Traffic", "stopped", ["Test stopped", "Stepped aside: the create of partition p1 took ag1"]),
        ]
        status = pod.admin("test", "cluster", "--status")  # the operator's view: the tests it finished, and why it stopped
        assert status.code == 0 and "Stepped aside: the create of partition p1 took ag1" in status.out, status
        cables = pod.admin_api.GetCabling(admin_pb2.GetRequest(id="cl0"), timeout=5).cables
        assert {c.verdict for c in cables if c.kind == "IPU-Link"} == {"passed"}  # the finished test's verdicts are kept
    finally:
        pod.stop()
