"""How long the `vipu` command takes, whole process, as a user waits for it: timed by hyperfine.

On a fresh pod (16 machines, SQLite) hyperfine runs `vipu create partition` (the partition is
removed before each run, untimed), `vipu list partitions`, `vipu --help` and, for reference, a
bare `python -c 'import grpc'` (the floor of any Python gRPC client), and reports each command's
median and spread. With `--before REV` the same commands of an older revision
(extracted with `git archive`, run by this virtual environment) are timed alternately: the runs
are split into `--rounds`, each round timing every command of each tree in turn, so that the
machine's drift (a third within an hour) falls on both alike.

    python -m bench.cli_speed --before f0158a7 --runs 40
"""

from __future__ import annotations

import json
import shlex
import shutil
import statistics
import subprocess
import sys
from pathlib import Path
from tempfile import TemporaryDirectory

import click

from bench.common import running_pod, save, table
from bench.compare import compile_sources, extract

ROOT = Path(__file__).resolve().parent.parent
VIPU = Path(sys.executable).parent / "vipu"


def commands(tree: Path, port: int, ipuof_dir: Path) -> dict[str, tuple[str, str]]:
    """name -> (command, the command to run before each timed run) for the vipu of `tree`; the
    IPUoF files go to `ipuof_dir`, not to the machine's."""
    vipu = f"env PYTHONPATH={tree / 'src'} VIPU_IPUOF_DIR={ipuof_dir} {VIPU} --api-host 127.0.0.1 --api-port {port}"
    return {
        "vipu create partition P --size 1": (f"{vipu} create partition hf --size 1",
                                             f"sh -c {shlex.quote(f'{vipu} remove partition hf --force >/dev/null 2>&1 || true')}"),
        "vipu list partitions": (f"{vipu} list partitions", "true"),
        "vipu --help": (f"{vipu} --help", "true"),
        "python -c 'import grpc'": (f"{sys.executable} -c 'import grpc'", "true"),  # what any Python gRPC client pays first
    }


def hyperfine_times(hyperfine: str, command: str, prepare: str, runs: int, out: Path) -> list[float]:
    """Seconds of each of `runs` timed runs of `command`, `prepare` run untimed before each."""
    subprocess.run([hyperfine, "-N", "--warmup", "1", "--runs", str(runs), "--export-json", str(out), "--prepare", prepare, command],
                   check=True, stdout=subprocess.DEVNULL)
    return list(json.loads(out.read_text())["results"][0]["times"])


def summary(times: list[float]) -> dict[str, float]:
    return {"median_ms": round(1000 * statistics.median(times), 1), "mean_ms": round(1000 * statistics.mean(times), 1),
            "stddev_ms": round(1000 * statistics.pstdev(times), 1), "min_ms": round(1000 * min(times), 1)}


@click.command()
@click.option("--before", default="", help="An older revision to time in the same runs.")
@click.option("--runs", default=40, show_default=True, help="Timed runs of each command.")
@click.option("--rounds", default=5, show_default=True, help="Rounds the runs are split into, every command of each tree in turn.")
@click.option("--name", default="cli-speed", show_default=True, help="Results file: bench/results/NAME.json.")
def main(before, runs, rounds, name):
    """Time whole `vipu` commands against a running pod, with hyperfine."""
    hyperfine = shutil.which("hyperfine")
    if hyperfine is None:
        raise click.ClickException("hyperfine is not installed; scripts/system-deps installs it")
    with TemporaryDirectory(prefix="vipu-cli-speed-") as scratch:
        trees = {"after": ROOT}
        compile_sources(ROOT)
        if before:
            trees = {"before": Path(scratch) / "before", **trees}
            trees["before"].mkdir()
            extract(before, trees["before"])
        with running_pod(16, "sqlite") as pod:
            ipuof_dir = Path(scratch) / "ipuof.conf.d"
            names = list(commands(ROOT, pod.user_port, ipuof_dir))
            times: dict[tuple[str, str], list[float]] = {(command, side): [] for command in names for side in trees}
            per_round = max(2, runs // rounds)  # hyperfine times at least two
            for _ in range(rounds):
                for command_name in names:
                    for side, tree in trees.items():
                        command, prepare = commands(tree, pod.user_port, ipuof_dir)[command_name]
                        times[command_name, side] += hyperfine_times(hyperfine, command, prepare, per_round, Path(scratch) / "out.json")
            measured = {command: {side: summary(times[command, side]) for side in trees} for command in names}
    path = save(name, {"benchmark": "cli-speed", "before": before or None, "runs": per_round * rounds, "rounds": rounds,
                       "commands": measured})
    headings = ["command", *(f"{side} median ms" for side in trees)]
    click.echo(table(headings, [[command, *(m[side]["median_ms"] for side in trees)] for command, m in measured.items()]))
    click.echo(f"written: {path}")


if __name__ == "__main__":
    main()
