"""Several vipu-server replicas on one real PostgreSQL: one leads, the others stand by and take over.

Real processes throughout: agents, three `vipu-server --ha` replicas, the CLIs given every
replica's address (`-H h1,h2,h3`).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.functional.harness import BIN, Pod, Result, rows, wait_until
from tests.ports import free_port
from tests.processes import dying_with_parent

pytestmark = [pytest.mark.functional, pytest.mark.postgres]

LEASE_SECONDS = 3.0
TAKEOVER_LIMIT = 10.0  # seconds from the leader's death until a client is served again


@dataclass
class Replica:
    name: str
    user_port: int = field(default_factory=free_port)
    admin_port: int = field(default_factory=free_port)
    metrics_port: int = field(default_factory=free_port)
    lease_seconds: float = LEASE_SECONDS
    options: tuple[str, ...] = ()
    environment: dict[str, str] = field(default_factory=dict)  # besides the test's own: failpoints, say
    db_url: str = ""  # the store, if not the pod's (the same database, reached another way)
    process: subprocess.Popen | None = None

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.user_port}"

    def start(self, pod: Pod, wait: bool = True) -> Replica:
        """Start the replica's process; with `wait`, until its metrics end-point answers."""
        with open(pod.directory / f"server-{self.name}.log", "ab") as log:
            self.process = subprocess.Popen(
                dying_with_parent([str(BIN / "vipu-server"), "--db", self.db_url or pod.db_url, "--data-dir", str(pod.directory),
                                   "--listen-address", "127.0.0.1", "--port", str(self.user_port), "--admin-port", str(self.admin_port),
                                   "--metrics-port", str(self.metrics_port), "--health-interval", "0.3", "--agent-timeout", "3",
                                   "--ha", "--ha-lease-seconds", str(self.lease_seconds), *self.options]),
                stdout=log, stderr=subprocess.STDOUT, env={**os.environ, **self.environment},
            )
        if wait:
            wait_until(self.answers_metrics, what=f"replica {self.name}")
        return self

    def answers_metrics(self) -> bool:
        try:
            self.leads()
            return True
        except OSError:
            assert self.process.poll() is None, f"replica {self.name} exited with status {self.process.returncode}"
            return False

    def leads(self) -> bool:
        text = urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=2).read().decode()
        return "\nvipu_leader 1.0" in text

    def log(self, pod: Pod) -> str:
        return (pod.directory / f"server-{self.name}.log").read_text()


def cli(program: str, hosts: str, *args: str, cwd: Path) -> Result:
    done = subprocess.run([str(BIN / program), "-H", hosts, "--api-timeout", "5", *args],
                          capture_output=True, text=True, timeout=60, cwd=cwd)
    return Result(done.returncode, done.stdout, done.stderr)


@pytest.fixture
def replicated(request, tmp_path, postgres_url):
    """Agents of 2 machines, registered, and three replicas on one PostgreSQL database (lease: the parameter, if any)."""
    lease_seconds = getattr(request, "param", LEASE_SECONDS)
    pod = Pod(tmp_path, machines=2, db_url=postgres_url)
    for group in pod.agent_groups:
        pod.start_agent(*group)
    for machine in pod.rack.machines:
        pod.wait_for_agent(machine.name)
    replicas = [Replica(name, lease_seconds=lease_seconds).start(pod) for name in ("a", "b", "c")]
    try:
        leader = wait_until(lambda: the_leader(replicas), what="a leader")
        pod.admin_port = leader.admin_port  # pod.register speaks to the leader directly
        pod.register()
        yield pod, replicas
    finally:
        for replica in replicas:
            if replica.process.poll() is None:
                replica.process.send_signal(signal.SIGCONT)
                replica.process.kill()
            replica.process.wait()
        pod.stop()


