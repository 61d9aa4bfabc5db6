"""The hardware a machine driver reports beyond the fabric: power, inventory, health.

Plain values shared by the agent's drivers (`vipu.backends.capabilities`), the agent link and the
controller, which offers a command only on machines whose agent has the capability it needs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


class Capability(str, Enum):
    FABRIC = "fabric"            # apply, clear and list partition settings; the IPUoF end-point; links
    POWER = "power"              # state, on, off, reset, power cycle
    INVENTORY = "inventory"      # serials, firmware and component versions, ports' cables
    HEALTH = "health"            # component health and events
    DIAGNOSTICS = "diagnostics"  # the cluster-test steps
    TELEMETRY = "telemetry"      # per-IPU utilisation, temperature, power, clocks, memory, error counters
    LOGS = "logs"                # the machine's own log, and its BMC's


class PowerState(str, Enum):
    ON = "On"
    OFF = "Off"
    POWERING_ON = "PoweringOn"
    POWERING_OFF = "PoweringOff"
    UNKNOWN = "Unknown"

    @classmethod
    def _missing_(cls, value: object) -> PowerState:
        return cls.UNKNOWN  # a state this version does not know, or none said


class PowerAction(str, Enum):
    ON = "on"
    OFF = "off"          # forced off: what an administrator asks of a wedged machine
    RESET = "reset"      # a warm restart, where the machine offers one (else as cycle)
    CYCLE = "cycle"      # off, then on


class HealthLevel(str, Enum):
    """Redfish's Status.Health, plus Unknown for a part that could not be read."""

    OK = "OK"
    WARNING = "Warning"
    CRITICAL = "Critical"
    UNKNOWN = "Unknown"

    @classmethod
    def _missing_(cls, value: object) -> HealthLevel:
        return cls.UNKNOWN


@dataclass(frozen=True)
class Cable:
    """A chassis port's cable as the machine's management controller names it."""

    port: str      # the chassis port, as the machine names it ("1".."8" IPU-Link, "sync1", "gw1", ...)
    serial: str
    vendor: str = ""
    model: str = ""


@dataclass(frozen=True)
class Component:
    """A replaceable part: its identity and firmware."""

    id: str        # unique within the machine, e.g. "system", "chassis", "bmc", "fan2"
    kind: str      # system | chassis | manager | firmware | fan | psu | ...
    name: str = ""
    serial: str = ""
    model: str = ""
    manufacturer: str = ""
    firmware: str = ""


@dataclass(frozen=True)
class HardwareInventory:
    serial: str                  # the machine's (chassis) serial
    manufacturer: str = ""
    model: str = ""
    part_number: str = ""
    firmware: dict[str, str] = field(default_factory=dict)   # component -> version, e.g. {"bmc": "2.5.0"}
    components: tuple[Component, ...] = ()
    cables: tuple[Cable, ...] = ()


@dataclass(frozen=True)
class ComponentHealth:
    component: str           # Component.id
    health: HealthLevel
    state: str = "Enabled"   # Redfish's Status.State: Enabled, Disabled, Absent, StandbyOffline, ...
    message: str = ""


@dataclass(frozen=True)
class MachineHealth:
    health: HealthLevel                     # the worst of the components'
    components: tuple[ComponentHealth, ...] = ()


@dataclass(frozen=True)
class HealthEvent:
    """Something the machine said happened: a component's health changed, its power went off, ..."""

    sequence: int            # increasing per driver instance, from 1
    at: float                # seconds since the epoch
    severity: HealthLevel
    component: str
    message: str


NO_CAPABILITIES_SAID = (Capability.FABRIC.value, Capability.DIAGNOSTICS.value)  # what an agent from before capabilities has


@dataclass(frozen=True)
class MachineCondition:
    """What an agent said of its machine's power and health at the controller's last look."""

    power_state: str = ""  # a PowerState; "" without the power capability
    health: str = ""       # a HealthLevel; "" without the health capability
    components: tuple[ComponentHealth, ...] = ()
    # A line per capability that could not be read ("power: BMC https://...: credentials refused"):
    # the agent is shown Down for it, though its fabric may still serve its partitions.
    problems: tuple[str, ...] = ()
    events: tuple[HealthEvent, ...] = ()  # the latest the controller was told of, oldest first
