"""Where the controller's time goes under load: a sampling profile of `vipu-server`.

Runs the partition benchmark's load (64 machines, 8 clients by default) while py-spy samples the
thread holding the controller's interpreter lock (`--gil`: a thread blocked on a lock, a socket or
a queue is not busy, and counting it would hide where the time goes), writes a flame graph
(bench/results/profile.svg) and prints the share of those samples spent in each layer: gRPC, the
store (SQLAlchemy and the database driver), placement and topology, logging, and the rest of vipu,
and what share of the time the lock was held at all. The rest of the controller's CPU is spent
outside the lock: gRPC's C core and the kernel.

    python -m bench.profile --machines 64 --clients 8
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path

import click

from bench.common import RESULTS, running_pod, save, table
from bench.partitions import measure

SAMPLES_PER_S = 200
# The first matching rule names a sample's layer, looking from the innermost frame outwards.
LAYERS = [
    ("store: SQLAlchemy and the database driver", ("sqlalchemy/", "sqlite3", "psycopg")),
    ("gRPC (server and agent calls)", ("grpc/",)),
    ("logging", ("logging/",)),
    ("placement and topology", ("vipu/model/",)),
    ("store: vipu's own code", ("vipu/store/",)),
    ("protobuf conversions", ("vipu/api/", "google/protobuf")),
    ("services and servicers", ("vipu/controller/",)),
]


def layer_of(stack: list[str]) -> str:
    for frame in reversed(stack):
        for name, markers in LAYERS:
            if any(marker in frame for marker in markers):
                return name
    return "other (threads, queues, interpreter)"


@click.command()
@click.option("--machines", default=64, show_default=True)
@click.option("--clients", default=8, show_default=True)
@click.option("--duration", default=15.0, show_default=True)
@click.option("--name", default="profile", show_default=True, help="Results: bench/results/NAME.json and NAME.svg.")
def main(machines, clients, duration, name):
    """Profile vipu-server under the partition benchmark's load."""
    spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
    if spy is None:
        raise click.ClickException("py-spy is not installed; bench/run installs it (pip install 'vipu[bench]')")
    raw = RESULTS / f"{name}.raw"
    with running_pod(machines, "sqlite") as pod:
        common = [spy, "record", "--pid", str(pod.server.pid), "--duration", str(int(duration)), "--gil", "--rate", str(SAMPLES_PER_S)]
        recorders = [subprocess.Popen([*common, "--format", "raw", "-o", str(raw)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL),
                     subprocess.Popen([*common, "--format", "flamegraph", "-o", str(RESULTS / f"{name}.svg")],
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)]
        load = measure(pod, clients, 1, duration + 2)
        for recorder in recorders:
            recorder.wait(timeout=120)
    counts: Counter[str] = Counter()
    for line in raw.read_text().splitlines():
        stack, _, samples = line.rpartition(" ")
        counts[layer_of(stack.split(";"))] += int(samples)
    raw.unlink()
    total = sum(counts.values())
    shares = {layer: round(100 * n / total, 1) for layer, n in counts.most_common()}
    lock_held = round(100 * total / (SAMPLES_PER_S * int(duration)), 1)
    path = save(name, {"benchmark": "profile", "machines": machines, "clients": clients, "load": load,
                       "samples_holding_the_lock": total, "lock_held_percent": lock_held, "share_percent": shares})
    click.echo(f"{machines} machines, {clients} clients: {load['pairs_per_s']} pairs/s, create p99 {load['create']['p99_ms']} ms, "
               f"controller CPU {load['server_cpu_percent']}%, interpreter lock held {lock_held}% of the time")
    click.echo(table(["layer", "share of samples holding the lock %"], [[layer, share] for layer, share in shares.items()]))
    click.echo(f"written: {path} and {RESULTS / f'{name}.svg'}")


if __name__ == "__main__":
    main()