def readiness(replica: Replica, timeout: float = 2.0) -> int:
    """What a Kubernetes readiness probe or a load balancer sees: 200, 503, or 0 when nothing answers in `timeout`."""
    try:
        return urllib.request.urlopen(f"http://127.0.0.1:{replica.metrics_port}/readyz", timeout=timeout).status
    except urllib.error.HTTPError as refused:
        return refused.code
    except OSError:
        return 0


def the_leader(replicas: list[Replica]) -> Replica | None:
    """The one live replica that leads; None while none does. Two leading at once fails the test."""
    leading = [r for r in replicas if r.process.poll() is None and r.leads()]
    assert len(leading) <= 1, f"{[r.name for r in leading]} lead at once"
    return leading[0] if leading else None


def test_standbys_refuse_and_name_the_leader(replicated):
    pod, replicas = replicated
    leader = the_leader(replicas)
    standby = next(r for r in replicas if r is not leader)
    refused = cli("vipu", standby.address, "list", "partitions", cwd=pod.directory)
    assert refused.code == 1 and refused.out == ""
    assert refused.err.splitlines() == [
        "list partitions: failed: this vipu-server is a standby replica; the leader is at "
        f"127.0.0.1, user port {leader.user_port}, admin port {leader.admin_port}."
    ]
    assert readiness(leader) == 200 and readiness(standby) == 503
    # Listed first, the standby is passed over for the leader.
    hosts = ",".join([standby.address, leader.address])
    assert cli("vipu", hosts, "create", "partition", "p1", "--size", "4", cwd=pod.directory).out == "create partition (p1): success.\n"
    assert cli("vipu", standby.address, "--server-version", cwd=pod.directory).code == 0  # the version answers anyone


def test_a_standby_serves_within_10_seconds_of_the_leader_being_killed(replicated):
    pod, replicas = replicated
    hosts = ",".join(r.address for r in replicas)
    assert cli("vipu", hosts, "create", "partition", "p1", "--size", "4", cwd=pod.directory).code == 0
    held = pod.held_anywhere("p1")
    leader = the_leader(replicas)
    admin_hosts = ",".join(f"127.0.0.1:{r.admin_port}" for r in replicas)
    drained = cli("vipu-admin", admin_hosts, "drain", "agent", "ag2", "--reason", "cable repair", cwd=pod.directory)
    assert drained.code == 0, drained.err

    leader.process.kill()
    killed = time.monotonic()
    # Timed by the replicas' readiness, polled from here: a command's own start-up on a loaded
    # machine is not the takeover's time.
    wait_until(lambda: any(readiness(r) == 200 for r in replicas if r is not leader), timeout=TAKEOVER_LIMIT + 5,
               what="a standby to serve")
    took = time.monotonic() - killed
    assert took < TAKEOVER_LIMIT, f"served again after {took:.1f} s"
    listed = cli("vipu", hosts, "list", "partitions", cwd=pod.directory)  # given every replica, a client finds the new leader
    assert listed.code == 0, listed.err
    assert [row[0] for row in rows(listed.out)] == ["p1"] and rows(listed.out)[0][-1] == "ACTIVE"
    assert pod.held_anywhere("p1") == held  # the partition kept its IPUs, configured as before

    successor = the_leader(replicas)
    assert successor is not None and successor is not leader
    assert "elected leader (term 2)" in successor.log(pod)
    agents = {row[0]: row[6] for row in rows(cli("vipu-admin", admin_hosts, "list", "agents", cwd=pod.directory).out)}
    assert agents["ag2"].startswith("DRAINED: cable repair, by "), agents  # the drain outlives its leader
    refused = cli("vipu", hosts, "create", "partition", "p2", "--size", "4", cwd=pod.directory)
    assert refused.code == 1 and "agent ag2 is draining for cable repair" in refused.err, refused.err
    assert cli("vipu-admin", admin_hosts, "resume", "agent", "ag2", cwd=pod.directory).code == 0
    assert cli("vipu", hosts, "create", "partition", "p2", "--size", "4", cwd=pod.directory).code == 0
    assert cli("vipu", hosts, "remove", "partition", "p1", cwd=pod.directory).code == 0
    assert pod.held_anywhere("p1") == [] and pod.held_anywhere("p2")

    leader.start(pod)  # back, as a standby: the successor keeps the lead
    assert the_leader(replicas) is successor
    assert [row[0] for row in rows(cli("vipu-admin", admin_hosts, "list", "agents", cwd=pod.directory).out)] == ["ag1", "ag2"]


