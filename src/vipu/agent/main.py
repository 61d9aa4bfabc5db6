"""`vipu-agent`: serve one IPU-Machine (or, for large simulated pods, several) to the controller.

Each machine gets its own gRPC server on the address its rack description gives it, so a
controller cannot tell a process hosting many simulated machines from one agent per machine.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
import typing
from pathlib import Path

import click
import grpc

from vipu import failpoints
from vipu.agent.announcer import Announcer
from vipu.agent.exporter import MachineMetrics
from vipu.agent.holds import MachineHold
from vipu.agent.ipuof import IpuofServicer
from vipu.agent.service import AgentServicer
from vipu.agent.watch import MachineWatch
from vipu.api.announcements import DISCOVERY_PORT
from vipu.api.protos import agent_pb2_grpc, ipuof_pb2_grpc
from vipu.api.serving import serve
from vipu.api.status import GuardInterceptor
from vipu.api.tls import agent_server_credentials, link_authority
from vipu.backends.capabilities import Health, Inventory, MachineLog, Power, Telemetry
from vipu.backends.composed import ComposedMachine
from vipu.backends.sim.machine import RackFile, SimMachine
from vipu.backends.sim.rack import RackMachine
from vipu.model.errors import VipuError

log = logging.getLogger("vipu.agent")

WATCH_INTERVAL = 0.2  # seconds between looks at whether a simulated machine plays dead


def composed(fabric: SimMachine, machine: RackMachine) -> ComposedMachine:
    """The machine as its description says: the simulator's fabric, and each other capability from
    the driver its `drivers` names (the simulator's by default)."""
    given: dict[str, Power | Inventory | Health | Telemetry] = {"power": fabric, "inventory": fabric, "health": fabric,
                                                                "telemetry": fabric}
    logs: list[MachineLog] = [fabric]
    closing = []
    if "redfish" in machine.drivers.values():
        try:
            from vipu.backends.redfish import RedfishMachine, bmc_config  # sushy is imported only where a BMC is used
        except ImportError as missing:
            raise VipuError(f"machine {machine.name}: its redfish driver needs {missing.name or 'sushy'}: install vipu[redfish]") from None
        bmc = RedfishMachine(bmc_config(machine.bmc, f"machine {machine.name}: bmc"))
        bmc.start()
        closing.append(bmc.close)
        given.update({capability: bmc for capability, driver in machine.drivers.items() if driver == "redfish" and capability in given})
        if machine.drivers.get("logs") == "redfish":
            logs.append(bmc)
    return ComposedMachine(fabric, machine.name, power=typing.cast(Power, given["power"]),
                           inventory=typing.cast(Inventory, given["inventory"]), health=typing.cast(Health, given["health"]),
                           telemetry=typing.cast(Telemetry, given["telemetry"]), logs=logs, closing=closing)


class MachineHost:
    """One machine's end-points: the agent service and, when it has one, the IPUoF end-point.

    A machine that plays dead (the rack's `faults.silent`) closes its ports, so callers see the
    connection refused exactly as for a machine that is off; its ports reopen when it recovers.
    """

    def __init__(self, backend: ComposedMachine, host: str, port: int, ipuof_port: int, tls_dir: Path | None, state_dir: Path):
        self.backend = backend
        self.host, self.port, self.ipuof_port = host, port, ipuof_port
        self.tls_dir = tls_dir  # the agent link's files: only the site's controllers, by their certificates, are answered
        self.hold = MachineHold(backend.machine_name, state_dir / f"{backend.machine_name}.holder",
                                link_authority(tls_dir) if tls_dir is not None else None)
        self.watch = MachineWatch(backend)
        self.metrics = MachineMetrics(backend, self.watch)
        self.servers: list[grpc.Server] = []

    def open(self) -> None:
        """Open both end-points, or neither."""
        try:
            self.servers.append(serve(
                lambda s: agent_pb2_grpc.add_AgentServiceServicer_to_server(AgentServicer(self.backend, self.hold, self.watch), s),
                self.host, self.port, GuardInterceptor(count_malformed=self.metrics.count_malformed),
                credentials=agent_server_credentials(self.tls_dir) if self.tls_dir is not None else None))
            if self.ipuof_port:
                self.servers.append(serve(
                    lambda s: ipuof_pb2_grpc.add_IpuofServiceServicer_to_server(IpuofServicer(self.backend), s),
                    self.host, self.ipuof_port, GuardInterceptor(count_malformed=self.metrics.count_malformed)))
        except VipuError:
            self.close()
            raise

    def close(self) -> None:
        for server in self.servers:
            server.stop(grace=0).wait()
        self.servers = []

    def shut_down(self) -> None:
        """Close its end-points, its watch and its drivers' connections (a BMC's session and poller)."""
        self.close()
        self.watch.stop()
        self.backend.close()

    def follow_faults(self) -> None:
        try:
            silent = self.backend.silent()
        except VipuError as error:
            log.warning("%s: %s", self.backend.machine_name, error.message)
            return
        if silent and self.servers:
            log.info("machine %s plays dead", self.backend.machine_name)
            self.close()
        elif not silent and not self.servers:
            try:
                self.open()
                log.info("machine %s answers again", self.backend.machine_name)
            except VipuError as error:  # its ports may still be held; the next look tries again
                log.warning("machine %s: %s", self.backend.machine_name, error.message)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--rack", "rack_path", required=True, type=click.Path(path_type=Path),
              help="Rack description (YAML) of the simulated hardware.")
