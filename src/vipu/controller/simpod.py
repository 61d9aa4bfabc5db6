"""`vipu-server --sim N`: a controller with a simulated pod of N IPU-Machines, ready to use.

The pod is real processes on loopback: one `vipu-agent` per machine, serving the simulated
machines of a rack description kept in the data directory (edit it to inject faults), each
with its OpenMetrics exporter 6000 ports above its agent port. The
machines are registered as agents ag1..agN in rack order, formed into cluster cl0 and given to
allocation alloc-1, so `vipu create partition p1 --size 4` works at once. Restarting with the
same data directory reuses the rack and the entities, and reconciles the fresh agents with the
partitions the store remembers.
"""

from __future__ import annotations

import logging
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


def agent_id(position: int) -> str:
    return f"ag{position + 1}"


class SimPod:
    def __init__(self, data_dir: Path, machines: int, topology: IldTopology, num_ilds: int, base_port: int = 18101):
        self.rack_path = data_dir / "sim-rack.yaml"
        self.base_port = base_port
        self.log_dir = data_dir / "logs"
        self.machines = machines
        self.topology = topology
        self.num_ilds = num_ilds
        self.processes: list[subprocess.Popen] = []

    def rack(self) -> Rack:
        """The pod's rack: the one on disk if it matches, else a freshly generated one."""
        if self.rack_path.exists():
            rack = load_rack(self.rack_path)
            if len(rack.machines) != self.machines:
                raise InvalidArgument(
                    f"{self.rack_path} describes {len(rack.machines)} machines, not {self.machines}; "
                    "use another --data-dir for a pod of a different size"
                )
            return rack
        rack = generate_rack(self.machines, name=f"sim{self.machines}", topology=self.topology, num_ilds=self.num_ilds,
                             agent_base_port=self.base_port, with_exporters=True, time_scale=DEMO_TIME_SCALE)
        save_rack(rack, self.rack_path)
        return rack

    def start(self, rack: Rack) -> None:
        self.log_dir.mkdir(parents=True, exist_ok=True)
        for machine in rack.machines:
            with open(self.log_dir / f"agent-{machine.name}.log", "ab") as log_file:
                self.processes.append(
                    subprocess.Popen(
                        [sys.executable, "-m", "vipu.agent", "--rack", str(self.rack_path), "--machine", machine.name],
                        stdout=log_file,
                        stderr=subprocess.STDOUT,
                        stdin=subprocess.DEVNULL,
                    )
                )

    def wait_ready(self, controller: Controller, rack: Rack, timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        for machine, process in zip(rack.machines, self.processes, strict=True):
            while True:
                if process.poll() is not None:
                    raise Unavailable(f"the agent of {machine.name} exited; see {self.log_dir / f'agent-{machine.name}.log'}")
                try:
                    controller.gateway.inventory(machine.host, machine.port)
                    break
                except Unavailable:
                    if time.monotonic() > deadline:
                        raise Unavailable(f"the agent of {machine.name} did not answer within {timeout:.0f}s") from None
                    time.sleep(0.05)

    def register(self, controller: Controller, rack: Rack) -> None:
        """Create the pod's agents, cluster and allocation, keeping any that already exist."""
        known = {view.agent.id for view in controller.agents.list()}
        for position, machine in enumerate(rack.machines):
            if agent_id(position) not in known:
                controller.agents.create(agent_id(position), machine.host, machine.port)
        clusters = {cluster.id for cluster, _ in controller.clusters.list()}
        if CLUSTER_ID not in clusters:
            controller.clusters.create(
                Cluster(
                    CLUSTER_ID,
                    tuple(agent_id(p) for p in range(len(rack.machines))),
                    self.topology,
                    self.num_ilds,
                    GwTopology.LOOPED if self.num_ilds > 1 else None,
                )
            )
        allocations = {allocation.id for allocation, _ in controller.allocations.list()}
        if ALLOCATION_ID not in allocations:
            controller.allocations.create(ALLOCATION_ID, CLUSTER_ID, size=len(rack.machines) * IPUS_PER_MACHINE)

    def stop(self) -> None:
        for process in self.processes:
            process.terminate()
        for process in self.processes:
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
