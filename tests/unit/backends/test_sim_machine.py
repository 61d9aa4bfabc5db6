"""The simulated IPU-M2000 refuses what real hardware would, and heals when its rack is fixed."""

from __future__ import annotations

import pytest

from vipu.backends.sim.machine import RackFile, SimMachine
from vipu.backends.sim.rack import generate_rack, save_rack
from vipu.model.configuration import AgentSettings, IpuSetting, PortLink
from vipu.model.errors import Conflict, HardwareFailure, InvalidArgument


def settings(pid: str, indices=(0, 1, 2, 3), ipulinks=()) -> AgentSettings:
    return AgentSettings(
        partition_id=pid, ipus=tuple(IpuSetting(i, r, 0, 0, ()) for r, i in enumerate(indices)), ipulinks=tuple(ipulinks),
        synclinks=(), gwlinks=(), ipulink_routing="SWNC", gw_routing="DEFAULT", sync_type="POD_NATIVE_DEFAULT",
        reconfigurable=False,
    )


@pytest.fixture
def rack_path(tmp_path):
    path = tmp_path / "rack.yaml"
    save_rack(generate_rack(3), path)
    return path


@pytest.fixture
def machine(rack_path):
    return SimMachine(RackFile(rack_path), "m01")


def test_inventory_comes_from_the_rack(machine):
    inventory = machine.inventory()
    assert (inventory.serial, inventory.platform, inventory.backend, len(inventory.ipus)) == ("0024.0001.8200000", "IPU-M2000", "sim", 4)
    assert inventory.versions["ipuof-server"]


def test_apply_is_idempotent_and_clear_frees_the_ipus(machine):
    machine.apply(settings("p1", (0, 1)))
    machine.apply(settings("p1", (0, 1)))
    with pytest.raises(Conflict, match="IPU 1 is already configured for partition p1"):
        machine.apply(settings("p2", (1, 2)))
    machine.apply(settings("p2", (2, 3)))
    assert sorted(p.partition_id for p in machine.partitions()) == ["p1", "p2"]
    machine.clear("p1")
    machine.clear("p1")
    machine.apply(settings("p3", (0, 1)))
    assert sorted(p.partition_id for p in machine.partitions()) == ["p2", "p3"]


def test_a_link_must_reach_the_machine_and_port_the_cluster_expects(machine):
    machine.apply(settings("ok", ipulinks=[PortLink(5, "0024.0001.8200001", 1)]))
    machine.clear("ok")
    with pytest.raises(HardwareFailure, match="IPU-Link port 5 reaches m02:1, but the cluster expects m03:1"):
        machine.apply(settings("crossed", ipulinks=[PortLink(5, "0024.0001.8200002", 1)]))
    with pytest.raises(HardwareFailure, match="IPU-Link port 1 has no cable"):
        machine.apply(settings("loose", ipulinks=[PortLink(1, "0024.0001.8200001", 5)]))
    assert machine.partitions() == []


def test_a_fault_written_into_the_rack_takes_effect_and_heals(machine, rack_path):
    original = rack_path.read_text()
    rack_path.write_text(original.replace("name: m01\n", "name: m01\n  faults: {configure: IPU 2 does not train}\n", 1))
    with pytest.raises(HardwareFailure, match="m01: IPU 2 does not train"):
        machine.apply(settings("p1"))
    rack_path.write_text(original)
    machine.apply(settings("p1"))


def test_ipus_that_do_not_exist_are_refused(machine):
    with pytest.raises(InvalidArgument, match="has no IPU 4"):
        machine.apply(settings("p1", (3, 4)))
