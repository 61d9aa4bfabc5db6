"""One machine as the agent serves it: a fabric, and power, inventory, health, telemetry and logs
from whichever driver gives each (`vipu.backends.capabilities`).

Telemetry is the fabric's (what the gateway counts of its IPUs) with, where a BMC gives it, the
BMC's temperatures and power in place of the fabric's; logs are the fabric's (the gateway's own
log) and the BMC's log services, where a BMC gives them too.

The fabric (the gateway: partition settings, IPUoF, links, the cluster-test steps) is the
simulator's here; power, inventory and health may be the simulator's too or a BMC's. While the
machine is powered off, or being powered off, cycled or reset, the fabric refuses every call as a
machine without power would; once power has gone, the fabric is told to forget what it held
(`MachineBackend.power_lost`), since a real gateway loses its settings with its power.

A capability whose driver fails (its BMC unreachable, its credentials refused) does not stop the
others: the agent still serves the fabric, and reports the failure, one line per capability, in
the machine's condition, which the controller shows as the agent's Down reason.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence

from vipu.backends.base import MachineBackend, PartitionAttachments
from vipu.backends.capabilities import Health, Inventory, MachineLog, Power, Telemetry, checked_power_request
from vipu.model.clustertests import Observation, Probe
from vipu.model.configuration import AgentSettings
from vipu.model.entities import MachineInventory
from vipu.model.errors import Conflict, Unavailable, VipuError
from vipu.model.hardware import Capability, HardwareInventory, HealthEvent, HealthLevel, MachineCondition, PowerAction, PowerState
from vipu.model.linkhealth import LinkReading
from vipu.model.telemetry import TelemetryReading, with_environment

log = logging.getLogger(__name__)

HARDWARE_SECONDS = 30.0  # how long a reading of the machine's hardware inventory serves


class ComposedMachine(MachineBackend):
    def __init__(self, fabric: MachineBackend, machine_name: str, power: Power | None = None, inventory: Inventory | None = None,
                 health: Health | None = None, telemetry: Telemetry | None = None, logs: Sequence[MachineLog] = (),
                 closing: Sequence[Callable[[], None]] = ()):
        """`telemetry`: the driver of the temperatures and power (the fabric's own, or a BMC's);
        `logs`: each driver whose log is the machine's; `closing`: what `close` calls, its drivers'
        own ends (a BMC's session and poller)."""
        self.fabric = fabric
        self.machine_name = machine_name
        self.name, self.version = fabric.name, fabric.version
        self.power_driver, self.inventory_driver, self.health_driver = power, inventory, health
        self.telemetry_driver, self.log_drivers = telemetry, tuple(logs)
        self._closing = tuple(closing)
        self._hardware: tuple[float, HardwareInventory | None] = (0.0, None)  # (when, on the monotonic clock) its last reading
        self._lock = threading.Lock()
        self._without_power = ""  # why the fabric refuses now ("... is powered off"); "" while it has power
        self._acting: PowerAction | None = None  # the power action under way
        self._lost = False  # the fabric was told its power went, since the machine was last seen on
        self._problems: dict[Capability, str] = {}  # the last failure of each capability that fails now
        self._told: tuple[str, ...] = ()  # the reasons of the problems last looked at, each logged when it first showed

    def capabilities(self) -> tuple[str, ...]:
        drivers = {Capability.FABRIC: self.fabric, Capability.DIAGNOSTICS: self.fabric, Capability.POWER: self.power_driver,
                   Capability.INVENTORY: self.inventory_driver, Capability.HEALTH: self.health_driver,
                   Capability.TELEMETRY: self.telemetry_driver, Capability.LOGS: self.log_drivers or None}
        return tuple(capability.value for capability in Capability if drivers[capability] is not None)

    def inventory(self) -> MachineInventory:
        """The fabric's inventory, with the inventory capability's hardware as read within the last
        HARDWARE_SECONDS: the agent is asked for its inventory often (announcements, claims,
        scrapes), and a BMC answers slowly."""
        inventory = self.fabric.inventory()
        inventory.capabilities = self.capabilities()
        if self.inventory_driver is not None:
            with self._lock:
                read_at, hardware = self._hardware
            if hardware is None or time.monotonic() - read_at > HARDWARE_SECONDS:
                hardware = self._read(Capability.INVENTORY, self.inventory_driver.hardware)
                if hardware is not None:
                    with self._lock:
                        self._hardware = (time.monotonic(), hardware)
            if hardware is not None:
                inventory.cables, inventory.components = hardware.cables, hardware.components
        return inventory

    def condition(self, after_event: int) -> MachineCondition:
        """Power and health now, and the health events after `after_event`; a capability that
        cannot be read is a problem line, not an error."""
        power_state = ""
        if self.power_driver is not None:
            state = self._read(Capability.POWER, self.power_driver.power_state)
            power_state = (state or PowerState.UNKNOWN).value
            if state is not None:
                self._follow_power(state)
        health, components, events = "", (), ()
        if self.health_driver is not None:
            machine_health = self._read(Capability.HEALTH, self.health_driver.health)
            health = machine_health.health.value if machine_health is not None else HealthLevel.UNKNOWN.value
            if machine_health is not None:
                driver = self.health_driver
                components = machine_health.components
                events = tuple(self._read(Capability.HEALTH, lambda: self._events_after(driver, after_event)) or ())
        if self.inventory_driver is not None and Capability.INVENTORY in self._problems:
            self._read(Capability.INVENTORY, self.inventory_driver.hardware)  # looked at again, to clear its problem
        return MachineCondition(power_state, health, components, self._problem_lines(), events)

    @staticmethod
    def _events_after(driver: Health, after_event: int) -> list[HealthEvent]:
        """The events after `after_event`; every one kept if the caller knows of more than there
        have been (this agent restarted, and counts from 1 again)."""
        events = driver.events(after_event)
        if not events and after_event:
            kept = driver.events(0)
            if kept and kept[-1].sequence < after_event:
                return kept
        return events

    def _problem_lines(self) -> tuple[str, ...]:
        """A line per reason, naming the capabilities failing for it; each logged once, when it first shows."""
        with self._lock:
            failing: dict[str, list[str]] = {}  # reason -> the capabilities failing for it, in the order of Capability
            for capability in Capability:
                if capability in self._problems:
                    failing.setdefault(self._problems[capability], []).append(capability.value)
            told, self._told = self._told, tuple(failing)
        for reason, capabilities in failing.items():
            if reason not in told:
                log.warning("%s: %s: %s", self.machine_name, ", ".join(capabilities), reason)
        if told and not failing:
            log.info("%s: every capability answers again", self.machine_name)
        return tuple(f"{', '.join(capabilities)}: {reason}" for reason, capabilities in failing.items())

    def telemetry(self) -> TelemetryReading:
        """The fabric's reading, with the telemetry driver's temperatures and power where it is
        another (a BMC's); Unavailable if a driver does not answer (the agent keeps serving its last
        reading, with its age)."""
        if self.telemetry_driver is None:
            raise Unavailable(f"{self.machine_name} has no telemetry capability")
        if self.telemetry_driver is self.fabric or not isinstance(self.fabric, Telemetry):
            return self.telemetry_driver.telemetry()
        return with_environment(self.fabric.telemetry(), self.telemetry_driver.telemetry())

    def log_lines(self) -> list[tuple[float, str, str]]:
        """New lines of each log driver, oldest first; one whose driver fails is skipped until it answers."""
        lines = []
        for driver in self.log_drivers:
            try:
                lines += driver.log_lines()
            except VipuError as error:
                log.debug("%s: its log is not read: %s", self.machine_name, error.message)
        return sorted(lines, key=lambda line: line[0])

    def power(self, action: PowerAction, timeout: float) -> PowerState:
        """Do a power action, one at a time. The fabric refuses calls while an action other than on
        is under way, and forgets what it held once the action is done (power went, or went
        through off); one that fails leaves the fabric as it was, for the next look at the power
        state to tell."""
        if self.power_driver is None:
            raise Unavailable(f"{self.machine_name} has no power capability")
        action = checked_power_request(action, timeout)
        with self._lock:
            if self._acting is not None:
                raise Conflict(f"{self.machine_name}: power {self._acting.value} is under way")
            self._acting, before = action, self._without_power
            if action is not PowerAction.ON:
                self._without_power = f"{self.machine_name}: power {action.value} under way"
        try:
            state = self.power_driver.power(action, timeout)
        except VipuError:
            with self._lock:
                self._acting, self._without_power = None, before
            raise
        if action is not PowerAction.ON:
            self.fabric.power_lost()
        with self._lock:
            self._acting, self._lost = None, action is not PowerAction.ON
        self._follow_power(state)
        return state

    def _follow_power(self, state: PowerState) -> None:
        """What a reading of the power state says of the fabric, unless an action under way decides:
        on, it serves; off or on its way (off, or on from off), it refuses, and forgets what it held
        the first time; unknown says nothing."""
        with self._lock:
            if self._acting is not None or state is PowerState.UNKNOWN:
                return
            if state is PowerState.ON:
                self._without_power, self._lost = "", False
                return
            self._without_power = (f"{self.machine_name} is powered off" if state is PowerState.OFF
                                   else f"{self.machine_name} is not powered on (its power state is {state.value})")
            newly, self._lost = not self._lost, True
        if newly:
            self.fabric.power_lost()  # turned off by other means than ours (its BMC's own interface, a fault)

    def _read(self, capability: Capability, read):
        """What `read` returns, or None if it fails, the failure then kept as the capability's problem."""
        try:
            value = read()
        except VipuError as error:
            with self._lock:
                self._problems[capability] = error.message
            return None
        with self._lock:
            self._problems.pop(capability, None)
        return value

    def _check_power(self) -> None:
        if self._without_power:
            raise Unavailable(self._without_power)

    def apply(self, settings: AgentSettings) -> None:
        self._check_power()
        self.fabric.apply(settings)

    def clear(self, partition_id: str) -> None:
        self._check_power()
        self.fabric.clear(partition_id)

    def partitions(self) -> list[AgentSettings]:
        self._check_power()
        return self.fabric.partitions()

    def diagnose(self, probe: Probe, ipus: dict[int, int], seed: int) -> Observation:
        self._check_power()
        return self.fabric.diagnose(probe, ipus, seed)

    def link_counters(self) -> list[LinkReading]:
        return self.fabric.link_counters()

    def reset_link(self, place: str) -> None:
        self._check_power()
        self.fabric.reset_link(place)

    def ipuof_attach(self, partition_id: str, device_id: int, chip_id: str, attach_key: str, session: str = "",
                     hold_seconds: float = 0.0) -> None:
        self._check_power()
        self.fabric.ipuof_attach(partition_id, device_id, chip_id, attach_key, session, hold_seconds)

    def ipuof_run(self, partition_id: str, device_id: int, chip_id: str, routing_id: int, seed: int, attach_key: str,
                  session: str = "") -> int:
        self._check_power()
        return self.fabric.ipuof_run(partition_id, device_id, chip_id, routing_id, seed, attach_key, session)

    def ipuof_detach(self, partition_id: str, device_id: int, session: str) -> None:
        self.fabric.ipuof_detach(partition_id, device_id, session)

    def attachments(self, partition_ids: Sequence[str], fence_seconds: float = 0.0) -> list[PartitionAttachments]:
        return self.fabric.attachments(partition_ids, fence_seconds)

    def power_lost(self) -> None:
        self.fabric.power_lost()

    def silent(self) -> bool:
        return self.fabric.silent()

    def close(self) -> None:
        for close in self._closing:
            close()
