"""Partition latency and throughput: create+remove pairs through the real user API.

For each store and pod size a fresh pod is started (real `vipu-server`, real `vipu-agent`
processes on loopback); then for each number of clients, that many client processes (each its
own gRPC channel, as separate users would be) create a partition, remove it, and repeat for a
fixed time. Reported: p50/p99 of create and of remove as the client sees them, and completed
pairs per second over all clients.

    python -m bench.partitions --machines 16,64,256 --clients 1,8,32 --stores sqlite,postgres

`--ha` runs the controller as a lone `--ha` replica, to measure what leading costs: every write
transaction then also checks the lease.

With N closed-loop clients, mean latency is N divided by throughput whatever the design, so a
percentile at saturation measures throughput. `--rate R1,R2` measures latency at a given load
instead (open loop): pairs arrive at R per second in all, at Poisson-distributed times, spread over
the `--clients` processes; each pair starts at its arrival time whether or not earlier ones have
ended, and its create latency counts from that time (a controller that falls behind shows it).

    python -m bench.partitions --machines 64 --stores sqlite --clients 4 --rate 100,150
"""

from __future__ import annotations

import multiprocessing
import random
import threading
import time
from queue import Empty

import click
import grpc

from bench.common import ProcessCost, running_pod, save, settle, split, summarise_ms, table
from vipu.api.protos import vipuuser_pb2, vipuuser_pb2_grpc

WARM_UP_PAIRS = 3


def client(port: int, number: int, size: int, ready, start, duration: float, results) -> None:
    """One client: warm up, say so on `ready`, then create+remove pairs from `start` for `duration`."""
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    api = vipuuser_pb2_grpc.UserServiceStub(channel)

    def pair(name: str, creates: list, removes: list, failures: list) -> None:
        began = time.perf_counter()
        try:
            api.CreatePartition(vipuuser_pb2.CreatePartitionRequest(
                requirements=vipuuser_pb2.PartitionRequirements(id=name, size=size)), timeout=60)
        except grpc.RpcError as error:
            failures.append(error.details())
            return
        created = time.perf_counter()
        api.RemovePartition(vipuuser_pb2.RemovePartitionRequest(partition_id=name), timeout=60)
        creates.append(created - began)
        removes.append(time.perf_counter() - created)

    for n in range(WARM_UP_PAIRS):
        pair(f"warm{number}-{n}", [], [], [])
    creates, removes, failures = [], [], []
    ready.put(number)
    start.wait()
    deadline = time.monotonic() + duration
    n = 0
    while time.monotonic() < deadline:
        pair(f"c{number}-{n}", creates, removes, failures)
        n += 1
    results.put((creates, removes, failures))
    channel.close()


def open_loop_client(port: int, number: int, size: int, rate: float, ready, start, duration: float, results) -> None:
    """One generator of an open-loop load: pairs at Poisson-distributed times, `rate` per second,
    each sent without waiting for the earlier ones; its create latency counts from its arrival."""
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    api = vipuuser_pb2_grpc.UserServiceStub(channel)
    for n in range(WARM_UP_PAIRS):
        name = f"warm{number}-{n}"
        api.CreatePartition(vipuuser_pb2.CreatePartitionRequest(requirements=vipuuser_pb2.PartitionRequirements(id=name, size=size)),
                            timeout=60)
        api.RemovePartition(vipuuser_pb2.RemovePartitionRequest(partition_id=name), timeout=60)
    creates: list[float] = []
    removes: list[float] = []
    failures: list[str] = []
    finished = threading.Semaphore(0)

    def launch(name: str, arrival: float) -> None:
        request = vipuuser_pb2.CreatePartitionRequest(requirements=vipuuser_pb2.PartitionRequirements(id=name, size=size))

        def created(future) -> None:
            try:
                future.result()
            except grpc.RpcError as error:
                failures.append(error.details())
                finished.release()
                return
            at = time.perf_counter()
            creates.append(at - arrival)

            def removed(future) -> None:
                try:
                    future.result()
                    removes.append(time.perf_counter() - at)
                except grpc.RpcError as error:
                    failures.append(error.details())
                finished.release()

            api.RemovePartition.future(vipuuser_pb2.RemovePartitionRequest(partition_id=name), timeout=60).add_done_callback(removed)

        api.CreatePartition.future(request, timeout=60).add_done_callback(created)

    arrivals = random.Random(number)
    ready.put(number)
    start.wait()
    arrival = time.perf_counter()
    end = arrival + duration
    sent = 0
    while (arrival := arrival + arrivals.expovariate(rate)) < end:
        time.sleep(max(0.0, arrival - time.perf_counter()))
        launch(f"o{number}-{sent}", arrival)
        sent += 1
    deadline = time.monotonic() + 120
    for _ in range(sent):
        if not finished.acquire(timeout=max(0.0, deadline - time.monotonic())):
            failures.append("a pair did not finish within 120 s of the end")
            break
    results.put((creates, removes, failures))
    channel.close()


