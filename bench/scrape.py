"""How long a scrape of an agent's /metrics takes, with the per-IPU telemetry, over HTTP as Prometheus asks.

A real `vipu-agent` process serves one simulated machine whose 4 IPUs are in a partition an IPUoF
client runs on; its exporter is scraped `--scrapes` times in a row, with the telemetry read on the
agent's own schedule meanwhile. Twice: with the machine's BMC answering at once (the simulator),
and with a BMC that takes `--bmc-seconds` to answer (the agent's telemetry read stalled by a
failpoint), which the scrape must not wait on. The issue's target: under 50 ms at 4 IPUs.

    python -m bench.scrape --scrapes 500
"""

from __future__ import annotations

import os
import statistics
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from tempfile import TemporaryDirectory

import click

from bench.common import percentile, save, table
from tests.functional.harness import Pod
from tests.functional.test_ipuof import ipuof
from tests.ports import free_port
from vipu import failpoints
from vipu.backends.sim.rack import save_rack


@contextmanager
def failpoints_armed(value: str) -> Iterator[None]:
    """VIPU_FAILPOINTS set to `value` for the processes started meanwhile."""
    before = os.environ.get(failpoints.VARIABLE)
    os.environ[failpoints.VARIABLE] = value
    try:
        yield
    finally:
        if before is None:
            del os.environ[failpoints.VARIABLE]
        else:
            os.environ[failpoints.VARIABLE] = before


def scrape_times(url: str, scrapes: int) -> tuple[list[float], int]:
    times, size = [], 0
    for _ in range(scrapes):
        began = time.perf_counter()
        with urllib.request.urlopen(url, timeout=10) as answer:
            size = len(answer.read())
        times.append(time.perf_counter() - began)
    return times, size


@click.command()
@click.option("--scrapes", default=500, show_default=True, help="Timed scrapes of each kind.")
@click.option("--bmc-seconds", default=2.0, show_default=True, help="How long the slow BMC takes to answer a telemetry read.")
@click.option("--name", default="scrape", show_default=True, help="Results file: bench/results/NAME.json.")
def main(scrapes, bmc_seconds, name):
    """Time scrapes of an agent's exporter, its BMC quick and slow."""
    rows, results = [], {}
    for kind, stall in (("BMC answers at once", ""), (f"BMC answers in {bmc_seconds:g} s", f"machine.telemetry=delay({bmc_seconds})")):
        with TemporaryDirectory(prefix="vipu-bench-") as directory:
            pod = Pod(Path(directory), machines=1)
            pod.rack.machines[0].exporter_port = free_port()
            save_rack(pod.rack, pod.rack_path)
            try:
                with failpoints_armed(stall):  # the agent arms it; the controller never meets the point
                    pod.start()
                pod.register()
                assert pod.user("create", "partition", "p1", "--size", "4").code == 0
                assert ipuof(pod, "--partition", "p1").code == 0
                url = f"http://127.0.0.1:{pod.rack.machines[0].exporter_port}/metrics"
                scrape_times(url, 20)  # warm up
                times, size = scrape_times(url, scrapes)
            finally:
                pod.stop()
        ms = [t * 1000 for t in times]
        results[kind] = {"scrapes": scrapes, "bytes": size, "median_ms": statistics.median(ms), "p99_ms": percentile(ms, 0.99),
                         "max_ms": max(ms)}
        rows.append([kind, scrapes, size, f"{statistics.median(ms):.2f}", f"{percentile(ms, 0.99):.2f}", f"{max(ms):.2f}"])
    print(table(["agent's BMC", "scrapes", "bytes", "median ms", "p99 ms", "max ms"], rows))
    print(f"written: {save(name, {'target_ms': 50, 'results': results})}")


if __name__ == "__main__":
    main()
