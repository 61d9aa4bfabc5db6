"""Idle-time tests (issue 32 item 5): an owner lends its free machines to the IPU-Link and Traffic
tests, and a partition that needs one takes them back at once, the test stopping with the results
of the tests it finished kept. Over test_services' in-memory pod of 8 simulated machines, whose
test steps can be held (`StepGate`) and, like an agent that aborts its step, end when cancelled."""

from __future__ import annotations

import logging
from concurrent.futures import ThreadPoolExecutor

import pytest

from vipu import failpoints
from vipu.backends.sim.rack import save_rack
from vipu.controller.core.commands import ClaimMachines, LendMachines, ReturnMachines
from vipu.controller.core.lending import STEP_OFF_SECONDS
from vipu.model import clustertests as ct
from vipu.model.clustertests import CableVerdict, RunState, Status
from vipu.model.entities import PartitionRequest
from vipu.model.errors import Conflict
from vipu.model.topology import LinkKind

SECONDS = 30.0
EVERY_MACHINE = tuple(f"ag{n}" for n in range(1, 9))


@pytest.fixture
def pod(pod):
    """test_services' pod, its test steps without their simulated durations."""
    pod.rack.time_scale = 0
    save_rack(pod.rack, pod.rack_path)
    return pod


@pytest.fixture
def pool(pod):
    """Threads for what runs meanwhile; what a test left held is let go before they are joined."""
    threads = ThreadPoolExecutor(4)
    yield threads
    failpoints.disarm()
    pod.gateway.step_may_go.set()
    threads.shutdown(wait=True)


def lend(pod, seconds: float = 60.0):
    command = pod.owners.owner("a1").submit(LendMachines(test="idle-time test of cluster cl0", seconds=seconds))
    return command.reply.wait(SECONDS, "the lending")


def published(pod, condition) -> None:
    """Until the allocation's published snapshot meets `condition` (at most SECONDS)."""
    owner = pod.owners.owner("a1")
    with pod.owners.changed:
        assert pod.owners.changed.wait_for(lambda: condition(owner.snapshot), timeout=SECONDS)


def test_an_owner_lends_only_its_free_machines_and_a_partition_there_takes_them_back_at_once(pod):
    pod.partitions.create(PartitionRequest("p1", 8))  # ag1, ag2
    pod.gateway.unreachable.add(pod.address("ag8"))
    pod.health.check_all(seconds=SECONDS)  # ag8 is down
    loan = lend(pod)
    assert loan.machines == ("ag3", "ag4", "ag5", "ag6", "ag7") == pod.owners.owner("a1").snapshot.lent
    assert lend(pod) is None  # one loan at a time

    created = pod.partitions.create(PartitionRequest("p2", 4))  # placement does not see the loan
    assert created.agent_ids == ["ag3"] and pod.held("ag3") == {"p2"}
    assert loan.why == "the create of partition p2 took ag3" and pod.owners.owner("a1").snapshot.lent == ()
    again = lend(pod)
    assert again.machines == ("ag4", "ag5", "ag6", "ag7")
    pod.owners.owner("a1").submit(ReturnMachines(loan=loan)).reply.wait(SECONDS, "the late return")  # of the loan taken back
    assert pod.owners.owner("a1").snapshot.lent == again.machines  # gives nothing back: the loan out now is another
    pod.owners.owner("a1").submit(ReturnMachines(loan=again)).reply.wait(SECONDS, "the return")

    assert lend(pod).machines == ("ag4", "ag5", "ag6", "ag7")  # the last loan was returned
    for partition_id in ("p1", "p2"):
        pod.partitions.remove(partition_id)
    pod.gateway.unreachable.clear()
    pod.health.check_all(seconds=SECONDS)
    pod.owners.owner("a1").submit(ClaimMachines(test="cluster cl0")).reply.wait(SECONDS, "the claim")
    assert pod.owners.owner("a1").snapshot.lent == ()  # a disruptive test takes every machine, the lent ones too
    assert lend(pod) is None  # and nothing is lent while it holds them


def test_a_waiting_request_started_on_lent_machines_takes_them_back(pod):
    pod.partitions.create(PartitionRequest("big", 16))
    small = pod.partitions.create(PartitionRequest("small", 4))
    loan = lend(pod)
    assert len(loan.machines) == 3 and small.agent_ids[0] not in loan.machines
    assert pod.requests.create(PartitionRequest("q", 16), wait_seconds=SECONDS).position == 1  # no four machines are free
    assert loan.why == ""
    pod.partitions.remove("small")  # the queue's pass starts q on the lent machines and small's
    published(pod, lambda snapshot: "q" in snapshot.partitions)
    assert set(pod.owners.owner("a1").snapshot.partitions["q"].agent_ids) == {*loan.machines, *small.agent_ids}
    assert loan.why == f"the create of partition q took {', '.join(loan.machines)}"


