"""The controller's services over real simulated machines, reached in memory instead of over gRPC.

The gateway here is a test double for the services' neighbour only: behind it are real
`SimMachine` backends on a real rack file, so every refusal is the backend's own.
"""

from __future__ import annotations

import dataclasses
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.unit.backends.test_sim_machine import settings
from vipu import failpoints
from vipu.backends.sim import faults
from vipu.backends.sim.machine import RackFile, SimMachine
from vipu.backends.sim.rack import generate_rack, load_rack, save_rack
from vipu.controller.wiring import ControllerServices
from vipu.model import clustertests as ct
from vipu.model.entities import (
    MAX_AUTO_RESETS,
    AgentStatus,
    Cluster,
    IldTopology,
    OperationState,
    PartitionRequest,
    ReadyState,
    SyncType,
)
from vipu.model.errors import (
    AlreadyExists,
    Conflict,
    HardwareFailure,
    InvalidArgument,
    NotFound,
    Unavailable,
    VipuError,
)
from vipu.model.topology import LinkKind
from vipu.store.store import Store

MACHINES = 8


class StepGate:
    """Holds test steps while cleared; a step whose call is cancelled (an idle-time test's) ends at
    once, as an agent that aborts its step, unless `cancellable` is False."""

    def __init__(self) -> None:
        self._open = True
        self._changed = threading.Condition()
        self.cancellable = True

    def set(self) -> None:
        with self._changed:
            self._open = True
            self._changed.notify_all()

    def clear(self) -> None:
        with self._changed:
            self._open = False

    def wait(self, cancellation=None) -> bool:
        """Until the gate opens (at most a minute), or the step is cancelled; whether it was cancelled."""
        cancelled = threading.Event()

        def cancel() -> None:
            with self._changed:
                cancelled.set()
                self._changed.notify_all()

        if cancellation is not None and self.cancellable:
            cancellation.arm(cancel)
        with self._changed:
            self._changed.wait_for(lambda: self._open or cancelled.is_set(), timeout=60)
        return cancelled.is_set()


class InMemoryGateway:
    """Reaches simulated machines by address; an address in `unreachable` does not answer."""

    def __init__(self, rack_path):
        self.rack = RackFile(rack_path)
        self.machines = {(m.host, m.port): SimMachine(self.rack, m.name) for m in self.rack.current().machines}
        self.unreachable: set[tuple[str, int]] = set()
        self.diagnosing = threading.Event()  # set when a test step reaches a machine
        self.step_may_go = StepGate()  # the step goes on once this is set

    def machine(self, host, port) -> SimMachine:
        if (host, port) in self.unreachable or (host, port) not in self.machines:
            raise Unavailable("unreachable (connection refused)")
        return self.machines[(host, port)]

    def restart(self, host, port) -> None:
        """The machine's agent restarts: its configuration is gone."""
        self.machines[(host, port)] = SimMachine(self.rack, self.machines[(host, port)].machine_name)

    def inventory(self, host, port):
        return self.machine(host, port).inventory()

    def apply(self, host, port, settings):
        self.machine(host, port).apply(settings)

    def clear(self, host, port, partition_id):
        self.machine(host, port).clear(partition_id)

    def link_counters(self, host, port):
        return self.machine(host, port).link_counters(), time.time()

    def reset_link(self, host, port, place):
        self.machine(host, port).reset_link(place)

    def attachments(self, host, port, partition_ids, fence_seconds=0.0):
        return {a.partition_id: a.attached_clients for a in self.machine(host, port).attachments(partition_ids, fence_seconds)}

    def apply_all(self, targets):
        return [self._outcome(lambda h=host, p=port, s=settings: self.apply(h, p, s)) for host, port, settings in targets]

    def clear_all(self, targets, partition_id):
        return [self._outcome(lambda h=host, p=port: self.clear(h, p, partition_id)) for host, port in targets]

    @staticmethod
    def _outcome(call):
        """One call's error, or None; the machines answer one after the other."""
        try:
            call()
        except VipuError as error:
            return error
        return None

    def partitions(self, host, port):
        return self.machine(host, port).partitions()

    def claim(self, host, port, takeover_grant=""):
        self.machine(host, port)
        return ""

    def release(self, host, port):
        self.machine(host, port)

    def forget(self, host, port):
        pass

    def diagnose(self, host, port, probe, ipus, seed, cancellation=None):
        self.diagnosing.set()
        if self.step_may_go.wait(cancellation):
            raise Unavailable(f"the test step at {host}:{port} was cancelled")
        return self.machine(host, port).diagnose(probe, ipus, seed)


