"""The README's walk-throughs, run as written: each command line of a block, in a scratch home and
working directory, its output against the lines the README shows under it (keys and the store's
path vary)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
from pathlib import Path

import pytest

from tests.functional.harness import BIN, wait_until

pytestmark = pytest.mark.functional

README = Path(__file__).resolve().parents[2] / "README.md"


def section(title: str) -> str:
    return README.read_text().split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]


def first_block(text: str, after: str = "") -> list[str]:
    """The lines of the first indented block (after the line containing `after`), unindented,
    continuation lines joined."""
    lines = text.split(after, 1)[1].splitlines() if after else text.splitlines()
    block: list[str] = []
    for line in lines:
        if line.startswith("    "):
            if block and block[-1].endswith("\\"):
                block[-1] = block[-1][:-1].rstrip() + " " + line.strip()
            else:
                block.append(line[4:])
        elif block and line.strip():
            break
    return block


def as_pattern(shown: str) -> str:
    """A line of output as the README shows it, with what differs between runs left open."""
    pattern = re.escape(shown)
    pattern = re.sub(r"'[A-Za-z0-9_\\-]{16,}'", "'[A-Za-z0-9_-]+'", pattern)  # an access key
    pattern = pattern.replace(re.escape("sqlite:////root/.local/share/vipu/vipu.db"), "sqlite:///.*/vipu\\.db")
    return pattern.replace(re.escape("/root/"), "/.*/")  # the scratch home


def busy(ports) -> list[int]:
    """Those of the ports something on this machine answers on."""
    taken = []
    for port in ports:
        with socket.socket() as probe:
            if probe.connect_ex(("127.0.0.1", port)) == 0:
                taken.append(port)
    return taken


def simulated_pod_ports(machines: int, base: int = 18101) -> list[int]:
    """What the simulated machines of the default rack listen on: agents, IPUoF, RDMA and exporters."""
    return [base + offset + n for n in range(machines) for offset in (0, 2000, 4000, 6000)]


@pytest.fixture
def scratch(tmp_path):
    env = {**os.environ, "HOME": str(tmp_path), "USER": "root", "LOGNAME": "root", "PATH": f"{BIN}:/usr/bin:/bin",
           "VIPU_IPUOF_DIR": str(tmp_path / "ipuof")}
    for name in ("VIPU_CLI_API_HOST", "VIPU_CLI_API_PORT", "VIPU_CLI_API_USER_ID", "VIPU_CLI_API_ACCESS_KEY"):
        env.pop(name, None)
    background: list[subprocess.Popen] = []
    yield tmp_path, env, background
    for process in background:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)


def run_walkthrough(block: list[str], directory: Path, env: dict, background: list, ready: str, outputs_shown: bool = True) -> None:
    """Run each `$ ` line; with `outputs_shown`, compare what it prints with the lines under it,
    else only require it to succeed. A line ending in & runs on until the test ends, once it
    printed `ready`."""
    steps: list[tuple[str, list[str]]] = []
    for line in block:
        if line.startswith("$ "):
            steps.append((line[2:].split("  #", 1)[0].strip(), []))
        elif steps:
            steps[-1][1].append(line)
    assert steps, "the README shows commands"
    for command, shown in steps:
        if command.endswith("&"):
            log = directory / f"background-{len(background)}.log"
            with open(log, "ab") as out:
                background.append(subprocess.Popen(["bash", "-c", command[:-1]], cwd=directory, env=env, stdout=out,
                                                   stderr=subprocess.STDOUT))
            wait_until(lambda: ready in log.read_text() or background[-1].poll() is not None, timeout=90, what=command)  # noqa: B023
            assert background[-1].poll() is None, log.read_text()
            continue
        done = subprocess.run(["bash", "-c", command], cwd=directory, env=env, capture_output=True, text=True, timeout=120)
        if not outputs_shown:
            assert done.returncode == 0, (command, done.stdout, done.stderr)
            continue
        seen = (done.stdout + done.stderr).splitlines()
        assert len(seen) == len(shown), (command, seen, shown)
        for line, expected in zip(seen, shown, strict=True):
            assert re.fullmatch(as_pattern(expected), line), (command, line, expected)


def test_the_secure_mode_walkthrough_works_as_written(scratch):
    directory, env, background = scratch
    taken = busy([8090, 8091, 8092, *simulated_pod_ports(4)])
    assert not taken, f"the walk-through uses the default ports; something else holds {taken}"
    run_walkthrough(first_block(section("Secure mode")), directory, env, background, "try: vipu create partition")
    run_walkthrough(first_block(section("Secure mode"), "come from that authority"), directory, env, background, "")
    assert (directory / "m01-certs" / "agent.pem").exists() and (directory / "tenant-a-certs" / "controller" / "ca.pem").exists()


def test_the_simulated_hardware_walkthrough_works_as_written(scratch):
    directory, env, background = scratch
    taken = busy(simulated_pod_ports(64))
    assert not taken, f"the walk-through's agents use the default ports; something else holds {taken}"
    block = first_block(section("The simulated hardware"), "faults into them:")
    commands = [f"$ {line}" + (" &" if line.startswith("vipu-agent") else "") for line in block]
    run_walkthrough(commands, directory, env, background, "served on", outputs_shown=False)
    assert "m08:7" in (directory / "pod.yaml").read_text()


def test_the_tenant_vpod_walkthrough_works_as_written(scratch):
    directory, env, background = scratch
    taken = busy([8095, 9100, 9101, 9102, *simulated_pod_ports(16, base=18301)])
    assert not taken, f"the walk-through uses the default ports; something else holds {taken}"
    try:
        run_walkthrough(first_block(section("Tenant vPODs")), directory, env, background, "serve")
    finally:  # the tenant's controller runs in a session of its own: stop it if the release did not
        for pid_file in (directory / ".local/share/vipu-vpod/vpods").glob("*/controller.pid"):
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid_file.read_text()), signal.SIGKILL)
