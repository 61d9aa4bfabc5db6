"""A machine composed of capabilities: the fabric follows power whoever gives it, a wedge clears
with a power cycle, and a failing capability is a problem line (logged once), not an error."""

from __future__ import annotations

import logging

import pytest

from tests.unit.backends.test_sim_machine import settings
from vipu.backends.capabilities import Power
from vipu.backends.composed import ComposedMachine
from vipu.backends.sim import faults
from vipu.backends.sim.machine import RackFile, SimMachine
from vipu.backends.sim.rack import generate_rack, load_rack, save_rack
from vipu.model.errors import Conflict, HardwareFailure, Unavailable
from vipu.model.hardware import PowerAction, PowerState


class Bmc(Power):
    """A BMC standing in for a Redfish one: it powers the machine, or fails as told."""

    def __init__(self):
        self.state, self.failure = PowerState.ON, ""
        self.during = None  # called while an action is under way

    def power_state(self) -> PowerState:
        if self.failure:
            raise Unavailable(self.failure)
        return self.state

    def power(self, action: PowerAction, timeout: float) -> PowerState:
        if self.failure:
            raise Unavailable(self.failure)
        if self.during is not None:
            self.during()
        self.state = PowerState.OFF if action is PowerAction.OFF else PowerState.ON
        return self.state


@pytest.fixture
def rack_path(tmp_path):
    path = tmp_path / "rack.yaml"
    save_rack(generate_rack(2), path)
    return path


@pytest.fixture
def fabric(rack_path):
    return SimMachine(RackFile(rack_path), "m01")


def edit(path, change) -> None:
    rack = load_rack(path)
    change(rack)
    save_rack(rack, path)


def test_the_simulator_gives_every_capability_and_a_bmc_may_give_power(fabric):
    assert ComposedMachine(fabric, "m01", fabric, fabric, fabric).capabilities() == (
        "fabric", "power", "inventory", "health", "diagnostics")
    assert ComposedMachine(fabric, "m01", Bmc()).capabilities() == ("fabric", "power", "diagnostics")
    assert ComposedMachine(fabric, "m01", fabric, fabric, fabric, telemetry=fabric, logs=[fabric]).capabilities() == (
        "fabric", "power", "inventory", "health", "diagnostics", "telemetry", "logs")
    without = ComposedMachine(fabric, "m01")
    assert without.inventory().capabilities == ("fabric", "diagnostics")
    with pytest.raises(Unavailable, match="no power capability"):
        without.power(PowerAction.CYCLE, 10)


def test_the_fabric_refuses_while_a_bmc_powers_the_machine_and_forgets_its_settings_once_power_went(fabric):
    bmc = Bmc()
    machine = ComposedMachine(fabric, "m01", bmc)
    machine.apply(settings("p1"))
    refused = []

    def meanwhile():
        with pytest.raises(Unavailable, match="m01: power cycle under way"):
            machine.partitions()
        refused.append(True)

    bmc.during = meanwhile
    assert machine.power(PowerAction.CYCLE, 10) is PowerState.ON
    bmc.during = None
    assert refused and machine.partitions() == []  # its settings went with its power
    assert machine.power(PowerAction.OFF, 10) is PowerState.OFF
    with pytest.raises(Unavailable, match="m01 is powered off"):
        machine.apply(settings("p1"))
    machine.power(PowerAction.ON, 10)
    machine.apply(settings("p1"))


def test_a_machine_turned_off_behind_the_agents_back_loses_its_settings_when_seen_off(fabric):
    bmc = Bmc()
    machine = ComposedMachine(fabric, "m01", bmc)
    machine.apply(settings("p1"))
    bmc.state = PowerState.OFF  # its BMC's own interface, or a fault
    assert machine.condition(0).power_state == "Off"
    with pytest.raises(Unavailable, match="powered off"):
        machine.partitions()
    bmc.state = PowerState.ON
    assert machine.condition(0).power_state == "On"
    assert machine.partitions() == []


def test_a_wedged_machine_refuses_until_power_cycled(fabric, rack_path):
    machine = ComposedMachine(fabric, "m01", fabric, fabric, fabric)
    edit(rack_path, lambda rack: faults.wedge(rack, "m01", "IPU-Link training hangs"))
    with pytest.raises(HardwareFailure, match="IPU-Link training hangs"):
        machine.apply(settings("p1"))
    machine.power(PowerAction.CYCLE, 10)
    machine.apply(settings("p1"))
    edit(rack_path, lambda rack: faults.wedge(rack, "m01", "hangs again"))  # a new wedge needs a new power cycle
    with pytest.raises(HardwareFailure, match="hangs again"):
        machine.apply(settings("p2", (2,)))