def test_a_lease_not_returned_in_time_is_taken_back_by_the_owner(pod):
    loan = lend(pod, seconds=0.2)
    published(pod, lambda snapshot: snapshot.lent == ())
    assert loan.why == "its loan of 0.2 s ran out"


def hold(pod, where: str, first: failpoints.Failpoint) -> None:
    """Hold the idle-time run just started at `where`: paused (`first`, armed before it started)
    before a test starts, or in a test's step at the machines, which then runs until cancelled."""
    assert first.reached.wait(SECONDS)  # the loan is out and the run saved: its first test is about to start
    if where == "before IPU-Link":
        return
    if where == "in IPU-Link":
        pod.gateway.step_may_go.clear()
        failpoints.disarm("clustertest.step")
        assert pod.gateway.diagnosing.wait(SECONDS)
        return
    second = failpoints.arm("clustertest.step", "pause")  # the next test's start pauses there
    first.released.set()
    assert second.reached.wait(SECONDS)
    if where == "in Traffic":
        pod.gateway.step_may_go.clear()
        pod.gateway.diagnosing.clear()
        failpoints.disarm("clustertest.step")
        assert pod.gateway.diagnosing.wait(SECONDS)


@pytest.mark.parametrize("where", ["before IPU-Link", "in IPU-Link", "before Traffic", "in Traffic"])
def test_a_create_at_any_step_of_an_idle_test_gets_its_machines_and_the_test_keeps_what_it_finished(pod, pool, caplog, where):
    told = []
    record_test = pod.services.links.record_test
    pod.services.links.record_test = lambda test, results: told.append((test, list(results))) or record_test(test, results)
    first = failpoints.arm("clustertest.step", "pause")
    running = pool.submit(pod.clustertests.test_idle, "a1")
    hold(pod, where, first)
    with pytest.raises(Conflict, match=r"^No results available\. An idle-time test of ag1, ag2, ag3, ag4, ag5, ag6, ag7, ag8 "
                                       r"\(free machines of allocation a1, which a partition takes back at once\) in cluster cl0"):
        pod.clustertests.status()

    created = pod.partitions.create(PartitionRequest("p1", 4))  # while the test is held where it is
    assert created.agent_ids == ["ag1"] and pod.held("ag1") == {"p1"}
    assert "did not stop within" not in caplog.text  # a cancelled step ends at once: the create did not wait for it
    failpoints.disarm()
    pod.gateway.step_may_go.set()

    run = running.result(timeout=SECONDS)
    assert run.state is RunState.STEPPED_ASIDE and pod.clustertests.status().state is RunState.STEPPED_ASIDE
    stopped = ct.TestType.IPULINK if where.endswith("IPU-Link") else ct.TestType.TRAFFIC
    kept = [o for o in run.outcomes if o.status is not Status.STOPPED]
    assert [(o.test, o.status, o.summary) for o in run.outcomes[len(kept):]] == [
        (stopped, Status.STOPPED, ["Test stopped", "Stepped aside: the create of partition p1 took ag1"])]
    verdicts = {r.cable.key: r.verdict for r in pod.clustertests.cabling("cl0")[1] if r.cable.kind is LinkKind.IPULINK}
    assert told and {test for test, _ in told} == {"idle-time"}
    ledger = {r.cable.key: r.verdict for r in told[-1][1] if r.cable.kind is LinkKind.IPULINK}
    if stopped is ct.TestType.IPULINK:
        assert kept == [] and set(verdicts.values()) == set(ledger.values()) == {CableVerdict.UNTESTED}
    else:
        assert [(o.test, o.status, o.passed, o.total, o.summary, o.machines) for o in kept] == [
            (ct.TestType.IPULINK, Status.PASSED, 156, 156, ["All Links Passed", f"Idle-time test of {', '.join(EVERY_MACHINE)}"],
             EVERY_MACHINE)]
        assert set(verdicts.values()) == set(ledger.values()) == {CableVerdict.PASSED}


