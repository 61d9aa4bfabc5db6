"""The physical floor of a create+remove pair on this machine: what gRPC alone costs.

A user end-point that does nothing but what a create and a remove of a 1-IPU partition must do
on the wire: answer `CreatePartition` after one `ApplyPartition` call to an agent, and
`RemovePartition` after one `ClearPartition`; the agent answers at once. Clients are processes of
their own, as in `bench.partitions`, each in a closed loop of pairs. The end-point's CPU per pair
and its pairs per second are the most any controller written on Python's gRPC can do here; what
vipu-server spends beyond them is its own work. Its context switches per pair are the least a
server on gRPC's threads makes, against which `bench.partitions` counts vipu-server's.

`--end-point aio` serves the same end-point on `grpc.aio` instead, its handlers and its agent
calls coroutines of one event loop: the floor of a controller that took its requests and made
its agent calls on one thread, without handing them between threads.

    python -m bench.floor --clients 1,8 --pairs 1500 --end-point threads,aio
"""

from __future__ import annotations

import asyncio
import multiprocessing
import time
import typing
from concurrent import futures

import click
import grpc

from bench.common import ProcessCost, save, split, table
from tests.ports import free_port
from vipu.api.protos import agent_pb2, agent_pb2_grpc, vipuuser_pb2, vipuuser_pb2_grpc

WARM_UP_PAIRS = 50


class _Agent(agent_pb2_grpc.AgentServiceServicer):
    def ApplyPartition(self, request, context):
        return agent_pb2.ApplyPartitionReply()

    def ClearPartition(self, request, context):
        return agent_pb2.ClearPartitionReply()


class _UserEndPoint(vipuuser_pb2_grpc.UserServiceServicer):
    def __init__(self, agent_port: int):
        self.agent = agent_pb2_grpc.AgentServiceStub(grpc.insecure_channel(f"127.0.0.1:{agent_port}"))

    def CreatePartition(self, request, context):
        self.agent.ApplyPartition(agent_pb2.ApplyPartitionRequest(), timeout=10)
        return vipuuser_pb2.CreatePartitionReply(partition_id=request.requirements.id)

    def RemovePartition(self, request, context):
        self.agent.ClearPartition(agent_pb2.ClearPartitionRequest(partition_id=request.partition_id), timeout=10)
        return vipuuser_pb2.RemovePartitionReply()


class _AioUserEndPoint(vipuuser_pb2_grpc.UserServiceServicer):
    """`_UserEndPoint` on grpc.aio: made within the event loop that serves it."""

    def __init__(self, agent_port: int):
        self.agent = agent_pb2_grpc.AgentServiceStub(grpc.aio.insecure_channel(f"127.0.0.1:{agent_port}"))

    async def CreatePartition(self, request, context):
        await self.agent.ApplyPartition(agent_pb2.ApplyPartitionRequest(), timeout=10)
        return vipuuser_pb2.CreatePartitionReply(partition_id=request.requirements.id)

    async def RemovePartition(self, request, context):
        await self.agent.ClearPartition(agent_pb2.ClearPartitionRequest(partition_id=request.partition_id), timeout=10)
        return vipuuser_pb2.RemovePartitionReply()


def _serve_user_aio(port: int, agent_port: int, ready) -> None:
    async def serve() -> None:
        server = grpc.aio.server()
        vipuuser_pb2_grpc.add_UserServiceServicer_to_server(_AioUserEndPoint(agent_port), server)
        server.add_insecure_port(f"127.0.0.1:{port}")
        await server.start()
        ready.set()
        await server.wait_for_termination()

    asyncio.run(serve())


def _serve(add, servicer, port: int, workers: int, ready) -> None:
    server = grpc.server(futures.ThreadPoolExecutor(workers))
    add(servicer, server)
    server.add_insecure_port(f"127.0.0.1:{port}")
    server.start()
    ready.set()
    server.wait_for_termination()


def _serve_agent(port: int, ready) -> None:
    _serve(agent_pb2_grpc.add_AgentServiceServicer_to_server, _Agent(), port, 16, ready)


