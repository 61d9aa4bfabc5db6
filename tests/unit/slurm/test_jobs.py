"""The prolog's and epilog's decisions, with the controller and slurmctld as test doubles (the
real ones are in tests/functional/test_slurm.py)."""

from __future__ import annotations

import dataclasses
import time
from pathlib import Path

import pytest

from vipu.api.protos import vipuuser_pb2 as pb
from vipu.client.settings import ClientSettings
from vipu.client.user import UserClient
from vipu.model.accounts import AccountMap
from vipu.model.errors import (
    AlreadyExists,
    Conflict,
    HardwareFailure,
    InvalidArgument,
    NoRoom,
    NotFound,
    Unavailable,
)
from vipu.slurm.config import VipuSlurmConfig
from vipu.slurm.jobs import JobFailed, JobPartitions, time_limit_seconds


class Controller:
    """Partitions by id; `refuse` maps a method to the error it raises next (None: none, that time)."""

    timeout = 10.0  # a Connection's, which bounds each waiting call

    def __init__(self):
        self.partitions: dict[str, pb.PartitionRequirements] = {}
        self.refuse: dict[str, list[Exception]] = {}
        self.queued: list[pb.QueuedRequest] = []  # what successive waiting calls answer; empty: no room is ever lacking
        self.waiting: set[str] = set()  # requests waiting for room, by partition id
        self.waits: list[int] = []  # the wait_seconds of each create
        self.created: list[pb.CreatePartitionRequest] = []  # each create as asked (but those refused)
        self.reservations: list[pb.Reservation] = []  # vipu's
        self.notices: dict[str, list[str]] = {}  # partition id -> its drain notices

    def call(self, _stub, method, request):
        if self.refuse.get(method) and (refusal := self.refuse[method].pop(0)) is not None:
            raise refusal
        if method == "CreatePartition":
            if request.requirements.id in self.partitions:
                raise AlreadyExists(f"partition {request.requirements.id} already exists")
            self.waits.append(request.wait_seconds)
            self.created.append(request)
            if self.queued:
                return pb.CreatePartitionReply(partition_id=request.requirements.id, queued=self.queued.pop(0))
            self.partitions[request.requirements.id] = request.requirements
            return pb.CreatePartitionReply(partition_id=request.requirements.id)
        if method == "WaitPartition":
            return pb.WaitPartitionReply(queued=self.queued.pop(0))
        if method == "RemovePartition":
            if request.partition_id in self.waiting:  # a remove of a request that waits cancels it
                self.waiting.remove(request.partition_id)
            elif self.partitions.pop(request.partition_id, None) is None:
                raise NotFound(f"partition {request.partition_id} does not exist")
            return pb.RemovePartitionReply()
        if method == "ListQueued":
            return pb.ListQueuedReply(requests=[pb.QueuedRequest(partition_id=p) for p in sorted(self.waiting)])
        if method == "ListReservations":
            return pb.ListReservationsReply(reservations=self.reservations)
        if method == "ListPartitions":
            return pb.ListPartitionsReply(partitions=[pb.Partition(id=p, status=pb.PartitionStatus(drain_notices=self.notices.get(p, [])))
                                                      for p in self.partitions])
        if method == "GetPartitionIpuofConfig":
            gcds = self.partitions[request.partition_id].num_gcds
            return pb.GetPartitionIpuofConfigReply(ipuof_config=pb.PartitionConfig(
                gcd_configs=[pb.PartitionConfig.Gcd(attributes={"GCD Id": str(g)}) for g in range(gcds)]))
        raise AssertionError(method)


class Slurm:
    def __init__(self, known: dict[str, dict[str, str]]):
        self.known = known
        self.comments: dict[str, str] = {}
        self.said: list[str] = []
        self.cancelled: list[str] = []

    def job(self, job_id):
        return self.known.get(job_id)

    def job_states(self):
        return {job_id: fields.get("JobState", "PENDING") for job_id, fields in self.known.items()}

    def comment(self, job_id, text):
        self.comments[job_id] = text
        self.said.append(text)

    def cancel(self, job_id):
        self.cancelled.append(job_id)


@pytest.fixture
def world(tmp_path: Path):
    controller = Controller()
    slurm = Slurm({"7": {"NumTasks": "2", "JobState": "CONFIGURING"}})
    config = VipuSlurmConfig(tmp_path / "vipu.conf", "ctl", tmp_path / "ipuof", max_ipus_per_job=16)
    user = UserClient(ClientSettings("localhost", 8090), 1.0)
    user.connection = controller  # type: ignore[assignment] - the double answers the calls a Connection would make
    return JobPartitions(config, slurm, user), controller, slurm, tmp_path / "ipuof"


JOB = {"SLURM_JOB_ID": "7", "SPANK_VIPU_IPUS": "4", "SPANK_VIPU_NUM_REPLICAS": "2"}


