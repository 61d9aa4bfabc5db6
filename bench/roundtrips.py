"""Where one client's create goes: the round trips it is made of, each timed alone on one pod.

A create through the user API is one call to the controller, which makes one call to the agent
of each machine concerned (1-IPU partitions: one), with the controller's own work between. This
times, one after the other on the same pod, the median of: a call to the controller that does no
work (listing no partitions), a call to an agent that does none (listing its partitions), an
agent's clear+apply of one partition's settings, and a create and a remove through the user API.
What a create costs beyond the two round trips is the controller's own work.

    python -m bench.roundtrips --machines 64 --samples 300
"""

from __future__ import annotations

import itertools
import statistics
import time
from collections.abc import Callable

import click
import grpc

from bench.common import running_pod, save, table
from vipu.api.protos import agent_pb2, agent_pb2_grpc, vipuuser_pb2, vipuuser_pb2_grpc

WARM_UP = 20


def timed(call: Callable[[], object]) -> float:
    """Seconds one call took."""
    began = time.perf_counter()
    call()
    return time.perf_counter() - began


def median_ms(call: Callable[[], object], samples: int) -> float:
    times = [timed(call) for _ in range(WARM_UP + samples)]
    return round(1000 * statistics.median(times[WARM_UP:]), 3)


@click.command()
@click.option("--machines", default=64, show_default=True)
@click.option("--store", default="sqlite", show_default=True, type=click.Choice(["sqlite", "postgres"]))
@click.option("--samples", default=300, show_default=True, help="Timed calls of each kind.")
@click.option("--name", default="roundtrips", show_default=True, help="Results file: bench/results/NAME.json.")
def main(machines, store, samples, name):
    """Time the round trips a create is made of, one client, one pod."""
    with running_pod(machines, store) as pod:
        user = vipuuser_pb2_grpc.UserServiceStub(grpc.insecure_channel(f"127.0.0.1:{pod.user_port}"))
        names = (f"rt{n}" for n in itertools.count())
        created: list[str] = []

        def create() -> None:
            created.append(next(names))
            user.CreatePartition(vipuuser_pb2.CreatePartitionRequest(
                requirements=vipuuser_pb2.PartitionRequirements(id=created[-1], size=1)), timeout=30)

        def remove() -> None:
            user.RemovePartition(vipuuser_pb2.RemovePartitionRequest(partition_id=created.pop()), timeout=30)

        figures = {"controller call doing nothing (ListPartitions, none)":
                   median_ms(lambda: user.ListPartitions(vipuuser_pb2.ListPartitionsRequest(), timeout=30), samples)}
        create()  # one partition to find on its agent
        machine = next(m for m in pod.rack.machines if pod.held(m.name))
        agent = agent_pb2_grpc.AgentServiceStub(grpc.insecure_channel(f"{machine.host}:{machine.port}"))
        (settings,) = agent.ListPartitions(agent_pb2.ListPartitionsRequest(), timeout=30).partitions

        def clear_and_apply() -> None:
            agent.ClearPartition(agent_pb2.ClearPartitionRequest(partition_id=settings.partition_id), timeout=30)
            agent.ApplyPartition(agent_pb2.ApplyPartitionRequest(settings=settings), timeout=30)

        figures["agent call doing nothing (ListPartitions, one)"] = median_ms(
            lambda: agent.ListPartitions(agent_pb2.ListPartitionsRequest(), timeout=30), samples)
        figures["agent clear + apply of one partition"] = median_ms(clear_and_apply, samples)
        remove()
        creates, removes = [], []
        for _ in range(WARM_UP + samples):  # alternately, as the pod holds fewer IPUs than there are samples
            creates.append(timed(create))
            removes.append(timed(remove))
        figures["create through the user API"] = round(1000 * statistics.median(creates[WARM_UP:]), 3)
        figures["remove through the user API"] = round(1000 * statistics.median(removes[WARM_UP:]), 3)
    path = save(name, {"benchmark": "roundtrips", "machines": machines, "store": store, "samples": samples, "median_ms": figures})
    click.echo(table(["call", "median ms"], [[call, ms] for call, ms in figures.items()]))
    click.echo(f"written: {path}")


if __name__ == "__main__":
    main()
