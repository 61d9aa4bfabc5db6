"""SIGKILL the controller at random points of a storm of creates and removes; its promises hold.

Each round, client threads create and remove partitions as fast as the controller answers, the
controller is killed at a random moment, and started again. Then the invariants are checked:
every IPU in at most one partition; every partition a client was told exists is there, ACTIVE,
and configured on exactly its agents; every partition a client was told is gone is gone; no
agent holds a partition the store does not know; nothing is left mid-operation. A call cut off by
the kill has an unknown outcome, and either outcome is accepted.
"""

from __future__ import annotations

import random
import signal
import threading
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import grpc
import pytest

from tests.functional.harness import Pod, wait_until
from vipu.api.protos import vipuuser_pb2 as pb
from vipu.api.protos import vipuuser_pb2_grpc as pb_grpc

pytestmark = pytest.mark.functional

ROUNDS = 50  # per store, as the issue that made the controller crash-safe asks
CLIENTS = 6
SIZES = (1, 2, 4, 8)


@dataclass
class Ledger:
    """What the clients were told, and the calls whose answer the kill swallowed."""

    present: set[str] = field(default_factory=set)
    gone: set[str] = field(default_factory=set)
    unknown: set[str] = field(default_factory=set)
    answered: int = 0  # calls answered, successes and refusals alike
    lock: threading.Lock = field(default_factory=threading.Lock)

    def settle(self, existing: set[str]) -> None:
        """After the checks: an unknown outcome is whatever the restarted controller holds."""
        for partition_id in self.unknown:
            (self.present if partition_id in existing else self.gone).add(partition_id)
            (self.gone if partition_id in existing else self.present).discard(partition_id)
        self.unknown.clear()


def storm(port: int, client: int, round_number: int, ledger: Ledger, seed: int, stop: threading.Event) -> None:
    """One client: create and remove its own partitions until the controller stops answering."""
    chooser = random.Random(seed)
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
    api = pb_grpc.UserServiceStub(channel)
    serial = 0
    try:
        while not stop.is_set():
            with ledger.lock:
                mine = sorted(p for p in ledger.present if p.startswith(f"c{client}-"))
            if mine and chooser.random() < 0.5:
                partition_id, done = chooser.choice(mine), ledger.gone
                rpc, request = api.RemovePartition, pb.RemovePartitionRequest(partition_id=partition_id)
            else:
                serial += 1
                partition_id, done = f"c{client}-r{round_number}-{serial}", ledger.present
                requirements = pb.PartitionRequirements(id=partition_id, size=chooser.choice(SIZES))
                rpc, request = api.CreatePartition, pb.CreatePartitionRequest(requirements=requirements)
            try:
                rpc(request, timeout=30)
            except grpc.RpcError as error:
                if error.code() == grpc.StatusCode.FAILED_PRECONDITION and ("free" in error.details() or "no room" in error.details()):
                    with ledger.lock:
                        ledger.answered += 1
                    continue
                if error.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
                    with ledger.lock:
                        ledger.unknown.add(partition_id)
                    return  # the controller is gone
                raise AssertionError(f"{partition_id}: {error.code()} {error.details()}") from None
            with ledger.lock:
                ledger.present.discard(partition_id)
                done.add(partition_id)
                ledger.answered += 1
    finally:
        channel.close()


def check_invariants(pod: Pod, ledger: Ledger) -> set[str]:
    """Assert the controller's promises against its answers and every agent's holdings; the partitions there are."""
    api = pb_grpc.UserServiceStub(pod._channel(pod.user_port))
    partitions = api.ListPartitions(pb.ListPartitionsRequest(), timeout=30).partitions
    existing = {p.id for p in partitions}

    ipus = [(ipu.agent_id, ipu.agent_ipu_index) for p in partitions for ipu in p.spec.ipus]
    assert len(ipus) == len(set(ipus)), "an IPU is in two partitions"
    kept = ledger.present - ledger.unknown  # less those whose removal the kill cut short
    assert kept <= existing, f"acknowledged partitions lost: {sorted(kept - existing)}"
    assert not ledger.gone & existing, f"removed partitions back: {sorted(ledger.gone & existing)}"
    assert existing <= ledger.present | ledger.unknown, f"partitions nobody asked for: {sorted(existing - ledger.present - ledger.unknown)}"

    statuses = [api.GetPartitionStatus(pb.GetPartitionStatusRequest(partition_id=p.id), timeout=30).status for p in partitions]
    busy = {s.partition_id: (s.ready_state, s.operation_state) for s in statuses
            if (s.ready_state, s.operation_state) != (pb.PS_ACTIVE, pb.POS_IDLE)}
    assert not busy, f"partitions not ACTIVE and idle after the restart: {busy}"

    machine_of = {f"ag{n}": m.name for n, m in enumerate(pod.rack.machines, start=1)}
    wanted: dict[str, dict[str, list[int]]] = defaultdict(dict)
    for p in partitions:
        for ipu in p.spec.ipus:
            wanted[machine_of[ipu.agent_id]].setdefault(p.id, []).append(ipu.agent_ipu_index)
    for machine in pod.rack.machines:
        held = pod.held(machine.name)
        expected = {partition_id: sorted(indices) for partition_id, indices in wanted[machine.name].items()}
        assert held == expected, f"{machine.name} holds {held}, the store says {expected}"
    return existing


@pytest.fixture
def crashing_pod(store_url, tmp_path):
    """A registered pod of 4 machines, once on SQLite and once on PostgreSQL."""
    pod = Pod(tmp_path, machines=4, db_url=store_url).start().register()
    yield pod
    pod.stop()


def storm_and_kill(pod: Pod, ledger: Ledger, pool: ThreadPoolExecutor, chooser: random.Random, round_number: int) -> None:
    """Clients storm the controller; after a random number of answers it is killed, then started again."""
    stop = threading.Event()
    clients = [pool.submit(storm, pod.user_port, c, round_number, ledger, chooser.random(), stop) for c in range(CLIENTS)]
    kill_after = ledger.answered + chooser.randint(5, 60)
    wait_until(lambda: ledger.answered >= kill_after or any(c.done() for c in clients), timeout=120, what="the storm")
    stop.set()
    pod.stop_server(signal.SIGKILL)
    for client in clients:
        client.result(timeout=60)  # re-raises what a client found wrong
    pod.start_server()


def test_sigkill_at_random_points_of_a_storm_keeps_every_promise(crashing_pod):
    pod = crashing_pod
    chooser = random.Random(20261122)
    ledger = Ledger()
    with ThreadPoolExecutor(CLIENTS) as pool:
        for round_number in range(ROUNDS):
            storm_and_kill(pod, ledger, pool, chooser, round_number)
            ledger.settle(check_invariants(pod, ledger))
    finished = (pod.directory / "server.log").read_text().count("finished the interrupted")
    assert finished > 0, "no kill landed inside an operation; the test proved nothing"
    assert len(ledger.present) + len(ledger.gone) > ROUNDS * CLIENTS  # the storms did work