class Pod:
    def __init__(self, tmp_path, topology=IldTopology.MESH, store_url: str | None = None):
        self.rack_path = tmp_path / "rack.yaml"
        self.rack = generate_rack(MACHINES, topology=topology)
        save_rack(self.rack, self.rack_path)
        self.gateway = InMemoryGateway(self.rack_path)
        self.store = Store(store_url or f"sqlite:///{tmp_path / 'vipu.db'}")
        self.services = services = ControllerServices(self.store, self.gateway, workers=8)
        self.owners, self.partitions, self.requests = services.owners, services.partitions, services.requests
        self.allocations, self.clusters, self.agents = services.allocations, services.clusters, services.agents
        self.clustertests, self.health = services.clustertests, services.health
        self.store.own()  # as a serving controller does: the only writer, trusting its own configuration cache
        self.owners.load()
        for n, machine in enumerate(self.rack.machines, start=1):
            self.agents.create(f"ag{n}", machine.host, machine.port)
        self.clusters.create(Cluster("cl0", tuple(f"ag{n}" for n in range(1, MACHINES + 1)), topology))
        self.allocations.create("a1", "cl0", size=MACHINES * 4)

    def close(self) -> None:
        self.services.stop("the test is over")
        self.store.close()

    def restarted(self) -> ControllerServices:
        """The services of a controller started again on the same store (this one's stopped first)."""
        self.services.stop("the controller restarts")
        services = ControllerServices(self.store, self.gateway, workers=8)
        self.store.own()
        services.owners.load()
        return services

    def address(self, agent_id):
        machine = self.rack.machines[int(agent_id[2:]) - 1]
        return machine.host, machine.port

    def held(self, agent_id) -> set[str]:
        return {s.partition_id for s in self.gateway.machines[self.address(agent_id)].partitions()}

    def held_anywhere(self, partition_id) -> list[str]:
        return [f"ag{n}" for n in range(1, MACHINES + 1) if partition_id in self.held(f"ag{n}")]

    def fault(self, machine_name, reason):
        text = self.rack_path.read_text()
        self.rack_path.write_text(text.replace(f"name: {machine_name}\n", f"name: {machine_name}\n  faults: {{configure: {reason}}}\n", 1))

    def heal(self):
        save_rack(self.rack, self.rack_path)


def test_a_partition_is_configured_on_exactly_its_agents(pod):
    partition = pod.partitions.create(PartitionRequest("p1", 8))
    assert partition.ready_state is ReadyState.ACTIVE
    assert pod.held_anywhere("p1") == partition.agent_ids == ["ag1", "ag2"]
    pod.partitions.remove("p1")
    assert pod.held_anywhere("p1") == []
    with pytest.raises(NotFound):
        pod.partitions.get("p1")


def test_a_create_failing_at_an_agent_leaves_nothing_behind(pod):
    pod.fault("m02", "IPU-Link training failed on IPU 3")
    with pytest.raises(HardwareFailure, match="partition p1 could not be created and was not kept: "
                                              "agent ag2: m02: IPU-Link training failed on IPU 3"):
        pod.partitions.create(PartitionRequest("p1", 8))
    with pytest.raises(NotFound):
        pod.partitions.get("p1")
    assert pod.held_anywhere("p1") == []
    pod.heal()
    assert pod.partitions.create(PartitionRequest("p2", 8)).agent_ids == ["ag1", "ag2"]  # its IPUs were free again


