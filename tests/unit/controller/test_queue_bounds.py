"""How many requests may wait, and what a pass over a long queue costs (test_services' pod).

The queue is bounded per user of secure mode and in all, and a request past either bound is
refused in one line naming the limit and the option that sets it. A pass over the queue asks
placement once per shape of request waiting, not once per request, so that ten thousand waiting
cost a pass what three do (`bench.enqueue` measures what an enqueue costs with ten thousand
waiting against none).
"""

from __future__ import annotations

import pytest

from tests.unit.controller.test_services import Pod
from vipu.controller.core import queueing
from vipu.controller.usecases.requests import Waiting
from vipu.controller.wiring import ControllerServices
from vipu.model.entities import OPEN_ACCESS, Access, PartitionRequest
from vipu.model.errors import Conflict
from vipu.model.waiting import QueueLimits

ALICE = Access("alice", frozenset({"a1"}))
BOB = Access("bob", frozenset({"a1"}))


@pytest.fixture
def bounded(tmp_path):
    """test_services' pod, whose controller lets 3 requests wait per user and 5 in all."""
    pod = Pod(tmp_path)
    pod.services.stop("replaced by one with smaller bounds")
    pod.services = ControllerServices(pod.store, pod.gateway, workers=8, limits=QueueLimits(per_user=3, total=5))
    pod.services.owners.load()
    pod.partitions, pod.requests = pod.services.partitions, pod.services.requests
    pod.partitions.create(PartitionRequest("full", 32))
    yield pod
    pod.close()


def queue_up(pod, name: str, access: Access = OPEN_ACCESS) -> Waiting:
    waiting = pod.requests.create(PartitionRequest(name, 4), access, wait_seconds=600)
    assert isinstance(waiting, Waiting)
    return waiting


def test_a_users_request_past_their_bound_is_refused_in_one_line_and_others_still_wait(bounded):
    for n in range(3):
        queue_up(bounded, f"a{n}", ALICE)
    with pytest.raises(Conflict, match=r"^user alice has 3 requests waiting, the most one user may \(vipu-server "
                                       r"--max-waiting-per-user\); cancel one, or wait for one to start$"):
        queue_up(bounded, "a3", ALICE)
    queue_up(bounded, "b0", BOB)  # another user's still waits
    bounded.requests.cancel("a0", ALICE)
    queue_up(bounded, "a3", ALICE)  # a place of alice's came free
    assert [w.request.partition_id for w in bounded.requests.list()] == ["a1", "a2", "b0", "a3"]


def test_a_request_past_the_controllers_bound_is_refused_in_one_line(bounded):
    for n in range(5):
        queue_up(bounded, f"r{n}")  # open mode: no user, only the bound of all
    with pytest.raises(Conflict, match=r"^5 requests wait on this controller, the most it takes \(vipu-server --max-waiting\); "
                                       r"try again when some have started$"):
        queue_up(bounded, "r5")
    bounded.requests.cancel("r0")
    queue_up(bounded, "r5")  # a place came free


def test_a_pass_over_thousands_waiting_asks_placement_once_per_shape(pod, monkeypatch):
    pod.partitions.create(PartitionRequest("full", 32))
    sizes = (1, 2, 4)
    for n in range(2_000):
        pod.requests.create(PartitionRequest(f"w{n}", sizes[n % 3]), wait_seconds=600)
    asked: list[int] = []
    real_try, real_place = queueing.try_place, queueing.place_partition
    monkeypatch.setattr(queueing, "try_place", lambda *a, **k: asked.append(a[3]) or real_try(*a, **k))
    monkeypatch.setattr(queueing, "place_partition", lambda *a, **k: asked.append(a[3]) or real_place(*a, **k))
    pod.partitions.remove("full")  # one pass: what starts, what is held, and why the rest still wait
    assert pod.owners.wait_quiet(30)
    snapshot = pod.owners.owner("a1").snapshot
    started = len(snapshot.partitions)
    assert started > 0 and len(snapshot.queue.requests) == 2_000 - started
    # Each request started is placed once, and each shape a few times a pass (the removal's, and
    # the one after the grants): to find that it no longer fits and to explain why it waits. Far
    # fewer than 2,000.
    assert len(asked) <= started + 2 * (1 + 2 * len(sizes)) + 2, (len(asked), started)
    assert all("; " in w.reason for w in pod.requests.list()[:50])


def test_the_101st_waiting_request_of_one_user_is_refused_by_default(pod):
    pod.partitions.create(PartitionRequest("full", 32))
    for n in range(100):
        queue_up(pod, f"a{n}", ALICE)
    with pytest.raises(Conflict, match=r"^user alice has 100 requests waiting, the most one user may \(vipu-server "
                                       r"--max-waiting-per-user\); cancel one, or wait for one to start$"):
        queue_up(pod, "a100", ALICE)
    assert len(pod.requests.list()) == 100
