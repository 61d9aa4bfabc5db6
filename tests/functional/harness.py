"""Real controller and agent processes on loopback, and the real CLIs to drive them."""

from __future__ import annotations

import os
import pty
import queue
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import grpc

from tests.ports import free_port
from tests.processes import dying_with_parent
from vipu.api import credentials
from vipu.api.protos import (
    admin_pb2,
    admin_pb2_grpc,
    agent_pb2,
    agent_pb2_grpc,
    version_pb2,
    version_pb2_grpc,
    vipuuser_pb2,
    vipuuser_pb2_grpc,
)
from vipu.api.tls import TlsFiles, agent_channel_credentials, client_credentials
from vipu.backends.sim import faults
from vipu.backends.sim.rack import Rack, generate_rack, load_rack, save_rack
from vipu.client import Stream, UserClient
from vipu.model.entities import IldTopology
from vipu.model.topology import LinkKind

BIN = Path(sys.executable).parent


@dataclass
class Result:
    code: int
    out: str
    err: str

    @property
    def lines(self) -> list[str]:
        return self.out.splitlines()


def wait_until(condition, timeout: float = 20.0, what: str = "condition"):
    """Poll `condition` until it returns something true, or fail after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def web_answers(web: subprocess.Popen | None, port: int, log: Path) -> bool:
    """Whether vipu-web listens on its port yet; its log's end if it exited instead."""
    if web is not None and web.poll() is not None:
        raise AssertionError(f"vipu-web exited with status {web.returncode}:\n{log.read_text()[-3000:]}")
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


