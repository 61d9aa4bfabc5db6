"""Many clients racing for the last free IPUs get exactly what there is, on SQLite and PostgreSQL."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from tests.functional.harness import Pod
from vipu.api.protos import vipuuser_pb2 as pb
from vipu.api.protos import vipuuser_pb2_grpc as pb_grpc

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
    assert all(code == grpc.StatusCode.FAILED_PRECONDITION and "not enough free IPUs" in details
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
