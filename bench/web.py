"""The dashboard with a large pod: how long its first page takes to load, and whether changes keep
flowing to an open page while partitions come and go.

For each pod size a fresh pod is registered (`bench.common.running_pod`: one cluster, a torus,
one allocation) and filled a quarter full with partitions of 1, 4 and 16 IPUs, then vipu-web is
started over it and Debian's headless Chromium (Playwright) opens the racks page:

- first load, cold: vipu-web just started, so it reads every list from the controller, and a new
  browser profile; `--cold` times, vipu-web restarted for each;
- first load, warm: a new browser profile each time (nothing cached in the browser), vipu-web
  having read the lists already; `--loads` times;

each timed by the browser's navigation timing (the HTML's last byte, DOMContentLoaded, load:
the rack is drawn by then, there being no script that draws it). Then, with the racks page
open, a churn of create+remove pairs of 1-IPU partitions at `--churn` pairs per second and, every
`--every` seconds, a marker partition that stays 2 s; the page records (a MutationObserver) when
each marker's IPU appears, against when its create was acknowledged: the update's latency,
from the controller's answer to the page showing it without a reload.

    python -m bench.web --machines 16,1024
"""

from __future__ import annotations

import threading
import time

import click
import grpc

from bench.common import ProcessCost, running_pod, save, split, summarise_ms, table
from tests.browser import chromium
from vipu.api.protos import vipuuser_pb2, vipuuser_pb2_grpc

FILL = 0.25  # of the pod's IPUs taken by partitions before the page is opened
TARGET_FIRST_LOAD_S = 1.0
TIMING = """() => { const n = performance.getEntriesByType('navigation')[0];
  return {html: n.responseEnd, dom: n.domContentLoadedEventEnd, load: n.loadEventEnd, bytes: n.transferSize}; }"""
WATCH_MARKERS = """() => { window.seen = {};
  new MutationObserver(() => { for (const ipu of document.querySelectorAll('.ipu[data-partition^="marker-"]'))
      if (!(ipu.dataset.partition in window.seen)) window.seen[ipu.dataset.partition] = performance.timeOrigin + performance.now(); })
    .observe(document.getElementById('main'), {childList: true, subtree: true}); }"""


def fill(api, machines: int) -> int:
    """Partitions of 16, 4 and 1 IPUs until FILL of the pod's IPUs are taken; how many were made."""
    wanted, taken, made = int(machines * 4 * FILL), 0, 0
    for size in (16, 4, 1):
        while taken + size <= wanted * {16: 0.5, 4: 0.8, 1: 1.0}[size]:
            api.CreatePartition(vipuuser_pb2.CreatePartitionRequest(
                requirements=vipuuser_pb2.PartitionRequirements(id=f"fill-{made}", size=size)), timeout=60)
            taken, made = taken + size, made + 1
    return made


def first_load(browser, url: str) -> dict:
    context = browser.new_context(base_url=url, viewport={"width": 1440, "height": 900})
    try:
        page = context.new_page()
        page.goto("/", wait_until="load", timeout=60_000)
        timing = page.evaluate(TIMING)
        timing["ipus"] = page.locator(".ipu").count()
        return timing
    finally:
        context.close()


def loads_summary(samples: list[dict]) -> dict:
    return {"html": summarise_ms([s["html"] / 1000 for s in samples]),
            "dom_content_loaded": summarise_ms([s["dom"] / 1000 for s in samples]),
            "load": summarise_ms([s["load"] / 1000 for s in samples]),
            "html_bytes": samples[-1]["bytes"], "ipus_drawn": samples[-1]["ipus"]}


class Churn:
    """Create+remove pairs of 1-IPU partitions at a rate, and now and then a marker that stays 2 s."""

    def __init__(self, port: int, rate: float, every: float):
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        self.api = vipuuser_pb2_grpc.UserServiceStub(self.channel)
        self.rate, self.every = rate, every
        self.acknowledged: dict[str, float] = {}  # marker -> epoch seconds its create was answered
        self.pairs = 0
        self.stop = threading.Event()
        self.removals: list[threading.Timer] = []

    def _pairs(self) -> None:
        n, started = 0, time.monotonic()
        while not self.stop.is_set():
            name = f"churn-{n}"
            self.api.CreatePartition(vipuuser_pb2.CreatePartitionRequest(
                requirements=vipuuser_pb2.PartitionRequirements(id=name, size=1)), timeout=60)
            self.api.RemovePartition(vipuuser_pb2.RemovePartitionRequest(partition_id=name), timeout=60)
            n, self.pairs = n + 1, self.pairs + 1
            self.stop.wait(max(0.0, started + n / self.rate - time.monotonic()))  # the rate, not a synchronisation

    def _markers(self) -> None:
        n = 0
        while not self.stop.wait(self.every):
            name = f"marker-{n}"
            self.api.CreatePartition(vipuuser_pb2.CreatePartitionRequest(
                requirements=vipuuser_pb2.PartitionRequirements(id=name, size=1)), timeout=60)
            self.acknowledged[name] = time.time()
            removal = threading.Timer(2.0, self.api.RemovePartition, (vipuuser_pb2.RemovePartitionRequest(partition_id=name),),
                                      {"timeout": 60})
            removal.start()
            self.removals.append(removal)
            n += 1

    def run(self, seconds: float) -> None:
        threads = [threading.Thread(target=self._pairs, daemon=True), threading.Thread(target=self._markers, daemon=True)]
        for thread in threads:
            thread.start()
        self.stop.wait(seconds)  # the length of the run is what is measured over
        self.stop.set()
        for thread in [*threads, *self.removals]:
            thread.join()
        self.channel.close()


