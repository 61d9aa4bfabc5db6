"""Rack descriptions: the simulated hardware, its cabling and its faults, in one YAML file.

A rack lists its IPU-Machines in rack order, each with the address its agent listens on, its
IPUoF end-point, component versions, IPUs, RNICs and faults, and then every cable that is really
plugged in: which port of which machine meets which port of which other, with the OSFP cable's
serial id. The simulated machines answer exactly as machines cabled that way would, so a missing
or crossed cable makes the partitions that need it fail, for the real reason.

`generate_rack` writes well-formed racks for the supported topologies, using the very cabling
rules the controller expects (`vipu.model.topology`), so a generated rack is correct by
construction and a fault is a deliberate edit of it.

    name: pod16
    machines:
      - name: m01
        serial: 0024.0001.8200001
        agent: {host: 127.0.0.1, port: 18101}
        ipuof: {host: 127.0.0.1, port: 20101, rdma_port: 22101}
        exporter_port: 24101
        versions: {agent: 0.1.0, gateway-software: 2.5.1, ...}
        faults: {configure: "IPU-Link training failed on IPU 2"}
        link_errors: {ipu1:4C: 521}        # corrected errors on an internal link under traffic
        broken_links: [ipu0:1A]            # internal links that never come up
    cables:
      - {kind: IPU-Link, a: m01:5, b: m02:1, serial: OSFP-I-00001, errors: 327}
      - {kind: Sync-Link, a: m01:6, b: m02:2, broken: true}
    time_scale: 0.01                       # simulated durations, scaled

Faults: remove a cable (missing), swap the ends of two (crossed), move an end to another port
(wrong port), change a version, change an RNIC's `pfc_classes`, give a link `errors` over the
traffic test's threshold of 300, mark a cable or internal link `broken`, set a machine's
`faults.silent` (it does not answer) or `faults.configure` (every partition apply fails).
`faults.wedged` makes every apply fail until the machine is power cycled, `faults.failed_components`
are reported Critical, and `faults.bmc_silent` leaves its power, inventory and health unanswered.
`vipu.backends.sim.faults` does each of these to a rack, and `vipu-sim fault` from the shell.

A machine may take its power, inventory and health from a real BMC instead, while the simulator
keeps its fabric: `drivers: {power: redfish, inventory: redfish, health: redfish}` and a `bmc:`
mapping for `vipu.backends.redfish` (url, credentials file, CA, ...).
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn

import yaml

from vipu import __version__, textfiles
from vipu.model.entities import IPUS_PER_MACHINE, GwTopology, IldTopology, IpuInfo
from vipu.model.errors import InvalidArgument
from vipu.model.topology import INTERNAL_LINKS, PORT_COUNTS, ClusterLayout, LinkKind

DEFAULT_VERSIONS = {
    "agent": __version__,
    "gateway-software": "2.5.1",
    "ipum-software": "2.5.1",
    "ipuof-server": "2.5.1",
    "firmware": "2.4.4",
    "bmc": "2.5.0",
}

RACK_LIMIT_BYTES = 256 << 20  # a rack of thousands of machines is tens of MiB; anything this long is not one
DEFAULT_PFC_CLASSES = [0, 1, 2, 3, 4, 5, 6, 7]
INTERNAL_LINK_KEYS = {link.key for link in INTERNAL_LINKS}
# What a machine may take from a driver other than the simulator.
DRIVEN_CAPABILITIES = ("power", "inventory", "health", "telemetry", "logs")
MACHINE_DRIVERS = ("sim", "redfish")


@dataclass(frozen=True)
class Endpoint:
    machine: str
    port: int

    def __str__(self) -> str:
        return f"{self.machine}:{self.port}"


DEGRADATION_PATTERNS = ("steady", "bursts", "flapping")
BURST_SECONDS = 20.0  # a bursting link's errors come in the first 20 s of each minute


@dataclass(frozen=True)
class Degradation:
    """A link going bad over time, from `since` (seconds since the epoch): its corrected errors
    growing steadily or in bursts, or its recoveries (retraining) repeating, `per_minute` of them,
    until it fails `fails_after` seconds on (0: it never does), or stops getting worse at
    `recovered_at` (0: it has not). A reset of the link retrains it: up again, to fail
    `fails_after` seconds after that (its counters go on)."""

    pattern: str
    since: float
    per_minute: int
    fails_after: float = 0.0
    recovered_at: float = 0.0

    def counters(self, now: float, retrained_at: float = 0.0) -> tuple[int, int, bool]:
        """Its corrected errors, recoveries and whether it is up, at `now`, the link last reset at
        `retrained_at` (0: never)."""
        until = min(now, self.recovered_at) if self.recovered_at else now
        elapsed = max(0.0, until - self.since)
        minutes, into = divmod(elapsed, 60.0)
        trained = max(self.since, retrained_at)
        recovered = bool(self.recovered_at) and now >= self.recovered_at
        up = recovered or not (self.fails_after and now - trained >= self.fails_after)
        if self.pattern == "bursts":
            return int(self.per_minute * (minutes + min(into, BURST_SECONDS) / BURST_SECONDS)), 0, up
        if self.pattern == "flapping":
            recoveries = int(self.per_minute * elapsed / 60.0)
            return recoveries * 10, recoveries, up
        return int(self.per_minute * elapsed / 60.0), 0, up


@dataclass(frozen=True)
class RackCable:
    kind: LinkKind
    a: Endpoint
    b: Endpoint
    serial: str = ""
    errors: int = 0  # corrected errors the link shows under traffic
    broken: bool = False  # plugged in, but the link never comes up
    vendor: str = ""  # the OSFP cable's identity, as its EEPROM gives it
    model: str = ""
    degradation: Degradation | None = None  # its link going bad over time


@dataclass
class Rnic:
    name: str
    pfc_classes: list[int] = field(default_factory=lambda: list(DEFAULT_PFC_CLASSES))


@dataclass
class MachineFaults:
    configure: str = ""  # every partition apply fails with this reason
    apply_delay_ms: int = 0  # each apply and clear takes this long
    silent: bool = False  # the machine does not answer at all
    wedged: str = ""  # every partition apply fails with this reason until the machine is power cycled (or the fault healed)
    failed_components: list[str] = field(default_factory=list)  # the health capability reports these Critical
    bmc_silent: bool = False  # its BMC does not answer: power, inventory and health fail; its IPUs still serve
    ecc_errors: dict[int, int] = field(default_factory=dict)  # IPU index -> corrected ECC errors its telemetry counts
    parity_errors: dict[int, int] = field(default_factory=dict)  # IPU index -> parity errors its telemetry counts
    hot_ipus: dict[int, float] = field(default_factory=dict)  # IPU index -> degrees Celsius it runs above the model's


@dataclass
class RackMachine:
    name: str
    serial: str
    host: str
    port: int
    ipuof_host: str
    ipuof_port: int
    rdma_port: int
    exporter_port: int = 0
    versions: dict[str, str] = field(default_factory=lambda: dict(DEFAULT_VERSIONS))
    ipus: list[IpuInfo] = field(default_factory=list)
    rnics: list[Rnic] = field(default_factory=lambda: [Rnic("eth1")])
    faults: MachineFaults = field(default_factory=MachineFaults)
    # Which implementation gives each capability other than the simulator (`vipu.backends.capabilities`),
    # e.g. {power: redfish, inventory: redfish, health: redfish}, and the BMC the redfish one speaks to.
    drivers: dict[str, str] = field(default_factory=dict)
    bmc: dict = field(default_factory=dict)
    link_errors: dict[str, int] = field(default_factory=dict)  # internal link ("ipu1:4C") -> corrected errors
    broken_links: list[str] = field(default_factory=list)  # internal links that never come up
    degrading_links: dict[str, Degradation] = field(default_factory=dict)  # internal link -> how it goes bad


@dataclass
class Rack:
    name: str
    machines: list[RackMachine]
    cables: list[RackCable]
    time_scale: float = 1.0  # simulated durations (link training, traffic, ...) are multiplied by this

    def machine(self, name: str) -> RackMachine:
        for machine in self.machines:
            if machine.name == name:
                return machine
        raise InvalidArgument(f"rack {self.name} has no machine {name}")

    def plugged(self, machine: str, kind: LinkKind, port: int) -> tuple[RackCable, Endpoint] | None:
        """The cable in a port and the end it reaches, or None if the port is empty."""
        here = Endpoint(machine, port)
        for cable in self.cables:
            if cable.kind is kind and here in (cable.a, cable.b):
                return cable, cable.b if cable.a == here else cable.a
        return None


class IndexedRack(Rack):
    """A rack as read from its file, which its readers do not change: machines and cables are
    found by lookup rather than by scanning, which matters to an agent serving a big rack."""

    def __init__(self, rack: Rack):
        super().__init__(rack.name, rack.machines, rack.cables, rack.time_scale)
        self._machines = {m.name: m for m in self.machines}
        self._ports: dict[tuple[LinkKind, Endpoint], tuple[RackCable, Endpoint]] = {}
        for cable in self.cables:
            self._ports.setdefault((cable.kind, cable.a), (cable, cable.b))
            self._ports.setdefault((cable.kind, cable.b), (cable, cable.a))

    def machine(self, name: str) -> RackMachine:
        try:
            return self._machines[name]
        except KeyError:
            raise InvalidArgument(f"rack {self.name} has no machine {name}") from None

    def plugged(self, machine: str, kind: LinkKind, port: int) -> tuple[RackCable, Endpoint] | None:
        return self._ports.get((kind, Endpoint(machine, port)))


def default_ipus(serial: str) -> list[IpuInfo]:
    ipus = []
    for index in range(4):
        chip = zlib.crc32(f"{serial}/{index}".encode())
        ipus.append(
            IpuInfo(
                index=index,
                chip_id=f"0x{chip:08x}",
                attributes={
                    "board ipu index": str(index),
                    "board serial number": serial,
                    "board type": "M2000",
                    "clock": "1330MHz",
                    "driver version": "1.0.58",
                    "firmware version": DEFAULT_VERSIONS["firmware"],
                    "ipu architecture": "ipu2",
                    "ipu serial number": f"{serial}.{index}",
                },
            )
        )
    return ipus


def generate_rack(
    machines: int,
    *,
    name: str = "pod",
    topology: IldTopology = IldTopology.MESH,
    num_ilds: int = 1,
    host: str = "127.0.0.1",
    agent_base_port: int = 18101,
    with_exporters: bool = False,
    time_scale: float = 1.0,
) -> Rack:
    """A correctly cabled rack of `machines` IPU-Machines in the given topology."""
    if machines < 1:
        raise InvalidArgument("a rack needs at least one machine")
    names = [f"m{i + 1:0{max(2, len(str(machines)))}d}" for i in range(machines)]
    layout = ClusterLayout(names, topology, num_ilds, GwTopology.LOOPED if num_ilds > 1 else None)
    rack_machines = []
    for i, machine_name in enumerate(names):
        serial = f"0024.{i // 256 + 1:04d}.82{i:05d}"
        rack_machines.append(
            RackMachine(
                name=machine_name,
                serial=serial,
                host=host,
                port=agent_base_port + i,
                ipuof_host=host,
                ipuof_port=agent_base_port + 2000 + i,
                rdma_port=agent_base_port + 4000 + i,
                exporter_port=agent_base_port + 6000 + i if with_exporters else 0,
                ipus=default_ipus(serial),
            )
        )
    cables = []
    prefixes = {LinkKind.IPULINK: "I", LinkKind.SYNC: "S", LinkKind.GWLINK: "G"}
    for n, cable in enumerate(layout.cables()):
        kind = cable.lower.kind
        serial = f"OSFP-{prefixes[kind]}-{n + 1:05d}" if kind is not LinkKind.SYNC else ""
        cables.append(
            RackCable(kind, Endpoint(cable.lower.agent_id, cable.lower.number), Endpoint(cable.upper.agent_id, cable.upper.number), serial)
        )
    return Rack(name, rack_machines, cables, time_scale)


def rack_to_data(rack: Rack) -> dict:
    machines = []
    for m in rack.machines:
        entry: dict = {
            "name": m.name,
            "serial": m.serial,
            "agent": {"host": m.host, "port": m.port},
            "ipuof": {"host": m.ipuof_host, "port": m.ipuof_port, "rdma_port": m.rdma_port},
            "exporter_port": m.exporter_port,
            "versions": dict(m.versions),
            "rnics": [{"name": r.name, "pfc_classes": list(r.pfc_classes)} for r in m.rnics],
        }
        if m.ipus != default_ipus(m.serial):
            entry["ipus"] = [{"index": i.index, "chip_id": i.chip_id, "attributes": dict(i.attributes)} for i in m.ipus]
        faults = {k: v for k, v in vars(m.faults).items() if v}
        if faults:
            entry["faults"] = faults
        if m.drivers:
            entry["drivers"] = dict(m.drivers)
        if m.bmc:
            entry["bmc"] = dict(m.bmc)
        if m.link_errors:
            entry["link_errors"] = dict(m.link_errors)
        if m.broken_links:
            entry["broken_links"] = list(m.broken_links)
        if m.degrading_links:
            entry["degrading_links"] = {key: vars(d).copy() for key, d in m.degrading_links.items()}
        machines.append(entry)
    cables = []
    for c in rack.cables:
        entry = {"kind": c.kind.value, "a": str(c.a), "b": str(c.b)}
        if c.serial:
            entry["serial"] = c.serial
        if c.errors:
            entry["errors"] = c.errors
        if c.broken:
            entry["broken"] = True
        if c.vendor or c.model:
            entry["vendor"], entry["model"] = c.vendor, c.model
        if c.degradation is not None:
            entry["degrading"] = vars(c.degradation).copy()
        cables.append(entry)
    return {"name": rack.name, "time_scale": rack.time_scale, "machines": machines, "cables": cables}


# libyaml's safe loader and dumper when PyYAML was built with it: ten times faster on a big rack.
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_DUMPER = getattr(yaml, "CSafeDumper", yaml.SafeDumper)


def save_rack(rack: Rack, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(yaml.dump(rack_to_data(rack), Dumper=_DUMPER, sort_keys=False, width=120))
    tmp.replace(path)


class _Reader:
    """Reads one rack document, naming the place of any mistake in the error."""

    def __init__(self, source: str):
        self.source = source

    def fail(self, where: str, problem: str) -> NoReturn:
        raise InvalidArgument(f"{self.source}: {where}: {problem}")

    def mapping(self, value, where: str) -> dict:
        if not isinstance(value, dict):
            self.fail(where, "expected a mapping")
        return value

    def text(self, data: dict, key: str, where: str, default: str | None = None) -> str:
        value = data.get(key, default)
        if value is None:
            self.fail(where, f"'{key}' is missing")
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            self.fail(where, f"'{key}' must be text")
        return str(value)

    def listing(self, data: dict, key: str, where: str) -> list:
        value = data.get(key, [])
        if not isinstance(value, list):
            self.fail(where, f"'{key}' must be a list")
        return value

    def drivers(self, value, where: str) -> dict[str, str]:
        drivers = self.mapping(value, where)
        for capability, driver in drivers.items():
            if capability not in DRIVEN_CAPABILITIES:
                self.fail(where, f"{capability!r} is not a capability another driver can give; these are {', '.join(DRIVEN_CAPABILITIES)}")
            if driver not in MACHINE_DRIVERS:
                self.fail(where, f"{capability}: no driver {driver!r}; there are {', '.join(MACHINE_DRIVERS)}")
        return {str(k): str(v) for k, v in drivers.items()}

    def flag(self, data: dict, key: str, where: str) -> bool:
        value = data.get(key, False)
        if not isinstance(value, bool):
            self.fail(where, f"'{key}' must be true or false, not {value!r}")
        return value

    def internal_link(self, value, where: str) -> str:
        if value not in INTERNAL_LINK_KEYS:
            self.fail(where, f"{value!r} is not an internal link; they are named ipuN:PL, e.g. {INTERNAL_LINKS[-2].key}")
        return value

    def number(self, data: dict, key: str, where: str, default: int | None = None, low: int = 0, high: int = 65535) -> int:
        value = data.get(key, default)
        if value is None:
            self.fail(where, f"'{key}' is missing")
        if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
            self.fail(where, f"'{key}' must be a whole number from {low} to {high}, not {value!r}")
        return value

    def endpoint(self, value, where: str, machines: set[str], kind: LinkKind) -> Endpoint:
        if not isinstance(value, str) or value.count(":") != 1:
            self.fail(where, f"an end must be written MACHINE:PORT, not {value!r}")
        machine, _, port = value.partition(":")
        if machine not in machines:
            self.fail(where, f"no machine named {machine!r}")
        if not port.isdigit() or not 1 <= int(port) <= PORT_COUNTS[kind]:
            self.fail(where, f"{kind.value} ports are numbered 1 to {PORT_COUNTS[kind]}, not {port!r}")
        return Endpoint(machine, int(port))

    def machine(self, data, index: int) -> RackMachine:
        where = f"machines[{index}]"
        data = self.mapping(data, where)
        name = self.text(data, "name", where)
        serial = self.text(data, "serial", where)
        agent = self.mapping(data.get("agent", {}), f"{where}.agent")
        ipuof = self.mapping(data.get("ipuof", {}), f"{where}.ipuof")
        host = self.text(agent, "host", f"{where}.agent", "127.0.0.1")
        versions = self.mapping(data.get("versions", dict(DEFAULT_VERSIONS)), f"{where}.versions")
        faults = self.mapping(data.get("faults", {}), f"{where}.faults")
        unknown = set(faults) - set(vars(MachineFaults()))
        if unknown:
            self.fail(f"{where}.faults", f"unknown fault {sorted(unknown)[0]!r}")
        rnics = data.get("rnics", [{"name": "eth1"}])
        if not isinstance(rnics, list):
            self.fail(f"{where}.rnics", "expected a list")
        ipus = data.get("ipus")
        if ipus is not None and not isinstance(ipus, list):
            self.fail(f"{where}.ipus", "expected a list")
        link_errors = self.mapping(data.get("link_errors", {}), f"{where}.link_errors")
        broken_links = data.get("broken_links", [])
        if not isinstance(broken_links, list):
            self.fail(f"{where}.broken_links", "expected a list")
        return RackMachine(
            name=name,
            serial=serial,
            host=host,
            port=self.number(agent, "port", f"{where}.agent", low=1),
            ipuof_host=self.text(ipuof, "host", f"{where}.ipuof", host),
            ipuof_port=self.number(ipuof, "port", f"{where}.ipuof", 0),
            rdma_port=self.number(ipuof, "rdma_port", f"{where}.ipuof", 0),
            exporter_port=self.number(data, "exporter_port", where, 0),
            versions={str(k): str(v) for k, v in versions.items()},
            ipus=[self.ipu(ipu, f"{where}.ipus[{i}]") for i, ipu in enumerate(ipus)] if ipus is not None else default_ipus(serial),
            rnics=[self.rnic(r, f"{where}.rnics[{i}]") for i, r in enumerate(rnics)],
            faults=MachineFaults(
                configure=self.text(faults, "configure", f"{where}.faults", ""),
                apply_delay_ms=self.number(faults, "apply_delay_ms", f"{where}.faults", 0, high=600_000),
                silent=self.flag(faults, "silent", f"{where}.faults"),
                wedged=self.text(faults, "wedged", f"{where}.faults", ""),
                failed_components=[str(c) for c in self.listing(faults, "failed_components", f"{where}.faults")],
                bmc_silent=self.flag(faults, "bmc_silent", f"{where}.faults"),
                ecc_errors=self.per_ipu(faults, "ecc_errors", f"{where}.faults", 10**12),
                parity_errors=self.per_ipu(faults, "parity_errors", f"{where}.faults", 10**12),
                hot_ipus=self.per_ipu(faults, "hot_ipus", f"{where}.faults", 200),
            ),
            drivers=self.drivers(data.get("drivers", {}), f"{where}.drivers"),
            bmc=self.mapping(data.get("bmc", {}), f"{where}.bmc"),
            link_errors={
                self.internal_link(k, f"{where}.link_errors"): self.number(link_errors, k, f"{where}.link_errors", high=10**9)
                for k in link_errors
            },
            broken_links=[self.internal_link(k, f"{where}.broken_links[{i}]") for i, k in enumerate(broken_links)],
            degrading_links={self.internal_link(k, f"{where}.degrading_links"): self.degradation(v, f"{where}.degrading_links.{k}")
                             for k, v in self.mapping(data.get("degrading_links", {}), f"{where}.degrading_links").items()},
        )

    def per_ipu(self, data: dict, key: str, where: str, high: int) -> dict:
        """A mapping of IPU index (0 to 3) to a number from 0 to `high`."""
        given = self.mapping(data.get(key, {}), f"{where}.{key}")
        values = {}
        for index, value in given.items():
            if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < IPUS_PER_MACHINE:
                self.fail(f"{where}.{key}", f"{index!r} is not an IPU index (0 to {IPUS_PER_MACHINE - 1})")
            if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value <= high:
                self.fail(f"{where}.{key}.{index}", f"expected a number from 0 to {high}")
            values[index] = value
        return values

    def ipu(self, data, where: str) -> IpuInfo:
        data = self.mapping(data, where)
        attributes = self.mapping(data.get("attributes", {}), f"{where}.attributes")
        return IpuInfo(
            index=self.number(data, "index", where, high=3),
            chip_id=self.text(data, "chip_id", where),
            attributes={str(k): str(v) for k, v in attributes.items()},
        )

    def rnic(self, data, where: str) -> Rnic:
        data = self.mapping(data, where)
        classes = data.get("pfc_classes", list(DEFAULT_PFC_CLASSES))
        if not isinstance(classes, list) or not all(isinstance(c, int) and not isinstance(c, bool) for c in classes):
            self.fail(where, "'pfc_classes' must be a list of whole numbers")
        return Rnic(self.text(data, "name", where), list(classes))

    def cable(self, data, index: int, machines: set[str]) -> RackCable:
        where = f"cables[{index}]"
        data = self.mapping(data, where)
        kind_name = self.text(data, "kind", where)
        kinds = {k.value: k for k in LinkKind}
        if kind_name not in kinds:
            self.fail(where, f"kind must be one of {', '.join(kinds)}, not {kind_name!r}")
        kind = kinds[kind_name]
        return RackCable(
            kind=kind,
            a=self.endpoint(data.get("a"), f"{where}.a", machines, kind),
            b=self.endpoint(data.get("b"), f"{where}.b", machines, kind),
            serial=self.text(data, "serial", where, ""),
            errors=self.number(data, "errors", where, 0, high=10**9),
            broken=self.flag(data, "broken", where),
            vendor=self.text(data, "vendor", where, ""),
            model=self.text(data, "model", where, ""),
            degradation=self.degradation(data["degrading"], f"{where}.degrading") if "degrading" in data else None,
        )

    def degradation(self, data, where: str) -> Degradation:
        data = self.mapping(data, where)
        pattern = self.text(data, "pattern", where)
        if pattern not in DEGRADATION_PATTERNS:
            self.fail(where, f"pattern must be one of {', '.join(DEGRADATION_PATTERNS)}, not {pattern!r}")
        times = {}
        for key in ("since", "fails_after", "recovered_at"):
            value = data.get(key, 0.0)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                self.fail(f"{where}.{key}", "expected a number of seconds, 0 or more")
            times[key] = float(value)
        return Degradation(pattern, times["since"], self.number(data, "per_minute", where, high=10**9), times["fails_after"],
                           times["recovered_at"])


def _document(text: str, reader: _Reader):
    """The YAML document; a mistake is placed by the pure-Python loader, whose marks are finer."""
    try:
        return yaml.load(text, Loader=_LOADER)
    except yaml.YAMLError:
        pass
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as error:
        mark = getattr(error, "problem_mark", None)
        at = f"line {mark.line + 1}" if mark else "document"
        problem = " ".join(str(getattr(error, "problem", None) or error).split())  # one line, as every refusal
        reader.fail(at, f"not valid YAML ({problem})")


def parse_rack(text: str, source: str = "rack") -> Rack:
    reader = _Reader(source)
    data = _document(text, reader)
    data = reader.mapping(data, "document")
    raw_machines = data.get("machines")
    if not isinstance(raw_machines, list) or not raw_machines:
        reader.fail("machines", "a rack needs a non-empty list of machines")
    machines = [reader.machine(m, i) for i, m in enumerate(raw_machines)]
    for attribute, label in (("name", "name"), ("serial", "serial"), ("address", "agent address")):
        seen: dict = {}
        for i, m in enumerate(machines):
            key = (m.host, m.port) if attribute == "address" else getattr(m, attribute)
            if key in seen:
                reader.fail(f"machines[{i}]", f"{label} {key} is also used by machines[{seen[key]}]")
            seen[key] = i
    names = {m.name for m in machines}
    raw_cables = data.get("cables", [])
    if not isinstance(raw_cables, list):
        reader.fail("cables", "expected a list")
    cables = [reader.cable(c, i, names) for i, c in enumerate(raw_cables)]
    used: dict[tuple, int] = {}
    for i, cable in enumerate(cables):
        for end in (cable.a, cable.b):
            key = (cable.kind, end)
            if key in used:
                reader.fail(f"cables[{i}]", f"{cable.kind.value} port {end} already holds cables[{used[key]}]")
            used[key] = i
    scale = data.get("time_scale", 1.0)
    if not isinstance(scale, (int, float)) or isinstance(scale, bool) or not 0 <= scale <= 1000:
        reader.fail("time_scale", f"must be a number from 0 to 1000, not {scale!r}")
    return Rack(reader.text(data, "name", "document", "rack"), machines, cables, float(scale))


def load_rack(path: Path) -> Rack:
    return parse_rack(textfiles.read_text(Path(path), RACK_LIMIT_BYTES, "a rack description", "rack description "), str(path))
