"""State survives a controller restart, and agents are reconciled with the store."""

from __future__ import annotations

import signal
import subprocess
import time

import pytest

from tests.functional.harness import BIN, pairs, rows, wait_until
from tests.ports import free_port
from vipu.api.protos import agent_pb2, vipuuser_pb2, vipuuser_pb2_grpc


def plant_stray_configuration(pod, machine_name: str) -> None:
    """Configuration the store knows nothing of, as a crashed or foreign controller could leave."""
    stub = pod.agent_stub_at(pod.rack.machine(machine_name).port)
    settings = agent_pb2.PartitionSettings(partition_id="ghost", ipus=[agent_pb2.IpuSetting(index=3)])
    stub.ApplyPartition(agent_pb2.ApplyPartitionRequest(settings=settings))


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGKILL], ids=["stopped", "killed"])
def test_every_entity_survives_a_restart_and_agents_are_reconciled(pod, stop_signal):
    pod.register()
    assert pod.user("create", "partition", "p1", "--size", "8", "--num-gcds", "2").code == 0
    assert pod.user("create", "partition", "p2", "--size", "1").code == 0
    before = pod.snapshot()
    assert before["held"]["m01"] == {"p1": [0, 1, 2, 3]}

    pod.stop_server(stop_signal)
    pod.stop_agent("m01")  # its machine restarts and forgets its configuration
    pod.start_agent("m01")
    pod.wait_for_agent("m01")
    assert pod.held("m01") == {}
    plant_stray_configuration(pod, "m06")

    pod.start_server()
    after = pod.snapshot()
    assert after == before
    assert pod.held("m01") == {"p1": [0, 1, 2, 3]} and pod.held("m06") == {}
    assert rows(pod.user("list", "partitions").out) == [
        ["p1", "cl0", "1", "DEFAULT", "SWNC", "8", "2", "ACTIVE"],
        ["p2", "cl0", "1", "DEFAULT", "DNC", "1", "1", "ACTIVE"],
    ]


def test_stray_configuration_on_a_running_pod_is_cleared_by_the_health_pass(pod):
    pod.register()
    plant_stray_configuration(pod, "m03")
    wait_until(lambda: pod.held("m03") == {}, what="the stray configuration to be cleared")


def test_metrics_count_entities_and_requests(pod):
    pod.register()
    created = 'vipu_requests_total{code="%s",method="CreatePartition",service="virmgrpc.UserService"}'
    count = 'vipu_request_duration_seconds_count{method="CreatePartition",service="virmgrpc.UserService"}'
    within_30_s = 'vipu_request_duration_seconds_bucket{le="30.0",method="CreatePartition",service="virmgrpc.UserService"}'
    counters = (created % "OK", created % "INVALID_ARGUMENT", count, within_30_s)
    before = pod.metrics()  # the module's controller counts the requests of the tests before this one too
    assert pod.user("create", "partition", "p1", "--size", "4").code == 0
    assert pod.user("create", "partition", "p2", "--size", "3").code == 1
    samples = pod.metrics()
    assert samples['vipu_agents{status="Up"}'] == 8
    assert samples['vipu_partitions{state="ACTIVE"}'] == 1
    assert samples['vipu_ipus{use="partition"}'] == 4 and samples['vipu_ipus{use="free"}'] == 28
    assert samples["vipu_clusters"] == 1 and samples["vipu_allocations"] == 1
    assert [samples[c] - before.get(c, 0) for c in counters] == [1, 1, 2, 2]


def test_get_agent_status_follows_the_machine(pod):
    pod.register(machines=2)
    pod.stop_agent("m02")
    pod.wait_for_status("ag2", "Down")
    pod.start_agent("m02")
    pod.wait_for_status("ag2", "Up")
    assert pairs(pod.admin("get", "agent", "ag2").out)["Status"] == "Up"


def test_a_second_server_on_a_taken_port_refuses_to_start_and_the_first_serves_on(registered_pod, tmp_path):
    pod = registered_pod
    done = subprocess.run([str(BIN / "vipu-server"), "--db", f"sqlite:///{tmp_path / 'other.db'}", "--listen-address", "127.0.0.1",
                           "--port", str(pod.user_port), "--admin-port", str(free_port()), "--metrics-port", "0"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 1, done.stderr
    assert done.stderr.strip().splitlines()[-1] == f"vipu-server: cannot listen on 127.0.0.1:{pod.user_port} (is the port taken?)"
    assert pod.user("create", "partition", "p1", "--size", "1").code == 0  # every connection still reaches the first


def partition_status(pod, partition_id: str):
    api = vipuuser_pb2_grpc.UserServiceStub(pod._channel(pod.user_port))
    return api.GetPartitionStatus(vipuuser_pb2.GetPartitionStatusRequest(partition_id=partition_id)).status


def test_a_lost_agent_puts_its_partitions_in_error_and_on_its_return_they_are_reset_automatically(registered_pod):
    pod = registered_pod
    error, active = vipuuser_pb2.PS_ERROR, vipuuser_pb2.PS_ACTIVE
    assert pod.user("create", "partition", "p1", "--size", "8").code == 0
    assert pod.user("create", "partition", "kept", "--size", "4", "--disable-auto-reset").code == 0
    agent_of = {m.name: f"ag{n}" for n, m in enumerate(pod.rack.machines, start=1)}
    lost = [m.name for m in pod.rack.machines if "p1" in pod.held(m.name)][-1]
    kept_machine = next(m.name for m in pod.rack.machines if "kept" in pod.held(m.name))
    for machine in (lost, kept_machine):
        pod.stop_agent(machine)
    wait_until(lambda: partition_status(pod, "p1").ready_state == error, what="p1 in ERROR")
    status = partition_status(pod, "p1")
    assert [e for e in status.errors if e.startswith(f"agent {agent_of[lost]} is down: ")], status.errors
    assert (status.auto_reset_retry_count, status.max_auto_reset_retries) == (0, 3)
    assert pairs(pod.admin("get", "agent", agent_of[lost]).out)["Status"] == "Down"
    wait_until(lambda: partition_status(pod, "kept").ready_state == error, what="kept in ERROR")

    for machine in (lost, kept_machine):  # the machines come back, having forgotten their configuration
        pod.start_agent(machine)
    wait_until(lambda: partition_status(pod, "p1").ready_state == active, what="p1 to be reset automatically")
    pod.wait_for_status(agent_of[kept_machine], "Up")  # the controller reaches it again (p1 may not need it)
    status = partition_status(pod, "p1")
    assert (status.auto_reset_retry_count, list(status.errors)) == (1, [])
    assert status.HasField("last_auto_reset_time")  # when the controller reset it, in the published field
    assert abs(time.time() - status.last_auto_reset_time.ToSeconds()) < 120
    assert pairs(pod.user("get", "partition", "p1").out)["Last Auto-reset"].endswith(" UTC")
    assert [m.name for m in pod.rack.machines if "p1" in pod.held(m.name)][-1] == lost  # configured there again
    kept = partition_status(pod, "kept")  # its policy: no automatic reset; its user resets it
    assert (kept.ready_state, kept.max_auto_reset_retries, kept.auto_reset_retry_count) == (error, 0, 0)
    assert "kept" not in pod.held(kept_machine)
    assert pod.user("reset", "partition", "kept").code == 0
    assert partition_status(pod, "kept").ready_state == active
