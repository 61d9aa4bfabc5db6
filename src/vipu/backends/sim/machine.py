"""A simulated IPU-M2000: a first-class backend with state, validation, delays and faults.

It holds the partition settings applied to it and refuses what a real machine would: an IPU
that already belongs to another partition, a link whose cable is missing or reaches the wrong
machine or port (read from the rack description), or any configuration while the rack says the
machine has a configuration fault. The rack file is re-read when it changes, so editing it
injects or heals a fault in a running pod.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

from vipu import __version__
from vipu.backends.base import MachineBackend
from vipu.backends.sim.rack import Rack, RackMachine, load_rack
from vipu.model.configuration import AgentSettings, PortLink
from vipu.model.entities import IPUS_PER_MACHINE, MachineInventory
from vipu.model.errors import Conflict, HardwareFailure, InvalidArgument
from vipu.model.topology import LinkKind

IPU_ARCH_ID_MK2 = 1


class RackFile:
    """A rack description on disk, re-read whenever its modification time changes."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self._lock = threading.Lock()
        self._stamp: tuple[int, int] | None = None
        self._rack: Rack | None = None
        self.current()

    def current(self) -> Rack:
        with self._lock:
            try:
                stat = self.path.stat()
            except OSError as error:
                raise InvalidArgument(f"cannot read rack description {self.path}: {error.strerror}") from error
            stamp = (stat.st_mtime_ns, stat.st_size)
            if stamp != self._stamp:
                self._rack = load_rack(self.path)
                self._stamp = stamp
            assert self._rack is not None
            return self._rack


class SimMachine(MachineBackend):
    name = "sim"
    version = __version__

    def __init__(self, rack: RackFile, machine_name: str):
        self.rack = rack
        self.machine_name = machine_name
        self.machine()  # fail early if the rack has no such machine
        self._lock = threading.Lock()
        self._partitions: dict[str, AgentSettings] = {}
        self._owner: dict[int, str] = {}  # IPU index -> partition id

    def machine(self) -> RackMachine:
        return self.rack.current().machine(self.machine_name)

    def inventory(self) -> MachineInventory:
        m = self.machine()
        return MachineInventory(
            serial=m.serial,
            platform="IPU-M2000",
            manufacturer="Graphcore",
            board_part_number="M2000-SIM",
            versions=dict(m.versions),
            backend=self.name,
            backend_version=self.version,
            ipuof_host=m.ipuof_host,
            ipuof_port=m.ipuof_port,
            rdma_port=m.rdma_port,
            ipus=list(m.ipus),
            exporter_port=m.exporter_port,
            ipu_arch_id=IPU_ARCH_ID_MK2,
        )

    def apply(self, settings: AgentSettings) -> None:
        rack = self.rack.current()
        machine = rack.machine(self.machine_name)
        self._delay(machine)
        if machine.faults.configure:
            raise HardwareFailure(f"{machine.name}: {machine.faults.configure}")
        indices = [ipu.index for ipu in settings.ipus]
        if not indices:
            raise InvalidArgument(f"partition {settings.partition_id} names no IPU of {machine.name}")
        for index in indices:
            if not 0 <= index < IPUS_PER_MACHINE:
                raise InvalidArgument(f"{machine.name} has no IPU {index}")
        for kind, links in (
            (LinkKind.IPULINK, settings.ipulinks),
            (LinkKind.SYNC, settings.synclinks),
            (LinkKind.GWLINK, settings.gwlinks),
        ):
            for link in links:
                self._check_cable(rack, machine, kind, link)
        with self._lock:
            for index in indices:
                owner = self._owner.get(index)
                if owner not in (None, settings.partition_id):
                    raise Conflict(f"{machine.name}: IPU {index} is already configured for partition {owner}")
            self._drop(settings.partition_id)
            self._partitions[settings.partition_id] = settings
            self._owner.update({index: settings.partition_id for index in indices})

    def clear(self, partition_id: str) -> None:
        self._delay(self.machine())
        with self._lock:
            self._drop(partition_id)

    def partitions(self) -> list[AgentSettings]:
        with self._lock:
            return list(self._partitions.values())

    def _drop(self, partition_id: str) -> None:
        old = self._partitions.pop(partition_id, None)
        if old is not None:
            for ipu in old.ipus:
                self._owner.pop(ipu.index, None)

    @staticmethod
    def _delay(machine: RackMachine) -> None:
        if machine.faults.apply_delay_ms:
            time.sleep(machine.faults.apply_delay_ms / 1000)

    @staticmethod
    def _check_cable(rack: Rack, machine: RackMachine, kind: LinkKind, link: PortLink) -> None:
        expected = next((m.name for m in rack.machines if m.serial == link.peer_serial), link.peer_serial)
        plugged = rack.plugged(machine.name, kind, link.port)
        if plugged is None:
            raise HardwareFailure(
                f"{machine.name}: {kind.value} port {link.port} has no cable "
                f"(expected one to {expected}:{link.peer_port})"
            )
        _, far = plugged
        if far.machine != expected or far.port != link.peer_port:
            raise HardwareFailure(
                f"{machine.name}: {kind.value} port {link.port} reaches {far.machine}:{far.port}, "
                f"but the cluster expects {expected}:{link.peer_port}"
            )
