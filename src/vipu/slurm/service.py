"""`vipu-slurm-service`: the prolog's and epilog's work, done by one long-lived process.

Starting Python and gRPC for every job costs more than the job itself costs Slurm. On the
slurmctld host, this service listens on a Unix socket (default /run/vipu/slurm.sock, readable
and writable by its owner only: run it as SlurmUser). The shell front doors `slurm/vipu-slurm-prolog`
and `-epilog` hand it each job with IPUs through `nc.openbsd -U`, and fall back to the
Python programs when it does not answer, so that it is an accelerator, never a dependency.

A request is the step (`prolog` or `epilog`) on the first line, then the job's variables as
NAME=VALUE lines (SLURM_JOB_ID and the SPANK_VIPU_* ones, each once), ended by closing the
sending side. The reply is `working` as soon as the request is taken, then, when the work is
done, `ok` or `failed: REASON` (the job's comment says it too, as the programs do). A front door
that got no `working` starts the program instead; one that got `working` and nothing more fails
the step, since the work may be half done.

Every `--licences-interval` seconds it also keeps Slurm's licences `ipu` equal to the IPUs free
for jobs (`licences.sync`), and removes what jobs that are over left at the controller (their
epilog may not have run: `JobPartitions.forget_finished_jobs`).

When vipu.conf sets `Topology`, it also keeps Slurm's topology file equal to vipu's IPU-Link
domains and allocations every `--topology-interval` seconds (`vipu.slurm.topology`).

vipu.conf is read when the service starts: restart it after changing the file.
"""

from __future__ import annotations

import logging
import os
import signal
import socket
import socketserver
import sys
import threading
from pathlib import Path

import click

from vipu.model.errors import InvalidArgument, VipuError
from vipu.slurm import config as slurm_config
from vipu.slurm import licences
from vipu.slurm import topology as slurm_topology
from vipu.slurm.jobs import JobPartitions

log = logging.getLogger("vipu.slurm.service")

DEFAULT_SOCKET = Path("/run/vipu/slurm.sock")
REQUEST_DEADLINE_SECONDS = 10.0  # to send the request in; the work itself has the connection's deadlines
MAX_REQUEST_BYTES = 8192
PASSED_VARIABLES = ("SLURM_JOB_ID", "SPANK_VIPU_IPUS", "SPANK_VIPU_NUM_REPLICAS")


def parse_request(data: bytes) -> tuple[str, dict[str, str]]:
    """The step and the job's variables of a request; InvalidArgument for anything else."""
    lines = data.decode(errors="replace").splitlines()
    if not lines or lines[0] not in ("prolog", "epilog"):
        raise InvalidArgument("a request starts with the step, prolog or epilog")
    pairs = [line.split("=", 1) for line in lines[1:] if "=" in line]
    names = [name for name, _ in pairs]
    repeated = sorted({name for name in names if names.count(name) > 1})
    if repeated:  # a value with a line break in it would otherwise speak for another job
        raise InvalidArgument(f"a request names {', '.join(repeated)} more than once")
    env = dict(pairs)
    if not env.get("SLURM_JOB_ID", "").isdigit():
        raise InvalidArgument("a request names its job as SLURM_JOB_ID=N")
    return lines[0], {name: env[name] for name in PASSED_VARIABLES if env.get(name)}


class _Request(socketserver.StreamRequestHandler):
    server: _Service

    def handle(self) -> None:
        self.request.settimeout(REQUEST_DEADLINE_SECONDS)
        try:
            request = self.rfile.read(MAX_REQUEST_BYTES)
            self.request.settimeout(None)  # the work has the deadlines of its calls
            self._answer(request)
        except OSError as error:  # the front door went away, or never finished its request
            log.warning("a request was lost: %s", error)

    def _answer(self, request: bytes) -> None:
        try:
            step, env = parse_request(request)
        except InvalidArgument as refusal:
            self.wfile.write(f"working\nfailed: {refusal.message}\n".encode())
            return
        self.wfile.write(b"working\n")
        self.wfile.flush()
        try:
            if step == "prolog":
                self.server.jobs.prolog(env)
            else:
                self.server.jobs.epilog(env)
            reply = "ok"
        except VipuError as error:
            log.warning("job %s: %s", env["SLURM_JOB_ID"], error.message)
            reply = f"failed: {error.message}"
        except Exception:  # a bug, or a Slurm command that hung: the job fails its step rather than the service
            log.exception("job %s: %s failed", env["SLURM_JOB_ID"], step)
            reply = "failed: internal error of vipu-slurm-service; its log has the details"
        self.wfile.write(f"{reply}\n".encode())


