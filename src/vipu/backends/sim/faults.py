"""Faults, written into a rack: each function edits a `Rack` the way a technician (or time) would.

Tests and benchmarks start from a well-formed rack (`generate_rack`) and apply the faults they
need; `vipu-sim fault` does the same from the shell. Every function checks that what it names
exists, so a typo is an error rather than a fault that silently never happens.
"""

from __future__ import annotations

from dataclasses import replace

from vipu.backends.sim.rack import DEGRADATION_PATTERNS, Degradation, Endpoint, Rack, RackCable
from vipu.model.entities import IPUS_PER_MACHINE
from vipu.model.errors import InvalidArgument
from vipu.model.topology import INTERNAL_LINKS, PORT_COUNTS, LinkKind

KIND_NAMES = {
    "ipu-link": LinkKind.IPULINK, "ipulink": LinkKind.IPULINK,
    "sync-link": LinkKind.SYNC, "sync": LinkKind.SYNC, "synclink": LinkKind.SYNC,
    "gw-link": LinkKind.GWLINK, "gwlink": LinkKind.GWLINK, "gw": LinkKind.GWLINK,
}


def kind_named(name: str) -> LinkKind:
    try:
        return KIND_NAMES[name.lower()]
    except KeyError:
        raise InvalidArgument(f"unknown link kind {name!r}: use IPU-Link, Sync-Link or GW-Link") from None


def _cable_at(rack: Rack, machine: str, kind: LinkKind, port: int) -> tuple[int, RackCable]:
    rack.machine(machine)
    for index, cable in enumerate(rack.cables):
        if cable.kind is kind and Endpoint(machine, port) in (cable.a, cable.b):
            return index, cable
    raise InvalidArgument(f"no {kind.value} cable is plugged into {machine}:{port}")


def _moved(cable: RackCable, old: Endpoint, new: Endpoint) -> RackCable:
    return replace(cable, a=new) if cable.a == old else replace(cable, b=new)


def unplug(rack: Rack, machine: str, kind: LinkKind, port: int) -> None:
    """A missing cable."""
    index, _ = _cable_at(rack, machine, kind, port)
    del rack.cables[index]


def cross(rack: Rack, machine: str, kind: LinkKind, port: int, other_machine: str, other_port: int) -> None:
    """Two cables swapped at one end: each now sits where the other should."""
    first, cable = _cable_at(rack, machine, kind, port)
    second, other = _cable_at(rack, other_machine, kind, other_port)
    here, there = Endpoint(machine, port), Endpoint(other_machine, other_port)
    rack.cables[first] = _moved(cable, here, there)
    rack.cables[second] = _moved(other, there, here)


def move(rack: Rack, machine: str, kind: LinkKind, port: int, new_port: int) -> None:
    """A cable end plugged into the wrong (free) port of the same machine."""
    if not 1 <= new_port <= PORT_COUNTS[kind]:
        raise InvalidArgument(f"{kind.value} ports are numbered 1 to {PORT_COUNTS[kind]}, not {new_port}")
    index, cable = _cable_at(rack, machine, kind, port)
    if rack.plugged(machine, kind, new_port) is not None:
        raise InvalidArgument(f"there is already a cable in {kind.value} port {machine}:{new_port}")
    rack.cables[index] = _moved(cable, Endpoint(machine, port), Endpoint(machine, new_port))


def _internal_key(link: str) -> str:
    keys = {item.key for item in INTERNAL_LINKS}
    if link not in keys:
        raise InvalidArgument(f"{link!r} is not an internal link; they are named ipuN:PL, e.g. ipu1:4C")
    return link


def set_errors(rack: Rack, machine: str, link: str, errors: int, kind: LinkKind = LinkKind.IPULINK) -> None:
    """Corrected errors on a link under traffic: a chassis port's cable ("5") or an internal link ("ipu1:4C")."""
    if link.isdigit():
        index, cable = _cable_at(rack, machine, kind, int(link))
        rack.cables[index] = replace(cable, errors=errors)
    else:
        rack.machine(machine).link_errors[_internal_key(link)] = errors


def break_link(rack: Rack, machine: str, link: str, kind: LinkKind = LinkKind.IPULINK) -> None:
    """A link that never comes up: a chassis port's cable ("6", of `kind`) or an internal link."""
    if link.isdigit():
        index, cable = _cable_at(rack, machine, kind, int(link))
        rack.cables[index] = replace(cable, broken=True)
    else:
        broken = rack.machine(machine).broken_links
        if _internal_key(link) not in broken:
            broken.append(link)


def set_version(rack: Rack, machine: str, component: str, version: str) -> None:
    versions = rack.machine(machine).versions
    if component not in versions:
        raise InvalidArgument(f"{machine} has no component {component!r}; it has {', '.join(sorted(versions))}")
    versions[component] = version


def set_pfc_classes(rack: Rack, machine: str, rnic: str, classes: list[int]) -> None:
    for candidate in rack.machine(machine).rnics:
        if candidate.name == rnic:
            candidate.pfc_classes = list(classes)
            return
    raise InvalidArgument(f"{machine} has no RNIC {rnic!r}")


