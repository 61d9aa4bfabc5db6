"""A simulated IPU-M2000: a first-class backend with state, validation, delays and faults.

It holds the partition settings applied to it and refuses what a real machine would: an IPU
that already belongs to another partition, a link whose cable is missing or reaches the wrong
machine or port (read from the rack description), or any configuration while the rack says the
machine has a configuration fault. The rack file is re-read when it changes, so editing it
injects or heals a fault in a running pod.

It remembers which IPUoF client sessions are attached to which IPU, each until the client
detaches, its hold lapses (each run renews it) or its partition's settings are cleared or
replaced, and the fences that keep an idle partition idle while the controller moves it.

It gives every capability (`vipu.backends.capabilities`): power as a BMC would (a machine
powered off refuses partition settings, and a power cycle loses them all, as the real one's
gateway does, and clears a `faults.wedged`), inventory (its components and each chassis port's
cable) and health (the rack's `faults.failed_components` are Critical, with an event each time a
component's health changes, seen when health is read). `faults.bmc_silent` makes those three
fail as an unreachable BMC does, while its IPUs still serve.

Its telemetry is a model that a test can reason about: an IPU is busy for RUN_WORK_SECONDS after
each program an IPUoF client runs on it, its utilisation follows that with a time constant of
UTILISATION_SECONDS, its temperature follows its utilisation (plus the rack's `faults.hot_ipus`)
with one of TEMPERATURE_SECONDS, and its power its utilisation; it throttles its clock when hot;
its memory holds a program while a client is attached or it is busy; its ECC and parity counters are the rack's
`faults.ecc_errors` and `faults.parity_errors`, its link errors those of its internal links. It
writes its own log (`vipu.backends.sim.machinelog`): partitions configured and cleared, power,
health events, error counts that rose.
"""

from __future__ import annotations

import contextlib
import hmac
import math
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from vipu import __version__
from vipu.backends.base import (
    DEFAULT_HOLD_SECONDS,
    MAX_FENCE_SECONDS,
    MAX_HOLD_SECONDS,
    MachineBackend,
    PartitionAttachments,
)
from vipu.backends.capabilities import Health, Inventory, MachineLog, Power, Telemetry, checked_power_request
from vipu.backends.sim.machinelog import LogFollower, machine_log_path, write_lines
from vipu.backends.sim.rack import (
    PORT_COUNTS,
    IndexedRack,
    Rack,
    RackMachine,
    load_rack,
)
from vipu.model.clustertests import (
    InternalReading,
    Observation,
    PortReading,
    Probe,
    program_checksum,
)
from vipu.model.configuration import AgentSettings, PortLink
from vipu.model.entities import IPUS_PER_MACHINE, MachineInventory
from vipu.model.errors import (
    Conflict,
    HardwareFailure,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    Unavailable,
)
from vipu.model.hardware import (
    Cable,
    Component,
    ComponentHealth,
    HardwareInventory,
    HealthEvent,
    HealthLevel,
    MachineHealth,
    PowerAction,
    PowerState,
)
from vipu.model.linkhealth import CableIdentity, LinkName, LinkReading
from vipu.model.telemetry import IpuReading, SensorReading, TelemetryReading
from vipu.model.topology import INTERNAL_LINKS, IPULINK_PORT_IPU, LinkKind

IPU_ARCH_ID_MK2 = 1

