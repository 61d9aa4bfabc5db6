"""What vipu-slurm-licences reserves out of Slurm's licences: the IPUs Slurm's jobs cannot have.

The controller and slurmctld are doubles here (test_jobs' Slurm); test_slurm_queue.py runs the
same against the real ones."""

from __future__ import annotations

from tests.unit.slurm.test_jobs import Slurm
from vipu.api.protos import vipuuser_pb2 as pb
from vipu.client.settings import ClientSettings
from vipu.client.user import UserClient
from vipu.slurm import licences


class Controller:
    """The user end-point's answers that a sync reads."""

    def __init__(self, partitions: dict[str, int], allocations: list[pb.AllocationCapacity]):
        self.partitions, self.allocations = partitions, allocations

    def call(self, _stub, method, request):
        if method == "GetCapacity":
            return pb.GetCapacityReply(allocations=self.allocations)
        if method == "ListPartitions":
            return pb.ListPartitionsReply(partitions=[
                pb.Partition(id=name, spec=pb.PartitionSpec(ipus=[pb.PartitionIpu() for _ in range(size)]))
                for name, size in self.partitions.items()])
        raise AssertionError(method)


def test_partitions_not_of_a_live_job_ipus_on_machines_down_and_ipus_held_for_others_are_reserved(monkeypatch):
    user = UserClient(ClientSettings("localhost", 8090), 1.0)
    user.connection = Controller(  # type: ignore[assignment]
        {"by-hand": 2, "slurm-7": 4, "slurm-8": 1, "slurm-999": 1},  # 7 runs; 8 is over; Slurm knows no job 999
        [pb.AllocationCapacity(allocation_id="a1", total_ipus=16, down_ipus=4, held_ipus=2, held_for="by-hand-waits", draining_ipus=3),
         pb.AllocationCapacity(allocation_id="a2", total_ipus=16, held_ipus=3, held_for="slurm-9", reserved_ipus=2)])  # job 9's own
    slurm = Slurm({"7": {"JobState": "RUNNING"}, "8": {"JobState": "COMPLETED"}, "9": {"JobState": "CONFIGURING"}})
    reserved: list[int] = []
    monkeypatch.setattr(licences, "licences", lambda: 32)
    monkeypatch.setattr(licences, "reserve", reserved.append)
    count = licences.sync(user, slurm)
    assert (count.outside, count.down, count.held, count.draining, count.reserved_for_people, count.reserved, reserved) == (
        4, 4, 2, 3, 2, 15, [15])
    assert count.describe() == ("32 licences ipu; 4 IPUs held outside Slurm, 4 free on machines that are down, 2 free held for "
                                "a request outside Slurm, 3 free on machines being drained, 2 free in reservations for their users, "
                                "reserved (vipu-outside)")
