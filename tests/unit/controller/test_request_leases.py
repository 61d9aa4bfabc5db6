"""A waiting request lives while its waiter asks after it (test_services' pod): one nobody has asked
after for the queue's lease is withdrawn and never becomes a partition; one asked after keeps its
place; one made to be picked up later (detached) has no lease, and says so in the store."""

from __future__ import annotations

import time

import pytest

from tests.unit.controller.test_services import Pod
from vipu.controller.usecases.requests import Waiting
from vipu.controller.wiring import ControllerServices
from vipu.model.entities import PartitionRequest
from vipu.model.errors import Conflict
from vipu.model.waiting import QueueLimits

LEASE = 0.5


@pytest.fixture
def leased(tmp_path):
    """test_services' pod, whose queue's lease is LEASE seconds, its allocation full."""
    pod = Pod(tmp_path)
    pod.services.stop("replaced by one with a short lease")
    pod.services = ControllerServices(pod.store, pod.gateway, workers=8, limits=QueueLimits(lease_seconds=LEASE))
    pod.services.owners.load()
    pod.partitions, pod.requests = pod.services.partitions, pod.services.requests
    pod.partitions.create(PartitionRequest("full", 32))
    yield pod
    pod.close()


def stored(pod):
    with pod.store.reading() as tx:
        return tx.list_requests()


def waiting(pod) -> list[str]:
    return [w.request.partition_id for w in pod.requests.list()]


def test_a_request_nobody_asks_after_is_withdrawn_and_one_asked_after_or_detached_keeps_its_place(leased):
    for name, detached in (("left", False), ("kept", False), ("later", True)):
        assert isinstance(leased.requests.create(PartitionRequest(name, 4), wait_seconds=600, detached=detached), Waiting)
    assert {r.partition_id: r.detached for r in stored(leased)} == {"left": False, "kept": False, "later": True}
    deadline = time.monotonic() + 20 * LEASE
    while "left" in waiting(leased):  # its waiter is gone; kept's asks every fifth of a lease
        assert time.monotonic() < deadline, "the request nobody asked after was not withdrawn"
        leased.requests.wait("kept", 0)
        time.sleep(LEASE / 5)
    assert waiting(leased) == ["kept", "later"]
    with pytest.raises(Conflict, match=r"^the request of partition left was withdrawn: nobody asked after it for 0.5 s, "
                                       r"so its waiter is gone$"):
        leased.requests.wait("left", 0)
    leased.requests.remove("full")
    deadline = time.monotonic() + 10
    while waiting(leased):
        assert time.monotonic() < deadline, "the requests left did not start"
        time.sleep(0.05)
    assert sorted(p.id for p in leased.partitions.list()) == ["kept", "later"]
