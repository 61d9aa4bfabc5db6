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
from tests.ports import free_port

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
    pattern = re.sub(r"\d{4}\\-\d\d\\-\d\d\\ \d\d:\d\d:\d\d", r"\\d{4}-\\d\\d-\\d\\d\\ \\d\\d:\\d\\d:\\d\\d", pattern)  # a time
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


def run_walkthrough(block: list[str], directory: Path, env: dict, background: list, ready: str, outputs_shown: bool = True) -> Path:
    """Run each `$ ` line; with `outputs_shown`, compare what it prints with the lines under it,
    else only require it to succeed. A line ending in & runs on until the test ends, once it
    printed `ready`. A line that changes directory (`mkdir -p D && cd D`) moves the lines after it
    there, as a shell would; the directory the walk-through ends in."""
    steps: list[tuple[str, list[str]]] = []
    for line in block:
        if line.startswith("$ "):
            steps.append((line[2:].split("  #", 1)[0].strip(), []))
        elif steps:
            steps[-1][1].append(line)
    assert steps, "the README shows commands"
    for command, shown in steps:
        if re.fullmatch(r"(mkdir -p \S+ && )?cd \S+", command):
            moved = subprocess.run(["bash", "-c", f"{command} && pwd"], cwd=directory, env=env, capture_output=True, text=True,
                                   timeout=30, check=True)
            directory = Path(moved.stdout.strip())
            continue
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
    return directory


def secure_mode(tree: Path, env: dict, background: list) -> None:
    taken = busy([8090, 8091, 8092, *simulated_pod_ports(4)])
    assert not taken, f"the walk-through uses the default ports; something else holds {taken}"
    directory = run_walkthrough(first_block(section("Secure mode")), tree, env, background, "try: vipu create partition")
    directory = run_walkthrough(first_block(section("Secure mode"), "come from that authority"), directory, env, background, "")
    assert (directory / "m01-certs" / "agent.pem").exists() and (directory / "tenant-a-certs" / "controller" / "ca.pem").exists()


def simulated_hardware(tree: Path, env: dict, background: list) -> None:
    taken = busy(simulated_pod_ports(64))
    assert not taken, f"the walk-through's agents use the default ports; something else holds {taken}"
    block = first_block(section("The simulated hardware"), "faults into them:")
    commands = [f"$ {line}" + (" &" if line.startswith("vipu-agent") else "") for line in block]
    directory = run_walkthrough(commands, tree, env, background, "served on", outputs_shown=False)
    assert "m08:7" in (directory / "pod.yaml").read_text()


def tenant_vpods(tree: Path, env: dict, background: list) -> None:
    taken = busy([8095, 9100, 9101, 9102, *simulated_pod_ports(16, base=18301)])
    assert not taken, f"the walk-through uses the default ports; something else holds {taken}"
    home = Path(env["HOME"])
    try:
        run_walkthrough(first_block(section("Tenant vPODs")), tree, env, background, "serve")
    finally:  # the tenant's controller runs in a session of its own: stop it if the release did not
        for pid_file in (home / ".local/share/vipu-vpod/vpods").glob("*/controller.pid"):
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(pid_file.read_text()), signal.SIGKILL)


def scripts_pod(tree: Path, env: dict, background: list) -> None:
    """The set-up's main job, `scripts/pod`: its pod in the default data directory, and the dashboard."""
    taken = busy([8090, 8091, 8092, *simulated_pod_ports(16)])
    assert not taken, f"scripts/pod uses the default ports; something else holds {taken}"
    run_walkthrough([f"$ {README.parent / 'scripts' / 'pod'} &"], tree, {**env, "VIPU_WEB_PORT": str(free_port())}, background,
                    "the dashboard:")
    assert "give --sim-rebuild" not in "".join(log.read_text() for log in tree.glob("background-*.log"))


def operating_a_pod(tree: Path, env: dict, background: list) -> None:
    """Drains, maintenance windows, reservations, accounts and telemetry on the pod of `scripts/pod`, as the README shows them."""
    scripts_pod(tree, env, background)
    run_walkthrough(first_block(section("Operating a pod"), "the whole of it"), tree, env, background, "")
    run_walkthrough(first_block(section("Operating a pod"), "test suite runs it on `scripts/pod` (open mode"), tree, env, background, "")
    # Readings differ from run to run: each command must succeed, and the log line the walk-through greps for must be there.
    run_walkthrough(first_block(section("Watching a pod: telemetry, logs, dashboards and alerts"), "The walk-through"), tree, env,
                    background, "", outputs_shown=False)

    def logged() -> bool:
        done = subprocess.run(["bash", "-c", "vipu-admin logs agent ag1 --grep ECC"], cwd=tree, env=env, capture_output=True, text=True,
                              timeout=60)
        return done.stdout.strip().endswith("gateway: IPU 2: 3 corrected ECC errors (3 in all)")

    wait_until(logged, timeout=15, what="the ECC errors the fault injector raised, in the machine's log")


def stop(background: list) -> None:
    """End what a walk-through left running (each the README leaves to Ctrl-C), before the next uses its ports."""
    for process in background:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
    background.clear()


WALKTHROUGHS = {"secure mode": secure_mode, "the simulated hardware": simulated_hardware, "tenant vPODs": tenant_vpods,
                "operating a pod": operating_a_pod}  # on scripts/pod, which it starts first


@pytest.mark.parametrize("order", [list(WALKTHROUGHS), list(reversed(WALKTHROUGHS))], ids=["in order", "reversed"])
def test_the_walkthroughs_work_as_written_in_any_order_on_one_machine_and_write_nothing_in_the_tree(scratch, order):
    """Every walk-through, one after the other in one home, as a new user tries them, in two
    orders; run from a directory standing for a clone of vipu, where none of them writes a file
    (keys and certificates least of all)."""
    home, env, background = scratch
    tree = home / "vipu"
    tree.mkdir()
    for name in order:
        WALKTHROUGHS[name](tree, env, background)
        stop(background)
        left = sorted(path.name for path in tree.iterdir() if not path.name.startswith("background-"))
        assert left == [], f"{name} wrote {left} in the tree"
