"""Partition operations share an agent; a reconciliation takes it alone only when it is free, and
an operation waits for a reconciliation only until its deadline."""

from __future__ import annotations

import threading

import pytest

from vipu.controller.services.hardware import AgentLocks
from vipu.model.errors import Unavailable

DEADLINE = 5.0


def holder(locks: AgentLocks, agents, release: threading.Event, timeout: float = DEADLINE):
    """A thread sharing `agents` until `release`; its `held` event is set once it holds them,
    and `refused` holds the Unavailable it got instead."""
    held, refused = threading.Event(), []

    def run():
        try:
            with locks.hold(agents, timeout=timeout):
                held.set()
                release.wait(DEADLINE)
        except Unavailable as error:
            refused.append(error)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, held, refused


def test_operations_on_different_partitions_of_one_agent_run_together():
    locks, release = AgentLocks(), threading.Event()
    _, first, _ = holder(locks, ["ag1", "ag2"], release)
    _, second, _ = holder(locks, ["ag2"], release)
    assert first.wait(DEADLINE) and second.wait(DEADLINE)
    release.set()


def test_a_reconciliation_never_waits_for_an_operation():
    locks, release = AgentLocks(), threading.Event()
    operation, operating, _ = holder(locks, ["ag1"], release)
    assert operating.wait(DEADLINE)
    with locks.hold_alone("ag1") as taken:
        assert not taken  # skipped: an operation holds ag1
    with locks.hold_alone("ag2") as taken:
        assert taken
    release.set()
    operation.join(DEADLINE)
    with locks.hold_alone("ag1") as taken:
        assert taken


def test_an_operation_waits_for_a_reconciliation_and_then_goes_on():
    locks, release = AgentLocks(), threading.Event()
    with locks.hold_alone("ag1") as taken:
        assert taken
        _, operating, _ = holder(locks, ["ag1", "ag2"], release)
        assert not operating.wait(0.2)  # the reconciliation has ag1 alone
        with locks.hold_alone("ag1") as again:
            assert not again  # and nobody else takes it alone meanwhile
    assert operating.wait(DEADLINE)
    release.set()


def test_an_operation_gives_up_at_its_deadline_saying_which_agent():
    locks, release = AgentLocks(), threading.Event()
    with locks.hold_alone("ag2") as taken:
        assert taken
        thread, operating, refused = holder(locks, ["ag1", "ag2"], release, timeout=0.2)
        thread.join(DEADLINE)
    assert not operating.is_set()
    assert [e.message for e in refused] == ["agent ag2 is being reconciled and did not come free within 0.2 s; try again"]
    with locks.hold_alone("ag1") as taken:
        assert taken  # what it had taken before giving up is released
    release.set()


def test_the_hold_alone_is_released_even_when_the_reconciliation_fails():
    locks = AgentLocks()
    with pytest.raises(RuntimeError), locks.hold_alone("ag1"):
        raise RuntimeError("boom")
    with locks.hold_alone("ag1") as taken:
        assert taken
