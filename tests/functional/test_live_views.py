"""What a live view (vipu-web) asks of the API: every partition with its status, owner and age in
one list, a cluster's cables with each one's verdict, and a watch of the controller's changes."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from tests.functional.harness import hears, watching
from vipu.api.protos import vipuuser_pb2
from vipu.backends.sim import faults
from vipu.client import AdminClient, UserClient
from vipu.model.topology import LinkKind


def test_partitions_come_with_their_status_owner_and_creation_time(registered_pod):
    pod = registered_pod
    pod.fault("m02", "IPU 2 failed")
    assert pod.user("create", "partition", "ok", "--size", "4").code == 0
    assert pod.user("create", "partition", "bad", "--size", "8", "--keep-on-error").code == 1
    with UserClient.connect("127.0.0.1", pod.user_port) as user:
        listed = {p.id: p for p in user.list_partitions()}
    assert listed["ok"].status.operation_state == vipuuser_pb2.POS_IDLE
    assert listed["ok"].status.errors == [] and listed["ok"].owner == ""  # open mode: nobody
    assert "IPU 2 failed" in " ".join(listed["bad"].status.errors)
    created = listed["ok"].created.ToDatetime(tzinfo=UTC)
    assert datetime.now(UTC) - timedelta(minutes=1) < created <= datetime.now(UTC)
    # The same figures the CLI shows from GetPartitionStatus.
    assert "IPU 2 failed" in pod.user("get", "partition", "bad").out


def test_each_cable_shows_the_verdict_of_the_last_cluster_test_with_its_failing_lines(registered_pod):
    pod = registered_pod
    with AdminClient.connect("127.0.0.1", pod.admin_port) as admin:
        untested = admin.cabling("cl0")
        assert untested.test_state == "" and {c.verdict for c in untested.cables} == {"untested"}
        assert len(untested.cables) == 7 * 4 + 7 * 2  # an 8-machine mesh: IPU-Link and Sync-Link cables
        pod.edit_rack(lambda rack: faults.unplug(rack, "m03", LinkKind.IPULINK, 5))
        assert pod.admin("test", "cluster", "cl0").code == 1
        tested = admin.cabling("cl0")
    assert tested.test_state == "finished"
    verdicts = {(c.kind, c.lower_agent_id, c.lower_port, c.upper_agent_id, c.upper_port): (c.verdict, list(c.failures))
                for c in tested.cables}
    assert verdicts.pop(("IPU-Link", "ag3", 5, "ag4", 1)) == (
        "failed", ["Cabling: ag3:5 [IPU-Link] <--> ag4:1 [IPU-Link] (failed)"])
    assert {verdict for verdict, _ in verdicts.values()} == {"passed"}  # IPU-Link training was skipped, Cabling judged them


def test_a_watch_hears_of_a_partition_the_cli_creates_and_of_a_cluster_test(registered_pod):
    pod = registered_pod
    with UserClient.connect("127.0.0.1", pod.user_port) as user:
        heard, stream = watching(user)
        try:
            assert pod.user("create", "partition", "p1", "--size", "4").code == 0
            assert hears(heard, "partitions")
            assert pod.admin("test", "cluster", "cl0", "--versions").code == 0
            assert hears(heard, "tests")
        finally:
            stream.cancel()