def test_an_idle_test_judges_only_the_free_machines_and_the_cables_between_them(pod):
    for name, size in (("p1", 8), ("p2", 8), ("p3", 4)):
        pod.partitions.create(PartitionRequest(name, size))
    snapshot = pod.owners.owner("a1").snapshot
    free = tuple(a for a in EVERY_MACHINE if a not in snapshot.used)
    assert len(free) == 3  # no traffic window of four machines fits: the Traffic test has nothing to test

    run = pod.clustertests.test_idle("a1")
    between = {c.key for c in snapshot.layout.ipulink_cables(free)}
    assert run.state is RunState.FINISHED and [(o.test, o.status, o.total, o.machines) for o in run.outcomes] == [
        (ct.TestType.IPULINK, Status.PASSED, len(between) + 3 * 16, free)]
    verdicts = {r.cable.key: r.verdict for r in pod.clustertests.cabling("cl0")[1] if r.cable.kind is LinkKind.IPULINK}
    assert between and {key for key, verdict in verdicts.items() if verdict is CableVerdict.PASSED} == between
    assert pod.owners.owner("a1").snapshot.lent == ()  # given back


def test_a_partitions_calls_to_a_lent_machine_wait_for_the_test_step_there_to_stop(pod, pool, monkeypatch):
    monkeypatch.setattr("vipu.controller.core.turns.STEP_OFF_SECONDS", SECONDS)  # the order below is the step's, not the deadline's
    gateway, order = pod.gateway, []
    diagnose, apply = gateway.diagnose, gateway.apply

    def stepping(host, port, *args):
        try:
            return diagnose(host, port, *args)
        finally:
            order.append(("step ended", port))

    def applying(host, port, settings):
        order.append(("applied", port))
        apply(host, port, settings)

    gateway.diagnose, gateway.apply = stepping, applying
    gateway.step_may_go.cancellable = False  # its steps end only when let go, as an agent that cannot abort them
    gateway.step_may_go.clear()
    running = pool.submit(pod.clustertests.test_idle, "a1")
    assert gateway.diagnosing.wait(SECONDS)
    creating = pool.submit(pod.partitions.create, PartitionRequest("p1", 4))
    published(pod, lambda snapshot: "p1" in snapshot.partitions and snapshot.lent == ())  # the loan is taken back
    assert pod.held("ag1") == set()  # its settings wait for the step on ag1
    gateway.step_may_go.set()
    assert creating.result(timeout=SECONDS).agent_ids == ["ag1"]
    port = pod.address("ag1")[1]
    assert order.index(("step ended", port)) < order.index(("applied", port))
    assert running.result(timeout=SECONDS).state is RunState.STEPPED_ASIDE


def test_a_step_that_does_not_stop_holds_a_partition_back_no_longer_than_the_deadline(pod, pool, caplog):
    pod.gateway.step_may_go.cancellable = False
    pod.gateway.step_may_go.clear()
    running = pool.submit(pod.clustertests.test_idle, "a1")
    assert pod.gateway.diagnosing.wait(SECONDS)
    with caplog.at_level(logging.WARNING, logger="vipu.controller.core"):
        assert pod.partitions.create(PartitionRequest("p1", 4)).agent_ids == ["ag1"]  # the step still runs
    assert pod.held("ag1") == {"p1"}
    assert (f"allocation a1: the idle-time test of cluster cl0's step on ag1 did not stop within {STEP_OFF_SECONDS:g} s; "
            "the calls there go ahead") in caplog.text
    pod.gateway.step_may_go.set()
    assert running.result(timeout=SECONDS).state is RunState.STEPPED_ASIDE


def test_an_operators_test_or_the_removal_of_the_cluster_makes_an_idle_test_step_aside(pod, pool):
    pod.gateway.step_may_go.clear()
    running = pool.submit(pod.clustertests.test_idle, "a1")
    assert pod.gateway.diagnosing.wait(SECONDS)
    assert pod.clustertests.start("cl0", {ct.TestType.VERSION}, wait=True).state is RunState.FINISHED
    assert running.result(timeout=SECONDS).outcomes[-1].summary == ["Test stopped", "Stepped aside: a test of cluster cl0 was started"]

    pod.gateway.diagnosing.clear()
    running = pool.submit(pod.clustertests.test_idle, "a1")
    assert pod.gateway.diagnosing.wait(SECONDS)
    with pytest.raises(Conflict, match="has 1 allocation"):
        pod.clusters.remove("cl0")
    assert not running.done()  # a refused remove leaves the idle-time run alone
    assert pod.clusters.remove("cl0", force=True) == ["allocation a1"]
    assert running.result(timeout=SECONDS).outcomes[-1].summary == ["Test stopped", "Stepped aside: cluster cl0 is being removed"]
    pod.gateway.step_may_go.set()
