"""What a request that waits for room costs as the queue grows: ten thousand waiting against none.

A pod whose allocation is full takes `--requests` creates willing to wait (`--wait`), one after
the other through the real user API, each of a few shapes; every one waits. The time each create
takes to be answered (queued, with its place and reason) is recorded: the median of the first
`--window` against that of the last, which the queue's design says cost the same (placement is
asked once per shape of request, not once per request waiting), and the controller's memory
before and after.

    python -m bench.enqueue --requests 10000 --machines 16
"""

from __future__ import annotations

import statistics
import time

import click
import grpc

from bench.common import ProcessCost, running_pod, save, table
from vipu.api.protos import vipuuser_pb2 as pb
from vipu.api.protos import vipuuser_pb2_grpc as pb_grpc

SIZES = (1, 2, 4)


@click.command()
@click.option("--requests", default=10_000, show_default=True, help="Requests queued, one after the other.")
@click.option("--machines", default=16, show_default=True)
@click.option("--window", default=200, show_default=True, help="Enqueues at each end compared.")
@click.option("--name", default="enqueue", show_default=True, help="Results file: bench/results/NAME.json.")
def main(requests, machines, window, name):
    """Enqueue latency with none waiting against with REQUESTS waiting."""
    with running_pod(machines, "sqlite", server_options=("--max-waiting", str(requests))) as pod:
        api = pb_grpc.UserServiceStub(grpc.insecure_channel(f"127.0.0.1:{pod.user_port}"))
        api.CreatePartition(pb.CreatePartitionRequest(requirements=pb.PartitionRequirements(id="full", size=machines * 4)), timeout=60)
        before = ProcessCost.of(pod.server.pid)
        seconds = []
        for n in range(requests):
            request = pb.CreatePartitionRequest(requirements=pb.PartitionRequirements(id=f"w{n}", size=SIZES[n % len(SIZES)]),
                                                wait_seconds=3600)
            began = time.perf_counter()
            reply = api.CreatePartition(request, timeout=60)
            seconds.append(time.perf_counter() - began)
            if not reply.HasField("queued"):
                raise click.ClickException(f"w{n} did not wait: the pod had room")
        after = ProcessCost.of(pod.server.pid)
        last = reply.queued
    first_ms, last_ms = (round(1000 * statistics.median(seconds[s]), 3) for s in (slice(0, window), slice(-window, None)))
    result = {"benchmark": "enqueue", "requests": requests, "machines": machines, "window": window,
              "first_median_ms": first_ms, "last_median_ms": last_ms, "last_over_first": round(last_ms / first_ms, 2),
              "last_position": last.position, "rss_mb_before": round(before.rss_mb, 1), "rss_mb_after": round(after.rss_mb, 1)}
    path = save(name, result)
    click.echo(table(["requests waiting", "enqueue median ms"], [[f"0 to {window}", first_ms],
                                                                [f"{requests - window} to {requests}", last_ms]]))
    click.echo(f"last / first: {result['last_over_first']}; the last told it is number {last.position}, \"{last.reason[:100]}\"; "
               f"controller resident {result['rss_mb_before']} MB -> {result['rss_mb_after']} MB")
    click.echo(f"written: {path}")


if __name__ == "__main__":
    main()