class Pod:
    """A rack of simulated machines, one agent process each, and a vipu-server over them.

    The rack is cabled as a torus unless asked otherwise; a mesh cluster over it just leaves
    the loop-back cables unused.
    """

    def __init__(self, directory: Path, machines: int = 8, topology: IldTopology = IldTopology.TORUS,
                 ilds: int = 1, db_url: str | None = None, time_scale: float = 0.001, agent_processes: int | None = None,
                 secure: bool = False, server_options: tuple[str, ...] = ()):
        """`server_options` go to every vipu-server started, after (so overriding) the tests' own."""
        self.directory = directory
        self.server_options = server_options
        self.rack_path = directory / "rack.yaml"
        self.rack: Rack = generate_rack(machines, topology=topology, num_ilds=ilds, time_scale=time_scale)
        for machine in self.rack.machines:  # ports of their own, so that several pods can run at once
            machine.port, machine.ipuof_port = free_port(), free_port()
        save_rack(self.rack, self.rack_path)
        self.db_url = db_url or f"sqlite:///{directory / 'vipu.db'}"
        self.user_port, self.admin_port, self.metrics_port = free_port(), free_port(), free_port()
        self.ipuof_dir = directory / "ipuof"
        self.agents: dict[str, subprocess.Popen] = {}
        # One agent process per machine unless asked for fewer, each then serving a slice of the rack.
        names = [m.name for m in self.rack.machines]
        groups = agent_processes or len(names)
        self.agent_groups = [names[i::groups] for i in range(groups)] if groups < len(names) else [[n] for n in names]
        self.secure = secure
        self.tls = TlsFiles(directory / "vipu-certs")
        self.admin_config = directory / "admin.vipu-cli.hcl"
        self.admin_key = ""
        self.server: subprocess.Popen | None = None
        self.web: subprocess.Popen | None = None
        self.web_port = 0
        self._channels: dict[int, grpc.Channel] = {}

    # Processes

    def initialise(self) -> str:
        """vipu-server --init --secure: the store, the certificates and the administrator; its output."""
        done = subprocess.run(
            [str(BIN / "vipu-server"), "--init", "--secure", "--db", self.db_url, "--tls-dir", str(self.tls.root),
             "--tls-hosts", "localhost,127.0.0.1,127.0.0.2", "--default-user-id", "admin",
             "--port", str(self.user_port), "--admin-port", str(self.admin_port)],
            capture_output=True, text=True, cwd=self.directory, timeout=60, check=True,
        )
        self.admin_key = next(line.split("'")[1] for line in done.stdout.splitlines() if line.startswith("Access key is"))
        return done.stdout

    def start(self) -> Pod:
        """Start the agents and the controller; if any part fails, stop the others again."""
        try:
            if self.secure:
                self.initialise()
            for group in self.agent_groups:
                self.start_agent(*group)
            patience = 20 + len(self.rack.machines) / 10  # a big rack takes its agents a while to read
            for machine in self.rack.machines:
                self.wait_for_agent(machine.name, patience)
            self.start_server()
        except BaseException:
            self.stop()
            raise
        return self

    def start_agent(self, *names: str) -> None:
        """One agent process serving the named machines, known by the first name."""
        machines = [option for name in names for option in ("--machine", name)]
        with open(self.directory / f"agent-{names[0]}.log", "ab") as log:
            self.agents[names[0]] = subprocess.Popen(
                dying_with_parent([sys.executable, "-m", "vipu.agent", "--rack", str(self.rack_path), *machines,
                                   "--announce-interval", "0", *(("--tls-dir", str(self.tls.agents_dir)) if self.secure else ())]),
                stdout=log, stderr=subprocess.STDOUT,
            )

    def wait_for_agent(self, name: str, timeout: float = 20.0) -> None:
        """Until the machine's agent answers; at once, with its log, if its process died instead."""
        group = next(g for g in self.agent_groups if name in g)

        def answers() -> bool:
            process = self.agents.get(group[0])
            if process is not None and process.poll() is not None:
                log = (self.directory / f"agent-{group[0]}.log").read_text()[-2000:]
                raise AssertionError(f"the agent of {name} exited with status {process.returncode}:\n{log}")
            return self._answers(self.rack.machine(name).port, agent=True)

        wait_until(answers, timeout=timeout, what=f"agent {name}")

    def stop_agent(self, name: str) -> None:
        process = self.agents.pop(name)
        process.send_signal(signal.SIGKILL)
        process.wait()

    def start_server(self, *extra: str) -> None:
        with open(self.directory / "server.log", "ab") as log:
            self.server = subprocess.Popen(
                dying_with_parent([str(BIN / "vipu-server"), "--db", self.db_url, "--data-dir", str(self.directory),
                 "--listen-address", "127.0.0.1", "--port", str(self.user_port), "--admin-port", str(self.admin_port),
                 "--metrics-port", str(self.metrics_port), "--health-interval", "0.3", "--agent-timeout", "3",
                 *(("--secure", "--tls-dir", str(self.tls.root)) if self.secure else ()), *self.server_options, *extra]),
                stdout=log, stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONFAULTHANDLER": "1"},
            )
        wait_until(lambda: self._answers(self.user_port) and self._answers(self.admin_port), what="vipu-server")
        if "--ha" in (*self.server_options, *extra):  # a replica answers its version before it leads
            wait_until(self._leads, what="vipu-server to lead")

    def stop_server(self, sig: int = signal.SIGTERM) -> None:
        """Signal the controller and wait for it to exit; if it does not, fail with what each of its
        threads was doing (vipu-server writes its stacks on SIGUSR1) and kill it."""
        server, self.server = self.server, None
        server.send_signal(sig)
        try:
            server.wait(timeout=30)
        except subprocess.TimeoutExpired:
            server.send_signal(signal.SIGUSR1)
            try:
                wait_until(lambda: "Thread 0x" in (self.directory / "server.log").read_text(), timeout=5, what="stacks")
            finally:
                server.kill()
            server.wait()
            log = (self.directory / "server.log").read_text()[-6000:]
            raise AssertionError(f"vipu-server did not stop within 30 s of signal {sig}:\n{log}") from None

    def start_web(self, *extra: str) -> str:
        """vipu-web over this pod's controller (secure when the pod is); its address."""
        self.web_port = free_port()
        with open(self.directory / "web.log", "ab") as log:
            self.web = subprocess.Popen(
                dying_with_parent([str(BIN / "vipu-web"), "--listen-address", "127.0.0.1", "--port", str(self.web_port),
                                   "-H", "127.0.0.1", "--api-port", str(self.user_port), "--admin-port", str(self.admin_port),
                                   *(("--secure", "--tls-dir", str(self.tls.root)) if self.secure else ()), *extra]),
                stdout=log, stderr=subprocess.STDOUT)
        wait_until(self._web_answers, what="vipu-web")
        return f"{'https' if self.secure else 'http'}://127.0.0.1:{self.web_port}"

    def _web_answers(self) -> bool:
        return web_answers(self.web, self.web_port, self.directory / "web.log")

    def stop_web(self) -> None:
        web, self.web = self.web, None
        if web is not None:
            web.terminate()
            web.wait(timeout=30)

    def stop(self) -> None:
        self.stop_web()
        if self.server is not None:
            self.stop_server()
        for name in list(self.agents):
            self.stop_agent(name)
        for channel in self._channels.values():
            channel.close()

    def _answers(self, port: int, agent: bool = False) -> bool:
        if self.server is not None and self.server.poll() is not None:
            log = (self.directory / "server.log").read_text()[-3000:]
            raise AssertionError(f"vipu-server exited with status {self.server.returncode}:\n{log}")
        try:
            if agent:
                self.agent_stub_at(port).GetInventory(agent_pb2.GetInventoryRequest(), timeout=1)
            else:
                version_pb2_grpc.VersionServiceStub(self._server_channel(port)).GetVersion(version_pb2.VersionRequest(), timeout=1)
            return True
        except grpc.RpcError:
            return False

    def _leads(self) -> bool:
        try:
            self.admin_api.ListAgents(admin_pb2.ListRequest(), timeout=1)
            return True
        except grpc.RpcError as error:
            if error.code() != grpc.StatusCode.UNAVAILABLE:
                raise
            return False

    # Direct access, for set-up and for looking behind the CLIs

    def _channel(self, port: int) -> grpc.Channel:
        if port not in self._channels:
            self._channels[port] = grpc.insecure_channel(f"127.0.0.1:{port}")
        return self._channels[port]

    def _server_channel(self, port: int) -> grpc.Channel:
        """A channel to vipu-server as its administrator: over mutual TLS with the key in secure mode."""
        if not self.secure:
            return self._channel(port)
        key = ("server", port)
        if key not in self._channels:
            files = self.tls
            transport = client_credentials(files.ca_for(files.client_dir), files.client_cert, files.client_key)
            caller = grpc.metadata_call_credentials(
                lambda _, callback: callback(credentials.metadata("admin", self.admin_key), None))
            self._channels[key] = grpc.secure_channel(f"127.0.0.1:{port}", grpc.composite_channel_credentials(transport, caller))
        return self._channels[key]

    def agent_stub_at(self, port: int):
        """An agent's service as the controller reaches it: over the agent link's mutual TLS in secure mode."""
        if not self.secure:
            return agent_pb2_grpc.AgentServiceStub(self._channel(port))
        key = ("agent", port)
        if key not in self._channels:
            self._channels[key] = grpc.secure_channel(f"127.0.0.1:{port}", agent_channel_credentials(self.tls))
        return agent_pb2_grpc.AgentServiceStub(self._channels[key])

    def held(self, machine_name: str) -> dict[str, list[int]]:
        """What a machine's agent holds: partition id -> its IPU indices there."""
        port = self.rack.machine(machine_name).port
        reply = self.agent_stub_at(port).ListPartitions(agent_pb2.ListPartitionsRequest(), timeout=5)
        return {p.partition_id: sorted(i.index for i in p.ipus) for p in reply.partitions}

    def settings(self, machine_name: str, partition_id: str):
        """The settings a machine's agent holds for one partition."""
        port = self.rack.machine(machine_name).port
        reply = self.agent_stub_at(port).ListPartitions(agent_pb2.ListPartitionsRequest(), timeout=5)
        return next(p for p in reply.partitions if p.partition_id == partition_id)

    def held_anywhere(self, partition_id: str) -> list[str]:
        return [m.name for m in self.rack.machines if partition_id in self.held(m.name)]

    def metrics(self) -> dict[str, float]:
        """The controller's metrics now: each sample's name with its labels, as exposed -> value."""
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=5).read().decode()
        return {line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1]) for line in text.splitlines() if line and not line.startswith("#")}

    @property
    def admin_api(self):
        return admin_pb2_grpc.AdminServiceStub(self._server_channel(self.admin_port))

    def unplug(self, machine_name: str, port: int) -> None:
        """Pull the IPU-Link cable out of a port, in the rack file the agents read."""
        self.edit_rack(lambda rack: faults.unplug(rack, machine_name, LinkKind.IPULINK, port))

    def fault(self, machine_name: str, reason: str) -> None:
        """Write a configuration fault for one machine into the rack file."""
        self.edit_rack(lambda rack: faults.fail_configuration(rack, machine_name, reason))

    def edit_rack(self, change) -> None:
        """Change the rack file the agents read (they pick the change up at once)."""
        rack = load_rack(self.rack_path)
        change(rack)
        save_rack(rack, self.rack_path)

    def wipe_rack_only(self) -> None:
        """Undo cabling edits and faults: the rack file as the pod was built."""
        save_rack(self.rack, self.rack_path)

    def wait_for_status(self, agent_id: str, status: str) -> None:
        wait_until(lambda: self.admin_api.GetAgent(admin_pb2.GetRequest(id=agent_id)).status == status,
                   what=f"agent {agent_id} to be {status}")

    def wipe(self) -> None:
        """Back to an empty controller over healthy, empty agents, for the next test."""
        save_rack(self.rack, self.rack_path)
        for group in self.agent_groups:
            if group[0] not in self.agents or self.agents[group[0]].poll() is not None:
                self.agents.pop(group[0], None)
                self.start_agent(*group)
        for machine in self.rack.machines:
            self.wait_for_agent(machine.name)
        if self.server is None or self.server.poll() is not None:
            self.start_server()
        api = self.admin_api
        if self.secure:
            for user in api.ListUsers(admin_pb2.ListRequest()).users:
                if user.id != "admin":
                    api.RemoveUser(admin_pb2.RemoveRequest(id=user.id))
        for cluster in api.ListClusters(admin_pb2.ListRequest()).clusters:
            api.RemoveCluster(admin_pb2.RemoveRequest(id=cluster.id, force=True))
        for agent in api.ListAgents(admin_pb2.ListRequest()).agents:
            api.RemoveAgent(admin_pb2.RemoveRequest(id=agent.id, force=True))
        for account in api.ListAccounts(admin_pb2.ListRequest()).accounts:  # after their partitions went with the clusters
            api.RemoveAccount(admin_pb2.RemoveAccountRequest(name=account.name))
        for machine in self.rack.machines:
            for partition_id in self.held(machine.name):
                self.agent_stub_at(machine.port).ClearPartition(agent_pb2.ClearPartitionRequest(partition_id=partition_id))
        if self.ipuof_dir.exists():
            for path in self.ipuof_dir.iterdir():
                path.unlink()

    def register(self, cluster: str = "cl0", allocation: str = "alloc-1", topology=admin_pb2.ILD_TOPOLOGY_MESH, ilds: int = 1,
                 machines: int | None = None):
        """Agents ag1..agN, one cluster of them all and one allocation of them all, straight over gRPC."""
        chosen = self.rack.machines[:machines]
        for n, machine in enumerate(chosen, start=1):
            self.admin_api.CreateAgent(admin_pb2.CreateAgentRequest(id=f"ag{n}", host=machine.host, port=machine.port))
        ids = [f"ag{n}" for n in range(1, len(chosen) + 1)]
        self.admin_api.CreateCluster(admin_pb2.CreateClusterRequest(id=cluster, agent_ids=ids, topology=topology, num_ipulinkdomains=ilds))
        if allocation:
            self.admin_api.CreateAllocation(admin_pb2.CreateAllocationRequest(id=allocation, cluster_id=cluster, agent_ids=ids))
        return self

    # The CLIs

    def _run(self, program: str, port: int, args, config: Path | None = None) -> Result:
        env = {**os.environ, "VIPU_IPUOF_DIR": str(self.ipuof_dir)}
        env.pop("VIPU_CLI_API_HOST", None)
        if config is None and self.secure:
            config = self.admin_config
        options = ["--config", str(config)] if config else []
        done = subprocess.run([str(BIN / program), "-H", "127.0.0.1", "--api-port", str(port), *options, *args],
                              capture_output=True, text=True, env=env, timeout=120, cwd=self.directory)
        return Result(done.returncode, done.stdout, done.stderr)

    def admin_on_terminal(self, *args: str, timeout: float = 120.0) -> tuple[int, str]:
        """vipu-admin with a terminal as its standard output and error: its exit status and what a
        person would have seen, without the terminal's control sequences."""
        primary, secondary = pty.openpty()
        env = {**os.environ, "TERM": "xterm", "COLUMNS": "120"}
        process = subprocess.Popen([str(BIN / "vipu-admin"), "-H", "127.0.0.1", "--api-port", str(self.admin_port), *args],
                                   stdin=subprocess.DEVNULL, stdout=secondary, stderr=secondary, env=env, cwd=self.directory)
        os.close(secondary)
        seen, deadline = bytearray(), time.monotonic() + timeout
        try:
            while time.monotonic() < deadline:
                if not select.select([primary], [], [], 0.5)[0]:
                    continue
                try:
                    chunk = os.read(primary, 65536)
                except OSError:  # EIO: the command ended and the terminal closed
                    break
                if not chunk:
                    break
                seen += chunk
            else:
                process.kill()
                raise AssertionError(f"vipu-admin {' '.join(args)} did not end within {timeout} s: {seen.decode()[-2000:]}")
        finally:
            os.close(primary)
        text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", seen.decode(errors="replace"))
        return process.wait(timeout=10), text.replace("\r\n", "\n").replace("\r", "\n")

    def admin(self, *args: str, config: Path | None = None) -> Result:
        return self._run("vipu-admin", self.admin_port, args, config)

    def user(self, *args: str, config: Path | None = None) -> Result:
        return self._run("vipu", self.user_port, args, config)

    def logged(self, text: str, timeout: float = 10.0) -> str:
        """The controller's log once `text` is in it: its lines are written a moment after they are logged."""
        log = self.directory / "server.log"
        wait_until(lambda: text in log.read_text(), timeout=timeout, what=f"{text!r} in the controller's log")
        return log.read_text()

    def snapshot(self) -> dict:
        """Everything the controller knows and every agent holds, to compare before and after."""
        api, request = self.admin_api, admin_pb2.ListRequest()
        agents = api.ListAgents(request).agents
        for agent in agents:
            agent.ClearField("status")
            agent.ClearField("last_error")
            agent.ClearField("condition")  # power and health as last read: the machine's, not the controller's to keep
        user = vipuuser_pb2_grpc.UserServiceStub(self._server_channel(self.user_port))
        return {
            "agents": list(agents),
            "clusters": list(api.ListClusters(request).clusters),
            "allocations": list(api.ListAllocations(request).allocations),
            "partitions": list(user.ListPartitions(vipuuser_pb2.ListPartitionsRequest()).partitions),
            "held": {m.name: self.held(m.name) for m in self.rack.machines},
            "ipuof": sorted(p.name for p in self.ipuof_dir.glob("*")) if self.ipuof_dir.exists() else [],
        }