def test_a_failing_bmc_is_one_problem_line_logged_once_and_cleared_when_it_answers(fabric, caplog):
    bmc = Bmc()
    machine = ComposedMachine(fabric, "m01", bmc, fabric, fabric)
    bmc.failure = "BMC https://bmc: credentials refused (HTTP 401)"
    with caplog.at_level(logging.INFO, logger="vipu.backends.composed"):
        for _ in range(3):
            condition = machine.condition(0)
            assert condition.problems == ("power: BMC https://bmc: credentials refused (HTTP 401)",)
            assert condition.power_state == "Unknown" and condition.health == "OK"
        machine.apply(settings("p1"))  # its IPUs still serve
        bmc.failure = ""
        assert machine.condition(0).problems == ()
    logged = [r.getMessage() for r in caplog.records]
    assert logged == ["m01: power: BMC https://bmc: credentials refused (HTTP 401)", "m01: every capability answers again"]


def test_the_simulators_bmc_can_fail_and_its_components_too(fabric, rack_path):
    machine = ComposedMachine(fabric, "m01", fabric, fabric, fabric)
    edit(rack_path, lambda rack: faults.fail_component(rack, "m01", "fan2"))
    condition = machine.condition(0)
    assert condition.health == "Critical" and [c.component for c in condition.components if c.health.value != "OK"] == ["fan2"]
    assert [(e.component, e.severity.value) for e in condition.events] == [("fan2", "Critical")]
    edit(rack_path, lambda rack: faults.silence_bmc(rack, "m01"))
    condition = machine.condition(condition.events[-1].sequence)
    assert condition.problems == ("power, health: the BMC of m01 does not answer",)
    assert machine.inventory().cables == ()  # served without the BMC's part, which is a problem from now on
    assert machine.condition(0).problems == ("power, inventory, health: the BMC of m01 does not answer",)
    machine.apply(settings("p1"))


def test_a_caller_that_knows_of_more_events_than_a_restarted_agent_had_gets_them_all(fabric, rack_path):
    machine = ComposedMachine(fabric, "m01", fabric, fabric, fabric)
    edit(rack_path, lambda rack: faults.fail_component(rack, "m01", "psu1"))
    [failed] = machine.condition(0).events
    assert machine.condition(failed.sequence).events == ()
    assert machine.condition(failed.sequence + 40).events == (failed,)  # it was told of 41 by the agent before this one


def test_a_look_at_the_power_state_during_an_action_does_not_open_the_fabric_again(fabric):
    bmc = Bmc()
    machine = ComposedMachine(fabric, "m01", bmc)
    machine.apply(settings("p1"))
    seen = []

    def meanwhile():  # the BMC still says On, as one does just after a restart is asked for
        seen.append(machine.condition(0).power_state)
        with pytest.raises(Unavailable, match="power cycle under way"):
            machine.apply(settings("p2", (2,)))
        with pytest.raises(Conflict, match="power cycle is under way"):
            machine.power(PowerAction.OFF, 10)

    bmc.during = meanwhile
    machine.power(PowerAction.CYCLE, 10)
    assert seen == ["On"] and machine.partitions() == []


def test_a_power_action_that_fails_leaves_the_fabric_as_it_was(fabric):
    bmc = Bmc()
    machine = ComposedMachine(fabric, "m01", bmc)
    machine.apply(settings("p1"))
    bmc.failure = "BMC https://bmc: power cycle needs ResetType PowerCycle"
    with pytest.raises(Unavailable, match="needs ResetType"):
        machine.power(PowerAction.CYCLE, 10)
    assert [s.partition_id for s in machine.partitions()] == ["p1"]  # nothing happened: nothing lost


def test_an_unknown_power_state_says_nothing_and_on_the_way_up_is_not_on(fabric):
    bmc = Bmc()
    machine = ComposedMachine(fabric, "m01", bmc)
    machine.apply(settings("p1"))
    bmc.state = PowerState.UNKNOWN
    assert machine.condition(0).power_state == "Unknown"
    assert [s.partition_id for s in machine.partitions()] == ["p1"]
    bmc.state = PowerState.POWERING_ON  # it went through off meanwhile
    machine.condition(0)
    with pytest.raises(Unavailable, match="not powered on"):
        machine.partitions()
    bmc.state = PowerState.ON
    machine.condition(0)
    assert machine.partitions() == []