# How long each cluster-test step takes on real hardware, in seconds; the rack's time_scale scales it.
PROBE_SECONDS = {
    Probe.SYNC: 0.9, Probe.CABLING: 12.0, Probe.IPULINK: 7.4, Probe.TRAFFIC: 52.0, Probe.GWLINK: 4.0, Probe.PFC: 0.7,
}
PROBE_PORTS = {
    Probe.SYNC: (LinkKind.SYNC, LinkKind.GWLINK),
    Probe.CABLING: (LinkKind.IPULINK, LinkKind.GWLINK),
    Probe.IPULINK: (LinkKind.IPULINK,),
    Probe.TRAFFIC: (LinkKind.IPULINK,),
    Probe.GWLINK: (LinkKind.GWLINK,),
    Probe.PFC: (),
}
SIM_CABLE_VENDOR, SIM_CABLE_MODEL = "vipu-sim", "OSFP-DAC-1m"  # what a simulated cable's EEPROM says unless the rack names it
PROGRAM_SECONDS = 0.05  # one run of the test program over IPUoF
MAX_SESSION_LENGTH = 128
MAX_SESSIONS_PER_IPU = 256  # clients attached to one IPU at once: a bound on what a key holder can make the machine keep
KEPT_EVENTS = 256
# The parts a simulated machine reports health for, as an IPU-M2000's BMC would.
SIM_COMPONENTS = ("system", "chassis", "bmc", "fan1", "fan2", "fan3", "fan4", "fan5", "psu1", "psu2")
# The telemetry model (see the module's docstring).
RUN_WORK_SECONDS = 3.0  # how long one program run keeps an IPU busy
MOST_QUEUED_SECONDS = 30.0  # runs in a burst keep it busy at most this far ahead
UTILISATION_SECONDS = 2.0
TEMPERATURE_SECONDS = 20.0
IDLE_CELSIUS, BUSY_CELSIUS, THROTTLE_CELSIUS = 35.0, 78.0, 95.0
IDLE_WATTS, BUSY_WATTS = 40.0, 150.0
INTAKE_CELSIUS, CHASSIS_WATTS = 25.0, 180.0  # the machine's own sensors: its air intake, and its power draw beside the IPUs
CLOCK_MHZ, THROTTLED_MHZ = 1330.0, 1000.0
MEMORY_BYTES = 900 * 2**20  # an IPU-M2000's GC200 has 900 MB of in-processor memory
PROGRAM_BYTES = 600 * 2**20  # what a loaded program takes of it


@dataclass
class Thermal:
    """One IPU's modelled state at `at` (the machine's monotonic clock)."""

    at: float
    busy_until: float = 0.0
    utilisation: float = 0.0  # 0 to 1
    temperature: float = IDLE_CELSIUS


def _towards(value: float, target: float, seconds: float, constant: float) -> float:
    return target + (value - target) * math.exp(-seconds / constant)


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
                self._rack = IndexedRack(load_rack(self.path))
                self._stamp = stamp
            assert self._rack is not None
            return self._rack


@dataclass
class Attachment:
    """One client session's attachment of one IPU."""

    partition_id: str
    attached_at: float  # seconds since the epoch, for reports
    hold: float  # seconds each renewal extends it by
    lapses: float  # on the machine's monotonic clock