class _Service(socketserver.ThreadingMixIn, socketserver.UnixStreamServer):
    daemon_threads = True

    def __init__(self, path: Path, jobs: JobPartitions):
        self.jobs = jobs
        super().__init__(str(path), _Request)


def serve(path: Path, jobs: JobPartitions) -> _Service:
    """The service, bound to `path` (a stale socket there is replaced; a live one is not), owner-only."""
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_socket():
        with socket.socket(socket.AF_UNIX) as probe:
            if probe.connect_ex(str(path)) == 0:
                raise OSError(f"another vipu-slurm-service serves {path}")
        path.unlink()
    old_mask = os.umask(0o177)
    try:
        return _Service(path, jobs)
    finally:
        os.umask(old_mask)


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--socket", "socket_path", type=click.Path(dir_okay=False, path_type=Path), default=DEFAULT_SOCKET,
              show_default=True, envvar="VIPU_SLURM_SOCKET", help="Where to listen; the front doors' VIPU_SLURM_SOCKET.")
@click.option("--conf", "conf_path", type=click.Path(dir_okay=False, path_type=Path), default=None,
              envvar="VIPU_SLURM_CONF", help="vipu.conf. Default: beside slurm.conf.")
@click.option("--licences-interval", type=click.FloatRange(min=0), default=10.0, show_default=True,
              help="Seconds between syncs of Slurm's licences ipu with the IPUs free (vipu-slurm-licences), and sweeps "
                   "of what finished jobs left; 0: none.")
@click.option("--topology-interval", type=click.FloatRange(min=0), default=30.0, show_default=True,
              help="Seconds between updates of Slurm's topology file, when vipu.conf sets Topology; 0: none.")
def main(socket_path, conf_path, licences_interval, topology_interval):
    """Do vipu's prolog and epilog work for slurmctld's jobs, handed over by the shell front doors."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s vipu-slurm-service: %(message)s", stream=sys.stderr)
    try:
        jobs = JobPartitions(slurm_config.load(conf_path))
        service = serve(socket_path, jobs)
    except (VipuError, OSError) as error:
        click.echo(f"vipu-slurm-service: {getattr(error, 'message', None) or error}", err=True)
        sys.exit(1)
    for signum in (signal.SIGTERM, signal.SIGINT):  # shutdown() waits for serve_forever, so from another thread
        signal.signal(signum, lambda *_: threading.Thread(target=service.shutdown).start())
    log.info("serving the prolog and epilog of jobs with IPUs on %s", socket_path)
    stop = threading.Event()
    if licences_interval:
        threading.Thread(target=upkeep, args=(jobs, licences_interval, stop), name="upkeep", daemon=True).start()
    if topology_interval and jobs.config.topology:
        threading.Thread(target=topology_upkeep, args=(jobs, topology_interval, stop), name="topology", daemon=True).start()
    try:
        service.serve_forever(poll_interval=0.5)
    finally:
        stop.set()
        service.server_close()
        socket_path.unlink(missing_ok=True)


def upkeep(jobs: JobPartitions, interval: float, stop: threading.Event) -> None:
    """Every `interval` seconds until `stop`: sweep what finished jobs left, tell jobs of drains
    under their partitions, and sync Slurm's licences with the IPUs free; say when what it found
    changes."""
    said = ""
    while True:
        try:
            jobs.forget_finished_jobs()
            jobs.tell_drains()
            line = licences.sync(jobs.user, jobs.slurm).describe()
        except VipuError as error:
            line = f"licences not synced: {error.message}"
        if line != said:
            log.info("%s", line)
            said = line
        if stop.wait(interval):
            return


def topology_upkeep(jobs: JobPartitions, interval: float, stop: threading.Event) -> None:
    """Every `interval` seconds until `stop`: bring Slurm's topology file up to date with vipu's
    allocations; say when it changed it, or when what stops it changes."""
    keeper = slurm_topology.TopologyKeeper(jobs.user, jobs.config)
    said = ""
    while True:
        try:
            line = ""
            if keeper.refresh():
                log.info("Slurm's topology updated from vipu's allocations: %s, and slurmctld reconfigured", keeper.path)
        except VipuError as error:
            line = f"Slurm's topology not updated: {error.message}"
        if line and line != said:
            log.warning("%s", line)
        said = line
        if stop.wait(interval):
            return
