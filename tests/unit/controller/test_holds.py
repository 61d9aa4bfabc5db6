"""One operation at a time per partition, waits with deadlines, and capacities that refuse."""

from __future__ import annotations

import threading

import pytest

from vipu.controller.services.holds import FINISHING, Capacity, PartitionHolds
from vipu.model.errors import AlreadyExists, Conflict, Unavailable

DEADLINE = 5.0


def test_a_second_operation_on_a_held_partition_is_refused_saying_what_is_under_way():
    holds = PartitionHolds()
    with holds.hold("p1", "creating"):
        with pytest.raises(Conflict, match=r"partition p1 is busy \(creating\)"):
            with holds.hold("p1", "resetting"):
                pass
        with pytest.raises(AlreadyExists), holds.hold("p1", "creating", busy=AlreadyExists("partition p1 already exists")):
            pass
        with holds.hold("p2", "removing"):  # another partition is free
            pass
    with holds.hold("p1", "resetting"):  # and p1 is free again
        pass


def test_a_waiting_operation_goes_on_when_the_holder_is_done():
    holds, holding, order = PartitionHolds(), threading.Event(), []

    def creator():
        with holds.hold("p1", "creating"):
            holding.set()
            threading.Event().wait(0.2)  # the create's work, while the remove waits
            order.append("created")

    thread = threading.Thread(target=creator)
    thread.start()
    assert holding.wait(DEADLINE)
    with holds.hold("p1", "removing", wait=DEADLINE):
        order.append("removing")
    thread.join(DEADLINE)
    assert order == ["created", "removing"]


def test_a_wait_ends_at_its_deadline_as_temporarily_unavailable():
    holds = PartitionHolds()
    with holds.hold("p1", "resetting"):
        with pytest.raises(Unavailable, match=r"partition p1 is still busy \(resetting\) after 0.1 s"):
            with holds.hold("p1", "removing", wait=0.1):
                pass


def test_a_health_pass_takes_only_free_partitions_and_a_user_waits_for_it():
    holds, order = PartitionHolds(), []
    with holds.hold("p1", "creating"), holds.held_if_free("p1", FINISHING) as free:
        assert not free

    def finish():
        with holds.held_if_free("p1", FINISHING) as free:
            assert free
            taken.set()
            threading.Event().wait(0.2)  # the pass's work on the partition
            order.append("finished")

    taken = threading.Event()
    thread = threading.Thread(target=finish)
    thread.start()
    assert taken.wait(DEADLINE)
    with holds.hold("p1", "removing"):  # no wait asked for, yet it waits for the pass
        order.append("removing")
    thread.join(DEADLINE)
    assert order == ["finished", "removing"]


def test_a_full_capacity_refuses_after_its_wait():
    capacity = Capacity("partition operations", 2, wait=0.1)
    with capacity.admitted(), capacity.admitted():
        with pytest.raises(Unavailable, match="has 2 partition operations under way, its limit"), capacity.admitted():
            pass
    with capacity.admitted():  # room again
        pass
