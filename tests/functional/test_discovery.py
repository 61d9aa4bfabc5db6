"""Agent auto-discovery across a network namespace joined by a veth pair (loopback where that cannot be).

The agents live in their own network namespace and announce themselves over its end of the veth
pair; vipu-server listens on the host's end only (`-a`). An agent announcing on loopback at the
same time must not be seen.
"""

from __future__ import annotations

import os
import random
import shutil
import subprocess
import sys
from dataclasses import dataclass

import pytest

from tests.functional.harness import BIN, Result, failed_line, rows, wait_until
from tests.ports import free_port
from vipu.backends.sim.rack import generate_rack, save_rack


@dataclass
class Link:
    """Where the agents live and the interface the controller listens on."""

    interface: str
    agent_host: str
    run_in: list[str]  # command prefix that runs a program where the agents live


def _ip(*args: str) -> None:
    subprocess.run(["ip", *args], check=True, capture_output=True)


@pytest.fixture
def link():
    if os.geteuid() != 0 or shutil.which("ip") is None:
        yield Link("lo", "127.0.0.1", [])
        return
    n = random.randrange(1, 250)
    namespace, host_side, agent_side = f"vipu-disc-{n}", f"vdh{n}", f"vda{n}"
    try:
        _ip("netns", "add", namespace)
    except subprocess.CalledProcessError:
        yield Link("lo", "127.0.0.1", [])  # namespaces are not allowed here
        return
    try:
        _ip("link", "add", host_side, "type", "veth", "peer", "name", agent_side)
        _ip("link", "set", agent_side, "netns", namespace)
        _ip("addr", "add", f"10.213.{n}.1/24", "dev", host_side)
        _ip("link", "set", host_side, "up")
        _ip("netns", "exec", namespace, "ip", "addr", "add", f"10.213.{n}.2/24", "dev", agent_side)
        _ip("netns", "exec", namespace, "ip", "link", "set", agent_side, "up")
        _ip("netns", "exec", namespace, "ip", "link", "set", "lo", "up")
        yield Link(host_side, f"10.213.{n}.2", ["ip", "netns", "exec", namespace])
    finally:
        subprocess.run(["ip", "netns", "del", namespace], capture_output=True)
        subprocess.run(["ip", "link", "del", host_side], capture_output=True)


class Processes:
    def __init__(self):
        self.running: list[subprocess.Popen] = []

    def start(self, command: list[str], log) -> subprocess.Popen:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        self.running.append(process)
        return process

    def stop(self):
        for process in self.running:
            process.terminate()
        for process in self.running:
            process.wait(timeout=30)


@pytest.fixture
def processes():
    started = Processes()
    yield started
    started.stop()


def admin(port: int, *args: str) -> Result:
    done = subprocess.run([str(BIN / "vipu-admin"), "-H", "127.0.0.1", "--api-port", str(port), *args],
                          capture_output=True, text=True, timeout=60)
    return Result(done.returncode, done.stdout, done.stderr)


def test_agents_are_discovered_on_the_chosen_interface_only_and_added(link, processes, tmp_path, capsys):
    announce_port = free_port()
    rack = generate_rack(2, host=link.agent_host)
    for machine in rack.machines:
        machine.port, machine.ipuof_port = free_port(), free_port()
    save_rack(rack, tmp_path / "rack.yaml")
    intruder = generate_rack(1)
    intruder.machines[0].port, intruder.machines[0].ipuof_port = free_port(), 0
    save_rack(intruder, tmp_path / "intruder.yaml")

    announce = ["--announce-interval", "0.2", "--announce-port", str(announce_port)]
    with open(tmp_path / "processes.log", "ab") as log:  # the processes write to their own copies of it
        for machine in rack.machines:
            processes.start([*link.run_in, sys.executable, "-m", "vipu.agent", "--rack", str(tmp_path / "rack.yaml"),
                             "--machine", machine.name, *announce], log)
        if link.interface != "lo":
            processes.start([sys.executable, "-m", "vipu.agent", "--rack", str(tmp_path / "intruder.yaml"), "--all-machines",
                             *announce], log)
        admin_port = free_port()
        processes.start([str(BIN / "vipu-server"), "--db", f"sqlite:///{tmp_path / 'vipu.db'}", "--listen-address", "127.0.0.1",
                         "--port", str(free_port()), "--admin-port", str(admin_port), "--metrics-port", "0",
                         "-a", link.interface, "--autodiscovery-port", str(announce_port)], log)

    def heard():
        result = admin(admin_port, "discover", "agents")
        return result.code == 0 and len(rows(result.out)) == 2 and rows(result.out)

    found = wait_until(heard, what="both agents to be heard")
    ports = sorted(m.port for m in rack.machines)
    assert [(r[0], r[1], r[2], r[4]) for r in found] == [
        (link.agent_host, str(port), link.interface, f"{link.agent_host}-{port}") for port in ports
    ]
    assert all(r[3].endswith("s") and float(r[3][:-1]) < 5 for r in found)
    with capsys.disabled():
        print(f"\n  discovery tested over {'a veth pair into a network namespace' if link.interface != 'lo' else 'loopback'}")

    added = admin(admin_port, "discover", "agents", "--auto-add")
    assert added.lines == [f"Added agent {link.agent_host}-{port}" for port in ports], added.err
    listing = rows(admin(admin_port, "list", "agents").out)
    assert [r[0] for r in listing] == [f"{link.agent_host}-{port}" for port in ports]
    assert "| Auto" in admin(admin_port, "get", "agent", listing[0][0]).out
    assert admin(admin_port, "discover", "agents", "--auto-add").lines == ["No new agents to add."]


def test_without_interfaces_discovery_is_off(processes, tmp_path):
    admin_port = free_port()
    with open(tmp_path / "server.log", "ab") as log:
        processes.start([str(BIN / "vipu-server"), "--db", f"sqlite:///{tmp_path / 'vipu.db'}", "--listen-address", "127.0.0.1",
                         "--port", str(free_port()), "--admin-port", str(admin_port), "--metrics-port", "0"], log)
    wait_until(lambda: admin(admin_port, "list", "agents").code == 0, what="vipu-server")
    failed_line(admin(admin_port, "discover", "agents"), "discover agents", None,
                "agent discovery is off; start vipu-server with -a/--autodiscovery-listen-interfaces")


def test_an_unknown_interface_is_refused_at_start(tmp_path):
    done = subprocess.run([str(BIN / "vipu-server"), "--db", f"sqlite:///{tmp_path / 'vipu.db'}", "-a", "nosuch0",
                           "--port", str(free_port()), "--admin-port", str(free_port()), "--metrics-port", "0"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert done.stderr.startswith("vipu-server: there is no network interface nosuch0 (there are ") and len(done.stderr.splitlines()) == 1
