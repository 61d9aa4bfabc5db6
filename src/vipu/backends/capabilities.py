"""What a machine driver can do, one capability at a time.

An IPU-Machine is reached by more than one way: its gateway configures the IPU-Link fabric and
serves IPUoF, its BMC powers it and reports its inventory and health. A site combines them per
machine, as Ironic combines a node's hardware interfaces: the agent's configuration names which
implementation gives each capability (`vipu.backends.composed`), and the controller offers a
command only on machines whose agent has the capability it needs.

The capabilities besides the fabric (`vipu.backends.base.MachineBackend`, with the cluster-test
steps of diagnostics) are defined here. Each raises the `vipu.model.errors` families:
`Unavailable` when the part that gives it does not answer (its BMC unreachable, its credentials
refused, its certificate not verified: the message says which, in one line), `InvalidArgument`
for a request that makes no sense.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod

from vipu.model.errors import InvalidArgument
from vipu.model.hardware import (
    Cable,
    Capability,
    Component,
    ComponentHealth,
    HardwareInventory,
    HealthEvent,
    HealthLevel,
    MachineHealth,
    PowerAction,
    PowerState,
)
from vipu.model.telemetry import TelemetryReading

__all__ = [
    "Cable",
    "Capability",
    "Component",
    "ComponentHealth",
    "HardwareInventory",
    "Health",
    "HealthEvent",
    "HealthLevel",
    "Inventory",
    "MachineHealth",
    "MachineLog",
    "Power",
    "PowerAction",
    "PowerState",
    "Telemetry",
    "checked_power_request",
]


def checked_power_request(action: object, timeout: object) -> PowerAction:
    """The action of a power request whose action and timeout (seconds above 0) make sense, or
    InvalidArgument in one line: checked before anything is done."""
    try:
        checked = PowerAction(action)
    except ValueError:
        raise InvalidArgument(f"unknown power action {action!r:.60}: one of {', '.join(a.value for a in PowerAction)}") from None
    if isinstance(timeout, bool) or not isinstance(timeout, int | float) or not math.isfinite(timeout) or timeout <= 0:
        raise InvalidArgument(f"a power timeout must be a number of seconds above 0, not {timeout!r:.60}")
    return checked


class Power(ABC):
    @abstractmethod
    def power_state(self) -> PowerState:
        """The machine's power state now."""

    @abstractmethod
    def power(self, action: PowerAction, timeout: float) -> PowerState:
        """Do `action` and wait, at most `timeout` seconds, until the machine reaches the state it
        leads to (Off after off, On after the others); that state. Unavailable if it does not."""


class Inventory(ABC):
    @abstractmethod
    def hardware(self) -> HardwareInventory:
        """What the machine is made of, read now."""


class Health(ABC):
    @abstractmethod
    def health(self) -> MachineHealth:
        """Each component's health now."""

    @abstractmethod
    def events(self, after: int) -> list[HealthEvent]:
        """The events with a sequence above `after` still kept (the most recent ones), oldest first."""


class Telemetry(ABC):
    @abstractmethod
    def telemetry(self) -> TelemetryReading:
        """What the machine measures of its IPUs now; a field it has no sensor for is None. The
        agent reads it on its own schedule, never while a scrape waits."""


class MachineLog(ABC):
    @abstractmethod
    def log_lines(self) -> list[tuple[float, str, str]]:
        """The lines logged since the last call, oldest first, as (seconds since the epoch, source,
        text); the first call gives what is still there from before, as much as the driver keeps."""
