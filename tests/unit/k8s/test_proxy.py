"""The proxy never loses a partition: a create that reached the controller and failed is cleaned
up, and tracked until it is (the controller and the tracker ConfigMap as test doubles here; the
real ones in tests/functional/test_kubernetes.py)."""

from __future__ import annotations

import pytest

from vipu.api.protos import vipuuser_pb2 as pb
from vipu.client.retry import Verdict, http_status, verdict_of_http
from vipu.k8s.controllers import Controller
from vipu.k8s.proxy import QUEUE_SECONDS, JobRequest, PartitionRequest, Partitions
from vipu.model.accounts import AccountMap
from vipu.model.errors import Conflict, HardwareFailure, NoRoom, NotFound, Unavailable, VipuError

CONTROLLER = Controller("ctl", 8090)


class Tracker:
    def __init__(self):
        self.tracked = {}

    def entries(self):
        return dict(self.tracked)

    def get(self, partition_id):
        return self.tracked.get(partition_id)

    def put(self, partition_id, entry):
        self.tracked[partition_id] = entry

    def drop(self, partition_id):
        self.tracked.pop(partition_id, None)


class User:
    """A controller whose create fails as told, leaving the partition behind (in ERROR) if told to."""

    def __init__(self, create_fails_with: VipuError, leaves_partition: bool, removal_fails_with: VipuError | None = None):
        self.create_fails_with, self.leaves_partition, self.removal_fails_with = create_fails_with, leaves_partition, removal_fails_with
        self.partitions: set[str] = set()

    def create_or_queue(self, partition_id, size, **_):
        if self.leaves_partition:
            self.partitions.add(partition_id)
        raise self.create_fails_with

    def remove_partition(self, partition_id, force=False):
        if self.removal_fails_with is not None:
            raise self.removal_fails_with
        if partition_id not in self.partitions:
            raise NotFound(f"partition {partition_id} does not exist")
        self.partitions.remove(partition_id)


def proxy(user: User) -> tuple[Partitions, Tracker]:
    tracker = Tracker()
    return Partitions(lambda: [CONTROLLER], lambda _: user, tracker), tracker  # type: ignore[arg-type]


REQUEST = PartitionRequest(id="p-default-job", namespace="default", job="job", uid="u1", size=4)


def test_a_create_failed_by_the_hardware_leaves_no_partition_and_the_job_is_told_why_for_good():
    user = User(HardwareFailure("agent ag1: IPU 2 failed to apply"), leaves_partition=True)
    partitions, tracker = proxy(user)
    with pytest.raises(HardwareFailure) as failed:
        partitions.create(REQUEST)
    assert user.partitions == set() and tracker.tracked == {}
    assert http_status(failed.value) == 422 and verdict_of_http(422) is Verdict.NEVER  # the launcher gives up, with the reason


def test_a_partition_that_cannot_be_removed_yet_stays_tracked_for_the_finaliser():
    user = User(Unavailable("vipu-server at ctl:8090: no answer before the deadline"), leaves_partition=True,
                removal_fails_with=Unavailable("vipu-server at ctl:8090: unreachable (connection refused)"))
    partitions, tracker = proxy(user)
    with pytest.raises(Unavailable):
        partitions.create(REQUEST)
    assert "p-default-job" in tracker.tracked and user.partitions == {"p-default-job"}
    user.removal_fails_with = None  # the controller is back: the job's deletion releases the IPUs
    assert partitions.remove("p-default-job") == {"id": "p-default-job", "removed": True}
    assert user.partitions == set() and tracker.tracked == {}


def test_a_create_whose_answer_was_lost_stays_tracked_though_nothing_is_there_yet():
    """The create may still be queued at the controller: only the job's next try or its deletion settles it."""
    user = User(Unavailable("vipu-server at ctl:8090: no answer before the deadline"), leaves_partition=False)
    partitions, tracker = proxy(user)
    with pytest.raises(Unavailable):
        partitions.create(REQUEST)
    assert "p-default-job" in tracker.tracked
    assert partitions.remove("p-default-job") == {"id": "p-default-job", "removed": True}  # the job's deletion
    assert tracker.tracked == {}


def test_a_refusal_made_before_anything_was_created_is_simply_forgotten():
    user = User(Conflict("no room for a partition of 4 IPUs"), leaves_partition=False,
                removal_fails_with=AssertionError("no removal is needed"))  # type: ignore[arg-type]
    partitions, tracker = proxy(user)
    with pytest.raises(Conflict) as refused:
        partitions.create(REQUEST)
    assert tracker.tracked == {} and http_status(refused.value) == 409 and verdict_of_http(409) is Verdict.LATER


class QueueingUser:
    """A controller with no room: requests wait until `grant`, as its queue would make them."""

    def __init__(self):
        self.waiting: dict[str, int] = {}  # partition id -> its size
        self.made: set[str] = set()
        self.asked: list[dict] = []
        self.ended: dict[str, VipuError] = {}

    def capacity(self, size=0, **_):
        return pb.GetCapacityReply(allocations=[pb.AllocationCapacity(total_ipus=8, used_ipus=8, fitting=0)])

    def list_queued(self):
        return [pb.QueuedRequest(partition_id=p, size=n) for p, n in self.waiting.items()]

    def create_or_queue(self, partition_id, size, **options):
        self.asked.append({"id": partition_id, **options})
        self.waiting[partition_id] = size
        return pb.CreatePartitionReply(partition_id=partition_id, queued=self._queued(partition_id))

    def wait_once(self, partition_id, seconds):
        if partition_id in self.ended:
            raise self.ended.pop(partition_id)
        if partition_id in self.waiting:
            return pb.WaitPartitionReply(queued=self._queued(partition_id))
        if partition_id in self.made:
            return pb.WaitPartitionReply(status=pb.PartitionStatus(partition_id=partition_id, ready_state=pb.PS_ACTIVE))
        raise NotFound(f"partition {partition_id} does not exist and no request of it waits")

    def reset_partition(self, partition_id, relocate=False):
        raise AssertionError("a partition just started is not reset")

    def list_reservations(self):
        return [pb.Reservation(name="train")]

    def grant(self, partition_id):
        del self.waiting[partition_id]
        self.made.add(partition_id)

    def _queued(self, partition_id):
        return pb.QueuedRequest(partition_id=partition_id, position=list(self.waiting).index(partition_id) + 1,
                                reason="first in the queue, ag1-ag2 held for it; it fits when p7 is removed")


