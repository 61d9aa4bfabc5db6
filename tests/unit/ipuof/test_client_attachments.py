"""The IPUoF client's session: what it attaches it detaches again, also when a step fails.

A real IPUoF end-point (the agent's servicer over a simulated machine) in this process, reached
over gRPC on loopback.
"""

from __future__ import annotations

import dataclasses

import pytest

from tests.ports import free_port
from tests.unit.backends.test_sim_machine import settings
from vipu.agent.ipuof import IpuofServicer
from vipu.api.protos import ipuof_pb2_grpc
from vipu.api.serving import serve
from vipu.api.status import GuardInterceptor
from vipu.backends.sim.machine import RackFile, SimMachine
from vipu.backends.sim.rack import generate_rack, save_rack
from vipu.ipuof.client import Client, Device, GcdFile
from vipu.model.errors import HardwareFailure, InvalidArgument, Unavailable


@pytest.fixture
def machine(tmp_path):
    path = tmp_path / "rack.yaml"
    save_rack(generate_rack(1, time_scale=0.001), path)
    machine = SimMachine(RackFile(path), "m01")
    machine.apply(dataclasses.replace(settings("p1"), attach_key="k"))
    return machine


@pytest.fixture
def endpoint(machine):
    port = free_port()
    server = serve(lambda s: ipuof_pb2_grpc.add_IpuofServiceServicer_to_server(IpuofServicer(machine), s), "127.0.0.1", port,
                   GuardInterceptor())
    yield port
    server.stop(grace=0).wait()


@pytest.fixture
def client():
    client = Client(timeout=5.0)
    yield client
    client.close()


def gcd(machine: SimMachine, port: int, chips: dict[int, str] | None = None) -> GcdFile:
    """Partition p1's one GCD, as its IPUoF file names it; `chips` overrides the chip ids it names."""
    real = {ipu.index: ipu.chip_id for ipu in machine.machine().ipus}
    named = {**real, **(chips or {})}
    devices = tuple(Device("127.0.0.1", port, index, index, named[index]) for index in range(4))
    return GcdFile(machine.rack.path, "p1", 0, devices, "k")


def clients(machine: SimMachine) -> int:
    return machine.attachments(["p1"])[0].attached_clients


def test_attach_holds_until_detach(machine, endpoint, client):
    assert client.attach([gcd(machine, endpoint)], 30) == 4
    assert clients(machine) == 1
    assert client.detach([gcd(machine, endpoint)]) == 4
    assert clients(machine) == 0


def test_a_run_detaches_what_it_attached(machine, endpoint, client):
    assert client.run([gcd(machine, endpoint)], seed=3) == 4
    assert clients(machine) == 0


def test_a_run_that_fails_detaches_too(machine, endpoint, client):
    with pytest.raises(HardwareFailure, match=r"IPU 2 at 127\.0\.0\.1:[0-9]+ returned a wrong result"):
        client.run([gcd(machine, endpoint, chips={2: ""})], seed=3)  # no chip named: its result is not the expected one
    assert clients(machine) == 0
    with pytest.raises(InvalidArgument, match=r"IPU 3 of m01 is chip .+, not wrong"):
        client.attach([gcd(machine, endpoint, chips={3: "wrong"})], 30)  # IPUs 0 to 2 attached first
    assert clients(machine) == 0


def test_a_fenced_partition_refuses_the_client(machine, endpoint, client):
    machine.attachments(["p1"], fence_seconds=30)
    with pytest.raises(Unavailable, match=r"IPU 0 at 127\.0\.0\.1:[0-9]+: partition p1 is being moved; attach again once it is ACTIVE"):
        client.run([gcd(machine, endpoint)], seed=3)
