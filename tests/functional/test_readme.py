"""The README's walk-throughs, run as written: each command line of a block, in a scratch home and
working directory, its output against the lines the README shows under it (keys and the store's
path vary)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import time
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


def run_walkthrough(block: list[str], directory: Path, env: dict, background: list, ready: str, outputs_shown: bool = True,
                    silent_at_most: float = 0.0) -> Path:
    """Run each `$ ` line; with `outputs_shown`, compare what it prints with the lines under it,
    else only require it to succeed. A line ending in & runs on until the test ends, once it
    printed `ready`, and with `silent_at_most` says something at least that often until then. A
    line that changes directory (`mkdir -p D && cd D`) moves the lines after it there, as a shell
    would; the directory the walk-through ends in."""
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
            log = directory / f"background-{len(list(directory.glob('background-*.log')))}.log"  # a log of its own, its words alone
            with open(log, "ab") as out:
                background.append(subprocess.Popen(["bash", "-c", command[:-1]], cwd=directory, env=env, stdout=out,
                                                   stderr=subprocess.STDOUT))
            wait_for_word(log, background[-1], ready, command, silent_at_most)
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


def wait_for_word(log: Path, process: subprocess.Popen, ready: str, command: str, silent_at_most: float) -> None:
    """Wait up to 90 s for a background command to print `ready`; with `silent_at_most`, fail if it
    is silent longer than that meanwhile (a new user takes a long silence for a hang)."""
    started = last_word = time.monotonic()
    size = 0
    while ready not in log.read_text():
        assert process.poll() is None, log.read_text()
        now = time.monotonic()
        if log.stat().st_size != size:
            size, last_word = log.stat().st_size, now
        silent = now - last_word
        assert not silent_at_most or silent <= silent_at_most, f"{command} said nothing for {silent:.0f} s:\n{log.read_text()}"
        assert now - started < 90, f"timed out waiting for {command} to say {ready!r}:\n{log.read_text()}"
        time.sleep(0.1)
    assert process.poll() is None, log.read_text()


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


def link_ledger(tree: Path, env: dict, background: list) -> None:
    """The ledger's walk-through on its own pod; readings and times differ between runs, so each
    command must succeed and the cable the fault degrades must be suspect, on p1's links."""
    taken = busy([8090, 8091, 8092, *simulated_pod_ports(4)])
    assert not taken, f"the walk-through uses the default ports; something else holds {taken}"
    run_walkthrough(first_block(section("The link ledger"), "must fit in the 7 days of full readings"), tree, env, background,
                    "try: vipu create partition", outputs_shown=False)

    def suspect_on_p1() -> set[str]:
        done = subprocess.run(["bash", "-c", "vipu-admin list links --partition p1 --suspect --json"], cwd=tree, env=env,
                              capture_output=True, text=True, timeout=60, check=True)
        return {link["name"] for link in json.loads(done.stdout)["links"]}

    wait_until(lambda: suspect_on_p1() >= {"ag1:5", "ag2:1"}, timeout=30, what="the degraded cable's ends suspect on p1's links")


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
                    "the dashboard:", silent_at_most=10)
    assert "give --sim-rebuild" not in "".join(log.read_text() for log in tree.glob("background-*.log"))


def scripts_pod_again(tree: Path, env: dict, background: list) -> None:
    """A second `scripts/pod` on the same data directory keeps the partitions of the first, and
    suggests a name that is free: the one it suggests is made."""
    stop(background)
    scripts_pod(tree, env, background)
    newest = max(tree.glob("background-*.log"), key=lambda log: int(log.stem.split("-")[1]))
    said = re.findall(r"try: (vipu create partition (\S+) --size 4) \(\d+ partition\(s\) kept from an earlier start", newest.read_text())
    assert len(said) == 1, newest.read_text()
    run_walkthrough([f"$ {said[0][0]}", f"create partition ({said[0][1]}): success."], tree, env, background, "")


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
    run_walkthrough(first_block(section("Running on real machines"), "walk-through](#watching-a-pod"), tree, env, background, "")
    scripts_pod_again(tree, env, background)


def stop(background: list) -> None:
    """End what a walk-through left running (each the README leaves to Ctrl-C), before the next uses its ports."""
    for process in background:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
    background.clear()


WALKTHROUGHS = {"secure mode": secure_mode, "the simulated hardware": simulated_hardware, "tenant vPODs": tenant_vpods,
                "the link ledger": link_ledger, "operating a pod": operating_a_pod}  # on scripts/pod, which it starts first


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
