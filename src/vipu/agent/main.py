"""`vipu-agent`: serve one IPU-Machine (or, for large simulated pods, several) to the controller.

Each machine gets its own gRPC server on the address its rack description gives it, so a
controller cannot tell a process hosting many simulated machines from one agent per machine.
"""

from __future__ import annotations

import os

# gRPC's C core logs to stderr on its own (a busy port, for one); vipu says what went wrong itself.
os.environ.setdefault("GRPC_VERBOSITY", "NONE")

import logging
import signal
import sys
import threading
from concurrent import futures
from pathlib import Path

import click
import grpc

from vipu.agent.exporter import start_exporter
from vipu.agent.service import AgentServicer
from vipu.api.protos import agent_pb2_grpc
from vipu.api.status import GuardInterceptor
from vipu.backends.sim.machine import RackFile, SimMachine
from vipu.model.errors import VipuError

log = logging.getLogger("vipu.agent")


def serve_machine(backend, host: str, port: int, workers: int = 8) -> grpc.Server:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=workers), interceptors=[GuardInterceptor()])
    agent_pb2_grpc.add_AgentServiceServicer_to_server(AgentServicer(backend), server)
    try:
        server.add_insecure_port(f"{host}:{port}")
    except RuntimeError as error:
        raise VipuError(f"cannot listen on {host}:{port}: {error}") from error
    server.start()
    return server


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--rack", "rack_path", required=True, type=click.Path(path_type=Path), help="Rack description (YAML) of the simulated hardware.")
@click.option("--machine", "machines", multiple=True, help="Machine of the rack to serve; repeat for several.")
@click.option("--all-machines", is_flag=True, help="Serve every machine of the rack from this process.")
@click.option("--listen-address", default=None, help="Address to listen on instead of the rack's.")
@click.option("--port", type=int, default=None, help="Port to listen on instead of the rack's (one machine only).")
@click.option("--exporter-port", type=int, default=None, help="OpenMetrics port instead of the rack's (one machine only; 0: off).")
@click.option("--log-level", default="INFO", type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False))
def main(rack_path, machines, all_machines, listen_address, port, exporter_port, log_level):
    """Serve simulated IPU-Machines of a rack description to vipu-server."""
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        rack = RackFile(rack_path)
        names = [m.name for m in rack.current().machines] if all_machines else list(machines)
        if not names:
            raise VipuError("name a machine with --machine, or use --all-machines")
        if len(names) > 1 and (port is not None or exporter_port is not None):
            raise VipuError("--port and --exporter-port apply to a single machine")
        servers = []
        for name in names:
            backend = SimMachine(rack, name)
            machine = backend.machine()
            host = listen_address or machine.host
            servers.append(serve_machine(backend, host, port or machine.port))
            metrics_port = machine.exporter_port if exporter_port is None else exporter_port
            if metrics_port:
                start_exporter(backend, host, metrics_port)
            log.info("machine %s (%s) served on %s:%s", name, machine.serial, host, port or machine.port)
    except VipuError as error:
        click.echo(f"vipu-agent: {error.message}", err=True)
        sys.exit(2)

    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    stop.wait()
    for server in servers:
        server.stop(grace=2)