def test_a_job_with_no_room_anywhere_waits_in_a_controllers_queue_and_starts_there_when_granted():
    user = QueueingUser()
    partitions, tracker = proxy(user)  # type: ignore[arg-type]
    job = JobRequest(namespace="default", job="job", uid="u1", size=8, id="p-default-job", replicas=8, expected_seconds=3600)
    for _ in range(2):  # the operator asks again at each resync: the request keeps its place
        with pytest.raises(Conflict, match=r"^waiting in the queue of V-IPU controller ctl:8090 \(number 1\): first in the queue"):
            partitions.choose(job)
    assert user.asked == [{"id": "p-default-job", "cluster_id": "", "num_replicas": 8, "num_gcds": 1, "wait_seconds": QUEUE_SECONDS,
                           "detached": True, "expected_seconds": 3600, "reservation": "", "account": "",
                           "labels": {"ipujob": "job", "namespace": "default"}}]  # no waiter's lease: the proxy
    # withdraws it when its job goes
    assert list(tracker.tracked) == ["p-default-job"]
    user.grant("p-default-job")
    assert partitions.choose(job) == CONTROLLER.describe()  # its pods go there now
    launcher = PartitionRequest(**job.model_dump(), controller="ctl:8090", wait=20, resume=True)
    assert partitions.create(launcher) == (201, {"id": "p-default-job", "created": True, "controller": "ctl:8090"})


def test_a_launcher_whose_request_waits_is_told_202_with_its_place_and_a_request_that_ended_is_made_again():
    user = QueueingUser()
    partitions, tracker = proxy(user)  # type: ignore[arg-type]
    status, answer = partitions.create(PartitionRequest(**{**REQUEST.model_dump(), "wait": 20}))
    assert (status, answer["waiting"], answer["position"]) == (202, True, 1)
    user.ended["p-default-job"] = NoRoom("no room for partition p-default-job after waiting 86400 s: ...")
    user.waiting.clear()
    assert partitions.create(PartitionRequest(**{**REQUEST.model_dump(), "resume": True}))[0] == 202  # asked for again
    assert len(user.asked) == 2 and "p-default-job" in tracker.tracked


def test_a_job_in_a_reservation_goes_to_the_controller_that_has_it_and_its_create_names_it():
    user = QueueingUser()  # no room anywhere: a job in a reservation goes there all the same, and waits in it
    partitions, _ = proxy(user)  # type: ignore[arg-type]
    job = JobRequest(namespace="default", job="job", uid="u1", size=8, id="p-default-job", replicas=8, reservation="train")
    assert partitions.choose(job) == CONTROLLER.describe() and user.asked == []  # its launcher makes it
    with pytest.raises(NotFound, match="no V-IPU controller has reservation gone"):
        partitions.choose(job.model_copy(update={"reservation": "gone"}))
    class Unanswering(QueueingUser):
        def list_reservations(self):
            raise Unavailable("unreachable")

    with pytest.raises(Unavailable, match="no V-IPU controller that answered has reservation train, and some did not answer "
                                          r"\(ctl:8090: unreachable\)"):  # not a NotFound, which would fail the job for good
        proxy(Unanswering())[0].choose(job)  # type: ignore[arg-type]
    status, _ = partitions.create(PartitionRequest(**job.model_dump(), controller="ctl:8090", wait=0))
    assert status == 202 and user.asked[0]["reservation"] == "train"


def test_a_tracked_partitions_drains_are_read_from_its_controller_and_an_untracked_ones_are_not_found():
    notice = "ag2 drained by ops: cable repair; this partition is left to finish"

    class Draining(QueueingUser):
        def partition_status(self, partition_id):
            assert partition_id in self.made
            return pb.PartitionStatus(partition_id=partition_id, drain_notices=[notice])

    user = Draining()
    partitions, _ = proxy(user)  # type: ignore[arg-type]
    with pytest.raises(NotFound, match="partition p-default-job is not one the proxy made"):
        partitions.drains("p-default-job")
    partitions.create(REQUEST)
    user.grant("p-default-job")
    assert partitions.drains("p-default-job") == {"id": "p-default-job", "controller": "ctl:8090", "drains": [notice]}
    assert partitions.drains("p-default-job", "u1")["drains"] == [notice]
    with pytest.raises(NotFound, match="partition p-default-job is job default/job's of uid u1, not of uid u2"):
        partitions.drains("p-default-job", "u2")  # a job of the same name made again


def test_a_jobs_namespace_maps_onto_the_vipu_account_its_partition_is_made_on():
    user = QueueingUser()
    tracker = Tracker()
    partitions = Partitions(lambda: [CONTROLLER], lambda _: user, tracker, accounts=AccountMap.parse("team-a=ml-a,*=same"))  # type: ignore[arg-type]
    for namespace in ("team-a", "team-b"):
        request = PartitionRequest(**{**REQUEST.model_dump(), "namespace": namespace, "id": f"p-{namespace}", "wait": 20})
        assert partitions.create(request)[0] == 202
    assert [asked["account"] for asked in user.asked] == ["ml-a", "team-b"]
