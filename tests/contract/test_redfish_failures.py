"""What only the Redfish driver has: its configuration, credentials and TLS, and what it makes of a BMC that refuses,
cannot be verified or is not there, each as one line; how it names cables and skips what a BMC lacks."""

from __future__ import annotations

import logging
import math
import time

import pytest

from tests.bmc import Bmc, cable
from tests.contract.conftest import POWER_TIMEOUT
from tests.ports import free_port
from vipu.api.tls import make_authority
from vipu.backends.capabilities import Cable, HealthLevel, PowerAction, PowerState
from vipu.backends.redfish import EVENTS_KEPT, RedfishMachine, bmc_config
from vipu.model.errors import InvalidArgument, Unavailable


@pytest.fixture(scope="module")
def bmc(tmp_path_factory):
    bmc = Bmc(tmp_path_factory.mktemp("bmc"), power_delay=(1, 1)).start()
    yield bmc
    bmc.close()


@pytest.fixture
def machines(bmc):
    """Makes RedfishMachines of the emulator, each with `changes` to its configuration; closes them after the test."""
    made = []

    def machine(**changes) -> RedfishMachine:
        mapping = {"url": bmc.url, "credentials": str(bmc.credentials), "ca": str(bmc.ca), "poll_seconds": 0.2, "timeout_seconds": 1,
                   **changes}
        made.append(RedfishMachine(bmc_config({key: value for key, value in mapping.items() if value is not None}, "bmc of m1")))
        return made[-1]

    yield machine
    for machine in made:
        machine.close()


def private_file(path, text: str, mode: int = 0o600):
    path.write_text(text)
    path.chmod(mode)
    return path


def refusal(call) -> str:
    with pytest.raises(Unavailable) as refused:
        call()
    assert "\n" not in refused.value.message
    return refused.value.message


def test_wrong_credentials_are_refused_in_one_line_until_the_file_is_fixed(bmc, machines, tmp_path):
    credentials = private_file(tmp_path / "credentials", "vipu:not-the-password\n")
    machine = machines(credentials=str(credentials))
    for call in (machine.power_state, machine.hardware, machine.health):
        assert refusal(call) == f"BMC {bmc.url}: credentials refused (HTTP 401)"
    assert refusal(lambda: machine.power(PowerAction.OFF, POWER_TIMEOUT)) == f"BMC {bmc.url}: credentials refused (HTTP 401)"
    credentials.write_text(bmc.credentials.read_text())
    assert machine.power_state() is PowerState.ON


def test_a_certificate_not_signed_by_the_ca_is_not_trusted(bmc, machines, tmp_path):
    other = tmp_path / "other-ca.pem"
    other.write_bytes(make_authority("another authority")[1])
    message = refusal(machines(ca=str(other)).power_state)
    assert message.startswith(f"BMC {bmc.url}: certificate not verified against CA file {other}: ")
    assert "unable to get local issuer certificate" in message


def test_without_verification_it_connects_and_says_so_once(bmc, machines, caplog):
    caplog.set_level(logging.WARNING, logger="vipu.backends.redfish")
    machine = machines(ca=None, verify=False)
    assert machine.power_state() is PowerState.ON
    assert machine.hardware().serial == bmc.serial
    warnings = [record for record in caplog.records if "NOT verified" in record.getMessage()]
    assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING
    assert f"TLS certificate of BMC {bmc.url} NOT verified" in warnings[0].getMessage()


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660])
def test_credentials_others_may_read_are_refused(bmc, tmp_path, mode):
    loose = private_file(tmp_path / "credentials", "vipu:secret\n", mode)
    with pytest.raises(InvalidArgument) as refused:
        bmc_config({"url": bmc.url, "credentials": str(loose)}, "bmc of m1")
    assert refused.value.message.startswith(f"bmc of m1: credentials file {loose} has mode {mode:04o}")
    assert "\n" not in refused.value.message


def test_credentials_loosened_later_make_the_bmc_unavailable(bmc, machines, tmp_path):
    credentials = private_file(tmp_path / "credentials", bmc.credentials.read_text())
    machine = machines(credentials=str(credentials))
    credentials.chmod(0o644)
    assert "has mode 0644" in refusal(machine.power_state)


def test_an_absent_bmc_is_refused_quickly(tmp_path):
    url = f"https://127.0.0.1:{free_port()}"
    machine = RedfishMachine(bmc_config({"url": url, "credentials": str(private_file(tmp_path / "c", "u:p\n")), "timeout_seconds": 1},
                                        "bmc of m1"))
    started = time.monotonic()
    assert refusal(machine.power_state) == f"BMC {url}: connection refused"
    assert time.monotonic() - started < 2


