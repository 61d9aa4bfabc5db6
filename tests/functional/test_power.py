"""Machines that take power, inventory and health from BMCs and their fabric from the simulator
(issue 34), on real agent processes, vipu-server and sushy-emulator (`tests.bmc`):

- m02's power, inventory and health are its emulated BMC's, and the BMC's cable serials show in
  `vipu-admin get agent ag2`;
- a power cycle of ag2 with a partition ACTIVE there is refused; forced, the partition fails and
  is reset once the machine answers again;
- a partition whose automatic reset fails (a machine wedged until power cycled) is brought back
  by one power cycle of its machines, and only once in its life;
- m03, m04 and m05 have BMCs with wrong credentials, none listening, and a certificate their
  configured authority did not sign: each agent logs one line, and the controller shows it Down
  with that reason (its fabric still serves).
"""

from __future__ import annotations

import urllib.request

import pytest

from tests.bmc import Bmc, cable
from tests.functional.harness import Pod, pairs, wait_until
from tests.ports import free_port
from vipu.api.protos import admin_pb2
from vipu.backends.sim import faults
from vipu.backends.sim.rack import save_rack
from vipu.model.entities import IldTopology

pytestmark = pytest.mark.functional

BMC_CABLES = [("1", "BMC-OSFP-0001"), ("2", "BMC-OSFP-0002"), ("5", "BMC-OSFP-0005")]


@pytest.fixture(scope="module")
def bmcs(tmp_path_factory):
    directory = tmp_path_factory.mktemp("bmcs")
    good, other = Bmc(directory / "m02", "m02", power_delay=(1, 1)), Bmc(directory / "other", "other")
    try:
        for bmc in (good, other):
            bmc.start()
        good.set_cables([cable(port, serial, "Amphenol", "OSFP-800G-1m", under=good.chassis_path) for port, serial in BMC_CABLES])
        yield good, other
    finally:
        good.close()
        other.close()


def bmc_of(bmc: Bmc, **changes) -> dict:
    return {"url": bmc.url, "credentials": str(bmc.credentials), "ca": str(bmc.ca), "poll_seconds": 0.5, "timeout_seconds": 2,
            **changes}


@pytest.fixture(scope="module")
def pod(tmp_path_factory, bmcs):
    good, other = bmcs
    directory = tmp_path_factory.mktemp("power")
    wrong = directory / "wrong-credentials"
    wrong.write_text("vipu:not-the-password\n")
    wrong.chmod(0o600)
    started = Pod(directory, machines=5, topology=IldTopology.MESH)
    described = {"m02": bmc_of(good),
                 "m03": bmc_of(good, credentials=str(wrong)),
                 "m04": bmc_of(good, url=f"https://127.0.0.1:{free_port()}"),  # nothing listens there
                 "m05": bmc_of(good, ca=str(other.ca))}  # an authority that did not sign the BMC's certificate
    for name, bmc in described.items():
        machine = started.rack.machine(name)
        machine.drivers, machine.bmc = {"power": "redfish", "inventory": "redfish", "health": "redfish"}, bmc
    m02 = started.rack.machine("m02")
    m02.drivers.update({"telemetry": "redfish", "logs": "redfish"})
    m02.exporter_port = free_port()
    save_rack(started.rack, started.rack_path)
    started.start()
    api = started.admin_api
    for n, machine in enumerate(started.rack.machines, start=1):
        api.CreateAgent(admin_pb2.CreateAgentRequest(id=f"ag{n}", host=machine.host, port=machine.port))
    api.CreateCluster(admin_pb2.CreateClusterRequest(id="cl0", agent_ids=["ag1", "ag2"], topology=admin_pb2.ILD_TOPOLOGY_MESH,
                                                     num_ipulinkdomains=1))
    api.CreateAllocation(admin_pb2.CreateAllocationRequest(id="a2", cluster_id="cl0", agent_ids=["ag2"]))
    yield started
    started.stop()


def partition(pod: Pod, partition_id: str) -> dict[str, str]:
    return pairs(pod.user("get", "partition", partition_id).out)


def test_the_bmcs_inventory_power_and_health_show_in_get_agent(pod):
    shown = pod.admin("get", "agent", "ag2")
    assert shown.code == 0, shown.err
    details = pairs(shown.out)
    assert details["Capabilities"] == "fabric, power, inventory, health, diagnostics, telemetry, logs"
    wait_until(lambda: pairs(pod.admin("get", "agent", "ag2").out).get("Power") == "On", what="ag2's power state from its BMC")
    assert pairs(pod.admin("get", "agent", "ag2").out)["Health"] == "OK"
    cells = [[cell.strip() for cell in line.split("|")] for line in shown.out.splitlines()]
    for port, serial in BMC_CABLES:
        assert [port, serial, "Amphenol", "OSFP-800G-1m"] in cells, f"cable {serial} at port {port}:\n{shown.out}"
    simulated = pairs(pod.admin("get", "agent", "ag1").out)
    assert simulated["Power"] == "On" and simulated["Health"] == "OK"  # the simulator gives every capability too