def test_a_create_kept_on_error_stays_in_error_configured_nowhere(pod):
    pod.fault("m02", "IPU-Link training failed on IPU 3")
    with pytest.raises(HardwareFailure, match="partition p1 is in ERROR: agent ag2: m02: IPU-Link training failed on IPU 3"):
        pod.partitions.create(PartitionRequest("p1", 8), keep_on_error=True)
    stored = pod.partitions.get("p1")
    assert (stored.ready_state, stored.operation_state) == (ReadyState.ERROR, OperationState.FAILED)
    assert stored.errors == ["agent ag2: m02: IPU-Link training failed on IPU 3"]
    assert pod.held_anywhere("p1") == []
    # It keeps its IPUs until reset or removed, so the next partition goes elsewhere.
    assert pod.partitions.create(PartitionRequest("p2", 8)).agent_ids == ["ag3", "ag4"]
    pod.heal()
    assert pod.partitions.reset("p1").ready_state is ReadyState.ACTIVE
    assert pod.held_anywhere("p1") == ["ag1", "ag2"]


def test_an_unreachable_agent_is_a_temporary_failure(pod):
    pod.gateway.unreachable.add(pod.address("ag2"))
    with pytest.raises(Unavailable, match="agent ag2: unreachable"):
        pod.partitions.create(PartitionRequest("p1", 8))
    assert pod.held_anywhere("p1") == []


def test_removal_refuses_to_forget_configuration_it_cannot_clear_unless_forced(pod):
    pod.partitions.create(PartitionRequest("p1", 8))
    pod.gateway.unreachable.add(pod.address("ag1"))
    with pytest.raises(Unavailable, match=r"cannot remove partition p1: agent ag1: unreachable.*--force"):
        pod.partitions.remove("p1")
    assert pod.partitions.get("p1").ready_state is ReadyState.ERROR
    assert pod.held_anywhere("p1") == ["ag1"]  # ag2 was cleared; unreachable ag1 still holds its part
    pod.partitions.remove("p1", force=True)
    pod.gateway.unreachable.clear()
    assert pod.held("ag1") == {"p1"}
    pod.health.check_all()
    assert pod.held("ag1") == set()


def test_the_health_pass_reapplies_lost_configuration_and_clears_unknown_configuration(pod):
    pod.partitions.create(PartitionRequest("p1", 8))
    pod.gateway.restart(*pod.address("ag2"))
    stray = pod.gateway.machines[pod.address("ag5")]
    stray.apply(settings("ghost"))
    pod.health.check_all()
    assert pod.held("ag2") == {"p1"}
    assert pod.held("ag5") == set()


def test_a_health_pass_that_read_a_machine_before_a_create_configured_it_does_not_find_the_partition_lost(pod, monkeypatch):
    read, judged = threading.Event(), threading.Event()
    reading = pod.gateway.partitions

    def read_ag1_then_stall(host, port):
        found = reading(host, port)
        if (host, port) == pod.address("ag1") and not read.is_set():
            read.set()
            assert judged.wait(10)  # its report reaches the owner only after the create below
        return found

    pod.health.check_all()  # the allocation's owner is made before the read (a read older than its owner is never judged)
    monkeypatch.setattr(pod.gateway, "partitions", read_ag1_then_stall)
    with ThreadPoolExecutor(1) as pool:
        passing = pool.submit(pod.health.check_all)
        assert read.wait(10)  # ag1 read: it holds nothing yet
        assert pod.partitions.create(PartitionRequest("p1", 4)).agent_ids == ["ag1"]
        pod.fault("m01", "IPU 1 lost its PCIe link")  # an apply there fails from now on: a re-apply would put p1 in ERROR
        judged.set()
        passing.result(30)
    assert pod.partitions.get("p1").ready_state is ReadyState.ACTIVE and pod.held("ag1") == {"p1"}
    pod.gateway.restart(*pod.address("ag1"))  # it loses p1 after a read of its own: that read is judged
    pod.health.check_all()
    partition = pod.partitions.get("p1")
    assert partition.ready_state is ReadyState.ERROR and partition.errors == ["agent ag1: m01: IPU 1 lost its PCIe link"]


