"""The controller's own work per create+remove pair, in one process: no gRPC, no threads contending.

On a pod of simulated machines reached in memory (the unit tests' `Pod`, on SQLite), half of
whose machines carry a 4-IPU partition each, as a busy pod does, one thread creates and removes
1-IPU partitions. The CPU time per pair is what the owner, placement, the store and the
simulated machines cost, without the gRPC and the hand-offs between threads that
`bench.partitions` measures too: so it moves little from run to run, and shows how that work
grows with the pod. With `--before REV` the older revision's tree is measured too, alternated
(each measure in a process of its own, importing that tree).

    python -m bench.decisions --machines 8,256,1024 --before 5553d08
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from tempfile import TemporaryDirectory

import click

from bench.common import save, split, table
from bench.compare import ROOT, extract

WARM_UP_PAIRS = 100

# Run in a process of its own with the tree measured first on the path: it imports only that
# tree's vipu and tests, so that an older revision is measured as it was.
MEASURE = """
import json, logging, pathlib, sys, tempfile, time
import tests.unit.controller.test_services as services
from vipu.model.entities import PartitionRequest
machines, pairs, warm_up = (int(a) for a in sys.argv[1:4])
services.MACHINES = machines
logging.disable(logging.INFO)
scratch = tempfile.TemporaryDirectory()
pod = services.Pod(pathlib.Path(scratch.name))
try:
    for n in range(machines // 2):
        pod.partitions.create(PartitionRequest(f"long{n}", 4))
    def pair(n):
        pod.partitions.create(PartitionRequest(f"p{n % 50}", 1))
        pod.partitions.remove(f"p{n % 50}")
    for n in range(warm_up):
        pair(n)
    started = time.process_time()
    for n in range(pairs):
        pair(n)
    print(json.dumps({"cpu_ms_per_pair": round(1000 * (time.process_time() - started) / pairs, 3)}))
finally:
    pod.close()
    scratch.cleanup()
"""


def measure(tree: Path, machines: int, pairs: int) -> float:
    """CPU ms per pair of the tree at `tree`, on a pod of `machines`."""
    environment = {**os.environ, "PYTHONPATH": f"{tree / 'src'}{os.pathsep}{tree}"}
    done = subprocess.run([sys.executable, "-c", MEASURE, str(machines), str(pairs), str(WARM_UP_PAIRS)], cwd=tree,
                          env=environment, capture_output=True, text=True, timeout=1800)
    if done.returncode:
        raise click.ClickException(f"the measure of {machines} machines failed: {done.stderr.strip()[-2000:]}")
    return float(json.loads(done.stdout.strip().splitlines()[-1])["cpu_ms_per_pair"])


@click.command()
@click.option("--machines", default="8,256,1024", show_default=True, help="Pod sizes, comma separated.")
@click.option("--pairs", default=500, show_default=True, help="Timed pairs per measure.")
@click.option("--before", default="", help="An older revision to measure too, alternated with this tree.")
@click.option("--repeats", default=1, show_default=True, help="Measures of each tree and size; the median is shown.")
@click.option("--name", default="decisions", show_default=True, help="Results file: bench/results/NAME.json.")
def main(machines, pairs, before, repeats, name):
    """The owner's CPU per create+remove pair in one process, by pod size (and against an older revision)."""
    sizes = [int(size) for size in split(machines)]
    with TemporaryDirectory() as scratch:
        trees = {"after": ROOT}
        if before:
            extract(before, Path(scratch) / "before")
            trees = {"before": Path(scratch) / "before", **trees}
        measured: dict[str, dict[int, list[float]]] = {side: {size: [] for size in sizes} for side in trees}
        for _ in range(repeats):
            for size in sizes:
                for side, tree in trees.items():
                    measured[side][size].append(measure(tree, size, pairs))
    rows = [{"machines": size, **{side: round(statistics.median(measured[side][size]), 3) for side in trees},
             "runs": {side: measured[side][size] for side in trees}} for size in sizes]
    path = save(name, {"benchmark": "decisions", "before": before, "pairs": pairs, "repeats": repeats, "rows": rows})
    headings = ["machines", *(f"{side} CPU ms/pair" for side in trees)] + (["after/before"] if before else [])
    click.echo(table(headings, [[row["machines"], *(row[side] for side in trees)]
                                + ([round(row["after"] / row["before"], 2)] if before else []) for row in rows]))
    click.echo(f"written: {path}")


if __name__ == "__main__":
    main()
