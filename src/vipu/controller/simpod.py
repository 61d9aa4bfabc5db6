"""`vipu-server --sim N`: a controller with a simulated pod of N IPU-Machines, ready to use.

The pod is real processes on loopback: one `vipu-agent` per machine, serving the simulated
machines of a rack description kept in the data directory (edit it to inject faults), each
with its OpenMetrics exporter 6000 ports above its agent port. The
machines are registered as agents ag1..agN in rack order, formed into cluster cl0 and given to
allocation alloc-1, so `vipu create partition p1 --size 4` works at once.

Restarting with the same data directory reuses the rack, and keeps the store's agents, clusters
and allocations as they are (an administrator may have changed them); the fresh agents are
reconciled with the partitions the store remembers. Until a start has registered them all
(sim-pod.json says when), a start creates whichever are missing. Agents a killed server left
running are stopped first (their process ids are in sim-agents.pid). A restart asking for another
pod shape than the directory holds (sim-pod.json) is refused unless told to rebuild, which
forgets the old pod: its rack, and in the store its agents with everything on them.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from vipu.backends.sim.rack import Rack, generate_rack, load_rack, save_rack
from vipu.controller.server import Controller
from vipu.model.entities import IPUS_PER_MACHINE, Cluster, GwTopology, IldTopology
from vipu.model.errors import InvalidArgument, Unavailable

log = logging.getLogger(__name__)

DEMO_TIME_SCALE = 0.05  # a full cluster test of the 16-machine pod takes seconds, not minutes
CLUSTER_ID = "cl0"
ALLOCATION_ID = "alloc-1"
PROGRESS_SECONDS = 5.0  # how often a start waiting for its agents says how far it is


def agent_id(position: int) -> str:
    return f"ag{position + 1}"


class SimPod:
    def __init__(self, data_dir: Path, machines: int, topology: IldTopology, num_ilds: int, base_port: int = 18101,
                 rebuild: bool = False, agent_tls: Path | None = None):
        data_dir = data_dir.resolve()  # the agents' command lines name the rack by it: one spelling
        self.rack_path = data_dir / "sim-rack.yaml"
        self.shape_path = data_dir / "sim-pod.json"
        self.pid_path = data_dir / "sim-agents.pid"
        self.base_port = base_port
        self.log_dir = data_dir / "logs"
        self.machines = machines
        self.topology = topology
        self.num_ilds = num_ilds
        self.rebuild = rebuild
        self.agent_tls = agent_tls  # secure mode: the agents serve the agent link's mutual TLS with these files
        self.processes: list[subprocess.Popen] = []

    @property
    def shape(self) -> dict:
        return {"machines": self.machines, "topology": self.topology.value, "ilds": self.num_ilds, "base_port": self.base_port}

    @staticmethod
    def describe(shape: dict) -> str:
        return (f"{shape['machines']} machines ({shape['topology']}, {shape['ilds']} IPU-Link domain(s), "
                f"agents from port {shape['base_port']})")

    def rack(self) -> Rack:
        """The pod's rack: the one on disk if it is of this shape, else a freshly generated one."""
        had_pod = self.rack_path.exists()
        if had_pod:
            state = self._state()
            if not state:  # a directory from before the shape was recorded: its size is all that is known
                state = {**self.shape, "machines": len(load_rack(self.rack_path).machines), "registered": True}
            recorded = {key: state.get(key) for key in self.shape}
            if recorded == self.shape:
                self._save_state(registered=state.get("registered", False), replaced=state.get("replaced", False))
                return load_rack(self.rack_path)
            if not self.rebuild:
                raise InvalidArgument(
                    f"{self.rack_path.parent} holds a simulated pod of {self.describe(recorded)}, not {self.describe(self.shape)}; "
                    "give --sim-rebuild to replace it (its partitions go with it), or use another --data-dir"
                )
            log.warning("rebuilding the simulated pod: %s replaces %s", self.describe(self.shape), self.describe(recorded))
        rack = generate_rack(self.machines, name=f"sim{self.machines}", topology=self.topology, num_ilds=self.num_ilds,
                             agent_base_port=self.base_port, with_exporters=True, time_scale=DEMO_TIME_SCALE)
        save_rack(rack, self.rack_path)
        self._save_state(registered=False, replaced=had_pod)
        return rack

    def _state(self) -> dict:
        return json.loads(self.shape_path.read_text()) if self.shape_path.exists() else {}

    def _save_state(self, registered: bool, replaced: bool) -> None:
        """The pod's shape, whether its entities are all registered, and whether an old pod's agents
        still have to be removed from the store (a rebuild not finished)."""
        self.shape_path.write_text(json.dumps({**self.shape, "registered": registered, "replaced": replaced}) + "\n")

    def stop_orphans(self) -> None:
        """Stop the agents a server killed without its clean-up left running: they hold the ports."""
        if not self.pid_path.exists():
            return
        orphans = []
        for pid in (int(line) for line in self.pid_path.read_text().split() if line.isdigit()):
            try:
                command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue  # gone
            if "vipu.agent" in command.split() and f"--rack {self.rack_path} " in f"{command} ":
                orphans.append(pid)
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
        if orphans:
            log.info("stopping the %d agents a previous vipu-server left running", len(orphans))
        deadline = time.monotonic() + 10
        while orphans and time.monotonic() < deadline:
            orphans = [pid for pid in orphans if Path(f"/proc/{pid}").exists() and not _zombie(pid)]
            time.sleep(0.05)
        for pid in orphans:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.pid_path.unlink(missing_ok=True)

    def start(self, rack: Rack) -> None:
        self.stop_orphans()
        self.log_dir.mkdir(parents=True, exist_ok=True)
        log.info("starting the simulated pod's %d agents (their logs: %s)", len(rack.machines), self.log_dir)
        for machine in rack.machines:
            with open(self.log_dir / f"agent-{machine.name}.log", "ab") as log_file:
                self.processes.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "vipu.agent", "--rack", str(self.rack_path), "--machine", machine.name,
                         *(("--tls-dir", str(self.agent_tls)) if self.agent_tls else ())],
                        stdout=log_file,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                    )
                )
        self.pid_path.write_text("".join(f"{process.pid}\n" for process in self.processes))

    def wait_ready(self, controller: Controller, rack: Rack, timeout: float = 60.0) -> None:
        """Wait until every agent answers, saying every few seconds how many do (agents start
        slowly on a loaded machine, and a silent wait looks like a hang)."""
        started = time.monotonic()
        deadline, next_word = started + timeout, started + PROGRESS_SECONDS
        for answering, (machine, process) in enumerate(zip(rack.machines, self.processes, strict=True)):
            while True:
                if process.poll() is not None:
                    raise Unavailable(f"the agent of {machine.name} exited; see {self.log_dir / f'agent-{machine.name}.log'}")
                try:
                    controller.gateway.inventory(machine.host, machine.port)
                    break
                except Unavailable:
                    now = time.monotonic()
                    if now > deadline:
                        raise Unavailable(f"the agent of {machine.name} did not answer within {timeout:.0f}s") from None
                    if now >= next_word:
                        log.info("starting the simulated pod's agents: %d of %d answer after %.0f s", answering, len(rack.machines),
                                 now - started)
                        next_word = now + PROGRESS_SECONDS
                    time.sleep(0.05)

    def register(self, controller: Controller, rack: Rack) -> bool:
        """Create the pod's agents, cluster and allocation, whichever are missing, until a start has
        registered them all (after a rebuild, having removed the old pod's agents with everything on
        them first); whether it did. Once registered, the store's entities are kept as they are: an
        administrator may have changed them."""
        state = self._state()
        if state.get("registered"):
            return False
        if state.get("replaced"):
            for old in [view.agent.id for view in controller.agents.list() if re.fullmatch(r"ag[0-9]+", view.agent.id)]:
                if any(view.agent.id == old for view in controller.agents.list()):  # a force may have taken it already
                    controller.agents.remove(old, force=True, gone=True)  # its machine went with the old pod
            self._save_state(registered=False, replaced=False)
        known = {view.agent.id for view in controller.agents.list()}
        for position, machine in enumerate(rack.machines):
            if agent_id(position) not in known:
                controller.agents.create(agent_id(position), machine.host, machine.port)
        if CLUSTER_ID not in {cluster.id for cluster, _ in controller.clusters.list()}:
            controller.clusters.create(
                Cluster(
                    CLUSTER_ID,
                    tuple(agent_id(p) for p in range(len(rack.machines))),
                    self.topology,
                    self.num_ilds,
                    GwTopology.LOOPED if self.num_ilds > 1 else None,
                )
            )
        if ALLOCATION_ID not in {allocation.id for allocation, _ in controller.allocations.list()}:
            controller.allocations.create(ALLOCATION_ID, CLUSTER_ID, size=len(rack.machines) * IPUS_PER_MACHINE)
        self._save_state(registered=True, replaced=False)
        return True

    @staticmethod
    def first_free_name(controller: Controller) -> tuple[str, int]:
        """A partition name to suggest that is not taken (p1, else the first pN free) and how many
        partitions the store holds from earlier starts: a restart must not suggest one that exists."""
        with controller.store.reading() as tx:
            kept = {p.id for p in tx.list_partitions()}
            taken = kept | {r.partition_id for r in tx.list_requests()}
        return next(f"p{n}" for n in itertools.count(1) if f"p{n}" not in taken), len(kept)

    def stop(self) -> None:
        for process in self.processes:
            process.terminate()
        for process in self.processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
        self.pid_path.unlink(missing_ok=True)


def _zombie(pid: int) -> bool:
    """Whether the process has ended and waits only to be reaped (by its parent, or by init)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True
