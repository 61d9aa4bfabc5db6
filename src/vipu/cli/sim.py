"""`vipu-sim`: write rack descriptions for the simulated backend, and put faults into them.

    vipu-sim rack pod.yaml --machines 64 --topology torus --ilds 2 --time-scale 0.01
    vipu-sim fault pod.yaml --unplug m03:IPU-Link:5 --version m08:agent=1.5.1 --pfc m05:eth1=0,2
    vipu-agent --rack pod.yaml --all-machines

Agents serving a rack re-read it when it changes, so faults can be put into a running pod.
"""

from __future__ import annotations

import time
from pathlib import Path

import click

from vipu.backends.sim import faults
from vipu.backends.sim.machinelog import machine_log_path, write_lines
from vipu.backends.sim.rack import generate_rack, load_rack, save_rack
from vipu.cli.common import CONTEXT, CommandGroup, fail, run
from vipu.model.entities import IldTopology
from vipu.model.errors import InvalidArgument, VipuError


@click.group(cls=CommandGroup, context_settings=CONTEXT)
def cli():
    """Rack descriptions for simulated IPU-Machines, and the faults in them."""


@cli.command("rack")
@click.argument("output", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--machines", type=click.IntRange(1, 4096), required=True, help="IPU-Machines in the rack (4 IPUs each).")
@click.option("--topology", type=click.Choice(["mesh", "torus"]), default="mesh", show_default=True)
@click.option("--ilds", type=click.IntRange(1, 1024), default=1, show_default=True, help="IPU-Link domains, joined by looped GW-Links.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address of the agents and IPUoF end-points.")
@click.option("--base-port", type=click.IntRange(1024, 65535 - 6 * 4096), default=18101, show_default=True,
              help="Port of the first agent; the others follow. IPUoF ports are 2000 above, RDMA 4000, exporters 6000.")
@click.option("--exporters", is_flag=True, help="Give every agent an OpenMetrics exporter.")
@click.option("--time-scale", type=click.FloatRange(0, 1000), default=1.0, show_default=True,
              help="Scale of simulated durations (link training, traffic, ...); 0.01 is a hundred times faster.")
@click.option("--name", default=None, help="Name of the rack. Default: pod<machines>.")
def make_rack(output, machines, topology, ilds, host, base_port, exporters, time_scale, name):
    """Write a correctly cabled rack description."""
    try:
        rack = generate_rack(machines, name=name or f"pod{machines}", topology=IldTopology(topology), num_ilds=ilds,
                             host=host, agent_base_port=base_port, with_exporters=exporters, time_scale=time_scale)
        save_rack(rack, output)
    except VipuError as error:
        fail("rack", str(output), error.message)
    except OSError as error:
        fail("rack", str(output), error.strerror or str(error))
    click.echo(f"rack ({output}): success. {machines} machines, {len(rack.cables)} cables.")


def _split(value: str, separator: str, what: str) -> tuple[str, str]:
    left, found, right = value.partition(separator)
    if not found or not left:
        raise InvalidArgument(f"{value!r}: expected {what}")
    return left, right


def _port_end(value: str) -> tuple[str, faults.LinkKind, int]:
    parts = value.split(":")
    if len(parts) != 3 or not parts[2].isdigit():
        raise InvalidArgument(f"{value!r}: expected MACHINE:KIND:PORT, e.g. m01:IPU-Link:5")
    return parts[0], faults.kind_named(parts[1]), int(parts[2])


def _link(value: str) -> tuple[str, str, faults.LinkKind]:
    """MACHINE:KIND:PORT for a cable, or MACHINE:ipuN:PL for a link inside a machine."""
    machine, rest = _split(value, ":", "MACHINE:KIND:PORT or MACHINE:ipuN:PL")
    if rest.startswith("ipu"):
        return machine, rest, faults.LinkKind.IPULINK
    kind, port = _split(rest, ":", "MACHINE:KIND:PORT")
    if not port.isdigit():
        raise InvalidArgument(f"{value!r}: the port must be a number")
    return machine, port, faults.kind_named(kind)


@cli.command("fault")
@click.argument("rack_path", type=click.Path(dir_okay=False, path_type=Path))
@click.option("--unplug", multiple=True, metavar="M:KIND:PORT", help="Remove the cable in this port.")
@click.option("--cross", multiple=True, metavar="M:KIND:PORT,M:PORT", help="Swap the cables in two ports.")
@click.option("--move", multiple=True, metavar="M:KIND:PORT=NEW", help="Move a cable end to another (free) port.")
@click.option("--errors", multiple=True, metavar="LINK=N", help="Corrected errors under traffic on M:KIND:PORT or M:ipuN:PL.")
@click.option("--break", "broken", multiple=True, metavar="LINK", help="A link that never comes up: M:KIND:PORT or M:ipuN:PL.")
@click.option("--version", "versions", multiple=True, metavar="M:COMPONENT=V", help="A component's version on a machine.")
@click.option("--pfc", multiple=True, metavar="M:RNIC=C,C,...", help="The PFC classes of an RNIC (empty for none).")
@click.option("--silent", multiple=True, metavar="M", help="A machine that does not answer.")
@click.option("--configure-fault", multiple=True, metavar="M=REASON", help="A machine whose partition configuration fails.")
@click.option("--wedge", multiple=True, metavar="M=REASON", help="A machine whose partition configuration fails until it is power cycled.")
@click.option("--fail-component", multiple=True, metavar="M:COMPONENT", help="A part (fan1..fan5, psu1, psu2, ...) reported Critical.")
@click.option("--silent-bmc", multiple=True, metavar="M", help="A machine whose BMC does not answer (its IPUs still serve).")
@click.option("--degrade", multiple=True, metavar="LINK=PATTERN:N[:S]",
              help="A link going bad from now: PATTERN steady or bursts (N corrected errors a minute) or flapping (N recoveries a "
                   "minute), failing after S seconds if given. LINK: M:KIND:PORT or M:ipuN:PL.")
@click.option("--recover", multiple=True, metavar="LINK", help="A degrading link that stops getting worse from now (and is up again).")
@click.option("--swap-cable", multiple=True, metavar="M:KIND:PORT=SERIAL", help="The cable in a port replaced by a new one.")
@click.option("--ipu-errors", multiple=True, metavar="M:ipuN:KIND=N", help="An IPU's corrected errors in all (KIND: ecc or parity).")
@click.option("--heat", multiple=True, metavar="M:ipuN=CELSIUS", help="An IPU running this much hotter than it should (0: cooled).")
@click.option("--log", "log_lines", multiple=True, metavar="M=TEXT", help="A line in the machine's own log.")
@click.option("--log-repeat", type=click.IntRange(1, 1_000_000), default=1, show_default=True,
              help="Write each --log line this many times (a machine flooding its log).")
def fault(rack_path, unplug, cross, move, errors, broken, versions, pfc, silent, configure_fault, wedge, fail_component, silent_bmc,
          degrade, recover, swap_cable, ipu_errors, heat, log_lines, log_repeat):
    """Put faults into a rack description, all at once or not at all.

    Each fault is also written, a line, into the log of the machine it names (beside the rack, in
    machine-logs/), as the machine would log what happened to it."""
    written: dict[str, list[str]] = {}
    try:
        rack = load_rack(rack_path)
        for value in unplug:
            faults.unplug(rack, *_port_end(value))
        for value in cross:
            first, second = _split(value, ",", "M:KIND:PORT,M:PORT")
            machine, kind, port = _port_end(first)
            other, other_port = _split(second, ":", "M:PORT")
            if not other_port.isdigit():
                raise InvalidArgument(f"{value!r}: the second port must be a number")
            faults.cross(rack, machine, kind, port, other, int(other_port))
        for value in move:
            end, new_port = _split(value, "=", "M:KIND:PORT=NEWPORT")
            if not new_port.isdigit():
                raise InvalidArgument(f"{value!r}: the new port must be a number")
            faults.move(rack, *_port_end(end), int(new_port))
        for value in errors:
            link, count = _split(value, "=", "LINK=N")
            if not count.isdigit():
                raise InvalidArgument(f"{value!r}: the error count must be a number")
            machine, name, kind = _link(link)
            faults.set_errors(rack, machine, name, int(count), kind)
        for value in broken:
            machine, name, kind = _link(value)
            faults.break_link(rack, machine, name, kind)
        for value in versions:
            where, version = _split(value, "=", "M:COMPONENT=VERSION")
            machine, component = _split(where, ":", "M:COMPONENT=VERSION")
            faults.set_version(rack, machine, component, version)
        for value in pfc:
            where, classes = _split(value, "=", "M:RNIC=C,C,...")
            machine, rnic = _split(where, ":", "M:RNIC=C,C,...")
            numbers = [c.strip() for c in classes.split(",") if c.strip()]
            if not all(c.isdigit() for c in numbers):
                raise InvalidArgument(f"{value!r}: PFC classes are numbers")
            faults.set_pfc_classes(rack, machine, rnic, [int(c) for c in numbers])
        for machine in silent:
            faults.silence(rack, machine)
        for value in configure_fault:
            machine, reason = _split(value, "=", "M=REASON")
            faults.fail_configuration(rack, machine, reason)
        for value in wedge:
            machine, reason = _split(value, "=", "M=REASON")
            faults.wedge(rack, machine, reason)
        for value in fail_component:
            machine, component = _split(value, ":", "M:COMPONENT")
            faults.fail_component(rack, machine, component)
        for machine in silent_bmc:
            faults.silence_bmc(rack, machine)
        now = time.time()
        for value in degrade:
            link, how = _split(value, "=", "LINK=PATTERN:N[:SECONDS]")
            pattern, _, rates = how.partition(":")
            rate, _, fails_after = rates.partition(":")
            if not rate.isdigit() or not (fails_after.isdigit() or not fails_after):
                raise InvalidArgument(f"{value!r}: expected LINK=PATTERN:N[:SECONDS], e.g. m03:IPU-Link:5=steady:30:3600")
            machine, name, kind = _link(link)
            faults.degrade(rack, machine, name, pattern, int(rate), now, float(fails_after or 0), kind)
        for value in recover:
            machine, name, kind = _link(value)
            faults.recover(rack, machine, name, now, kind)
        for value in swap_cable:
            end, serial = _split(value, "=", "M:KIND:PORT=SERIAL")
            faults.swap_cable(rack, *_port_end(end), serial)
        for value in ipu_errors:
            where, count = _split(value, "=", "M:ipuN:KIND=N")
            machine, rest = _split(where, ":", "M:ipuN:KIND=N")
            ipu, error_kind = _split(rest, ":", "M:ipuN:KIND=N")
            if not count.isdigit():
                raise InvalidArgument(f"{value!r}: the error count must be a number")
            faults.count_ipu_errors(rack, machine, ipu, error_kind, int(count))
        for value in heat:
            where, celsius = _split(value, "=", "M:ipuN=CELSIUS")
            machine, ipu = _split(where, ":", "M:ipuN=CELSIUS")
            try:
                faults.heat(rack, machine, ipu, float(celsius))
            except ValueError:
                raise InvalidArgument(f"{value!r}: the degrees must be a number") from None
        logged = []
        for value in log_lines:
            machine, text = _split(value, "=", "M=TEXT")
            rack.machine(machine)
            logged.append((machine, [text] * log_repeat))
        save_rack(rack, rack_path)
        options = {"unplug": unplug, "cross": cross, "move": move, "errors": errors, "break": broken, "version": versions,
                   "pfc": pfc, "silent": silent, "configure-fault": configure_fault, "wedge": wedge,
                   "fail-component": fail_component, "silent-bmc": silent_bmc, "degrade": degrade, "recover": recover,
                   "swap-cable": swap_cable, "ipu-errors": ipu_errors, "heat": heat}
        for option, values in options.items():
            for value in values:
                machine = value.split(":")[0].split("=")[0]
                written.setdefault(machine, []).append(f"fault injected: --{option} {value}")
        for machine, lines in logged:
            written.setdefault(machine, []).extend(lines)
    except VipuError as error:
        fail("fault", str(rack_path), error.message)
    except OSError as error:
        fail("fault", str(rack_path), error.strerror or str(error))
    for machine, lines in written.items():  # the faults are in: a log that cannot be written says so, and undoes nothing
        try:
            write_lines(machine_log_path(rack_path, machine), lines)
        except OSError as error:
            click.echo(f"fault ({rack_path}): {machine}'s log not written: {error.strerror or error}", err=True)
    click.echo(f"fault ({rack_path}): success.")


def main() -> None:
    run(cli, "vipu-sim")