def test_the_prolog_creates_one_gcd_per_task_and_writes_its_files(world):
    jobs, controller, slurm, ipuof = world
    assert jobs.prolog(JOB) == "slurm-7"
    made = controller.partitions["slurm-7"]
    assert (made.size, made.num_gcds, made.num_replicas) == (4, 2, 2)
    assert sorted(p.name for p in ipuof.iterdir()) == ["slurm-7_gcd0_ipuof.conf", "slurm-7_gcd1_ipuof.conf"]
    assert slurm.comments["7"] == "vipu: partition slurm-7"
    assert jobs.epilog({"SLURM_JOB_ID": "7"}) is True
    assert controller.partitions == {} and list(ipuof.iterdir()) == []
    assert jobs.epilog({"SLURM_JOB_ID": "7"}) is False  # a second epilog finds nothing to do


@pytest.mark.parametrize("limit, seconds", [
    ("01:00:00", 3600), ("1-02:03:04", 93784), ("30", 1800), ("30:15", 1815), ("2-12", 216000), ("2-12:30", 217800),
    ("UNLIMITED", 0), ("Partition_Limit", 0), ("NONE", 0), ("", 0), ("99999999-00:00:00", 0),
    ("364-23:59:59", 364 * 86400 + 86399), ("365-00:00:00", 0),  # a year: the backfill scheduler's stand-in for none
])
def test_a_jobs_time_limit_is_read_as_slurm_writes_it(limit, seconds):
    assert time_limit_seconds(limit) == seconds


def test_the_partition_is_expected_to_run_for_the_jobs_time_limit(world):
    jobs, controller, slurm, _ = world
    slurm.known["7"]["TimeLimit"] = "02:30:00"
    assert jobs.prolog(JOB) == "slurm-7"
    assert jobs.epilog({"SLURM_JOB_ID": "7"})
    slurm.known["7"]["TimeLimit"] = "UNLIMITED"
    assert jobs.prolog(JOB) == "slurm-7"
    assert [created.expected_seconds for created in controller.created] == [9000, 0]


def test_a_job_in_a_slurm_reservation_that_vipu_has_too_gets_its_partition_in_it(world):
    jobs, controller, slurm, _ = world
    jobs.config = dataclasses.replace(jobs.config, api_user="slurm")  # secure mode: Slurm's vipu user
    later = time.time() + 3600
    controller.reservations = [pb.Reservation(name="train", end=later, users=["slurm", "alice"]),
                               pb.Reservation(name="mw", end=later, maintenance=True),  # a window: nothing is made in it
                               pb.Reservation(name="over", end=time.time() - 1, users=["slurm"]),
                               pb.Reservation(name="theirs", end=later, users=["alice"])]  # not for Slurm's user
    for slurm_reservation in ("train", "only-in-slurm", "(null)", "mw", "over", "theirs"):
        slurm.known["7"]["Reservation"] = slurm_reservation
        assert jobs.prolog(JOB) == "slurm-7"
        assert jobs.epilog({"SLURM_JOB_ID": "7"})
    assert [created.reservation for created in controller.created] == ["train", "", "", "", "", ""]


def test_a_jobs_slurm_account_makes_its_partition_on_the_vipu_account_the_map_names(world):
    jobs, controller, slurm, _ = world
    jobs.config = dataclasses.replace(jobs.config, accounts=AccountMap.parse("physics=ml-a,*=same"))
    for slurm_account in ("physics", "chem", "(null)"):
        slurm.known["7"]["Account"] = slurm_account
        assert jobs.prolog(JOB) == "slurm-7"
        assert jobs.epilog({"SLURM_JOB_ID": "7"})
    assert [created.account for created in controller.created] == ["ml-a", "chem", ""]


def test_a_job_on_a_machine_being_drained_is_told_in_its_comment_once_per_change(world):
    jobs, controller, slurm, _ = world
    assert jobs.prolog(JOB) == "slurm-7"
    slurm.comments.clear()
    jobs.tell_drains()
    assert slurm.comments == {}  # nothing drains: nothing said
    controller.notices["slurm-7"] = ["agent ag1 is draining for cable repair (by admin since ...): it is left to finish there"]
    jobs.tell_drains()
    assert slurm.comments == {"7": "vipu: partition slurm-7: agent ag1 is draining for cable repair (by admin since ...): it is "
                                   "left to finish there"}
    slurm.comments.clear()
    jobs.tell_drains()
    assert slurm.comments == {}  # said once
    controller.notices.clear()
    jobs.tell_drains()
    assert slurm.comments == {"7": "vipu: partition slurm-7"}  # the drain ended: its partition again