PROMPTLY = 5.0  # seconds: a watch tells of a change at once, but the machine is shared


def watching(client: UserClient) -> tuple[queue.Queue, Stream]:
    """Each message's topics in a queue (None once the stream ended), from a thread, and the
    stream, to cancel; once the watch is in place."""
    stream = client.watch_changes()
    heard: queue.Queue = queue.Queue()

    def listen() -> None:
        for change in stream:
            heard.put(list(change.topics))
        heard.put(None)  # the stream ended

    threading.Thread(target=listen, daemon=True).start()
    assert heard.get(timeout=PROMPTLY) == []
    return heard, stream


def hears(heard: queue.Queue, topic: str) -> bool:
    """Whether a message names the topic within PROMPTLY seconds (an operation may be told of in
    several messages: a create's pending and active states, say)."""
    deadline = time.monotonic() + PROMPTLY
    while (left := deadline - time.monotonic()) > 0:
        try:
            if topic in (heard.get(timeout=left) or ()):
                return True
        except queue.Empty:
            break
    return False


def failed_line(result: Result, action: str, subject: str | None, reason: str) -> None:
    """The command failed with exactly one line naming its action and reason."""
    head = f"{action} ({subject})" if subject else action
    assert result.code == 1, (result.code, result.out, result.err)
    assert result.out == ""
    lines = result.err.splitlines()
    assert len(lines) == 1, result.err
    assert lines[0].startswith(f"{head}: failed: "), lines[0]
    assert reason in lines[0], lines[0]
    assert "Traceback" not in result.err


def blocks(text: str) -> list[list[str]]:
    """The runs of lines between the rules of a CLI's output (an empty table body is an empty run)."""
    found, current, ruled = [], [], False
    for line in text.splitlines():
        if line and set(line) == {"-"}:
            if current or ruled:
                found.append(current)
            current, ruled = [], True
        else:
            current.append(line)
    if current:
        found.append(current)
    return found


def pairs(text: str) -> dict[str, str]:
    """The first key/value table of a CLI's output."""
    first = next(block for block in blocks(text) if block)
    return {k.strip(): v.strip() for k, _, v in (line.partition("|") for line in first)}


def rows(text: str, table: int = 0) -> list[list[str]]:
    """The data rows of a CLI's table, as lists of cells.

    A table's header is a one-line block, or the text before the first rule of an output that does
    not open with one (whose last line is then the header); its body is the next block.
    """
    found = blocks(text)
    opens_with_rule = text.startswith("-")
    bodies = [found[i + 1] for i in range(len(found) - 1)
              if found[i] and "|" in found[i][-1] and (len(found[i]) == 1 or (i == 0 and not opens_with_rule))]
    return [[cell.strip() for cell in line.split("|")] for line in bodies[table]]