def silence(rack: Rack, machine: str) -> None:
    """A machine that does not answer."""
    rack.machine(machine).faults.silent = True


def fail_configuration(rack: Rack, machine: str, reason: str) -> None:
    """A machine whose every partition apply fails with `reason`."""
    rack.machine(machine).faults.configure = reason


def wedge(rack: Rack, machine: str, reason: str) -> None:
    """A machine whose every partition apply fails with `reason` until it is power cycled."""
    rack.machine(machine).faults.wedged = reason


def fail_component(rack: Rack, machine: str, component: str) -> None:
    """A part of the machine (fan1, psu2, ...) its health capability reports Critical."""
    failed = rack.machine(machine).faults.failed_components
    if component not in failed:
        failed.append(component)


def silence_bmc(rack: Rack, machine: str) -> None:
    """A machine whose BMC does not answer: its power, inventory and health fail; its IPUs still serve."""
    rack.machine(machine).faults.bmc_silent = True


def _ipu_index(ipu: str) -> int:
    name = ipu.removeprefix("ipu")
    if not name.isdigit() or not 0 <= int(name) < IPUS_PER_MACHINE:
        raise InvalidArgument(f"{ipu!r} is not an IPU of a machine: ipu0 to ipu{IPUS_PER_MACHINE - 1}")
    return int(name)


def count_ipu_errors(rack: Rack, machine: str, ipu: str, kind: str, count: int) -> None:
    """An IPU whose telemetry counts `count` corrected errors of `kind` (ecc or parity) in all."""
    faults = rack.machine(machine).faults
    counters = {"ecc": faults.ecc_errors, "parity": faults.parity_errors}
    if kind not in counters:
        raise InvalidArgument(f"unknown IPU error kind {kind!r}: ecc or parity")
    if count < 0:
        raise InvalidArgument(f"an error count is 0 or more, not {count}")
    counters[kind][_ipu_index(ipu)] = count


def heat(rack: Rack, machine: str, ipu: str, celsius: float) -> None:
    """An IPU that runs `celsius` hotter than the model says (a blocked air flow); 0 cools it again."""
    if not 0 <= celsius <= 200:
        raise InvalidArgument(f"an IPU runs 0 to 200 degrees hotter, not {celsius:g}")
    index = _ipu_index(ipu)
    hot = rack.machine(machine).faults.hot_ipus
    if celsius:
        hot[index] = celsius
    else:
        hot.pop(index, None)


def slow_down(rack: Rack, machine: str, delay_ms: int) -> None:
    """A machine whose every partition apply and clear takes `delay_ms`."""
    rack.machine(machine).faults.apply_delay_ms = delay_ms


def degrade(rack: Rack, machine: str, link: str, pattern: str, per_minute: int, since: float, fails_after: float = 0.0,
            kind: LinkKind = LinkKind.IPULINK) -> None:
    """A link that goes bad from `since`: errors growing steadily or in bursts, or recoveries
    repeating (flapping), `per_minute` of them, until it fails `fails_after` seconds on (0: never)."""
    if pattern not in DEGRADATION_PATTERNS:
        raise InvalidArgument(f"a link degrades {', '.join(DEGRADATION_PATTERNS)}, not {pattern!r}")
    if per_minute < 1 or fails_after < 0:
        raise InvalidArgument("a degrading link has 1 or more events a minute and fails after 0 seconds or more (0: never)")
    degradation = Degradation(pattern, since, per_minute, fails_after)
    if link.isdigit():
        index, cable = _cable_at(rack, machine, kind, int(link))
        rack.cables[index] = replace(cable, degradation=degradation)
    else:
        rack.machine(machine).degrading_links[_internal_key(link)] = degradation


def recover(rack: Rack, machine: str, link: str, at: float, kind: LinkKind = LinkKind.IPULINK) -> None:
    """A degrading link that stops getting worse at `at` (and comes back up, if it had failed)."""
    if link.isdigit():
        index, cable = _cable_at(rack, machine, kind, int(link))
        if cable.degradation is None:
            raise InvalidArgument(f"the {kind.value} link at {machine}:{link} is not degrading")
        rack.cables[index] = replace(cable, degradation=replace(cable.degradation, recovered_at=at))
    else:
        degrading = rack.machine(machine).degrading_links
        if _internal_key(link) not in degrading:
            raise InvalidArgument(f"the link {machine}:{link} is not degrading")
        degrading[link] = replace(degrading[link], recovered_at=at)


def swap_cable(rack: Rack, machine: str, kind: LinkKind, port: int, serial: str, vendor: str = "", model: str = "") -> None:
    """The cable in a port replaced by another (`serial`): a new cable, its link healthy."""
    if not serial:
        raise InvalidArgument("a replacement cable has a serial number")
    index, cable = _cable_at(rack, machine, kind, port)
    if serial == cable.serial:
        raise InvalidArgument(f"the cable at {machine}:{port} has serial {serial} already")
    rack.cables[index] = replace(cable, serial=serial, vendor=vendor or cable.vendor, model=model or cable.model, degradation=None,
                                 errors=0, broken=False)