@click.option("--machine", "machines", multiple=True, help="Machine of the rack to serve; repeat for several.")
@click.option("--all-machines", is_flag=True, help="Serve every machine of the rack from this process.")
@click.option("--listen-address", default=None, help="Address to listen on instead of the rack's.")
@click.option("--port", type=int, default=None, help="Port to listen on instead of the rack's (one machine only).")
@click.option("--exporter-port", type=int, default=None, help="OpenMetrics port instead of the rack's (one machine only; 0: off).")
@click.option("--announce-interval", type=click.FloatRange(min=0), default=5.0, show_default=True,
              help="Seconds between multicast announcements for auto-discovery (0: do not announce).")
@click.option("--announce-port", type=click.IntRange(1, 65535), default=DISCOVERY_PORT, show_default=True,
              help="UDP port of the announcements.")
@click.option("--announce-from", default=None, help="Address of the interface to announce on. Default: the listen address.")
@click.option("--tls-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Serve the agent end-point over mutual TLS with the agent link's files in this directory (agent.pem, "
                   "agent-key.pem, ca.pem: vipu-certs/agents from vipu-server --tls-init): only the site's controllers "
                   "are answered, and each machine obeys the one that holds it.")
@click.option("--state-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Where each machine's holder (the controller it obeys) is kept, as MACHINE.holder. "
                   "Default: agent-state beside the rack description.")
@click.option("--log-level", default="INFO", type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False))
def main(rack_path, machines, all_machines, listen_address, port, exporter_port, announce_interval, announce_port,
         announce_from, tls_dir, state_dir, log_level):
    """Serve simulated IPU-Machines of a rack description to vipu-server."""
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    failpoints.arm_from_environment()
    hosts: list[MachineHost] = []
    try:
        rack = RackFile(rack_path)
        names = [m.name for m in rack.current().machines] if all_machines else list(machines)
        if not names:
            raise VipuError("name a machine with --machine, or use --all-machines")
        if len(names) > 1 and (port is not None or exporter_port is not None):
            raise VipuError("--port and --exporter-port apply to a single machine")
        state_dir = state_dir or rack_path.resolve().parent / "agent-state"
        for name in names:
            fabric = SimMachine(rack, name)
            machine = fabric.machine()
            backend = composed(fabric, machine)
            backend.condition(0)  # a capability that fails at the start is logged now, a line each
            host = MachineHost(backend, listen_address or machine.host, port or machine.port, machine.ipuof_port, tls_dir, state_dir)
            if not machine.faults.silent:
                host.open()
            hosts.append(host)
            host.watch.start()
            metrics_port = machine.exporter_port if exporter_port is None else exporter_port
            if metrics_port:
                host.metrics.serve(host.host, metrics_port)
            log.info("machine %s (%s) served on %s:%s", name, machine.serial, host.host, host.port)
        announcer = None
        if announce_interval:
            source = announce_from or next((h.host for h in hosts if h.host not in ("0.0.0.0", "")), None)
            announcer = Announcer([(h.backend, h.host, h.port) for h in hosts], announce_interval, port=announce_port, source=source)
            announcer.start()
    except VipuError as error:
        click.echo(f"vipu-agent: {error.message}", err=True)
        for host in hosts:
            host.shut_down()
        sys.exit(2)

    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    while not stop.wait(WATCH_INTERVAL):
        for host in hosts:
            host.follow_faults()
    if announcer is not None:
        announcer.stop()
    for host in hosts:
        host.shut_down()
