"""Draw the recorded results: partition latency and throughput against pod size.

    python -m bench.plot        # reads bench/results/partitions.json (and controller-cost.json)
"""

from __future__ import annotations

import json

import click
import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt

from bench.common import RESULTS


def load(name: str) -> dict | None:
    path = RESULTS / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


@click.command()
@click.option("--output", default=str(RESULTS / "latency.png"), show_default=True)
def main(output):
    """Create latency (p50, p99) and pairs per second against the number of IPU-Machines."""
    partitions = load("partitions")
    if partitions is None:
        raise click.ClickException("no bench/results/partitions.json yet; run python -m bench.partitions first")
    cost = load("controller-cost")
    figure, (latency, throughput) = plt.subplots(1, 2, figsize=(12, 4.8))
    series: dict[tuple[str, int], list[dict]] = {}
    for run in partitions["runs"]:
        series.setdefault((run["store"], run["clients"]), []).append(run)
    for (store, clients), runs in sorted(series.items()):
        runs.sort(key=lambda r: r["machines"])
        machines = [r["machines"] for r in runs]
        line = latency.plot(machines, [r["create"]["p99_ms"] for r in runs], marker="o", label=f"{store}, {clients} clients, p99")[0]
        latency.plot(machines, [r["create"]["p50_ms"] for r in runs], marker=".", linestyle=":", color=line.get_color(),
                     label=f"{store}, {clients} clients, p50")
        throughput.plot(machines, [r["pairs_per_s"] for r in runs], marker="o", color=line.get_color(), label=f"{store}, {clients} clients")
    if cost is not None:
        runs = sorted(cost["runs"], key=lambda r: r["machines"])
        latency.plot([r["machines"] for r in runs], [r["load"]["create"]["p99_ms"] for r in runs], marker="s", color="black",
                     label=f"{cost['runs'][0]['store']}, {runs[0]['load']['clients']} clients, p99 (controller-cost run)")
    latency.axhline(25, color="grey", linewidth=0.8, linestyle="--")
    latency.axhline(100, color="grey", linewidth=0.8, linestyle="--")
    throughput.axhline(200, color="grey", linewidth=0.8, linestyle="--")
    for axes in (latency, throughput):
        axes.set_xscale("log", base=2)
        axes.set_xlabel("IPU-Machines in the pod")
        axes.grid(True, which="both", alpha=0.3)
    latency.set_yscale("log")
    latency.set_ylim(top=latency.get_ylim()[1] * 30)  # room above the lines for the legend
    latency.set_ylabel("create partition latency, ms")
    latency.set_title("Create latency (dashed: 25 ms and 100 ms targets)")
    throughput.set_ylabel("create+remove pairs per second")
    throughput.set_title("Throughput (dashed: 200 pairs/s target)")
    latency.legend(fontsize=6, ncol=2, loc="upper left")
    throughput.set_ylim(top=max(220, throughput.get_ylim()[1] * 1.4))
    throughput.legend(fontsize=6, ncol=2, loc="upper left")
    figure.suptitle(f"vipu {partitions['revision']} on {partitions['machine']['cpus']} CPUs, {partitions['machine']['when']}", fontsize=9)
    figure.tight_layout()
    figure.savefig(output, dpi=110)
    click.echo(f"written: {output}")


if __name__ == "__main__":
    main()