def test_a_health_pass_that_found_a_machine_silent_before_it_answered_a_create_does_not_fail_the_partition(pod, monkeypatch):
    asked, judged = threading.Event(), threading.Event()
    reading = pod.gateway.partitions

    def ag1_silent_to_its_first_read(host, port):
        if (host, port) == pod.address("ag1") and not asked.is_set():
            asked.set()
            assert judged.wait(10)  # its answer reaches the owner only after the create below
            raise Unavailable("unreachable (connection refused)")
        return reading(host, port)

    pod.health.check_all()  # the allocation's owner is made before the read (a read older than its owner is never judged)
    monkeypatch.setattr(pod.gateway, "partitions", ag1_silent_to_its_first_read)
    with ThreadPoolExecutor(1) as pool:
        passing = pool.submit(pod.health.check_all)
        assert asked.wait(10)
        assert pod.partitions.create(PartitionRequest("p1", 4)).agent_ids == ["ag1"]  # ag1 answers the create's calls
        judged.set()
        passing.result(30)
    partition = pod.partitions.get("p1")  # not failed as lost (and then reset automatically, ag1 answering again)
    assert (partition.ready_state, partition.auto_reset_count) == (ReadyState.ACTIVE, 0) and pod.held("ag1") == {"p1"}


def test_a_partition_lost_with_an_agent_is_cleared_from_those_that_answer_and_no_longer_stops_a_disruptive_test(pod):
    pod.partitions.create(PartitionRequest("p1", 8))  # ag1 and ag2
    pod.gateway.unreachable.add(pod.address("ag2"))
    pod.health.check_all()
    assert pod.partitions.get("p1").ready_state is ReadyState.ERROR
    assert pod.held_anywhere("p1") == ["ag2"]  # ag1 answers, and holds nothing of it; ag2 is cleared when it answers again
    pod.clustertests.start("cl0", {ct.TestType.SYNC}, wait=True)  # drives the links of machines that hold no partition


def test_the_health_pass_marks_agents_down_and_up_again(pod):
    pod.gateway.unreachable.add(pod.address("ag3"))
    pod.health.check_all()
    view = pod.agents.get("ag3")
    assert (view.agent.status, view.agent.last_error) == (AgentStatus.DOWN, "unreachable (connection refused)")
    pod.gateway.unreachable.clear()
    pod.health.check_all()
    assert pod.agents.get("ag3").agent.status is AgentStatus.UP


def test_interrupted_operations_are_finished_after_a_restart(pod):
    created = pod.partitions.create(PartitionRequest("p1", 4))
    removing = pod.partitions.create(PartitionRequest("p2", 4))
    placed = pod.partitions.create(PartitionRequest("p3", 4))
    pod.partitions.remove("p3")
    # As a controller stopped half-way would leave them: a reset and a remove under way, and a
    # create recorded but never pushed to its agents.
    with pod.store.transaction() as tx:
        tx.transition(created, "reset")
        tx.transition(removing, "remove")
        tx.add_partition(dataclasses.replace(placed, ready_state=ReadyState.PENDING, operation_state=OperationState.CREATING))
    pod.gateway.restart(*pod.address(created.agent_ids[0]))
    pod.health.recover()
    assert pod.partitions.get("p1").ready_state is ReadyState.ACTIVE
    assert pod.held_anywhere("p1") == created.agent_ids
    with pytest.raises(NotFound):
        pod.partitions.get("p2")
    assert pod.held_anywhere("p2") == []
    assert pod.partitions.get("p3").ready_state is ReadyState.ACTIVE
    assert pod.held_anywhere("p3") == placed.agent_ids


def test_a_health_pass_leaves_an_operation_under_way_alone_and_finishes_one_nobody_owns(pod):
    pod.partitions.create(PartitionRequest("p1", 4))
    clearing = failpoints.arm("agent.clear", "pause")  # the reset's first agent call stalls
    try:
        with ThreadPoolExecutor(1) as pool:
            resetting = pool.submit(pod.partitions.reset, "p1")
            assert clearing.reached.wait(10)
            pod.health.check_all()  # its operation owns it: the pass leaves it alone
            assert pod.partitions.get("p1").operation_state is OperationState.RESETTING
            clearing.released.set()
            assert resetting.result(10).ready_state is ReadyState.ACTIVE
    finally:
        failpoints.disarm()
    created = pod.partitions.get("p1")
    with pod.store.transaction() as tx:  # as a controller stopped in the middle of a reset leaves it
        tx.transition(created, "reset")
    services = pod.restarted()
    services.health.check_all()  # nobody owns it now: the pass finishes it
    assert services.partitions.get("p1").ready_state is ReadyState.ACTIVE
    assert pod.held_anywhere("p1") == created.agent_ids


