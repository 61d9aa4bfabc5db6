"""What every benchmark shares: pods of real processes, a PostgreSQL, process costs, results.

The benchmarks reuse the functional tests' `Pod` (a real `vipu-server` over real `vipu-agent`
processes on loopback) and their throw-away PostgreSQL, so what is measured is what is tested.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import time
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from tempfile import TemporaryDirectory

from tests.functional.harness import Pod
from tests.postgres import PostgresServer
from vipu.api.protos import admin_pb2
from vipu.model.entities import IldTopology

RESULTS = Path(os.environ.get("VIPU_BENCH_RESULTS", Path(__file__).parent / "results"))
PRODUCTION_TIMINGS = ("--health-interval", "10", "--agent-timeout", "10")  # not the tests' hurried ones
# The longest a measurement waits for the machine to be quiet first (`settle`). The suite's runs of
# the benchmarks, beside other tests that keep the machine busy, check what a run records rather
# than its figures, and set it short.
SETTLE_SECONDS = float(os.environ.get("VIPU_BENCH_SETTLE_SECONDS", "60"))
AGENT_PROCESSES = 16  # larger pods share these processes, every machine still on its own gRPC server
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


@dataclass
class ProcessCost:
    """Resident memory now, and CPU seconds used and context switches made so far, of one process.

    Context switches (every thread's, voluntary and not) count the hand-offs between threads: at
    saturation much of the controller's CPU in the kernel is spent switching between them, and
    under load their count per pair is steadier from run to run than throughput on a shared machine."""

    rss_mb: float
    cpu_seconds: float
    switches: int

    @classmethod
    def of(cls, pid: int) -> ProcessCost:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        cpu = (int(fields[11]) + int(fields[12])) / CLOCK_TICKS  # utime, stime
        resident_pages = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
        return cls(resident_pages * PAGE_SIZE / 2**20, cpu, _switches(pid))


def _switches(pid: int) -> int:
    """The context switches of every thread of a process now alive (the process's own status
    counts its first thread's alone). A thread that ends between two readings takes its count
    with it, so their difference counts too few: the servers measured keep their threads (gRPC's
    pool, the agent calls') for their whole life."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            status = (task / "status").read_text()
        except OSError:  # the thread ended
            continue
        total += sum(int(value) for key, _, value in (line.partition(":") for line in status.splitlines())
                     if key in ("voluntary_ctxt_switches", "nonvoluntary_ctxt_switches"))
    return total


def machine_busy_fraction(interval: float = 1.0) -> float:
    """The share of all CPUs' time spent busy over `interval` seconds (from /proc/stat)."""
    def sample() -> tuple[int, int]:
        fields = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
        idle = fields[3] + fields[4]  # idle, iowait
        return sum(fields) - idle, sum(fields)

    busy_before, total_before = sample()
    time.sleep(interval)
    busy_after, total_after = sample()
    return (busy_after - busy_before) / max(1, total_after - total_before)


def settle(quiet: float = 0.25) -> float:
    """Wait until the machine is quiet (what the last measurement left running has finished), or
    SETTLE_SECONDS pass; the busy fraction last seen."""
    ends = time.monotonic() + SETTLE_SECONDS
    while True:
        busy = machine_busy_fraction()
        if busy < quiet or time.monotonic() > ends:
            return busy


def percentile(values: list[float], fraction: float) -> float:
    """The value below which `fraction` of `values` lie (nearest rank)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(fraction * len(ordered)) - 1))]


def summarise_ms(seconds: list[float]) -> dict:
    if not seconds:
        return {"count": 0}
    ms = [s * 1000 for s in seconds]
    return {"count": len(ms), "p50_ms": round(percentile(ms, 0.5), 2), "p99_ms": round(percentile(ms, 0.99), 2),
            "mean_ms": round(statistics.fmean(ms), 2), "max_ms": round(max(ms), 2)}


@contextmanager
def postgres_database():
    """A database URL on a fresh PostgreSQL that commits like the SQLite store: no fsync per commit."""
    server = PostgresServer(durable=True)
    try:
        yield server.url(server.create_database())
    finally:
        server.stop()


@contextmanager
def running_pod(machines: int, store: str, time_scale: float = 0.001, server_options: tuple[str, ...] = ()):
    """A registered pod (agents ag1..agN, cluster cl0 as a torus, allocation alloc-1) on the given store."""
    with TemporaryDirectory(prefix="vipu-bench-") as directory:
        with postgres_database() if store == "postgres" else nullcontext() as db_url:  # None: the pod's SQLite file
            pod = Pod(Path(directory), machines=machines, topology=IldTopology.TORUS, db_url=db_url,
                      time_scale=time_scale, agent_processes=min(machines, AGENT_PROCESSES),
                      server_options=(*PRODUCTION_TIMINGS, *server_options))
            try:
                pod.start()
                pod.register(topology=admin_pb2.ILD_TOPOLOGY_TORUS)
                yield pod
            finally:
                pod.stop()


def machine_facts() -> dict:
    return {"cpus": os.cpu_count(), "python": platform.python_version(), "kernel": platform.release(),
            "cpu_model": _cpu_model(), "when": time.strftime("%Y-%m-%d %H:%M:%S %Z")}


def _cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor()


def git_revision() -> str:
    """The revision measured, marked `-dirty` when its files differ from it (a copy of a working
    tree); the results recorded so far (bench/results, which a run of several benchmarks writes as
    it goes) are not what is measured."""
    tree = Path(__file__).parent.parent
    revision = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=tree).stdout.strip()
    changed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no", "--", ".", ":!bench/results"],
                             capture_output=True, text=True, cwd=tree).stdout.strip()
    return f"{revision}-dirty" if changed else revision


def save(name: str, data: dict) -> Path:
    RESULTS.mkdir(exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps({"machine": machine_facts(), "revision": git_revision(), **data}, indent=2) + "\n")
    return path


def split(text: str) -> list[str]:
    """The items of a comma-separated option."""
    return [part.strip() for part in text.split(",") if part.strip()]


def table(headings: list[str], rows: list[list]) -> str:
    """A plain fixed-width table for the terminal."""
    cells = [[str(c) for c in row] for row in [headings, *rows]]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headings))]
    lines = ["  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in cells]
    return "\n".join([lines[0], "  ".join("-" * w for w in widths), *lines[1:]])
