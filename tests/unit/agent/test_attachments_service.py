"""The agent's Attachments call: a report anyone may read, a fence only from the controller holding the machine."""

from __future__ import annotations

import dataclasses
from unittest import mock

import pytest

from tests.unit.agent.test_machine_hold import SITE_CERT, configure
from tests.unit.backends.test_sim_machine import settings
from vipu.agent.holds import MachineHold
from vipu.agent.ipuof import IpuofServicer
from vipu.agent.service import AgentServicer
from vipu.api.protos import agent_pb2, ipuof_pb2
from vipu.backends.sim.machine import RackFile, SimMachine
from vipu.backends.sim.rack import generate_rack, save_rack
from vipu.model.errors import PermissionDenied, Unavailable


def caller(name: str):
    """A call's context as the agent sees it on the mutual-TLS link of controller `name`."""
    context = mock.Mock()
    context.auth_context.return_value = {"x509_common_name": [name.encode()]}
    context.invocation_metadata.return_value = ()  # a controller without replicas: no leader's epoch
    return context


@pytest.fixture
def machine(tmp_path):
    path = tmp_path / "rack.yaml"
    save_rack(generate_rack(1, time_scale=0.001), path)
    machine = SimMachine(RackFile(path), "m01")
    machine.apply(dataclasses.replace(settings("p1", (0, 1)), attach_key="k"))
    return machine


@pytest.fixture
def agent(machine, tmp_path):
    hold = MachineHold("m01", tmp_path / "m01.holder", SITE_CERT)
    configure(hold, "ctl-a")
    return AgentServicer(machine, hold)


def test_anyone_reads_who_is_attached(machine, agent):
    IpuofServicer(machine).Attach(ipuof_pb2.AttachRequest(partition_id="p1", device_id=1, attach_key="k", session="s1"), None)
    reply = agent.Attachments(agent_pb2.AttachmentsRequest(partition_ids=["p1", "p9"]), caller("ctl-b"))
    (p1, p9) = reply.partitions
    assert (p1.partition_id, p1.attached_clients, p1.fenced_until) == ("p1", 1, 0)
    assert reply.read_at >= p1.oldest_attached_at > 0
    assert (p9.partition_id, p9.attached_clients, p9.oldest_attached_at) == ("p9", 0, 0)
    IpuofServicer(machine).Detach(ipuof_pb2.DetachRequest(partition_id="p1", device_id=1, session="s1"), None)
    assert agent.Attachments(agent_pb2.AttachmentsRequest(), caller("ctl-b")).partitions[0].attached_clients == 0


def test_only_the_holder_fences(machine, agent):
    with pytest.raises(PermissionDenied, match="machine m01 is held by controller ctl-a, not ctl-b"):
        agent.Attachments(agent_pb2.AttachmentsRequest(partition_ids=["p1"], fence_seconds=30), caller("ctl-b"))
    IpuofServicer(machine).Attach(ipuof_pb2.AttachRequest(partition_id="p1", device_id=0, attach_key="k", session="s1"), None)
    IpuofServicer(machine).Detach(ipuof_pb2.DetachRequest(partition_id="p1", device_id=0, session="s1"), None)
    (fenced,) = agent.Attachments(agent_pb2.AttachmentsRequest(partition_ids=["p1"], fence_seconds=30), caller("ctl-a")).partitions
    assert fenced.fenced_until > 0
    with pytest.raises(Unavailable, match="partition p1 is being moved"):
        IpuofServicer(machine).Run(ipuof_pb2.RunRequest(partition_id="p1", device_id=0, attach_key="k", session="s1"), None)