def updates(browser, url: str, pod, rate: float, every: float, seconds: float) -> dict:
    page = browser.new_context(base_url=url, viewport={"width": 1440, "height": 900}).new_page()
    page.goto("/", wait_until="load", timeout=60_000)
    page.wait_for_selector("#live[data-state=live]")
    page.evaluate(WATCH_MARKERS)
    web_before, server_before = ProcessCost.of(pod.web.pid), ProcessCost.of(pod.server.pid)
    churn = Churn(pod.user_port, rate, every)
    churn.run(seconds)
    web_after, server_after = ProcessCost.of(pod.web.pid), ProcessCost.of(pod.server.pid)
    seen = page.evaluate("() => window.seen")
    redraws = int(page.evaluate("() => Number(document.getElementById('main').dataset.redraws || 0)"))
    page.context.close()
    latencies = [seen[name] / 1000 - at for name, at in churn.acknowledged.items() if name in seen]
    return {"churn_pairs_per_s": round(churn.pairs / seconds, 1), "markers": len(churn.acknowledged),
            "markers_seen": len(latencies), "marker_latency": summarise_ms(latencies), "redraws_per_s": round(redraws / seconds, 2),
            "web_cpu_percent": round(100 * (web_after.cpu_seconds - web_before.cpu_seconds) / seconds, 1),
            "web_rss_mb": round(web_after.rss_mb, 1),
            "controller_cpu_percent": round(100 * (server_after.cpu_seconds - server_before.cpu_seconds) / seconds, 1)}


@click.command()
@click.option("--machines", default="16,1024", show_default=True, help="Pod sizes, comma separated.")
@click.option("--cold", default=3, show_default=True, help="First loads just after vipu-web starts (restarted for each).")
@click.option("--loads", default=10, show_default=True, help="First loads of a new browser profile, vipu-web warm.")
@click.option("--churn", "rate", default=10.0, show_default=True, help="Create+remove pairs per second while updates are timed.")
@click.option("--every", default=0.5, show_default=True, help="Seconds between marker partitions.")
@click.option("--seconds", default=30.0, show_default=True, help="Length of the update run.")
@click.option("--name", default="web", show_default=True, help="Results file: bench/results/NAME.json.")
def main(machines, cold, loads, rate, every, seconds, name):
    """The dashboard's first load and its live updates, by pod size."""
    runs = []
    for count in map(int, split(machines)):
        with running_pod(count, "sqlite") as pod, chromium() as browser:
            api = vipuuser_pb2_grpc.UserServiceStub(grpc.insecure_channel(f"127.0.0.1:{pod.user_port}"))
            partitions = fill(api, count)
            cold_loads = []
            for _ in range(cold):
                pod.stop_web()
                cold_loads.append(first_load(browser, pod.start_web()))
            url = f"http://127.0.0.1:{pod.web_port}"
            warm_loads = [first_load(browser, url) for _ in range(loads)]
            run = {"machines": count, "partitions": partitions, "first_load_cold": loads_summary(cold_loads),
                   "first_load_warm": loads_summary(warm_loads), "updates": updates(browser, url, pod, rate, every, seconds)}
            runs.append(run)
            click.echo(f"{count} machines: cold load p50 {run['first_load_cold']['load'].get('p50_ms')} ms, warm load p50 "
                       f"{run['first_load_warm']['load'].get('p50_ms')} ms; markers seen {run['updates']['markers_seen']}/"
                       f"{run['updates']['markers']}, p50 {run['updates']['marker_latency'].get('p50_ms')} ms", err=True)
    path = save(name, {"benchmark": "web", "target_first_load_s": TARGET_FIRST_LOAD_S, "churn_pairs_per_s": rate,
                       "marker_every_s": every, "seconds": seconds, "fill": FILL, "runs": runs})
    click.echo(table(
        ["machines", "partitions", "HTML KB", "cold load p50/max ms", "warm load p50/p99/max ms", "update p50/p99/max ms",
         "markers seen", "redraws/s", "web CPU %", "controller CPU %"],
        [[r["machines"], r["partitions"], round(r["first_load_warm"]["html_bytes"] / 1024),
          f"{r['first_load_cold']['load'].get('p50_ms')}/{r['first_load_cold']['load'].get('max_ms')}",
          f"{r['first_load_warm']['load'].get('p50_ms')}/{r['first_load_warm']['load'].get('p99_ms')}/"
          f"{r['first_load_warm']['load'].get('max_ms')}",
          f"{r['updates']['marker_latency'].get('p50_ms')}/{r['updates']['marker_latency'].get('p99_ms')}/"
          f"{r['updates']['marker_latency'].get('max_ms')}",
          f"{r['updates']['markers_seen']}/{r['updates']['markers']}", r["updates"]["redraws_per_s"], r["updates"]["web_cpu_percent"],
          r["updates"]["controller_cpu_percent"]] for r in runs]))
    click.echo(f"written: {path}")


if __name__ == "__main__":
    main()