def test_the_queue_outlives_the_leader_and_a_client_waiting_through_the_takeover_gets_its_partition(replicated):
    pod, replicas = replicated
    hosts = ",".join(r.address for r in replicas)
    assert cli("vipu", hosts, "create", "partition", "full", "--size", "8", cwd=pod.directory).code == 0
    waiting = subprocess.Popen([str(BIN / "vipu"), "-H", hosts, "--api-timeout", "5", "create", "partition", "patient", "--size", "4",
                                "--wait", "--timeout", "120"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               cwd=pod.directory, env={**os.environ, "VIPU_IPUOF_DIR": str(pod.directory / "ipuof")})
    wait_until(lambda: rows(cli("vipu", hosts, "list", "requests", cwd=pod.directory).out), what="the request to wait")
    leader = the_leader(replicas)
    leader.process.kill()
    listed = wait_until(lambda: (r := cli("vipu", hosts, "list", "requests", cwd=pod.directory)).code == 0 and r,
                        timeout=TAKEOVER_LIMIT + 5, what="a standby to serve")
    assert [row[:4] for row in rows(listed.out)] == [["1", "patient", "alloc-1", "4"]]  # the successor found the queue
    assert waiting.poll() is None
    assert cli("vipu", hosts, "remove", "partition", "full", cwd=pod.directory).code == 0
    out, err = waiting.communicate(timeout=60)
    assert (waiting.returncode, out) == (0, "create partition (patient): success.\n"), err
    assert len(pod.held_anywhere("patient")) == 1


@pytest.mark.parametrize("replicated", [30.0], indirect=True)  # a lease long enough for its expiry to tell
def test_a_leader_stopping_cleanly_hands_over_at_once(replicated):
    _, replicas = replicated
    leader = the_leader(replicas)
    leader.process.terminate()
    assert leader.process.wait(timeout=30) == 0
    stopped = time.monotonic()
    successor = wait_until(lambda: the_leader(replicas), timeout=40, what="a new leader")
    # Unreleased, the lease (renewed every third of it until the leader's exit) would run 20 s or more past it.
    assert time.monotonic() - stopped < 10.0
    assert successor is not leader


def test_a_leader_frozen_past_its_lease_is_deposed_and_exits_without_serving(replicated):
    pod, replicas = replicated
    hosts = ",".join(r.address for r in replicas)
    leader = the_leader(replicas)
    leader.process.send_signal(signal.SIGSTOP)  # a leader that hangs, not one that dies
    successor = wait_until(lambda: the_leader([r for r in replicas if r is not leader]), timeout=TAKEOVER_LIMIT + 5,
                           what="a standby to take over from the frozen leader")
    assert cli("vipu", successor.address, "create", "partition", "p1", "--size", "8", cwd=pod.directory).code == 0

    leader.process.send_signal(signal.SIGCONT)
    assert leader.process.wait(timeout=30) == 3
    # Thawed, its watchdog finds its loop was held past half a lease, or its loop finds the lead gone.
    assert re.search(r"no longer the leader \((its lease loop was held for|the lead passed to 127\.0\.0\.1)", leader.log(pod))
    listed = cli("vipu", hosts, "list", "partitions", cwd=pod.directory)
    assert [row[0] for row in rows(listed.out)] == ["p1"]
    assert pod.held_anywhere("p1") == ["m01", "m02"]  # the deposed leader's health pass cleared nothing


def test_a_deposed_leaders_late_agent_call_is_refused_by_the_agent(tmp_path, postgres_url):
    """The leader's create has its agent call on the way (held by a failpoint) when it freezes past
    its lease; its successor finishes the create with calls of the next term. Thawed, the old
    leader's call arrives with the old term: the agent refuses it and says so, and the successor's
    configuration stands."""
    pod = Pod(tmp_path, machines=1, db_url=postgres_url)
    pod.start_agent("m01")
    pod.wait_for_agent("m01")
    # Its exit held longer than its call: the late call goes out, as it may in the instant before any exit.
    first = Replica("a", environment={"VIPU_FAILPOINTS": "agent.apply=1*delay(8);server.exit=delay(10)"}).start(pod)
    second = Replica("b")
    try:
        wait_until(first.leads, what="the first replica to lead")
        pod.admin_port = first.admin_port
        pod.register()
        second.start(pod)
        creating = subprocess.Popen([str(BIN / "vipu"), "-H", first.address, "create", "partition", "p1", "--size", "4"],
                                    stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=pod.directory)
        wait_until(lambda: "p1" in cli("vipu", first.address, "list", "partitions", cwd=pod.directory).out,
                   what="the create to be committed, its agent call held")
        first.process.send_signal(signal.SIGSTOP)
        wait_until(second.leads, timeout=TAKEOVER_LIMIT + 5, what="the second replica to take over")
        wait_until(lambda: "ACTIVE" in cli("vipu", second.address, "get", "partition", "p1", cwd=pod.directory).out,
                   what="the successor to finish the create, with calls of its term")
        first.process.send_signal(signal.SIGCONT)
        assert first.process.wait(timeout=30) == 3  # deposed
        creating.communicate(timeout=30)
        agent_log = (pod.directory / "agent-m01.log").read_text()
        assert "machine m01: refused a call of controller (plaintext) from leader epoch 1: epoch 2 leads now" in agent_log
        assert pod.held("m01") == {"p1": [0, 1, 2, 3]}
        assert "ACTIVE" in cli("vipu", second.address, "get", "partition", "p1", cwd=pod.directory).out
    finally:
        for replica in (first, second):
            if replica.process is None:
                continue
            if replica.process.poll() is None:
                replica.process.send_signal(signal.SIGCONT)
                replica.process.kill()
            replica.process.wait()
        pod.stop()


def test_replicas_in_secure_mode_hand_over_to_clients_with_mutual_tls(tmp_path, postgres_url):
    pod = Pod(tmp_path, machines=1, db_url=postgres_url, secure=True)
    pod.initialise()  # the store's administrator, and certificates every replica serves (127.0.0.1 among their names)
    pod.start_agent(*pod.agent_groups[0])
    replicas = [Replica(name, options=("--secure", "--tls-dir", str(pod.tls.root))).start(pod) for name in ("a", "b")]
    try:
        leader = wait_until(lambda: the_leader(replicas), what="a leader")
        admin_hosts = ",".join(f"127.0.0.1:{r.admin_port}" for r in replicas)
        config = str(pod.admin_config)
        machine = pod.rack.machines[0]
        created = cli("vipu-admin", admin_hosts, "--config", config, "create", "agent", "ag1", "--host", machine.host,
                      "--port", str(machine.port), cwd=pod.directory)
        assert created.out == "create agent (ag1): success.\n", created.err

        leader.process.kill()
        listed = wait_until(lambda: (r := cli("vipu-admin", admin_hosts, "--config", config, "list", "agents",
                                              cwd=pod.directory)).code == 0 and r,
                            timeout=TAKEOVER_LIMIT, what="the standby to serve over mutual TLS")
        assert [row[0] for row in rows(listed.out)] == ["ag1"]
        anonymous = cli("vipu-admin", admin_hosts, "list", "agents", cwd=pod.directory)  # no certificate, no key
        assert anonymous.code == 1 and "secure mode" in anonymous.err
    finally:
        for replica in replicas:
            replica.process.kill()
            replica.process.wait()
        pod.stop()