def test_the_bmcs_sensors_reach_the_agents_metrics_and_its_sel_reaches_the_controller(pod, bmcs):
    good, _ = bmcs
    exporter = f"http://127.0.0.1:{pod.rack.machine('m02').exporter_port}/metrics"

    def with_sensors() -> str | None:
        text = urllib.request.urlopen(exporter, timeout=5).read().decode()
        return text if "vipu_agent_sensor_celsius" in text else None

    scraped = wait_until(with_sensors, what="the BMC's sensors at ag2's exporter")
    assert 'vipu_agent_sensor_celsius{machine="m02",sensor="Chassis Intake Temp"} 25.0' in scraped  # sushy-emulator's Thermal
    assert 'vipu_agent_ipu_utilisation_percent{ipu="0"' in scraped  # the fabric's own count
    assert "vipu_agent_ipu_temperature_celsius" not in scraped  # the BMC has no IPU's sensor: absent, not the simulator's, not 0
    good.record_event("Warning", "Fan 3 speed below threshold")
    wait_until(lambda: "bmc: SEL: Warning: Fan 3 speed below threshold" in pod.admin("logs", "agent", "ag2").out, timeout=15,
               what="the BMC's SEL entry in vipu-admin logs agent ag2")


def test_a_power_cycle_with_a_partition_active_is_refused_and_forced_fails_and_resets_it(pod):
    assert pod.user("create", "partition", "p1", "--size", "4").code == 0
    refused = pod.admin("power", "cycle", "agent", "ag2")
    assert refused.code != 0 and len(refused.err.strip().splitlines()) == 1, refused.err
    assert "ACTIVE partition(s) p1" in refused.err and "--force" in refused.err
    assert partition(pod, "p1")["State"] == "ACTIVE"

    forced = pod.admin("power", "cycle", "agent", "ag2", "--force")
    assert forced.code == 0, forced.err
    assert "partition p1 failed" in forced.out and "agent ag2: power On" in forced.out
    wait_until(lambda: partition(pod, "p1")["State"] == "ACTIVE", timeout=30, what="p1 to be reset after the power cycle")
    status = partition(pod, "p1")
    assert status["Auto-reset Retries"].startswith("1/") and status["Power Cycled"] == "-", status  # a reset, not an escalation
    pod.logged("power cycle of its machine by the administrator")


def test_a_reset_that_does_not_bring_a_partition_back_escalates_once_to_a_power_cycle(pod):
    if partition(pod, "p1").get("State") is None:  # run on its own
        assert pod.user("create", "partition", "p1", "--size", "4").code == 0

    def answering(rack):
        rack.machine("m02").faults.silent = False

    try:
        pod.edit_rack(lambda rack: faults.wedge(rack, "m02", "IPU-Link training hangs"))
        pod.edit_rack(lambda rack: faults.silence(rack, "m02"))  # the agent gone: p1 fails, to be reset when it answers
        wait_until(lambda: partition(pod, "p1")["State"] == "ERROR", timeout=30, what="p1 to fail with its agent gone")
        pod.edit_rack(answering)  # its automatic reset fails (wedged), so its machine is power cycled, and it comes back
        wait_until(lambda: partition(pod, "p1")["State"] == "ACTIVE", timeout=60, what="p1 back after one power cycle")
        cycled = partition(pod, "p1")["Power Cycled"]
        assert cycled != "-"
        pod.logged("the reset did not bring it back (partition p1 is in ERROR: agent ag2: m02: IPU-Link training hangs); "
                   "power cycling ag2")

        pod.edit_rack(lambda rack: faults.wedge(rack, "m02", "IPU-Link training hangs again"))  # a new wedge, the same partition
        pod.edit_rack(lambda rack: faults.silence(rack, "m02"))
        wait_until(lambda: partition(pod, "p1")["State"] == "ERROR", timeout=30, what="p1 to fail again")
        pod.edit_rack(answering)
        log = pod.logged("partition p1: the reset did not bring it back, and its machines were power cycled once already", timeout=30)
        assert log.count("power cycling ag2") == 1  # no second power cycle: it is left to its user
        status = partition(pod, "p1")
        assert (status["State"], status["Power Cycled"]) == ("ERROR", cycled) and "IPU-Link training hangs again" in status["Errors"]
    finally:
        pod.edit_rack(lambda rack: (answering(rack), setattr(rack.machine("m02").faults, "wedged", "")))
        pod.user("remove", "partition", "p1", "--force")


@pytest.mark.parametrize(("agent_id", "machine", "reason"), [
    ("ag3", "m03", "credentials refused (HTTP 401)"),
    ("ag4", "m04", "connection refused"),
    ("ag5", "m05", "certificate not verified against CA file"),
])
def test_a_bmc_that_cannot_be_used_gives_one_line_at_the_agent_and_a_down_reason(pod, agent_id, machine, reason):
    wait_until(lambda: reason in pairs(pod.admin("get", "agent", agent_id).out).get("Last Error", ""), timeout=20,
               what=f"{agent_id} Down for its BMC")
    details = pairs(pod.admin("get", "agent", agent_id).out)
    assert details["Status"] == "Down" and details["Last Error"].startswith("power, inventory, health: BMC https://127.0.0.1:"), details
    log = (pod.directory / f"agent-{machine}.log").read_text()
    assert "Traceback" not in log
    said = [line for line in log.splitlines() if reason in line]
    assert len(said) == 1 and f"{machine}: power" in said[0] and "Traceback" not in log, log
    refused = pod.admin("power", "status", "agent", agent_id)
    assert refused.code != 0 and reason in refused.err and len(refused.err.strip().splitlines()) == 1, refused.err
