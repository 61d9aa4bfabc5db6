"""Partition operations share an agent; a reconciliation has it alone and is not starved."""

from __future__ import annotations

import threading

from vipu.controller.services.hardware import AgentLocks

DEADLINE = 5.0


def holder(locks: AgentLocks, agents, release: threading.Event, alone: bool = False):
    """A thread holding `agents` until `release`; its `held` event is set once it holds them."""
    held = threading.Event()

    def run():
        with locks.hold_alone(agents[0]) if alone else locks.hold(agents):
            held.set()
            release.wait(DEADLINE)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, held


def test_operations_on_different_partitions_of_one_agent_run_together():
    locks, release = AgentLocks(), threading.Event()
    _, first = holder(locks, ["ag1", "ag2"], release)
    _, second = holder(locks, ["ag2"], release)
    assert first.wait(DEADLINE) and second.wait(DEADLINE)
    release.set()


def test_a_reconciliation_waits_for_the_operations_and_holds_the_agent_alone():
    locks, release_operation, release_reconciliation = AgentLocks(), threading.Event(), threading.Event()
    operation, operating = holder(locks, ["ag1"], release_operation)
    assert operating.wait(DEADLINE)
    _, reconciling = holder(locks, ["ag1"], release_reconciliation, alone=True)
    assert not reconciling.wait(0.2)  # an operation holds ag1
    # A new operation queues behind the waiting reconciliation rather than starving it.
    _, late = holder(locks, ["ag1"], release_operation)
    assert not late.wait(0.2)
    release_operation.set()
    operation.join(DEADLINE)
    assert reconciling.wait(DEADLINE)
    assert not late.wait(0.2)  # the reconciliation has ag1 alone
    release_reconciliation.set()
    assert late.wait(DEADLINE)


def test_other_agents_are_not_held_by_a_reconciliation():
    locks, release = AgentLocks(), threading.Event()
    _, reconciling = holder(locks, ["ag1"], release, alone=True)
    assert reconciling.wait(DEADLINE)
    _, elsewhere = holder(locks, ["ag2"], release)
    assert elsewhere.wait(DEADLINE)
    release.set()
