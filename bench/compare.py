"""Before and after in one sitting: the partition benchmark of an older revision against this tree.

This machine's speed drifts by a third within an hour, so figures of separate runs cannot be
compared. This extracts the older revision's files (`git archive`) into a temporary directory and
runs its own `bench.partitions` and this tree's, alternately, `--repeats` times each, with the
same parameters and this virtual environment; it writes every run and the median of each row
to bench/results/NAME.json and prints them side by side.

    python -m bench.compare --before f0158a7 --machines 64 --clients 1,8 --stores sqlite,postgres
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tarfile
from collections.abc import Callable
from io import BytesIO
from pathlib import Path
from tempfile import TemporaryDirectory

import click

from bench.common import git_revision, save, table

ROOT = Path(__file__).resolve().parent.parent


def _cpu_ms_per_pair(run: dict) -> float | None:
    """The controller's CPU per pair as `bench.partitions` records it; for a revision that
    predates the record, the same worked out from its CPU share and pairs/s."""
    if run.get("server_cpu_ms_per_pair") is not None:
        return run["server_cpu_ms_per_pair"]
    if not run.get("pairs_per_s"):
        return None
    return round(10 * run["server_cpu_percent"] / run["pairs_per_s"], 3)


# (label, key in a run's record, or how it is worked out from one): the figures compared. Switches
# per pair are recorded from 2026-12-07 on: an older revision's runs show none.
FIGURES: list[tuple[str, tuple[str, ...] | Callable[[dict], float | None]]] = [
    ("create p50 ms", ("create", "p50_ms")), ("create p99 ms", ("create", "p99_ms")), ("pairs/s", ("pairs_per_s",)),
    ("server CPU %", ("server_cpu_percent",)), ("CPU ms/pair", _cpu_ms_per_pair), ("switches/pair", ("server_switches_per_pair",))]


def extract(revision: str, directory: Path) -> None:
    """The files of `revision` of this repository, into `directory`."""
    archive = subprocess.run(["git", "archive", "--format=tar", revision], cwd=ROOT, capture_output=True, check=False)
    if archive.returncode:
        raise click.ClickException(f"cannot extract revision {revision}: {archive.stderr.decode().strip()}")
    with tarfile.open(fileobj=BytesIO(archive.stdout)) as tar:
        tar.extractall(directory, filter="data")
    compile_sources(directory)


def compile_sources(tree: Path) -> None:
    """The tree's modules as bytecode, as an installed copy has them: with PYTHONDONTWRITEBYTECODE
    set, every process started from the tree would compile them again, and time it."""
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(tree / "src")], check=True, stdout=subprocess.DEVNULL)


def run_partitions(tree: Path, results: Path, name: str, arguments: list[str]) -> list[dict]:
    """One run of the partition benchmark of the tree at `tree`; its rows."""
    environment = {**os.environ, "PYTHONPATH": f"{tree / 'src'}{os.pathsep}{tree}", "VIPU_BENCH_RESULTS": str(results)}
    subprocess.run([sys.executable, "-m", "bench.partitions", *arguments, "--name", name], cwd=tree, env=environment, check=True,
                   stdout=subprocess.DEVNULL)
    return json.loads((results / f"{name}.json").read_text())["runs"]


def figure(run: dict, key: tuple[str, ...] | Callable[[dict], float | None]):
    if callable(key):
        return key(run)
    value = run
    for part in key:
        value = value.get(part) if isinstance(value, dict) else None
    return value


def medians(runs: list[list[dict]]) -> list[dict]:
    """Row by row (store, machines, clients), the median of each figure over the repeats."""
    rows = []
    for same_row in zip(*runs, strict=True):
        first = same_row[0]
        row = {"store": first["store"], "machines": first["machines"], "clients": first["clients"]}
        for label, key in FIGURES:
            values = [v for v in (figure(r, key) for r in same_row) if v is not None]
            row[label] = round(statistics.median(values), 2) if values else None
        rows.append(row)
    return rows


def _shown(value: float | None) -> str:
    return "-" if value is None else str(value)


@click.command()
@click.option("--before", required=True, help="The older revision (any name git knows).")
@click.option("--machines", default="64", show_default=True)
@click.option("--clients", default="1,8", show_default=True)
@click.option("--stores", default="sqlite,postgres", show_default=True)
@click.option("--duration", default=10.0, show_default=True, help="Seconds of load per row.")
@click.option("--repeats", default=3, show_default=True, help="Runs of each side, alternated.")
@click.option("--name", default="compare", show_default=True, help="Results file: bench/results/NAME.json.")
def main(before, machines, clients, stores, duration, repeats, name):
    """The partition benchmark of revision BEFORE against this tree, alternated in one sitting."""
    arguments = ["--machines", machines, "--clients", clients, "--stores", stores, "--duration", str(duration)]
    sides: dict[str, list[list[dict]]] = {"before": [], "after": []}
    with TemporaryDirectory(prefix="vipu-compare-") as scratch:
        old_tree, results = Path(scratch) / "before", Path(scratch) / "results"
        old_tree.mkdir()
        results.mkdir()
        extract(before, old_tree)
        for repeat in range(repeats):
            for side, tree in (("before", old_tree), ("after", ROOT)):
                click.echo(f"run {repeat + 1} of {repeats}: {side}", err=True)
                sides[side].append(run_partitions(tree, results, f"{side}-{repeat}", arguments))
    summary = {side: medians(runs) for side, runs in sides.items()}
    path = save(name, {"benchmark": "compare", "before": before, "after": git_revision(), "duration_s": duration,
                       "repeats": repeats, "medians": summary, "runs": sides})
    rows = []
    for old, new in zip(summary["before"], summary["after"], strict=True):
        ratio = round(new["pairs/s"] / old["pairs/s"], 2) if old["pairs/s"] else None
        rows.append([old["store"], old["machines"], old["clients"],
                     *(f"{_shown(old[label])} -> {_shown(new[label])}" for label, _ in FIGURES), ratio])
    click.echo(table(["store", "machines", "clients", *(label for label, _ in FIGURES), "pairs/s after/before"], rows))
    click.echo(f"medians of {repeats} alternated runs each; written: {path}")


if __name__ == "__main__":
    main()
