"""The machine capabilities' contract: the same tests run against every implementation of Power,
Inventory and Health (`vipu.backends.capabilities`).

Each implementation comes with a harness (`Harness`): its driver, started, and the means to change
the machine behind it as the world would, a part failing, a cable swapped, the management
controller freezing. `harness` runs each test once per implementation; each test module gets
machines of its own, in the state `Harness` promises.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Protocol, TypeVar

import pytest

from tests.bmc import Bmc, cable
from vipu.backends.redfish import RedfishMachine, bmc_config
from vipu.backends.sim import faults
from vipu.backends.sim.machine import RackFile, SimMachine
from vipu.backends.sim.rack import Endpoint, RackCable, generate_rack, load_rack, save_rack
from vipu.model.entities import IldTopology
from vipu.model.topology import LinkKind

POWER_TIMEOUT = 30.0        # seconds a power action may take; the harnesses' machines take a few
EVENT_WITHIN = 10.0         # seconds until a change the driver must see shows as an event
UNAVAILABLE_WITHIN = 5.0    # seconds until a call to a machine that stopped answering fails

T = TypeVar("T")


class Harness(Protocol):
    """One implementation under the contract. The machine starts On, every component OK."""

    driver: Any              # implements Power, Inventory and Health; its events are being gathered
    serial: str              # the machine's serial, as hardware() must report it
    known_component: str     # the id of a component health() reports, which fail_component can fail

    def fail_component(self, component: str) -> None:
        """Make the component report Critical health, as the machine would say of a failed part."""

    def heal_component(self, component: str) -> None:
        """Make it report OK again."""

    def stop_answering(self) -> None:
        """Freeze the machine's management controller: it accepts connections and answers nothing."""

    def answer_again(self) -> None:
        """Thaw it."""

    def set_cable(self, port: str, serial: str, vendor: str, model: str) -> None:
        """Plug a cable with this identity in the chassis port (replacing any there)."""


def wait_for(find: Callable[[], T | None], timeout: float, what: str) -> T:
    """What `find` returns once it is not None; fails the test after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while (found := find()) is None:
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g} s waiting for {what}")
        time.sleep(0.05)
    return found


class RedfishHarness:
    """sushy-emulator and its overlay (tests.bmc) behind a RedfishMachine that polls every 0.2 s.

    The fake driver's power changes are drawn from 1 to 2 s rather than its 1 to 11 (an overlay
    setting), so that the contract's few power actions fit the suite's minute."""

    known_component = "fan:0"

    def __init__(self, bmc: Bmc):
        self.bmc = bmc
        self.serial = bmc.serial
        self._cables: dict[str, dict] = {}
        bmc.set_cables([])
        config = bmc_config({"url": bmc.url, "credentials": str(bmc.credentials), "ca": str(bmc.ca), "poll_seconds": 0.2,
                             "timeout_seconds": 1}, "contract")
        self.driver = RedfishMachine(config).start()

    def _odata_id(self, component: str) -> str:
        kind, _, member = component.partition(":")
        members = {"fan": "Fans", "temperature": "Temperatures"}
        if kind in members:
            return f"{self.bmc.chassis_path}/Thermal#/{members[kind]}/{member}"
        return {"system": self.bmc.system_path, "chassis": self.bmc.chassis_path}[kind]

    def fail_component(self, component: str) -> None:
        self.bmc.fail_component(self._odata_id(component))

    def heal_component(self, component: str) -> None:
        self.bmc.heal_component(self._odata_id(component))

    def stop_answering(self) -> None:
        self.bmc.stop_answering()

    def answer_again(self) -> None:
        self.bmc.answer_again()

    def set_cable(self, port: str, serial: str, vendor: str, model: str) -> None:
        self._cables[port] = cable(port, serial, vendor, model, under=self.bmc.system_path)
        self.bmc.set_cables(list(self._cables.values()))

    def close(self) -> None:
        self.driver.close()


@pytest.fixture(scope="module")
def redfish_harness(tmp_path_factory) -> Iterator[RedfishHarness]:
    bmc = Bmc(tmp_path_factory.mktemp("bmc"), power_delay=(1, 2)).start()
    harness = RedfishHarness(bmc)
    yield harness
    harness.close()
    bmc.close()


class SimHarness:
    """The simulated IPU-M2000 (`vipu.backends.sim`): its faults and cables are edits of the rack
    file it reads (as `vipu-sim fault` makes them), its BMC's silence `faults.bmc_silent`."""

    known_component = "fan2"
    machine = "m02"  # in the middle of the rack: cables at both ends

    def __init__(self, rack_path: Path):
        self.rack_path = rack_path
        save_rack(generate_rack(4, topology=IldTopology.TORUS), rack_path)
        self.driver = SimMachine(RackFile(rack_path), self.machine)
        self.serial = load_rack(rack_path).machine(self.machine).serial

    def _edit(self, change: Callable[[Any], None]) -> None:
        rack = load_rack(self.rack_path)
        change(rack)
        save_rack(rack, self.rack_path)

    def fail_component(self, component: str) -> None:
        self._edit(lambda rack: faults.fail_component(rack, self.machine, component))

    def heal_component(self, component: str) -> None:
        self._edit(lambda rack: rack.machine(self.machine).faults.failed_components.remove(component))

    def stop_answering(self) -> None:
        self._edit(lambda rack: faults.silence_bmc(rack, self.machine))

    def answer_again(self) -> None:
        self._edit(lambda rack: setattr(rack.machine(self.machine).faults, "bmc_silent", False))

    def set_cable(self, port: str, serial: str, vendor: str, model: str) -> None:
        """Into an empty port, a cable to the same port of the next machine first."""
        kind, number = port_named(port)

        def change(rack) -> None:
            if rack.plugged(self.machine, kind, number) is None:
                rack.cables.append(RackCable(kind, Endpoint(self.machine, number), Endpoint("m03", number)))
            faults.swap_cable(rack, self.machine, kind, number, serial, vendor, model)

        self._edit(change)

    def close(self) -> None:
        pass


def port_named(place: str) -> tuple[LinkKind, int]:
    """A chassis port as the inventory names it: "5" (IPU-Link), "sync1", "gw2"."""
    for prefix, kind in (("sync", LinkKind.SYNC), ("gw", LinkKind.GWLINK)):
        if place.startswith(prefix):
            return kind, int(place.removeprefix(prefix))
    return LinkKind.IPULINK, int(place)


@pytest.fixture(scope="module")
def sim_harness(tmp_path_factory) -> Iterator[SimHarness]:
    yield SimHarness(tmp_path_factory.mktemp("sim") / "rack.yaml")


@pytest.fixture(scope="module", params=["sim", "redfish"])
def harness(request) -> Harness:
    return request.getfixturevalue(f"{request.param}_harness")