def _serve_user(port: int, agent_port: int, ready) -> None:
    _serve(vipuuser_pb2_grpc.add_UserServiceServicer_to_server, _UserEndPoint(agent_port), port, 32, ready)


def _client(port: int, name: str, pairs: int, start) -> None:
    user = vipuuser_pb2_grpc.UserServiceStub(grpc.insecure_channel(f"127.0.0.1:{port}"))

    def pair(n: int) -> None:
        partition_id = f"{name}-{n}"
        user.CreatePartition(vipuuser_pb2.CreatePartitionRequest(
            requirements=vipuuser_pb2.PartitionRequirements(id=partition_id, size=1)), timeout=30)
        user.RemovePartition(vipuuser_pb2.RemovePartitionRequest(partition_id=partition_id), timeout=30)

    for n in range(WARM_UP_PAIRS):
        pair(n)
    start.wait()
    for n in range(WARM_UP_PAIRS, WARM_UP_PAIRS + pairs):
        pair(n)


END_POINTS = {"threads": _serve_user, "aio": _serve_user_aio}


def measure(clients: int, pairs: int, end_point: str = "threads") -> dict:
    """One run: `clients` closed loops of `pairs` pairs each against a fresh end-point (served on
    gRPC's threads, or on `grpc.aio`) and agent."""
    context = multiprocessing.get_context("spawn")
    agent_port, user_port = free_port(), free_port()
    agent_ready, user_ready, start = context.Event(), context.Event(), context.Event()
    servers = [context.Process(target=_serve_agent, args=(agent_port, agent_ready), daemon=True),
               context.Process(target=END_POINTS[end_point], args=(user_port, agent_port, user_ready), daemon=True)]
    try:
        for server, ready in zip(servers, (agent_ready, user_ready), strict=True):
            server.start()
            if not ready.wait(30):
                raise click.ClickException("an end-point of the floor did not start")
        loops = [context.Process(target=_client, args=(user_port, f"c{c}", pairs, start)) for c in range(clients)]
        for loop in loops:
            loop.start()
        time.sleep(1.0)  # the clients' warm-up pairs, before the clock starts
        served_by = typing.cast(int, servers[1].pid)  # started above
        before, began = ProcessCost.of(served_by), time.perf_counter()
        start.set()
        for loop in loops:
            loop.join(600)
        elapsed, after = time.perf_counter() - began, ProcessCost.of(served_by)
        if any(loop.exitcode != 0 for loop in loops):
            raise click.ClickException("a client of the floor failed")
    finally:
        for server in servers:
            server.terminate()
    total = clients * pairs
    return {"end_point": end_point, "clients": clients, "pairs": total, "pairs_per_s": round(total / elapsed, 1),
            "cpu_ms_per_pair": round(1000 * (after.cpu_seconds - before.cpu_seconds) / total, 3),
            "switches_per_pair": round((after.switches - before.switches) / total, 1)}


@click.command()
@click.option("--clients", default="1,8", show_default=True)
@click.option("--pairs", default=1500, show_default=True, help="Timed pairs per client.")
@click.option("--end-point", "end_points", default="threads", show_default=True,
              help="How the end-point is served, comma separated: threads (gRPC's thread pool, as vipu-server), aio (grpc.aio).")
@click.option("--name", default="floor", show_default=True, help="Results file: bench/results/NAME.json.")
def main(clients, pairs, end_points, name):
    """A do-nothing user end-point's CPU per pair and pairs/s: the most Python's gRPC allows here."""
    unknown = sorted(set(split(end_points)) - set(END_POINTS))
    if unknown:
        raise click.UsageError(f"--end-point {unknown[0]} is not one of {', '.join(END_POINTS)}")
    runs = [measure(int(count), pairs, served) for served in split(end_points) for count in split(clients)]
    path = save(name, {"benchmark": "floor", "runs": runs})
    click.echo(table(["end-point", "clients", "pairs/s", "end-point CPU ms per pair", "switches per pair"],
                     [[r["end_point"], r["clients"], r["pairs_per_s"], r["cpu_ms_per_pair"], r["switches_per_pair"]] for r in runs]))
    click.echo(f"written: {path}")


if __name__ == "__main__":
    main()
