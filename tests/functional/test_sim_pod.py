"""The main job: `vipu-server --sim N` starts a ready pod of real agent processes, and restarts it."""

from __future__ import annotations

import signal
import subprocess
import urllib.request

import grpc
import pytest

from tests.functional.harness import BIN, Result, pairs, rows, wait_until
from tests.ports import free_port, free_run

MACHINES = 4


class SimServer:
    def __init__(self, directory):
        self.directory = directory
        self.user_port, self.admin_port, self.base = free_port(), free_port(), free_run(MACHINES)
        self.process = None
        self.starts = 0

    @property
    def log_path(self):
        return self.directory / f"server-{self.starts}.log"

    def start(self):
        self.starts += 1
        self.log = open(self.log_path, "ab")  # noqa: SIM115 - kept with the process it logs; stop() closes it
        self.process = subprocess.Popen(
            [str(BIN / "vipu-server"), "--sim", str(MACHINES), "--data-dir", str(self.directory), "--listen-address", "127.0.0.1",
             "--port", str(self.user_port), "--admin-port", str(self.admin_port), "--metrics-port", "0",
             "--sim-base-port", str(self.base)],
            stdout=self.log, stderr=subprocess.STDOUT,
        )
        wait_until(lambda: "try: vipu create partition" in self.log_path.read_text() or self.process.poll() is not None,
                   timeout=60, what="the simulated pod")
        assert self.process.poll() is None, self.log_path.read_text()

    def stop(self):
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(timeout=30)
        self.log.close()

    def run(self, program, port, *args) -> Result:
        done = subprocess.run([str(BIN / program), "-H", "127.0.0.1", "--api-port", str(port), *args],
                              capture_output=True, text=True, timeout=60)
        return Result(done.returncode, done.stdout, done.stderr)


@pytest.fixture
def sim_server(tmp_path):
    server = SimServer(tmp_path)
    yield server
    if server.process and server.process.poll() is None:
        server.stop()


def agent_pids(directory) -> set[int]:
    done = subprocess.run(["pgrep", "-f", f"vipu.agent --rack {directory}/sim-rack.yaml"], capture_output=True, text=True)
    return {int(pid) for pid in done.stdout.split()}


def agent_processes(directory) -> int:
    return len(agent_pids(directory))


def test_the_simulated_pod_is_ready_for_partitions_and_comes_back_after_a_restart(sim_server, tmp_path):
    sim_server.start()
    assert agent_processes(tmp_path) == MACHINES
    agents = rows(sim_server.run("vipu-admin", sim_server.admin_port, "list", "agents").out)
    assert [(a[0], a[3], a[4], a[5]) for a in agents] == [(f"ag{n}", "Up", "cl0", "alloc-1") for n in range(1, MACHINES + 1)]
    created = sim_server.run("vipu", sim_server.user_port, "create", "partition", "p1", "--size", "4",
                             "--ipuof-dir", str(tmp_path / "ipuof"))
    assert created.out == "create partition (p1): success.\n", created.err
    assert (tmp_path / "ipuof" / "p1_ipuof.conf").exists()
    exporter = pairs(sim_server.run("vipu-admin", sim_server.admin_port, "get", "agent", "ag1").out)["Exporter"]
    assert exporter == f"http://127.0.0.1:{sim_server.base + 6000}/metrics"
    scraped = urllib.request.urlopen(exporter, timeout=5).read().decode()
    assert 'vipu_agent_ipus{use="partition"} 4.0' in scraped and "vipu_agent_partitions 1.0" in scraped
    for port, method in ((sim_server.base, "/vipu.agent.v1.AgentService/ListPartitions"),
                         (sim_server.base + 2000, "/vipu.ipuof.v1.IpuofService/Run")):
        with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
            call = channel.unary_unary(method, request_serializer=None, response_deserializer=None)
            for _ in range(3):
                with pytest.raises(grpc.RpcError) as refused:
                    call(b"\xff\xff\xff\xff\x0f", timeout=5)
                assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    scraped = urllib.request.urlopen(exporter, timeout=5).read().decode()
    assert 'vipu_agent_malformed_requests_total{method="ListPartitions",service="vipu.agent.v1.AgentService"} 3.0' in scraped
    assert 'vipu_agent_malformed_requests_total{method="Run",service="vipu.ipuof.v1.IpuofService"} 3.0' in scraped

    sim_server.stop()
    assert agent_processes(tmp_path) == 0
    first_run = sim_server.log_path.read_text()
    assert "goes to ERROR" not in first_run and "is Down" not in first_run  # no pass saw the agents stop
    sim_server.start()
    listing = rows(sim_server.run("vipu", sim_server.user_port, "list", "partitions").out)
    assert listing == [["p1", "cl0", "1", "DEFAULT", "DNC", "4", "1", "ACTIVE"]]
    second_run = sim_server.log_path.read_text()
    assert "re-applied partition p1" in second_run and "automatic reset" not in second_run
    assert rows(sim_server.run("vipu-admin", sim_server.admin_port, "get", "agent", "ag1").out)[0][2] == "p1"


