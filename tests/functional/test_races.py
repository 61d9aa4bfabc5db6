"""Many clients racing for the last free IPUs get exactly what there is, on SQLite and PostgreSQL."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from tests.functional.harness import Pod
from vipu.api.protos import vipuuser_pb2 as pb
from vipu.api.protos import vipuuser_pb2_grpc as pb_grpc
from vipu.backends.sim import faults
from vipu.backends.sim.rack import save_rack

pytestmark = pytest.mark.functional

CLIENTS = 32


@pytest.fixture
def racing_pod(store_url, tmp_path):
    """A registered pod of 2 machines, once on SQLite and once on PostgreSQL."""
    pod = Pod(tmp_path, machines=2, db_url=store_url).start().register()
    yield pod
    pod.stop()


def create(api, partition_id: str, size: int):
    return api.CreatePartition(pb.CreatePartitionRequest(requirements=pb.PartitionRequirements(id=partition_id, size=size)),
                               timeout=120)


def test_32_clients_racing_for_the_last_free_ipus_get_exactly_the_capacity(racing_pod):
    pod = racing_pod
    api = pb_grpc.UserServiceStub(pod._channel(pod.user_port))
    create(api, "held-4", 4)
    create(api, "held-1", 1)  # 3 of the 8 IPUs are left
    start = threading.Barrier(CLIENTS)

    def claim(n: int):
        channel = grpc.insecure_channel(f"127.0.0.1:{pod.user_port}")  # a client of its own
        try:
            start.wait()
            create(pb_grpc.UserServiceStub(channel), f"race-{n}", 1)
            return "won"
        except grpc.RpcError as error:
            return (error.code(), error.details())
        finally:
            channel.close()

    with ThreadPoolExecutor(CLIENTS) as pool:
        results = list(pool.map(claim, range(CLIENTS)))
    winners = [f"race-{n}" for n, result in enumerate(results) if result == "won"]
    assert len(winners) == 3, results
    refusals = [result for result in results if result != "won"]
    assert all(code == grpc.StatusCode.FAILED_PRECONDITION and details.startswith("no free IPU in allocation")
               for code, details in refusals), refusals

    partitions = api.ListPartitions(pb.ListPartitionsRequest()).partitions
    assert sorted(p.id for p in partitions) == sorted(["held-4", "held-1", *winners])
    ipus = [(ipu.agent_id, ipu.agent_ipu_index) for p in partitions for ipu in p.spec.ipus]
    assert len(ipus) == len(set(ipus)) == 8  # every IPU once, none twice
    held = {partition: sorted(indices) for machine in pod.rack.machines for partition, indices in pod.held(machine.name).items()}
    assert sorted(held) == sorted(["held-4", "held-1", *winners])  # configured on the agents, each of them
    for partition in winners:
        api.RemovePartition(pb.RemovePartitionRequest(partition_id=partition))
    for partition in ("held-4", "held-1"):
        api.RemovePartition(pb.RemovePartitionRequest(partition_id=partition))


ROUNDS = 100


@pytest.fixture
def slow_pod(store_url, tmp_path):
    """2 machines whose every apply and clear takes 30 ms, so that operations overlap, and no
    health pass that could tidy up after a race: what the clients see is the operations' own work."""
    pod = Pod(tmp_path, machines=2, db_url=store_url, server_options=("--health-interval", "3600"))
    for machine in pod.rack.machines:
        faults.slow_down(pod.rack, machine.name, 30)
    save_rack(pod.rack, pod.rack_path)
    pod.start().register()
    yield pod
    pod.stop()


def answer(call):
    """'ok', or the status code of the refusal."""
    try:
        call()
        return "ok"
    except grpc.RpcError as error:
        return error.code()


def check_round(pod, api, partition_id: str, told: dict[str, object]) -> bool:
    """Every agent holds exactly the partitions the store knows as ACTIVE, on their own agents, and
    the clients' answers agree with what is left; whether the partition is left."""
    partitions = {p.id: p for p in api.ListPartitions(pb.ListPartitionsRequest()).partitions}
    held = {machine.name: set(pod.held(machine.name)) for machine in pod.rack.machines}
    for machine, holding in held.items():
        assert holding <= set(partitions), f"{machine} holds {holding - set(partitions)}, which the store does not know ({told})"
    left = partition_id in partitions
    if left:
        status = api.GetPartitionStatus(pb.GetPartitionStatusRequest(partition_id=partition_id)).status
        assert status.ready_state == pb.PS_ACTIVE and status.operation_state == pb.POS_IDLE, (told, status)
        assert pod.held_anywhere(partition_id), f"{partition_id} is ACTIVE but held by no agent ({told})"
    # What the clients were told agrees with what is left: a partition that came into being (or
    # was there) is gone exactly when the remove succeeded.
    existed = told["first"] == "ok" if "create" in told else True
    assert left == (existed and told["remove"] != "ok"), f"told {told}, and the partition is {'left' if left else 'gone'}"
    return left


def race(kind: str, first, second) -> dict[str, object]:
    """Send `first` (a create or a reset), then `second` (a remove) as soon as `first` is on its
    way; both answers."""
    with ThreadPoolExecutor(2) as pool:
        a = pool.submit(answer, first)
        b = pool.submit(answer, second)
        return {kind: True, "first": a.result(timeout=120), "remove": b.result(timeout=120)}


def test_a_forced_remove_racing_a_create_or_a_reset_leaves_no_agent_holding_a_forgotten_partition(slow_pod):
    pod = slow_pod
    api = pb_grpc.UserServiceStub(pod._channel(pod.user_port))

    def remove(partition_id):
        return lambda: api.RemovePartition(pb.RemovePartitionRequest(partition_id=partition_id, force=True), timeout=120)

    outcomes: dict[tuple[str, object, object], int] = {}
    for n in range(ROUNDS):
        told = race("create", lambda n=n: create(api, f"c{n}", 4), remove(f"c{n}"))
        left = check_round(pod, api, f"c{n}", told)
        outcomes[("create", told["first"], told["remove"])] = outcomes.get(("create", told["first"], told["remove"]), 0) + 1
        if left:
            api.RemovePartition(pb.RemovePartitionRequest(partition_id=f"c{n}"), timeout=60)

        create(api, f"r{n}", 4)
        reset = lambda n=n: api.ResetPartition(pb.ResetPartitionRequest(partition_id=f"r{n}"), timeout=120)  # noqa: E731
        told = race("reset", reset, remove(f"r{n}"))
        if check_round(pod, api, f"r{n}", told):
            api.RemovePartition(pb.RemovePartitionRequest(partition_id=f"r{n}"), timeout=60)
        outcomes[("reset", told["first"], told["remove"])] = outcomes.get(("reset", told["first"], told["remove"]), 0) + 1
    # The race was real: the remove met the create under way in some rounds, and came first in others.
    assert outcomes.get(("create", "ok", "ok"), 0) > 0, outcomes
