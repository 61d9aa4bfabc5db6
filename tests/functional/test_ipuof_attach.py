"""An IPUoF client stays attached to a partition, the agents report it, and a fence keeps an idle
partition idle: through real agent processes, the real `vipu-ipuof` and the controller's own
agent client. Its own pod of two machines (8 IPUs) is enough."""

from __future__ import annotations

import os
import signal
import subprocess

import pytest

from tests.functional.harness import BIN, Pod, Result, failed_line, wait_until
from tests.ports import free_port
from tests.processes import dying_with_parent
from vipu.api.protos import agent_pb2
from vipu.controller.infrastructure.agentclient import GrpcAgentGateway
from vipu.model.errors import InvalidArgument, Unavailable


@pytest.fixture(scope="module")
def module_pod(tmp_path_factory):
    pod = Pod(tmp_path_factory.mktemp("pod"), machines=2).start()
    yield pod
    pod.stop()


@pytest.fixture
def gateway():
    gateway = GrpcAgentGateway(timeout=5.0)
    yield gateway
    gateway.close()


@pytest.fixture
def p1(registered_pod):
    """Partition p1 over both machines, its IPUoF files in the pod's directory."""
    assert registered_pod.user("create", "partition", "p1", "--size", "8", "--num-gcds", "2").code == 0
    return registered_pod


class Attached:
    """A `vipu-ipuof attach` running; killed at the end of the test if it has not ended."""

    def __init__(self, pod: Pod, *args: str):
        self.process = subprocess.Popen(
            dying_with_parent([str(BIN / "vipu-ipuof"), "attach", *args]), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True, env={**os.environ, "VIPU_IPUOF_DIR": str(pod.ipuof_dir)})

    def end(self, sig: int | None = None) -> Result:
        if sig is not None:
            self.process.send_signal(sig)
        out, err = self.process.communicate(timeout=30)
        return Result(self.process.returncode, out, err)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.communicate(timeout=30)


@pytest.fixture
def attached():
    started: list[Attached] = []

    def start(pod: Pod, *args: str) -> Attached:
        started.append(Attached(pod, *args))
        return started[-1]

    yield start
    for one in started:
        one.kill()


def clients(pod: Pod, partition_id: str = "p1") -> list[int]:
    """The clients each machine's agent reports attached to the partition, as anyone may read them."""
    counts = []
    for machine in pod.rack.machines:
        reply = pod.agent_stub_at(machine.port).Attachments(agent_pb2.AttachmentsRequest(partition_ids=[partition_id]), timeout=5)
        (only,) = reply.partitions
        counts.append(only.attached_clients)
    return counts


def ipuof_run(pod: Pod, partition_id: str = "p1") -> Result:
    done = subprocess.run([str(BIN / "vipu-ipuof"), "run", "--partition", partition_id], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "VIPU_IPUOF_DIR": str(pod.ipuof_dir)})
    return Result(done.returncode, done.stdout, done.stderr)


def fence(gateway: GrpcAgentGateway, pod: Pod, seconds: float = 30.0) -> list[dict[str, int]]:
    return [gateway.attachments(m.host, m.port, ["p1"], fence_seconds=seconds) for m in pod.rack.machines]


def test_an_attached_client_is_reported_until_it_detaches_and_keeps_a_fence_off(p1, attached, gateway):
    pod = p1
    holding = attached(pod, "p1", "--hold", "600")
    wait_until(lambda: clients(pod) == [1, 1], what="the attach to show at both agents")
    assert holding.process.stdout.readline() == ("attach (p1): success. 8 IPUs in 2 GCD(s) attached for 600 s; "
                                                 "Ctrl-C detaches them sooner.\n")
    assert fence(gateway, pod) == [{"p1": 1}, {"p1": 1}]  # in use: no fence is set
    assert ipuof_run(pod).code == 0  # another client attaches, runs and detaches
    assert clients(pod) == [1, 1]
    done = holding.end(signal.SIGINT)
    assert (done.code, done.out, done.err) == (0, "detach (p1): success. 8 IPUs detached before the hold ended.\n", "")
    assert clients(pod) == [0, 0]
    assert [gateway.attachments(m.host, m.port, []) for m in pod.rack.machines] == [{"p1": 0}, {"p1": 0}]


def test_a_hold_ends_by_itself_and_a_killed_client_lapses(p1, attached):
    pod = p1
    short = attached(pod, "p1", "--hold", "0.5")
    assert short.end() == Result(0, "attach (p1): success. 8 IPUs in 2 GCD(s) attached for 0.5 s; Ctrl-C detaches them sooner.\n"
                                    "detach (p1): success. 8 IPUs detached.\n", "")
    assert clients(pod) == [0, 0]
    killed = attached(pod, "p1", "--hold", "5")
    wait_until(lambda: clients(pod) == [1, 1], what="the attach to show at both agents")
    assert killed.end(signal.SIGKILL).code == -signal.SIGKILL  # no detach: the attachments lapse at the end of the hold
    wait_until(lambda: clients(pod) == [0, 0], timeout=15, what="the attachments of the killed client to lapse")


def test_a_fence_on_an_idle_partition_refuses_clients_until_it_is_applied_again(p1, attached, gateway):
    pod = p1
    assert fence(gateway, pod) == [{"p1": 0}, {"p1": 0}]
    failed_line(ipuof_run(pod), "run", "p1", "partition p1 is being moved; attach again once it is ACTIVE")
    refused = attached(pod, "p1", "--hold", "60").end()
    failed_line(refused, "attach", "p1", "partition p1 is being moved; attach again once it is ACTIVE")
    assert clients(pod) == [0, 0]
    for machine in pod.rack.machines:  # the move given up: the controller applies its settings again
        settings = pod.settings(machine.name, "p1")
        pod.agent_stub_at(machine.port).ApplyPartition(agent_pb2.ApplyPartitionRequest(settings=settings), timeout=5)
    assert ipuof_run(pod).code == 0


def test_a_fence_lapses(p1, gateway):
    pod = p1
    fence(gateway, pod, seconds=0.5)
    wait_until(lambda: ipuof_run(pod).code == 0, timeout=10, what="the fence to lapse")


def test_bad_attach_and_fence_requests_are_refused_in_one_line(p1, attached, gateway):
    pod = p1
    for hold, reason in (("0", "0<x<=86400"), ("soon", "'soon' is not a valid float"), ("1e9", "0<x<=86400")):
        usage = attached(pod, "p1", "--hold", hold).end()
        assert usage.code == 2 and reason in usage.err and len(usage.err.splitlines()) == 1, usage.err
    failed_line(attached(pod, "p9", "--hold", "5").end(), "attach", "p9", "no IPUoF configuration of partition p9")
    machine = pod.rack.machines[0]
    with pytest.raises(InvalidArgument, match="fence_seconds must be between 0 and 3600, not -1"):
        gateway.attachments(machine.host, machine.port, ["p1"], fence_seconds=-1)
    with pytest.raises(InvalidArgument, match="a fence names the partitions it is for"):
        gateway.attachments(machine.host, machine.port, [], fence_seconds=5)
    with pytest.raises(Unavailable, match="unreachable"):
        gateway.attachments("127.0.0.1", free_port(), ["p1"])
    assert clients(pod) == [0, 0]
