"""How long the `vipu` command takes, whole process, as a user waits for it: timed by hyperfine.

On a fresh pod (16 machines, SQLite) hyperfine runs `vipu create partition` (the partition is
removed before each run, untimed), `vipu list partitions` and `vipu --help`, and reports each
command's median and spread. With `--before REV` the same commands of an older revision
(extracted with `git archive`, run by this virtual environment) are timed in the same hyperfine
run, alternately, so the two are compared under the same conditions.

    python -m bench.cli_speed --before f0158a7 --runs 40
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from tempfile import TemporaryDirectory

import click

from bench.common import running_pod, save, table
from bench.compare import compile_sources, extract

ROOT = Path(__file__).resolve().parent.parent
VIPU = Path(sys.executable).parent / "vipu"


def commands(tree: Path, port: int) -> dict[str, tuple[str, str]]:
    """name -> (command, the command to run before each timed run) for the vipu of `tree`."""
    vipu = f"env PYTHONPATH={tree / 'src'} {VIPU} --api-host 127.0.0.1 --api-port {port}"
    return {
        "vipu create partition P --size 1": (f"{vipu} create partition hf --size 1",
                                             f"sh -c {shlex.quote(f'{vipu} remove partition hf --force >/dev/null 2>&1 || true')}"),
        "vipu list partitions": (f"{vipu} list partitions", "true"),
        "vipu --help": (f"{vipu} --help", "true"),
    }


@click.command()
@click.option("--before", default="", help="An older revision to time in the same runs.")
@click.option("--runs", default=40, show_default=True, help="Timed runs of each command.")
@click.option("--name", default="cli-speed", show_default=True, help="Results file: bench/results/NAME.json.")
def main(before, runs, name):
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
            measured: dict[str, dict[str, dict]] = {}
            for command_name in commands(ROOT, pod.user_port):
                arguments = [hyperfine, "-N", "--warmup", "3", "--runs", str(runs), "--export-json", str(Path(scratch) / "out.json")]
                for tree in trees.values():
                    command, prepare = commands(tree, pod.user_port)[command_name]
                    arguments += ["--prepare", prepare, command]
                subprocess.run(arguments, check=True, stdout=subprocess.DEVNULL)
                results = json.loads((Path(scratch) / "out.json").read_text())["results"]
                measured[command_name] = {
                    side: {"median_ms": round(1000 * r["median"], 1), "mean_ms": round(1000 * r["mean"], 1),
                           "stddev_ms": round(1000 * (r["stddev"] or 0), 1), "min_ms": round(1000 * r["min"], 1)}
                    for side, r in zip(trees, results, strict=True)
                }
    path = save(name, {"benchmark": "cli-speed", "before": before or None, "runs": runs, "commands": measured})
    headings = ["command", *(f"{side} median ms" for side in trees)]
    click.echo(table(headings, [[command, *(m[side]["median_ms"] for side in trees)] for command, m in measured.items()]))
    click.echo(f"written: {path}")


if __name__ == "__main__":
    main()