def test_a_system_the_bmc_does_not_have(bmc, machines):
    assert refusal(machines(system="no-such-system").power_state).startswith(f"BMC {bmc.url}: it has no system ")
    identity = bmc.system_path.rsplit("/", 1)[1]
    assert machines(system=identity).power_state() is PowerState.ON
    assert machines(system=bmc.system_path, chassis=bmc.chassis_path).hardware().serial == bmc.serial


@pytest.mark.parametrize(("changes", "says"), [
    ({"url": None}, "url is required"),
    ({"url": "ftp://127.0.0.1"}, "must be https://HOST[:PORT]"),
    ({"url": "https://127.0.0.1:port"}, "is no URL"),
    ({"url": "https://admin:pw@127.0.0.1"}, "holds credentials"),
    ({"url": "https://127.0.0.1/redfish/v1"}, "not a path"),
    ({"url": "http://127.0.0.1:8000", "ca": None}, "plain http"),
    ({"url": "http://127.0.0.1:8000"}, "plain http"),
    ({"verify": "yes"}, "verify must be true or false"),
    ({"verify": False}, "ca is given but verify is false"),
    ({"ca": "/nonexistent/ca.pem"}, "ca file /nonexistent/ca.pem does not exist"),
    ({"ca": "NOT-PEM"}, "holds no usable certificate"),
    ({"credentials": None}, "credentials is required"),
    ({"credentials": "/nonexistent/credentials"}, "credentials file /nonexistent/credentials does not exist"),
    ({"credentials": "NO-COLON"}, "its first line must be username:password"),
    ({"poll_seconds": 0}, "poll_seconds must be a number of seconds above 0"),
    ({"poll_seconds": "5"}, "poll_seconds must be"),
    ({"poll_seconds": True}, "poll_seconds must be"),
    ({"poll_seconds": math.nan}, "poll_seconds must be"),
    ({"timeout_seconds": -1}, "timeout_seconds must be"),
    ({"timeout_seconds": 1000}, "timeout_seconds must be"),
    ({"system": ""}, "system must be an Id or an @odata.id"),
    ({"chassis": 7}, "chassis must be an Id or an @odata.id"),
    ({"colour": "blue"}, "unknown key 'colour'"),
])
def test_bad_configuration_values_are_refused_in_one_line(bmc, tmp_path, changes, says):
    files = {"NOT-PEM": str(private_file(tmp_path / "not.pem", "no certificate here\n")),
             "NO-COLON": str(private_file(tmp_path / "credentials", "just-a-password\n"))}
    mapping = {"url": bmc.url, "credentials": str(bmc.credentials), "ca": str(bmc.ca),
               **{key: files.get(value, value) if isinstance(value, str) else value for key, value in changes.items()}}
    with pytest.raises(InvalidArgument) as refused:
        bmc_config({key: value for key, value in mapping.items() if value is not None}, "bmc of m1")
    assert refused.value.message.startswith("bmc of m1: ") and says in refused.value.message
    assert "\n" not in refused.value.message


@pytest.mark.parametrize("mapping", [["url"], "https://127.0.0.1", None])
def test_a_configuration_that_is_no_mapping_is_refused(mapping):
    with pytest.raises(InvalidArgument, match=r"^bmc of m1: expected a mapping"):
        bmc_config(mapping, "bmc of m1")


def test_plain_http_is_accepted_only_without_verification(bmc, tmp_path):
    config = bmc_config({"url": "http://127.0.0.1:8000/", "verify": False, "credentials": str(bmc.credentials)}, "bmc of m1")
    assert (config.url, config.verify, config.ca) == ("http://127.0.0.1:8000", False, None)


def test_a_power_action_that_does_not_finish_names_the_state_it_is_stuck_in(bmc, machines):
    machine = machines()
    bmc.set_power_delay(3, 3)  # the fake driver applies it 2 to 3 s later
    try:
        message = refusal(lambda: machine.power(PowerAction.OFF, 0.5))
    finally:
        bmc.set_power_delay(1, 1)
    assert message == f"BMC {bmc.url}: power off did not reach Off within 0.5 s: the machine is On"
    assert machine.power(PowerAction.OFF, POWER_TIMEOUT) is PowerState.OFF
    assert machine.power(PowerAction.ON, POWER_TIMEOUT) is PowerState.ON


def test_a_cycle_without_power_cycle_is_forced_off_then_on(machines, caplog):
    caplog.set_level(logging.INFO, logger="vipu.backends.redfish")
    assert machines().power(PowerAction.CYCLE, POWER_TIMEOUT) is PowerState.ON  # the emulator allows no PowerCycle
    asked = [record.getMessage().rsplit("asked for ", 1)[1] for record in caplog.records if "asked for" in record.getMessage()]
    assert asked == ["ForceOff", "On"]