def measure(pod, clients: int, size: int, duration: float, rate: float | None = None) -> dict:
    """Closed loop (`rate` None): `clients` clients each repeating pairs as fast as answered.
    Open loop: `rate` pairs per second in all, offered by `clients` generators."""
    busy_before = settle()
    spawn = multiprocessing.get_context("spawn")
    ready, start, results = spawn.Queue(), spawn.Event(), spawn.Queue()
    if rate is None:
        workers = [spawn.Process(target=client, args=(pod.user_port, n, size, ready, start, duration, results))
                   for n in range(clients)]
    else:
        workers = [spawn.Process(target=open_loop_client, args=(pod.user_port, n, size, rate / clients, ready, start, duration, results))
                   for n in range(clients)]
    for worker in workers:
        worker.start()
    for _ in workers:
        _collect(ready, workers, 120)
    before = ProcessCost.of(pod.server.pid)
    began = time.monotonic()
    start.set()  # all clients are connected and warm: they start together
    collected = [_collect(results, workers, duration + 120) for _ in workers]
    elapsed = time.monotonic() - began
    after = ProcessCost.of(pod.server.pid)
    for worker in workers:
        worker.join()
    creates = [s for c, _, _ in collected for s in c]
    removes = [s for _, r, _ in collected for s in r]
    failures = [f for _, _, fs in collected for f in fs]
    return {
        "clients": clients,
        "offered_pairs_per_s": rate,
        "create": summarise_ms(creates),
        "remove": summarise_ms(removes),
        "pairs_per_s": round(len(creates) / elapsed, 1),
        "refused": len(failures),
        "refusals": sorted(set(failures))[:3],
        "server_cpu_percent": round(100 * (after.cpu_seconds - before.cpu_seconds) / elapsed, 1),
        "server_cpu_ms_per_pair": round(1000 * (after.cpu_seconds - before.cpu_seconds) / len(creates), 3) if creates else None,
        "server_switches_per_pair": round((after.switches - before.switches) / len(creates), 1) if creates else None,
        "server_rss_mb": round(after.rss_mb, 1),
        "machine_busy_before_percent": round(100 * busy_before, 1),
    }


def _collect(queue, workers, timeout: float):
    """The next item a client puts on `queue`; fails at once if a client died instead."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            return queue.get(timeout=0.5)
        except Empty:
            dead = [w for w in workers if w.exitcode not in (None, 0)]
            if dead:
                raise RuntimeError(f"a benchmark client exited with status {dead[0].exitcode}") from None
            if time.monotonic() > deadline:
                raise RuntimeError("the benchmark clients did not report in time") from None


@click.command()
@click.option("--machines", default="16,64,256", show_default=True, help="Pod sizes, comma separated.")
@click.option("--clients", default="1,8,32", show_default=True, help="Numbers of concurrent clients, comma separated.")
@click.option("--stores", default="sqlite,postgres", show_default=True, help="Stores: sqlite, postgres.")
@click.option("--size", default=1, show_default=True, help="IPUs per partition.")
@click.option("--duration", default=10.0, show_default=True, help="Seconds of load per measurement.")
@click.option("--ha", is_flag=True, help="Run the controller as a (lone) highly available replica.")
@click.option("--rate", "rates", default="", help="Open loop: offered pairs per second in all, comma separated "
                                                    "(Poisson arrivals over the --clients processes). Default: closed loop.")
@click.option("--name", default="partitions", show_default=True, help="Results file: bench/results/NAME.json.")
def main(machines, clients, stores, size, duration, ha, rates, name):
    """Create+remove latency and throughput over the user API, by store, pod size and clients."""
    runs = []
    loads = [float(r) for r in split(rates)] or [None]
    for store in split(stores):
        for pod_size in map(int, split(machines)):
            with running_pod(pod_size, store, server_options=("--ha",) if ha else ()) as pod:
                for count in map(int, split(clients)):
                    for rate in loads:
                        result = {"store": f"{store} --ha" if ha else store, "machines": pod_size, "ipus": pod_size * 4, "size": size,
                                  **measure(pod, count, size, duration, rate)}
                        runs.append(result)
                        offered = f", offered {rate:g}/s" if rate is not None else ""
                        click.echo(f"{store:8} {pod_size:5} machines {count:3} clients{offered}: create p50 "
                                   f"{result['create'].get('p50_ms')} ms p99 {result['create'].get('p99_ms')} ms, "
                                   f"{result['pairs_per_s']} pairs/s", err=True)
    path = save(name, {"benchmark": "partitions", "duration_s": duration, "runs": runs})
    rows = [[r["store"], r["machines"], r["clients"], r["offered_pairs_per_s"] or "closed", r["create"].get("p50_ms"),
             r["create"].get("p99_ms"), r["remove"].get("p50_ms"), r["remove"].get("p99_ms"), r["pairs_per_s"], r["refused"],
             r["server_cpu_percent"], r["server_cpu_ms_per_pair"], r["server_switches_per_pair"]]
            for r in runs]
    click.echo(table(["store", "machines", "clients", "offered/s", "create p50 ms", "create p99 ms", "remove p50 ms",
                      "remove p99 ms", "pairs/s", "refused", "server CPU %", "CPU ms/pair", "switches/pair"], rows))
    click.echo(f"written: {path}")


if __name__ == "__main__":
    main()