def test_the_simulated_pod_restarts_after_a_kill_and_keeps_what_an_administrator_changed(sim_server, tmp_path):
    sim_server.start()
    admin = sim_server.admin_port
    assert sim_server.run("vipu-admin", admin, "remove", "allocation", "alloc-1").code == 0
    assert sim_server.run("vipu-admin", admin, "create", "allocation", "mine", "--cluster", "cl0", "--agents", "ag1,ag2").code == 0
    sim_server.process.send_signal(signal.SIGKILL)  # no clean-up: its agents go on, holding their ports
    sim_server.process.wait(timeout=30)
    sim_server.log.close()
    orphans = agent_pids(tmp_path)
    assert len(orphans) == MACHINES

    sim_server.start()
    serving = agent_pids(tmp_path)
    assert len(serving) == MACHINES and not serving & orphans  # the orphans were stopped, new agents serve their ports
    assert "registered on an earlier start, kept as the store has it" in sim_server.log_path.read_text()
    allocations = rows(sim_server.run("vipu-admin", admin, "list", "allocations").out)
    assert [a[0] for a in allocations] == ["mine"]  # alloc-1 was not made again
    assert {a[3] for a in rows(sim_server.run("vipu-admin", admin, "list", "agents").out)} == {"Up"}
    sim_server.stop()


def test_another_pod_shape_on_an_existing_data_directory_is_refused_unless_rebuilt(sim_server, tmp_path):
    sim_server.start()
    sim_server.stop()
    command = [str(BIN / "vipu-server"), "--sim", str(MACHINES), "--sim-topology", "mesh", "--data-dir", str(tmp_path),
               "--listen-address", "127.0.0.1", "--port", str(sim_server.user_port), "--admin-port", str(sim_server.admin_port),
               "--metrics-port", "0", "--sim-base-port", str(sim_server.base)]
    refused = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 1 and "Traceback" not in refused.stderr
    assert refused.stderr.strip().splitlines()[-1] == (
        f"vipu-server: {tmp_path} holds a simulated pod of {MACHINES} machines (torus, 1 IPU-Link domain(s), agents from port "
        f"{sim_server.base}), not {MACHINES} machines (mesh, 1 IPU-Link domain(s), agents from port {sim_server.base}); "
        "give --sim-rebuild to replace it (its partitions go with it), or use another --data-dir")
    assert agent_processes(tmp_path) == 0
    with open(tmp_path / "rebuilt.log", "ab") as log:
        rebuilt = subprocess.Popen([*command, "--sim-rebuild"], stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: "try: vipu create partition" in (tmp_path / "rebuilt.log").read_text() or rebuilt.poll() is not None,
                   timeout=60, what="the rebuilt pod")
        assert rebuilt.poll() is None, (tmp_path / "rebuilt.log").read_text()
        assert f"as agents ag1..ag{MACHINES} in cluster cl0" in (tmp_path / "rebuilt.log").read_text()
        assert pairs(sim_server.run("vipu-admin", sim_server.admin_port, "get", "cluster", "cl0").out)["Topology"] == "mesh"
    finally:
        rebuilt.send_signal(signal.SIGTERM)
        rebuilt.wait(timeout=30)
