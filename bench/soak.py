"""Soak: a mixed load on a real controller for a set time, watching errors, latency and memory.

Clients (threads, each with its own gRPC channel) keep a few partitions of random sizes each,
and in random order create, inspect (list, status, IPUoF configuration), reset and remove them.
Every window (`--window` seconds) the script records the operations done, errors, latency
percentiles and the controller's resident memory. At the end it fits memory over the second
half of the run: the controller passes when it does not grow (less than 5 % and 4 MB from the
first to the last third of that half) and no operation failed except creations refused for want
of free IPUs, which a full pod gives by design.

    python -m bench.soak                      # 10 minutes, 16 machines, 8 clients, SQLite
    python -m bench.soak --minutes 60 --store postgres
"""

from __future__ import annotations

import random
import statistics
import sys
import threading
import time
from collections import Counter

import click
import grpc

from bench.common import ProcessCost, percentile, running_pod, save, table
from vipu.api.protos import vipuuser_pb2 as pb
from vipu.api.protos import vipuuser_pb2_grpc as pb_grpc

SIZES = (1, 1, 2, 2, 4, 4, 8, 16)
HELD_PER_CLIENT = 3


class Recorder:
    def __init__(self):
        self.lock = threading.Lock()
        self.latencies: list[tuple[float, float]] = []  # (when, seconds)
        self.errors: Counter[str] = Counter()
        self.refusals = 0

    def ok(self, started: float) -> None:
        with self.lock:
            self.latencies.append((started, time.monotonic() - started))

    def failed(self, operation: str, error: grpc.RpcError) -> None:
        with self.lock:
            details = error.details() or ""
            if operation == "create" and error.code() == grpc.StatusCode.FAILED_PRECONDITION and (
                    details.startswith("no free ") or details.startswith("no allocation has room")):
                self.refusals += 1
            else:
                self.errors[f"{operation}: {error.code().name}: {error.details()}"] += 1


def client(port: int, number: int, recorder: Recorder, stop: threading.Event, seed: int, sizes: tuple[int, ...]) -> None:
    chance = random.Random(seed + number)
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    api = pb_grpc.UserServiceStub(channel)
    held: list[str] = []
    serial = 0
    while not stop.is_set():
        choice = chance.random()
        if (choice < 0.35 and len(held) < HELD_PER_CLIENT) or not held:
            serial += 1
            name, operation = f"soak-{number}-{serial}", "create"
            method, request = api.CreatePartition, pb.CreatePartitionRequest(
                requirements=pb.PartitionRequirements(id=name, size=chance.choice(sizes)))
        elif choice < 0.6:
            name, operation = held[0], "remove"
            method, request = api.RemovePartition, pb.RemovePartitionRequest(partition_id=name)
        elif choice < 0.7:
            name, operation = chance.choice(held), "reset"
            method, request = api.ResetPartition, pb.ResetPartitionRequest(partition_id=name)
        else:
            name, operation = chance.choice(held), chance.choice(["list", "status", "ipuof"])
            method, request = {
                "list": (api.ListPartitions, pb.ListPartitionsRequest()),
                "status": (api.GetPartitionStatus, pb.GetPartitionStatusRequest(partition_id=name)),
                "ipuof": (api.GetPartitionIpuofConfig, pb.GetPartitionIpuofConfigRequest(partition_id=name)),
            }[operation]
        started = time.monotonic()
        try:
            method(request, timeout=60)
        except grpc.RpcError as error:
            recorder.failed(operation, error)
            continue
        recorder.ok(started)
        if operation == "create":
            held.append(name)
        elif operation == "remove":
            held.remove(name)
    for name in held:
        try:
            api.RemovePartition(pb.RemovePartitionRequest(partition_id=name), timeout=60)
        except grpc.RpcError as error:
            recorder.failed("remove", error)
    channel.close()


def memory_verdict(samples: list[float]) -> dict:
    """Whether resident memory grew over the second half of the run (the first half warms up)."""
    steady = samples[len(samples) // 2:]
    if len(steady) < 3:
        return {"grows": False, "note": "too short a run to judge"}
    third = max(1, len(steady) // 3)
    first, last = statistics.fmean(steady[:third]), statistics.fmean(steady[-third:])
    return {"first_third_mb": round(first, 1), "last_third_mb": round(last, 1),
            "grows": last > first * 1.05 and last - first > 4.0}


@click.command()
@click.option("--minutes", type=float, default=10.0, show_default=True)
@click.option("--seconds", type=float, default=None, help="Run this many seconds instead (smoke runs).")
@click.option("--machines", type=int, default=16, show_default=True)
@click.option("--clients", type=int, default=8, show_default=True)
@click.option("--store", type=click.Choice(["sqlite", "postgres"]), default="sqlite", show_default=True)
@click.option("--window", type=float, default=30.0, show_default=True, help="Seconds per reported window.")
@click.option("--seed", type=int, default=1, show_default=True)
@click.option("--name", default="soak", show_default=True, help="Results file name under bench/results/.")
def main(minutes, seconds, machines, clients, store, window, seed, name):
    duration = seconds if seconds is not None else minutes * 60
    recorder, stop = Recorder(), threading.Event()
    windows = []
    with running_pod(machines, store) as pod:
        pid = pod.server.pid
        sizes = tuple(size for size in SIZES if size <= machines * 4)  # what the pod can ever hold
        threads = [threading.Thread(target=client, args=(pod.user_port, n, recorder, stop, seed, sizes)) for n in range(clients)]
        begun = time.monotonic()
        for thread in threads:
            thread.start()
        while (elapsed := time.monotonic() - begun) < duration:
            time.sleep(min(window, duration - elapsed))
            with recorder.lock:
                recent = [s for t, s in recorder.latencies if t >= begun + len(windows) * window]
                errors = sum(recorder.errors.values())
            ms = [s * 1000 for s in recent]
            windows.append({"end_s": round(time.monotonic() - begun), "operations": len(ms), "errors_so_far": errors,
                            "p50_ms": round(percentile(ms, 0.5), 1) if ms else None,
                            "p99_ms": round(percentile(ms, 0.99), 1) if ms else None,
                            "controller_rss_mb": round(ProcessCost.of(pid).rss_mb, 1)})
            print(table(list(windows[-1]), [list(windows[-1].values())]).splitlines()[-1], flush=True)
        stop.set()
        for thread in threads:
            thread.join()
    memory = memory_verdict([w["controller_rss_mb"] for w in windows])
    result = {"duration_s": round(duration), "machines": machines, "clients": clients, "store": store,
              "operations": len(recorder.latencies), "refusals_for_room": recorder.refusals,
              "errors": dict(recorder.errors), "memory": memory, "windows": windows}
    print(table(["window end s", "operations", "p50 ms", "p99 ms", "controller MB"],
                [[w["end_s"], w["operations"], w["p50_ms"], w["p99_ms"], w["controller_rss_mb"]] for w in windows]))
    print(f"operations {result['operations']}, refused for room {recorder.refusals}, errors {sum(recorder.errors.values())}")
    for error, count in recorder.errors.most_common(10):
        print(f"  {count} x {error}")
    print(f"memory: {memory}")
    print(f"written: {save(name, result)}")
    if recorder.errors or memory["grows"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
