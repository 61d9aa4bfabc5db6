"""What `vipu-server` costs as the pod grows: memory and CPU, idle and under load, by agents.

For each pod size a fresh pod is registered (agents, one cluster, one allocation), then:

- idle: the controller's resident memory, and its CPU over a quiet window that spans its
  health passes (every agent asked what it holds every 10 s, as in production);
- under load: 8 clients creating and removing partitions, as `bench.partitions` does: the
  controller's CPU, its peak memory, and create latency;

and a straight line fitted through each measure against the number of agents says how it grows.

    python -m bench.controller_cost --machines 16,64,256,1024 --store sqlite
"""

from __future__ import annotations

import threading
import time

import click

from bench.common import ProcessCost, running_pod, save, split, table
from bench.partitions import measure

HEALTH_INTERVAL = 10.0


def idle_cost(pid: int, seconds: float) -> dict:
    before, started = ProcessCost.of(pid), time.monotonic()
    time.sleep(seconds)  # the quiet window itself is what is measured
    after = ProcessCost.of(pid)
    return {"rss_mb": round(after.rss_mb, 1),
            "cpu_percent": round(100 * (after.cpu_seconds - before.cpu_seconds) / (time.monotonic() - started), 2)}


class PeakMemory:
    """The largest resident size of a process seen while in use, polled every 0.2 s."""

    def __init__(self, pid: int):
        self.pid, self.peak_mb = pid, 0.0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)

    def _watch(self) -> None:
        while not self._done.wait(0.2):
            self.peak_mb = max(self.peak_mb, ProcessCost.of(self.pid).rss_mb)

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(self, *_) -> None:
        self._done.set()
        self._thread.join()


def slope(xs: list[float], ys: list[float]) -> float:
    """Least-squares slope of ys against xs."""
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    spread = sum((x - mx) ** 2 for x in xs)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / spread if spread else 0.0


@click.command()
@click.option("--machines", default="16,64,256,1024", show_default=True, help="Pod sizes (agents), comma separated.")
@click.option("--store", default="sqlite", show_default=True, type=click.Choice(["sqlite", "postgres"]))
@click.option("--clients", default=8, show_default=True, help="Concurrent clients for the load phase.")
@click.option("--idle", "idle_seconds", default=2 * HEALTH_INTERVAL + 1, show_default=True, help="Seconds of the idle window.")
@click.option("--duration", default=10.0, show_default=True, help="Seconds of the load phase.")
@click.option("--name", default="controller-cost", show_default=True, help="Results file: bench/results/NAME.json.")
def main(machines, store, clients, idle_seconds, duration, name):
    """Controller memory and CPU, idle and under load, against the number of agents."""
    runs = []
    for count in map(int, split(machines)):
        started = time.monotonic()
        with running_pod(count, store) as pod:
            ready = time.monotonic() - started
            pid = pod.server.pid
            idle = idle_cost(pid, idle_seconds)
            with PeakMemory(pid) as peak:
                load = measure(pod, clients, 1, duration)
            runs.append({"machines": count, "store": store, "pod_ready_s": round(ready, 1), "idle": idle,
                         "load": {"clients": clients, "cpu_percent": load["server_cpu_percent"],
                                  "peak_rss_mb": round(peak.peak_mb, 1), "create": load["create"], "remove": load["remove"],
                                  "pairs_per_s": load["pairs_per_s"]}})
            click.echo(f"{count:5} agents: idle {idle['rss_mb']} MB {idle['cpu_percent']}% CPU; under load "
                       f"{load['server_cpu_percent']}% CPU, peak {peak.peak_mb:.0f} MB, "
                       f"create p99 {load['create'].get('p99_ms')} ms", err=True)
    agents = [r["machines"] for r in runs]
    growth = {
        "idle_rss_mb_per_agent": round(slope(agents, [r["idle"]["rss_mb"] for r in runs]), 4),
        "idle_cpu_percent_per_agent": round(slope(agents, [r["idle"]["cpu_percent"] for r in runs]), 5),
        "load_rss_mb_per_agent": round(slope(agents, [r["load"]["peak_rss_mb"] for r in runs]), 4),
    }
    path = save(name, {"benchmark": "controller-cost", "health_interval_s": HEALTH_INTERVAL, "runs": runs, "growth": growth})
    click.echo(table(
        ["agents", "idle RSS MB", "idle CPU %", "load CPU %", "load peak RSS MB", "create p50 ms", "create p99 ms", "pairs/s"],
        [[r["machines"], r["idle"]["rss_mb"], r["idle"]["cpu_percent"], r["load"]["cpu_percent"], r["load"]["peak_rss_mb"],
          r["load"]["create"].get("p50_ms"), r["load"]["create"].get("p99_ms"), r["load"]["pairs_per_s"]] for r in runs]))
    click.echo(f"growth per agent: {growth}")
    click.echo(f"written: {path}")


if __name__ == "__main__":
    main()