def test_cables_are_named_by_their_port_here_and_absent_ones_skipped(bmc, machines):
    other_machine = "/redfish/v1/Systems/another-machine"
    between = cable("3", "OSFP-SN-3", "Amphenol", "OSFP-400G", under=other_machine)
    between["Links"]["DownstreamPorts"] = [{"@odata.id": f"{bmc.system_path}/FabricAdapters/IPU-Link/Ports/5"}]
    labelled = {"Id": "gw", "UserLabel": "gw1", "SerialNumber": "GW-SN-1", "Manufacturer": "TE", "PartNumber": "QSFP-GW"}
    absent = {**cable("8", "", under=bmc.system_path), "Status": {"State": "Absent"}}
    bmc.set_cables([between, labelled, absent])
    try:
        assert machines().hardware().cables == (Cable("5", "OSFP-SN-3", "Amphenol", "OSFP-400G"), Cable("gw1", "GW-SN-1", "TE", "QSFP-GW"))
    finally:
        bmc.set_cables(None)


def test_what_the_bmc_lacks_is_skipped(bmc, machines):
    bmc.set_cables(None)  # no Cables in the service root; no FirmwareInventory, no chassis Power (the emulator's own)
    hardware = machines().hardware()
    assert hardware.cables == ()
    assert hardware.firmware == {"bmc": "1.00"}
    assert {component.id for component in hardware.components} == {"system", "chassis", "bmc"}


def test_the_worst_level_rolls_up(bmc, machines):
    machine = machines()
    fan, chassis = f"{bmc.chassis_path}/Thermal#/Fans/1", bmc.chassis_path
    bmc.fail_component(fan, "Warning")
    try:
        health = machine.health()
        assert health.health is HealthLevel.WARNING
        bmc.fail_component(chassis, "Critical")
        health = machine.health()
        assert health.health is HealthLevel.CRITICAL
        levels = {part.component: part.health for part in health.components}
        assert (levels["fan:1"], levels["chassis"], levels["fan:0"]) == (HealthLevel.WARNING, HealthLevel.CRITICAL, HealthLevel.OK)
    finally:
        bmc.heal_component(fan)
        bmc.heal_component(chassis)
    assert machine.health().health is HealthLevel.OK


def test_the_events_kept_are_the_latest(machines):
    machine = machines()
    for number in range(EVENTS_KEPT + 44):
        machine._event(HealthLevel.WARNING, "fan:0", f"event {number}")
    kept = machine.events(0)
    assert len(kept) == EVENTS_KEPT and [event.sequence for event in kept] == list(range(45, EVENTS_KEPT + 45))
    assert [event.sequence for event in machine.events(EVENTS_KEPT + 40)] == list(range(EVENTS_KEPT + 41, EVENTS_KEPT + 45))


def test_telemetry_is_the_bmcs_sensors_and_one_it_lacks_is_absent(bmc, machines):
    machine = machines()
    reading = machine.telemetry()
    sensors = {(s.name, s.kind): s.value for s in reading.sensors}
    assert sensors[("Chassis Intake Temp", "temperature")] == 25  # sushy-emulator's own Thermal
    assert ("CPU Temp", "temperature") in sensors
    assert not any(kind == "power" for _, kind in sensors) and reading.ipus == ()  # no Power, no IPU's sensor: absent, not 0
    bmc.set_power_watts(412.5)
    try:
        afresh = machines(poll_seconds=60)  # no reading of its own yet: it reads now
        assert {(s.name, s.kind): s.value for s in afresh.telemetry().sensors}[("Chassis Power Control", "power")] == 412.5
    finally:
        bmc.set_power_watts(None)


def test_log_entries_of_the_bmcs_sel_are_given_once_each(bmc, machines):
    machine = machines(poll_seconds=0.001)

    def read() -> list:
        time.sleep(0.002)  # past its poll_seconds: a read of the BMC, not the rate limit's empty answer
        return machine.log_lines()

    assert read() == []  # no log service at all: nothing, and no error
    bmc.record_event("Warning", "Fan 2 speed below threshold", "2026-12-07T10:00:00Z")
    bmc.record_event("Critical", "PSU 1 input lost", "2026-12-07T10:05:00Z")
    first = read()
    assert [(source, text) for _, source, text in first] == [("bmc", "SEL: Warning: Fan 2 speed below threshold"),
                                                           ("bmc", "SEL: Critical: PSU 1 input lost")]
    assert first[0][0] == 1796637600.0  # as the BMC stamped it
    bmc.record_event("OK", "PSU 1 input restored", "2026-12-07T10:06:00Z")
    assert [text for _, _, text in read()] == ["SEL: OK: PSU 1 input restored"]
    assert read() == []
    assert machines(poll_seconds=60).log_lines() != [] and machines(poll_seconds=60).telemetry().sensors  # once now...
    slow = machines(poll_seconds=60)
    slow.telemetry(), slow.log_lines()
    bmc.record_event("Warning", "Fan 1 speed below threshold", "2026-12-07T10:07:00Z")
    assert slow.log_lines() == []  # ...then not again within its poll_seconds
