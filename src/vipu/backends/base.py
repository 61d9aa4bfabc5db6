"""The interface an agent uses to drive one IPU-Machine.

A backend introspects its machine and applies or clears partition settings. It raises the
`vipu.model.errors` families: `Conflict` when the request clashes with what the machine already
holds, `HardwareFailure` when the hardware cannot do it (a cable not where it should be, a link
that does not train), `InvalidArgument` for settings that make no sense for this machine.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

from vipu.model.clustertests import Observation, Probe
from vipu.model.configuration import AgentSettings
from vipu.model.entities import MachineInventory
from vipu.model.linkhealth import LinkReading


class MachineBackend(ABC):
    name: str = ""
    version: str = ""

    @abstractmethod
    def inventory(self) -> MachineInventory:
        """What the machine is: serial, versions, IPUs, IPUoF end-point."""

    @abstractmethod
    def apply(self, settings: AgentSettings) -> None:
        """Configure the machine for one partition; applying the same settings again is harmless."""

    @abstractmethod
    def clear(self, partition_id: str) -> None:
        """Remove one partition's configuration; clearing an unknown partition is harmless."""

    @abstractmethod
    def partitions(self) -> list[AgentSettings]:
        """The partition settings the machine holds now."""

    @abstractmethod
    def diagnose(self, probe: Probe, ipus: dict[int, int], seed: int) -> Observation:
        """Run one cluster-test step; `ipus` maps the IPUs a traffic step uses to their routing ids."""

    @abstractmethod
    def link_counters(self) -> list[LinkReading]:
        """Every link's corrected-error and recovery counters and state now, with each chassis
        port's cable identity: read without disturbing the links (partitions may be using them)."""

    @abstractmethod
    def reset_link(self, place: str) -> None:
        """Retrain one link (`LinkReading.place`); InvalidArgument for a place the machine has no link at."""

    @abstractmethod
    def ipuof_attach(self, partition_id: str, device_id: int, chip_id: str, attach_key: str) -> None:
        """Let an IPUoF client attach to one IPU, if that IPU is configured for `partition_id` and
        the client presents that partition's attach key."""

    @abstractmethod
    def ipuof_run(self, partition_id: str, device_id: int, chip_id: str, routing_id: int, seed: int, attach_key: str) -> int:
        """Run the test program on an attached IPU; its result."""

    def silent(self) -> bool:
        """Whether the machine is playing dead (a simulated fault); real machines never say so."""
        return False