def test_a_job_without_ipus_is_left_alone(world):
    jobs, controller, slurm, _ = world
    assert jobs.prolog({"SLURM_JOB_ID": "7"}) is None
    assert controller.partitions == {} and slurm.comments == {}


def test_no_room_or_no_controller_requeues_with_a_reason_and_leaves_nothing(world):
    jobs, controller, slurm, ipuof = world
    for error in (Conflict("no room for a partition of 4 IPUs"), Unavailable("vipu-server at ctl:8090: unreachable")):
        controller.refuse["CreatePartition"] = [error]
        with pytest.raises(JobFailed) as failed:
            jobs.prolog(JOB)
        assert not failed.value.permanent
        assert slurm.comments["7"] == f"vipu: no partition of 4 IPUs yet, job requeued: {error.message}"
    controller.refuse["ListPartitions"] = [Unavailable("vipu-server at ctl:8090: unreachable (connection refused)")]
    with pytest.raises(JobFailed):
        jobs.prolog(JOB)
    assert "unreachable" in slurm.comments["7"]
    assert slurm.cancelled == [] and controller.partitions == {} and not ipuof.exists()


def test_a_job_whose_ipus_are_scattered_waits_in_the_queue_saying_why_then_is_requeued_with_the_last_reason(world):
    jobs, controller, slurm, _ = world
    jobs.config = dataclasses.replace(jobs.config, queue_timeout=1)
    why = "first in the queue, ag1 held for it; no free 4-IPU run in allocation a1: 3 of 8 IPUs are free; it fits when p2 is removed"
    controller.queued = [pb.QueuedRequest(partition_id="slurm-7", position=1, reason=why)] * 2
    controller.refuse["WaitPartition"] = [None, NoRoom(f"no room for partition slurm-7 after waiting 1 s: {why}")]
    with pytest.raises(JobFailed) as failed:
        jobs.prolog(JOB)
    assert controller.waits == [1] and not failed.value.permanent
    assert slurm.said == [f"vipu: waiting for its IPUs: {why}",
                          f"vipu: no partition of 4 IPUs yet, job requeued: no room for partition slurm-7 after waiting 1 s: {why}"]


def test_a_request_the_controller_can_never_satisfy_cancels_the_job(world):
    jobs, controller, slurm, _ = world
    controller.refuse["CreatePartition"] = [InvalidArgument("3 replicas do not divide evenly into 2 GCD(s)")]
    with pytest.raises(JobFailed, match="cannot create partition slurm-7 of 4 IPUs in 2 GCD"):
        jobs.prolog(JOB)
    assert slurm.cancelled == ["7"] and "3 replicas" in slurm.comments["7"]
    controller.refuse["CreatePartition"] = [HardwareFailure("agent ag2: IPU 1 failed to apply")]
    with pytest.raises(JobFailed):  # the same IPUs would fail it again: Slurm is told why rather than requeueing forever
        jobs.prolog(JOB)
    assert slurm.cancelled == ["7", "7"] and "IPU 1 failed to apply" in slurm.comments["7"]
    with pytest.raises(JobFailed, match="more than MaxIpusPerJob"):
        jobs.prolog({**JOB, "SPANK_VIPU_IPUS": "32"})


def test_a_partition_left_by_an_earlier_attempt_is_replaced(world):
    jobs, controller, _, _ = world
    controller.partitions["slurm-7"] = pb.PartitionRequirements(id="slurm-7", size=1, num_gcds=1)
    jobs.prolog(JOB)
    assert controller.partitions["slurm-7"].size == 4


def test_the_prolog_removes_partitions_and_cancels_requests_of_jobs_that_are_over(world):
    jobs, controller, slurm, _ = world
    for job_id in ("3", "4", "5"):
        controller.partitions[f"slurm-{job_id}"] = pb.PartitionRequirements(id=f"slurm-{job_id}", size=1, num_gcds=1)
    controller.partitions["mine"] = pb.PartitionRequirements(id="mine", size=1, num_gcds=1)
    controller.waiting = {"slurm-6", "slurm-8"}  # job 6's epilog never ran; job 8's prolog waits
    slurm.known.update({"4": {"JobState": "RUNNING"}, "5": {"JobState": "CANCELLED"}, "6": {"JobState": "CANCELLED"},
                        "8": {"JobState": "CONFIGURING"}})  # Slurm forgot job 3
    jobs.prolog(JOB)
    assert sorted(controller.partitions) == ["mine", "slurm-4", "slurm-7"]
    assert controller.waiting == {"slurm-8"}


def test_files_that_cannot_be_written_undo_the_partition(world, tmp_path):
    jobs, controller, _, ipuof = world
    ipuof.write_text("not a directory")
    with pytest.raises(JobFailed, match="cannot write the IPUoF files of slurm-7"):
        jobs.prolog(JOB)
    assert controller.partitions == {}
