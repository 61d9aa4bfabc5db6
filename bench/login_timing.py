"""Whether the time of a refused login tells an unknown user from a known one.

A secure controller's user end-point is called over mutual TLS with three kinds of credentials,
in a shuffled order so that drift in the machine's speed touches each kind alike: a known user's
right key, a known user's wrong key, and a user that does not exist. Both refusals should cost one
scrypt each (the unknown user's key is checked against a decoy), so their times should match; the
right key takes the remembered short cut. Both lockouts are off for the run, or the wrong keys
would lock the user and then the address out.

    python -m bench.login_timing --samples 200
"""

from __future__ import annotations

import random
import secrets
import statistics
import time
from pathlib import Path
from tempfile import TemporaryDirectory

import click
import grpc

from bench.common import percentile, save, table
from tests.functional.harness import Pod
from vipu.api import credentials
from vipu.api.protos import vipuuser_pb2, vipuuser_pb2_grpc
from vipu.api.tls import client_credentials

WARM_UP = 10


@click.command()
@click.option("--samples", default=200, show_default=True, help="Timed calls of each kind.")
@click.option("--seed", default=2026, show_default=True)
@click.option("--name", default="login-timing", show_default=True, help="Results file: bench/results/NAME.json.")
def main(samples, seed, name):
    """Time logins with a right key, a wrong key and an unknown user, interleaved."""
    with TemporaryDirectory(prefix="vipu-bench-") as directory:
        pod = Pod(Path(directory), machines=1, secure=True, server_options=("--login-failures", "0", "--login-failures-per-address", "0"))
        try:
            pod.start()
            files = pod.tls
            channel = grpc.secure_channel(f"127.0.0.1:{pod.user_port}",
                                          client_credentials(files.ca_for(files.client_dir), files.client_cert, files.client_key))
            user = vipuuser_pb2_grpc.UserServiceStub(channel)
            kinds = {"known user, right key": ("admin", pod.admin_key),
                     "known user, wrong key": ("admin", None),
                     "unknown user": (None, None)}
            order = [kind for kind in kinds for _ in range(WARM_UP + samples)]
            random.Random(seed).shuffle(order)
            times: dict[str, list[float]] = {kind: [] for kind in kinds}
            outcomes: dict[str, set[str]] = {kind: set() for kind in kinds}
            for kind in order:
                user_id, key = kinds[kind]
                metadata = credentials.metadata(user_id or f"nobody-{secrets.token_hex(4)}", key or secrets.token_urlsafe(16))
                began = time.perf_counter()
                try:
                    user.ListPartitions(vipuuser_pb2.ListPartitionsRequest(), metadata=metadata, timeout=30)
                    outcomes[kind].add("OK")
                except grpc.RpcError as error:
                    outcomes[kind].add(error.code().name)
                times[kind].append(time.perf_counter() - began)
            channel.close()
        finally:
            pod.stop()
    figures = {}
    for kind, seconds in times.items():
        kept = [1000 * s for s in seconds[WARM_UP:]]
        figures[kind] = {"outcome": ",".join(sorted(outcomes[kind])), "median_ms": round(statistics.median(kept), 2),
                         "p10_ms": round(percentile(kept, 0.10), 2), "p90_ms": round(percentile(kept, 0.90), 2)}
    wrong, unknown = figures["known user, wrong key"]["median_ms"], figures["unknown user"]["median_ms"]
    path = save(name, {"benchmark": "login-timing", "samples": samples, "seed": seed, "figures": figures,
                       "unknown_minus_wrong_key_ms": round(unknown - wrong, 2)})
    click.echo(table(["credentials", "answer", "median ms", "p10 ms", "p90 ms"],
                     [[kind, f["outcome"], f["median_ms"], f["p10_ms"], f["p90_ms"]] for kind, f in figures.items()]))
    click.echo(f"unknown user minus known user's wrong key, medians: {unknown - wrong:+.2f} ms")
    click.echo(f"written: {path}")


if __name__ == "__main__":
    main()