def test_concurrent_requests_get_exactly_the_capacity(pod):
    outcomes: list[str] = []
    start = threading.Barrier(16)

    def request(n):
        start.wait()
        try:
            pod.partitions.create(PartitionRequest(f"p{n}", 4))
            outcomes.append("ok")
        except Conflict:
            outcomes.append("full")

    threads = [threading.Thread(target=request, args=(n,)) for n in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert outcomes.count("ok") == MACHINES and outcomes.count("full") == 16 - MACHINES
    holders = [pod.held(f"ag{n}") for n in range(1, MACHINES + 1)]
    assert all(len(h) == 1 for h in holders)


def test_requests_are_checked_before_anything_changes(pod):
    cases = [
        (PartitionRequest("p 1", 4), InvalidArgument, "invalid partition id"),
        (PartitionRequest("p1", 0), InvalidArgument, "power of two, not 0"),
        (PartitionRequest("p1", 6), InvalidArgument, "power of two, not 6"),
        (PartitionRequest("p1", 64), InvalidArgument, "larger than the cluster's 32 IPUs"),
        (PartitionRequest("p1", 4, allocation_id="nope"), NotFound, "allocation nope does not exist"),
        (PartitionRequest("p1", 4, cluster_id="nope"), NotFound, "cluster nope does not exist"),
        (PartitionRequest("p1", 4, num_gcds=2, num_replicas=3), InvalidArgument, "replicas"),
        (PartitionRequest("p1", 4, reconfigurable=True, sync_type=SyncType.POD_NATIVE_DEFAULT), InvalidArgument, "c2-compatible"),
        (PartitionRequest("p1", 4, sync_type=SyncType.GS2_INDEPENDENT_RAILS), InvalidArgument, "c2-independent-rails .* not supported"),
        (PartitionRequest("p1\n", 4), InvalidArgument, "invalid partition id"),
        (PartitionRequest("p1_gcd0", 4), InvalidArgument, "may not end in _gcd and a number"),
    ]
    for request, family, message in cases:
        with pytest.raises(family, match=message):
            pod.partitions.create(request)
    assert pod.partitions.list() == []
    pod.partitions.create(PartitionRequest("p1", 4))
    with pytest.raises(AlreadyExists):
        pod.partitions.create(PartitionRequest("p1", 4))


def test_removing_what_is_in_use_needs_force_and_says_what_went(pod):
    pod.partitions.create(PartitionRequest("p1", 4))
    with pytest.raises(Conflict, match="in cluster cl0"):
        pod.agents.remove("ag1")
    with pytest.raises(Conflict, match="has 1 allocation"):
        pod.clusters.remove("cl0")
    with pytest.raises(Conflict, match="holds 1 partition"):
        pod.allocations.remove("a1")
    assert pod.agents.remove("ag1", force=True) == ["partition p1", "allocation a1", "cluster cl0"]
    assert pod.held_anywhere("p1") == []
    assert [v.agent.id for v in pod.agents.list()] == [f"ag{n}" for n in range(2, MACHINES + 1)]


def test_an_allocation_removed_while_a_reader_makes_its_owner_does_not_come_back(pod, monkeypatch):
    """A reader (a health pass, the dashboard) starts to make the owner of an allocation never used
    yet, and the allocation is removed before it has read the store. It finds no allocation, and
    when one of that name is made again on other machines, its owner is the new one's: an owner made
    from what was read before the removal had placed every later create on the old machines."""
    readers, configuration, entered, go_on = set(), pod.store.configuration, threading.Event(), threading.Event()

    def slow_reading():
        read = configuration()
        if threading.current_thread() in readers:
            entered.set()
            assert go_on.wait(10)
        return read

    def read_owner():
        readers.add(threading.current_thread())
        return pod.owners.owner("a1")

    monkeypatch.setattr(pod.store, "configuration", slow_reading)
    with ThreadPoolExecutor(1) as pool:
        made = pool.submit(read_owner)
        assert entered.wait(10)
        pod.allocations.remove("a1")
        go_on.set()
        assert made.result(10) is None
    pod.allocations.create("a1", "cl0", ("ag3", "ag4"))
    assert pod.partitions.create(PartitionRequest("p1", 8)).agent_ids == ["ag3", "ag4"]


def test_auto_add_registers_new_addresses_and_reports_those_it_cannot_reach(pod):
    for n in range(1, MACHINES + 1):
        pod.agents.remove(f"ag{n}", force=True)
    first = pod.rack.machines[0]
    added, failures = pod.agents.auto_add([(first.host, first.port), ("127.0.0.1", 1)])
    assert added == [f"{first.host}-{first.port}"]
    assert failures == ["127.0.0.1-1: cannot reach agent 127.0.0.1-1 at 127.0.0.1:1: unreachable (connection refused)"]
    assert pod.agents.get(added[0]).agent.discovery_mode == "Auto"
    assert pod.agents.auto_add([(first.host, first.port)]) == ([], [])


def test_a_controller_stopping_mid_test_records_it_interrupted_not_finished(pod):
    pod.gateway.step_may_go.clear()
    pod.clustertests.start("cl0", {ct.TestType.SYNC, ct.TestType.CABLING}, wait=False)
    assert pod.gateway.diagnosing.wait(10)
    stopping = threading.Thread(target=pod.clustertests.shutdown)
    stopping.start()
    assert pod.clustertests._stop.wait(10)  # asked to stop while the step is in flight
    pod.gateway.step_may_go.set()  # the step in flight completes; its result must not count
    stopping.join(10)
    with pod.store.reading() as tx:
        run = tx.get_test_run()
    assert (run.state, run.outcomes) == (ct.RunState.INTERRUPTED, [])


def test_a_stop_whose_step_runs_on_says_so_in_a_line_and_the_run_stops_after_the_step(pod):
    pod.gateway.step_may_go.clear()
    pod.clustertests.start("cl0", set(), wait=False)
    assert pod.gateway.diagnosing.wait(10)
    with pytest.raises(Unavailable, match=r"^the cluster test of cl0 stops after its current step, still running after 0.2 s; "
                                          r"'vipu-admin test cluster --status' tells when it has$"):
        pod.clustertests.stop(wait=0.2)
    running = pod.clustertests._thread
    assert running is not None and running.is_alive()
    pod.gateway.step_may_go.set()
    running.join(10)
    with pytest.raises(Conflict, match="Last test in cluster cl0 was stopped"):
        pod.clustertests.status()


def test_a_test_stopped_by_the_operator_is_recorded_stopped(pod):
    pod.gateway.step_may_go.clear()
    pod.clustertests.start("cl0", set(), wait=False)
    assert pod.gateway.diagnosing.wait(10)
    stopping = threading.Thread(target=pod.clustertests.stop)
    stopping.start()
    assert pod.clustertests._stop.wait(10)
    pod.gateway.step_may_go.set()
    stopping.join(10)
    with pytest.raises(Conflict, match="Last test in cluster cl0 was stopped"):
        pod.clustertests.status()
    assert not pod.clustertests.testing("cl0") and pod.owners.owner("a1").snapshot.test == ""  # its machines given back


def test_a_cluster_keeps_each_cables_last_verdict_through_tests_of_another_cluster_or_of_other_cables(pod):
    pod.clusters.remove("cl0", force=True)
    for cluster_id, agents in (("cl0", (1, 2, 3, 4)), ("cl1", (5, 6, 7, 8))):
        pod.clusters.create(Cluster(cluster_id, tuple(f"ag{n}" for n in agents), IldTopology.MESH))
    unplugged = load_rack(pod.rack_path)
    faults.unplug(unplugged, "m02", LinkKind.IPULINK, 5)
    unplugged.time_scale = 0  # the tests' steps without their simulated durations
    save_rack(unplugged, pod.rack_path)

    def verdicts(cluster_id: str) -> tuple[ct.RunState | None, dict[str, str]]:
        state, cables = pod.clustertests.cabling(cluster_id)
        return state, {r.cable.key: r.verdict.value for r in cables}

    state, untested = verdicts("cl0")
    assert state is None and set(untested.values()) == {"untested"}
    pod.clustertests.start("cl0", set(), wait=True)  # Sync-Link judges its cables, Cabling the IPU-Link ones
    judged = verdicts("cl0")
    assert judged[0] is ct.RunState.FINISHED and [k for k, v in judged[1].items() if v != "passed"] == ["IPU-Link ag2:5 ag3:1"]
    assert judged[1]["IPU-Link ag2:5 ag3:1"] == "failed" and judged[1].keys() == untested.keys()
    pod.clustertests.start("cl1", set(), wait=True)
    pod.clustertests.start("cl0", {ct.TestType.VERSION}, wait=True)  # judges no cable
    assert verdicts("cl0") == judged
    assert set(verdicts("cl1")[1].values()) == {"passed"}
    pod.clustertests.start("cl0", {ct.TestType.SYNC}, wait=True)  # the Sync-Link cables judged again, the others kept
    assert verdicts("cl0") == judged
    pod.clusters.remove("cl0")
    pod.clusters.create(Cluster("cl0", ("ag1", "ag2", "ag3", "ag4"), IldTopology.MESH))
    assert verdicts("cl0") == (None, untested)  # a new cluster of the name starts untested


def test_a_run_a_crashed_controller_left_running_is_interrupted_for_its_cables_too(pod):
    with pod.store.transaction() as tx:
        tx.save_test_run(ct.TestRun("cl0", ct.RunState.RUNNING, [ct.TestType.VERSION]))
        tx.save_cable_verdicts("cl0", ct.CableVerdicts(ct.RunState.RUNNING))
    pod.clustertests.recover()
    assert pod.clustertests.cabling("cl0")[0] is ct.RunState.INTERRUPTED


def test_partitions_of_a_lost_agent_are_reset_when_it_returns_as_often_as_their_policy_allows(pod):
    pod.partitions.create(PartitionRequest("p1", 8))  # on ag1 and ag2
    for attempt in range(1, MAX_AUTO_RESETS + 2):
        pod.gateway.unreachable.add(pod.address("ag2"))
        pod.health.check_all()
        lost = pod.partitions.get("p1")
        assert (lost.ready_state, lost.errors) == (ReadyState.ERROR, ["agent ag2 is down: unreachable (connection refused)"])
        pod.health.check_all()  # still away: nothing to reset yet
        pod.gateway.unreachable.clear()
        pod.gateway.restart(*pod.address("ag2"))  # it comes back with nothing configured
        pod.health.check_all()
        back = pod.partitions.get("p1")
        if attempt <= MAX_AUTO_RESETS:
            assert (back.ready_state, back.auto_reset_count) == (ReadyState.ACTIVE, attempt)
            assert pod.held_anywhere("p1") == ["ag1", "ag2"]
        else:  # the retries are spent: its user decides
            assert (back.ready_state, back.auto_reset_count) == (ReadyState.ERROR, MAX_AUTO_RESETS)
            assert pod.held_anywhere("p1") == []


def test_a_partition_in_error_for_a_hardware_fault_is_not_reset_automatically(pod):
    pod.fault("m01", "IPU-Link training failed on IPU 3")
    with pytest.raises(HardwareFailure):
        pod.partitions.create(PartitionRequest("p1", 4), keep_on_error=True)
    pod.health.check_all()
    assert (pod.partitions.get("p1").ready_state, pod.partitions.get("p1").auto_reset_count) == (ReadyState.ERROR, 0)


def test_a_transition_the_store_refuses_is_read_again_from_the_store(pod):
    created = pod.partitions.create(PartitionRequest("p1", 4))
    with pod.store.transaction() as tx:  # a change its owner never saw (say, a deposed leader's)
        tx.transition(created, "remove")
    with pytest.raises(Conflict, match="partition p1 is ACTIVE/REMOVING, not ACTIVE/IDLE as 'reset' expected"):
        pod.partitions.reset("p1")
    assert pod.partitions.get("p1").operation_state is OperationState.REMOVING
