"""The crash-consistency storm at length: SIGKILL the controller at random points of a storm of
creates and removes, many rounds per store, and count every broken promise.

The suite runs the same storm (`tests/functional/test_crash_consistency.py`) for a few rounds and
stops at the first violation; this runs as many rounds as asked, goes on after a violation
(recording what it was), and writes rounds, operations answered, interrupted operations the
restarts finished and violations to bench/results/NAME.json.

    python -m bench.crashes --rounds 1000 --stores sqlite,postgres
"""

from __future__ import annotations

import random
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from pathlib import Path
from tempfile import TemporaryDirectory

import click

from bench.common import postgres_database, save, split, table
from tests.functional.harness import Pod
from tests.functional.test_crash_consistency import CLIENTS, Ledger, check_invariants, storm_and_kill


def run_store(store: str, rounds: int, machines: int, seed: int) -> dict:
    with TemporaryDirectory(prefix="vipu-crashes-") as directory:
        with postgres_database() if store == "postgres" else nullcontext() as db_url:  # None: the pod's SQLite file
            pod = Pod(Path(directory), machines=machines, db_url=db_url).start().register()
            chooser, ledger, violations, answered_before = random.Random(seed), Ledger(), [], 0
            began = time.monotonic()
            try:
                with ThreadPoolExecutor(CLIENTS) as pool:
                    for round_number in range(rounds):
                        storm_and_kill(pod, ledger, pool, chooser, round_number)
                        try:
                            ledger.settle(check_invariants(pod, ledger))
                        except AssertionError as violation:
                            violations.append(f"round {round_number}: {violation}".splitlines()[0])
                            answered_before += ledger.answered
                            ledger = Ledger()  # start the promises afresh from what is there now
                        if round_number % 50 == 49:
                            click.echo(f"{store}: {round_number + 1} rounds, {answered_before + ledger.answered} answers, "
                                       f"{len(violations)} violations", err=True)
                finished = (Path(directory) / "server.log").read_text().count("finished the interrupted")
            finally:
                pod.stop()
            return {"store": store, "machines": machines, "rounds": rounds, "seed": seed, "answered": answered_before + ledger.answered,
                    "interrupted_operations_finished": finished, "violations": len(violations),
                    "first_violations": violations[:10], "seconds": round(time.monotonic() - began, 1)}


@click.command()
@click.option("--rounds", default=1000, show_default=True, help="Kill-and-restart rounds per store.")
@click.option("--stores", default="sqlite,postgres", show_default=True, help="Stores: sqlite, postgres.")
@click.option("--machines", default=4, show_default=True, help="Machines in the pod.")
@click.option("--seed", default=20261122, show_default=True, help="Seed of the random kill points and requests.")
@click.option("--name", default="crashes", show_default=True, help="Results file: bench/results/NAME.json.")
def main(rounds, stores, machines, seed, name):
    """Count the promises the controller breaks across many SIGKILLs (the target is none)."""
    runs = [run_store(store, rounds, machines, seed) for store in split(stores)]
    path = save(name, {"benchmark": "crashes", "runs": runs})
    click.echo(table(["store", "rounds", "answered", "interrupted finished", "violations", "seconds"],
                     [[r["store"], r["rounds"], r["answered"], r["interrupted_operations_finished"], r["violations"], r["seconds"]]
                      for r in runs]))
    click.echo(f"written: {path}")
    if any(r["violations"] for r in runs):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