class SimMachine(MachineBackend, Power, Inventory, Health, Telemetry, MachineLog):
    name = "sim"
    version = __version__

    def __init__(self, rack: RackFile, machine_name: str, clock: Callable[[], float] = time.monotonic):
        """`clock`: the monotonic clock that attachments and fences lapse by (a test's own, to lapse them at will)."""
        self.rack = rack
        self.machine_name = machine_name
        self.machine()  # fail early if the rack has no such machine
        self._clock = clock
        self._lock = threading.Lock()
        self._partitions: dict[str, AgentSettings] = {}
        self._owner: dict[int, str] = {}  # IPU index -> partition id
        self._retrained: dict[str, float] = {}  # link place -> when it was last reset
        self._attachments: dict[tuple[int, str], Attachment] = {}  # (IPU index, client session) -> its attachment
        self._fences: dict[str, float] = {}  # partition id -> when its fence lapses, on `clock`
        self._power = PowerState.ON
        self._wedge_cleared = ""  # the `faults.wedged` reason a power cycle has cleared since it was set
        self._health: dict[str, HealthLevel] = {}  # component -> its health when last read
        self._events: list[HealthEvent] = []
        self._last_event = 0
        self._bmc_silent = False  # as last seen
        self._thermal = {index: Thermal(clock()) for index in range(IPUS_PER_MACHINE)}
        self._counted: dict[tuple[str, int], int] = {}  # (counter, IPU) -> its value when last read, to log a rise
        self.log_path = machine_log_path(rack.path, machine_name)
        self._follower = LogFollower(self.log_path)

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
        self._check_powered()
        self._delay(machine)
        if machine.faults.configure:
            raise HardwareFailure(f"{machine.name}: {machine.faults.configure}")
        if machine.faults.wedged and machine.faults.wedged != self._wedge_cleared:
            raise HardwareFailure(f"{machine.name}: {machine.faults.wedged}")
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
            again = self._partitions.get(settings.partition_id) == settings
            self._drop(settings.partition_id, keep_attachments=again)
            self._partitions[settings.partition_id] = settings
            self._owner.update({index: settings.partition_id for index in indices})
        if not again:
            self._log(f"partition {settings.partition_id} configured on IPUs {','.join(map(str, sorted(indices)))}")

    def clear(self, partition_id: str) -> None:
        self._check_powered()
        self._delay(self.machine())
        with self._lock:
            held = partition_id in self._partitions
            self._drop(partition_id)
        if held:
            self._log(f"partition {partition_id} cleared")

    def partitions(self) -> list[AgentSettings]:
        self._check_powered()
        with self._lock:
            return list(self._partitions.values())

    def power_state(self) -> PowerState:
        self._check_bmc()
        return self._power

    def power(self, action: PowerAction, timeout: float) -> PowerState:
        action = checked_power_request(action, timeout)
        self._check_bmc()
        if action is not PowerAction.ON:
            self.power_lost()
        with self._lock:
            self._power = PowerState.OFF if action is PowerAction.OFF else PowerState.ON
        self._log(f"power {action.value}: the machine is {self._power.value}")
        return self._power

    def power_lost(self) -> None:
        """Lose what the machine's power kept: every partition's settings, attachments and fences;
        a wedge clears."""
        wedged = self.machine().faults.wedged
        with self._lock:
            self._partitions.clear()
            self._owner.clear()
            self._attachments.clear()
            self._fences.clear()
            self._wedge_cleared = wedged

    def hardware(self) -> HardwareInventory:
        self._check_bmc()
        rack = self.rack.current()
        machine = rack.machine(self.machine_name)
        cables = []
        for kind in (LinkKind.IPULINK, LinkKind.SYNC, LinkKind.GWLINK):
            for port in range(1, PORT_COUNTS[kind] + 1):
                plugged = rack.plugged(machine.name, kind, port)
                if plugged is not None:
                    cable = plugged[0]
                    cables.append(Cable(LinkName.of_port(machine.name, kind, port).place, cable.serial,
                                        cable.vendor or SIM_CABLE_VENDOR, cable.model or SIM_CABLE_MODEL))
        bmc_version = machine.versions.get("bmc", "")
        components = tuple(Component(c, "fan" if c.startswith("fan") else "psu" if c.startswith("psu") else
                                     "manager" if c == "bmc" else c, c, f"{machine.serial}-{c}", "IPU-M2000", "Graphcore",
                                     bmc_version if c == "bmc" else "")
                           for c in SIM_COMPONENTS)
        return HardwareInventory(machine.serial, "Graphcore", "IPU-M2000", "M2000-SIM", dict(machine.versions), components,
                                 tuple(cables))

    def health(self) -> MachineHealth:
        self._observe()
        self._check_bmc()
        with self._lock:
            components = tuple(ComponentHealth(component, self._health.get(component, HealthLevel.OK)) for component in SIM_COMPONENTS)
        worst = HealthLevel.CRITICAL if any(c.health is HealthLevel.CRITICAL for c in components) else HealthLevel.OK
        return MachineHealth(worst, components)

    def events(self, after: int) -> list[HealthEvent]:
        """The machine's own record, read even while its BMC is silent (as a Redfish driver's poller keeps one)."""
        self._observe()
        with self._lock:
            return [event for event in self._events if event.sequence > after]

    def _observe(self) -> None:
        """Events for what changed since the last look: a component's health, the BMC's silence."""
        machine = self.machine()
        failed = set(machine.faults.failed_components)
        seen = {component: HealthLevel.CRITICAL if component in failed else HealthLevel.OK for component in SIM_COMPONENTS}
        with self._lock:
            if machine.faults.bmc_silent != self._bmc_silent:
                self._bmc_silent = machine.faults.bmc_silent
                self._event(HealthLevel.WARNING if self._bmc_silent else HealthLevel.OK, "bmc",
                            "does not answer" if self._bmc_silent else "answers again")
            if self._bmc_silent:
                return
            for component, level in seen.items():
                before = self._health.get(component, HealthLevel.OK)
                if level is not before:
                    self._event(level, component, f"health {level.value} (was {before.value})")
                self._health[component] = level

    def _event(self, severity: HealthLevel, component: str, message: str) -> None:
        self._last_event += 1
        self._events.append(HealthEvent(self._last_event, time.time(), severity, component, message))
        del self._events[:-KEPT_EVENTS]
        self._log(f"{severity.value}: {component}: {message}")

    def _log(self, text: str) -> None:
        """A line in the machine's own log; a log that cannot be written loses the line, not the call."""
        with contextlib.suppress(OSError):
            write_lines(self.log_path, [text])

    def log_lines(self) -> list[tuple[float, str, str]]:
        return [(at, "gateway", text) for at, text in self._follower.read()]

    def telemetry(self) -> TelemetryReading:
        """Each IPU's modelled readings now (see the module's docstring)."""
        machine = self.machine()
        now, wall = self._clock(), time.time()
        rises = []
        with self._lock:
            self._lapse(now)
            attached = {index for index, _ in self._attachments}
            ipus = []
            for index in range(IPUS_PER_MACHINE):
                state = self._advance(index, now, machine.faults.hot_ipus.get(index, 0.0))
                counters = {"ECC": machine.faults.ecc_errors.get(index, 0), "parity": machine.faults.parity_errors.get(index, 0)}
                for counter, value in counters.items():
                    if value > self._counted.get((counter, index), 0):
                        rises.append(f"IPU {index}: {value - self._counted.get((counter, index), 0)} corrected {counter} errors "
                                     f"({value} in all)")
                    self._counted[(counter, index)] = value
                links = sum(count for key, count in machine.link_errors.items()
                            if index in next((link.lower_ipu, link.upper_ipu) for link in INTERNAL_LINKS if link.key == key))
                powered = self._power is PowerState.ON
                ipus.append(IpuReading(
                    index, round(100 * state.utilisation, 1), round(state.temperature, 1),
                    round(IDLE_WATTS + (BUSY_WATTS - IDLE_WATTS) * state.utilisation, 1) if powered else 0.0,
                    (THROTTLED_MHZ if state.temperature >= THROTTLE_CELSIUS else CLOCK_MHZ) if powered else 0.0,
                    PROGRAM_BYTES if index in attached or state.busy_until > now else 0, MEMORY_BYTES, counters["ECC"],
                    counters["parity"], links))
        for rise in rises:
            self._log(rise)
        sensors = (SensorReading("Chassis Intake Temp", "temperature", INTAKE_CELSIUS),
                   SensorReading("Chassis Power", "power", round(CHASSIS_WATTS + sum(ipu.power or 0.0 for ipu in ipus), 1)))
        return TelemetryReading(wall, tuple(ipus), sensors if self._power is PowerState.ON else sensors[:1])

    def _advance(self, index: int, now: float, extra_celsius: float) -> Thermal:
        """IPU `index`'s model brought to `now`, a second at a time: busy, then idle, if its work
        ended meanwhile; a long idle gap goes straight to the idle state (under the lock)."""
        state = self._thermal[index]
        if state.busy_until <= state.at and now - state.at > 10 * TEMPERATURE_SECONDS:
            state.utilisation, state.temperature, state.at = 0.0, IDLE_CELSIUS + extra_celsius, now
        while state.at < now:
            busy = state.busy_until > state.at
            until = min(now, state.busy_until, state.at + 1.0) if busy else min(now, state.at + 1.0)
            seconds = until - state.at
            before = state.utilisation
            state.utilisation = _towards(before, 1.0 if busy else 0.0, seconds, UTILISATION_SECONDS)
            heat = IDLE_CELSIUS + extra_celsius + (BUSY_CELSIUS - IDLE_CELSIUS) * (before + state.utilisation) / 2
            state.temperature = _towards(state.temperature, heat, seconds, TEMPERATURE_SECONDS)
            state.at = until
        return state

    def _check_bmc(self) -> None:
        if self.machine().faults.bmc_silent:
            raise Unavailable(f"the BMC of {self.machine_name} does not answer")

    def _check_powered(self) -> None:
        if self._power is PowerState.OFF:
            raise Unavailable(f"{self.machine_name} is powered off")

    def silent(self) -> bool:
        return self.machine().faults.silent

    def diagnose(self, probe: Probe, ipus: dict[int, int], seed: int) -> Observation:
        self._check_powered()
        rack = self.rack.current()
        machine = rack.machine(self.machine_name)
        time.sleep(PROBE_SECONDS[probe] * rack.time_scale)
        if probe is Probe.PFC:
            return Observation(rnics={r.name: tuple(r.pfc_classes) for r in machine.rnics})
        ports = []
        for kind in PROBE_PORTS[probe]:
            for port in range(1, PORT_COUNTS[kind] + 1):
                if probe is Probe.TRAFFIC and IPULINK_PORT_IPU[port] not in ipus:
                    continue
                ports.append(self._read_port(rack, machine, kind, port, with_errors=probe is Probe.TRAFFIC))
        internal: tuple[InternalReading, ...] = ()
        if probe in (Probe.IPULINK, Probe.TRAFFIC):
            internal = tuple(
                InternalReading(
                    link.key,
                    up=link.key not in machine.broken_links,
                    errors=machine.link_errors.get(link.key, 0) if probe is Probe.TRAFFIC else 0,
                )
                for link in INTERNAL_LINKS
                if probe is Probe.IPULINK or (link.lower_ipu in ipus and link.upper_ipu in ipus)
            )
        chips = {ipu.index: ipu.chip_id for ipu in machine.ipus}
        checksums = {index: program_checksum(seed, chips.get(index, ""), routing) for index, routing in ipus.items()}
        return Observation(ports=tuple(ports), internal=internal, checksums=checksums)

    @staticmethod
    def _read_port(rack: Rack, machine: RackMachine, kind: LinkKind, port: int, with_errors: bool) -> PortReading:
        plugged = rack.plugged(machine.name, kind, port)
        if plugged is None:
            return PortReading(kind, port)
        cable, far = plugged
        far_machine = rack.machine(far.machine)
        up = not cable.broken and not far_machine.faults.silent
        return PortReading(
            kind, port, cable.serial, up,
            peer_serial=far_machine.serial if up else "",
            peer_port=far.port if up else 0,
            errors=cable.errors if with_errors else 0,
        )

    def link_counters(self) -> list[LinkReading]:
        rack = self.rack.current()
        machine = rack.machine(self.machine_name)
        now = time.time()
        readings = []
        for kind in (LinkKind.IPULINK, LinkKind.SYNC, LinkKind.GWLINK):
            for port in range(1, PORT_COUNTS[kind] + 1):
                plugged = rack.plugged(machine.name, kind, port)
                if plugged is None:
                    continue
                cable = plugged[0]
                trained = self._read_port(rack, machine, kind, port, with_errors=False)  # up, and where to, as a test sees it
                place = LinkName.of_port(machine.name, kind, port).place
                corrected, recoveries, up = (cable.degradation.counters(now, self._retrained.get(place, 0.0)) if cable.degradation
                                             else (0, 0, True))
                identity = CableIdentity(cable.serial, cable.vendor or SIM_CABLE_VENDOR, cable.model or SIM_CABLE_MODEL)
                up = up and trained.up
                readings.append(LinkReading(place, corrected, recoveries, up, identity,
                                            trained.peer_serial if up else "", trained.peer_port if up else 0))
        for link in INTERNAL_LINKS:
            degradation = machine.degrading_links.get(link.key)
            corrected, recoveries, up = degradation.counters(now, self._retrained.get(link.key, 0.0)) if degradation else (0, 0, True)
            readings.append(LinkReading(link.key, corrected, recoveries, up and link.key not in machine.broken_links))
        return readings

    def reset_link(self, place: str) -> None:
        """Retrain a link: one going bad over time comes up again, to fail as long after as it did
        first; a broken one (a fault of its cable) stays down."""
        LinkName.parse(f"{self.machine_name}:{place}")
        with self._lock:
            self._retrained[place] = time.time()

    def ipuof_attach(self, partition_id: str, device_id: int, chip_id: str, attach_key: str, session: str = "",
                     hold_seconds: float = 0.0) -> None:
        hold = _checked_seconds("hold_seconds", hold_seconds, MAX_HOLD_SECONDS) or DEFAULT_HOLD_SECONDS
        _check_session(session)
        machine = self.machine()
        _check_chip(machine, device_id, chip_id)
        with self._lock:
            self._admit(machine, partition_id, device_id, attach_key)
            self._attach(machine, partition_id, device_id, session, hold)

    def ipuof_run(self, partition_id: str, device_id: int, chip_id: str, routing_id: int, seed: int, attach_key: str,
                  session: str = "") -> int:
        _check_session(session)
        rack = self.rack.current()
        machine = rack.machine(self.machine_name)
        _check_chip(machine, device_id, chip_id)
        with self._lock:
            self._admit(machine, partition_id, device_id, attach_key)
            self._attach(machine, partition_id, device_id, session, None)
            now = self._clock()
            state = self._advance(device_id, now, machine.faults.hot_ipus.get(device_id, 0.0))
            state.busy_until = min(max(state.busy_until, now) + RUN_WORK_SECONDS, now + MOST_QUEUED_SECONDS)
        time.sleep(PROGRAM_SECONDS * rack.time_scale)
        chip = next(ipu.chip_id for ipu in machine.ipus if ipu.index == device_id)
        return program_checksum(seed, chip, routing_id)

    def ipuof_detach(self, partition_id: str, device_id: int, session: str) -> None:
        if not session:
            raise InvalidArgument("a detach names the client session that attached (AttachRequest.session)")
        _check_session(session)
        _check_chip(self.machine(), device_id, "")
        with self._lock:
            attachment = self._attachments.get((device_id, session))
            if attachment is not None and attachment.partition_id == partition_id:
                del self._attachments[(device_id, session)]

    def attachments(self, partition_ids: Sequence[str], fence_seconds: float = 0.0) -> list[PartitionAttachments]:
        fence = _checked_seconds("fence_seconds", fence_seconds, MAX_FENCE_SECONDS)
        asked = list(dict.fromkeys(partition_ids))
        if "" in asked:
            raise InvalidArgument("a partition id is empty")
        if fence and not asked:
            raise InvalidArgument("a fence names the partitions it is for")
        with self._lock:
            now, wall = self._clock(), time.time()
            self._lapse(now)
            reports = []
            for partition_id in asked or sorted(self._partitions):
                attached = [(session, a.attached_at) for (_, session), a in self._attachments.items() if a.partition_id == partition_id]
                if fence and not attached and partition_id in self._partitions:
                    self._fences[partition_id] = now + fence
                lapses = self._fences.get(partition_id)
                reports.append(PartitionAttachments(
                    partition_id, len({session for session, _ in attached}), min((at for _, at in attached), default=0.0),
                    wall + (lapses - now) if lapses is not None else 0.0))
            return reports

    def _admit(self, machine: RackMachine, partition_id: str, device_id: int, attach_key: str) -> None:
        """Refuse a client the IPU must not take (under the lock, with the attachment it then records)."""
        owner = self._owner.get(device_id)
        settings = self._partitions.get(owner) if owner is not None else None
        if owner is None or settings is None:
            raise PermissionDenied(f"IPU {device_id} of {machine.name} belongs to no partition")
        if owner != partition_id:
            # Never which: the caller proved nothing yet, and partition names are their tenants' own.
            raise PermissionDenied(f"IPU {device_id} of {machine.name} belongs to another partition, not {partition_id}")
        if not hmac.compare_digest(settings.attach_key.encode(), attach_key.encode()):
            raise PermissionDenied(f"the attach key is not partition {partition_id}'s: an IPUoF configuration of an earlier "
                                   "partition of that name, or none")
        self._lapse(self._clock())
        if partition_id in self._fences:
            raise Unavailable(f"partition {partition_id} is being moved; attach again once it is ACTIVE")

    def _attach(self, machine: RackMachine, partition_id: str, device_id: int, session: str, hold: float | None) -> None:
        """Record or renew a session's attachment of an IPU; `hold` None renews it by its own hold."""
        now = self._clock()
        held = self._attachments.get((device_id, session))
        if held is not None and held.partition_id == partition_id:
            held.hold = hold or held.hold
            held.lapses = now + held.hold
            return
        if sum(1 for index, _ in self._attachments if index == device_id) >= MAX_SESSIONS_PER_IPU:
            raise Conflict(f"IPU {device_id} of {machine.name} has {MAX_SESSIONS_PER_IPU} clients attached, the most it takes")
        hold = hold or DEFAULT_HOLD_SECONDS
        self._attachments[(device_id, session)] = Attachment(partition_id, time.time(), hold, now + hold)

    def _lapse(self, now: float) -> None:
        """Forget the attachments and fences whose time is up."""
        for key in [key for key, attachment in self._attachments.items() if attachment.lapses <= now]:
            del self._attachments[key]
        for partition_id in [p for p, lapses in self._fences.items() if lapses <= now]:
            del self._fences[partition_id]

    def _drop(self, partition_id: str, keep_attachments: bool = False) -> None:
        """Forget a partition's settings and its fence, and its clients' attachments unless kept
        (its same settings applied again)."""
        old = self._partitions.pop(partition_id, None)
        if old is not None:
            for ipu in old.ipus:
                self._owner.pop(ipu.index, None)
        self._fences.pop(partition_id, None)
        if not keep_attachments:
            for key in [key for key, attachment in self._attachments.items() if attachment.partition_id == partition_id]:
                del self._attachments[key]

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


def _check_chip(machine: RackMachine, device_id: int, chip_id: str) -> None:
    """That the machine has the IPU, and that it is the chip named (when one is)."""
    chip = next((ipu.chip_id for ipu in machine.ipus if ipu.index == device_id), None)
    if chip is None:
        raise NotFound(f"{machine.name} has no IPU {device_id}")
    if chip_id and chip_id != chip:
        raise InvalidArgument(f"IPU {device_id} of {machine.name} is chip {chip}, not {chip_id}")


def _check_session(session: str) -> None:
    if len(session) > MAX_SESSION_LENGTH or not session.isprintable():
        raise InvalidArgument(f"an IPUoF client session is at most {MAX_SESSION_LENGTH} printable characters")


def _checked_seconds(name: str, seconds: float, most: float) -> float:
    if not (math.isfinite(seconds) and 0 <= seconds <= most):
        raise InvalidArgument(f"{name} must be between 0 and {most:g}, not {seconds:g}")
    return seconds
