"""Cluster tests: run the suite against a cluster's agents, one test at a time per controller.

A run goes through the planned tests in the suite's order. Each step asks every agent concerned
to act and report (`AgentGateway.diagnose`), and `vipu.model.clustertests` judges the reports. A
test whose dependency failed earlier in the same run is skipped with the reason. The run is
saved after every step, so `--status` after a controller restart still has the last results;
a run the controller did not finish is recorded as interrupted. With it are saved the verdicts
of the cables it has judged so far, which the cluster keeps until its next test that judges them.

While a run is going the cluster cannot be removed. A run of tests that drive the links (Sync-Link,
IPU-Link, Traffic, GW-Link) first claims the cluster's machines from the owners of its allocations
(`vipu.controller.core`): refused in one line while partitions are there or being made, and
holding them until it ends, so that no partition is made, reset or moved there meanwhile. The
harmless tests (Cabling, Version, PFC) run beside partitions.

Idle-time tests (`vipu-server --idle-tests`, `run_idle`) run the IPU-Link and Traffic tests, which
drive only the links between the machines they test, on machines nobody uses: each allocation's
owner lends its free machines for a bounded time (`vipu.controller.core.lending`), and the tests
judge those machines and the cables between them. A partition that needs a lent machine takes the
loan back at once: the step under way is cancelled, and the run ends as stepped aside, the tests
it finished standing (saved, and told to the link ledger) and the one it was at saying why it
stopped. An operator's test, or the removal of the cluster, makes an idle-time run step aside too.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import ClassVar, TypeVar

from vipu import failpoints
from vipu.controller.core.agents import AgentGateway
from vipu.controller.core.changes import ChangeFeed, Topic
from vipu.controller.core.commands import ClaimMachines, LendMachines, ReleaseMachines, Reply, ReturnMachines
from vipu.controller.core.lending import Loan
from vipu.controller.core.owners import Owners
from vipu.controller.usecases.links import LinkLedger
from vipu.model import clustertests as judge
from vipu.model.clustertests import (
    DISRUPTIVE,
    Observation,
    Outcome,
    Probe,
    RunState,
    TestRun,
    TestType,
)
from vipu.model.entities import IPUS_PER_MACHINE, Agent, shown
from vipu.model.errors import Conflict, InvalidArgument, NotFound, Unavailable, VipuError
from vipu.model.topology import ClusterLayout
from vipu.store.store import Store

log = logging.getLogger(__name__)

STOP_WAIT_SECONDS = 50.0  # within the CLIs' default --api-timeout (60 s), so that they hear why it has not stopped yet
CLAIM_SECONDS = 30.0  # for an owner's turn, to claim its machines
# The longest a run waited for (`vipu-admin test cluster` without --start) is waited for on the
# end-point's thread; past it the run goes on and --status tells its end.
WAIT_SECONDS = 3600.0
# The tests that may run in idle time: they drive only the links between the machines they test.
IDLE_TESTS = frozenset({TestType.IPULINK, TestType.TRAFFIC})
IDLE_LOAN_SECONDS = 300.0  # the longest an idle-time run has its machines on loan (its steps take about a minute on real machines)
T = TypeVar("T")
R = TypeVar("R")


class _Context:
    """What the steps of one run need to know about the cluster; a run of some machines alone (an
    idle-time run's `loan` of them, or the drained ones an operator names) asks those only (`among`)."""

    def __init__(self, layout: ClusterLayout, agents: dict[str, Agent], loan: Loan | None = None,
                 among: tuple[str, ...] | None = None):
        self.layout = layout
        self.loan = loan
        self.among = loan.machines if loan is not None else among
        self.agents = agents if self.among is None else {a: agents[a] for a in self.among}
        self.tested = layout.agent_ids if self.among is None else self.among
        self.serials = {a: agent.inventory.serial for a, agent in agents.items()}
        self.chips = {a: {ipu.index: ipu.chip_id for ipu in agent.inventory.ipus} for a, agent in agents.items()}


class ClusterTestService:
    def __init__(self, store: Store, gateway: AgentGateway, owners: Owners, changes: ChangeFeed | None = None, workers: int = 32,
                 links: LinkLedger | None = None):
        """`links`: the link ledger, told each cable's verdict as the run judges it."""
        self.store = store
        self.gateway = gateway
        self.owners = owners
        self.links = links
        self.changes = changes  # told when a step starts; the store tells it of what is saved
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="cluster-test")
        self._lock = threading.Lock()
        self._run: TestRun | None = None
        self._starting = ""  # the cluster whose run is being started: its machines claimed, its first save made
        self._running_test: TestType | None = None  # the step of _run under way
        self._loan: Loan | None = None  # the machines _run tests, when it is an idle-time run
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._shutting_down = False

    def testing(self, cluster_id: str) -> bool:
        """Whether a run is going on the cluster, or being started there."""
        with self._lock:
            return cluster_id == self._starting or (self._run is not None and self._run.cluster_id == cluster_id)

    def busy(self, cluster_id: str) -> bool:
        """Whether a run that the cluster must wait for is going there, or being started: an
        idle-time run there steps aside instead, and has ended when this answers."""
        with self._lock:
            idle_here = self._loan is not None and self._run is not None and self._run.cluster_id == cluster_id
        if idle_here:
            self._step_aside(f"cluster {cluster_id} is being removed")
        return self.testing(cluster_id)

    def each(self, items: Iterable[T], call: Callable[[T], R]) -> list[R | VipuError]:
        """Run `call` on every item in parallel; each result, or the VipuError it raised, in order."""
        def attempt(item: T) -> R | VipuError:
            try:
                return call(item)
            except VipuError as error:
                return error

        return list(self._pool.map(attempt, list(items)))

    def recover(self) -> None:
        """At start-up: a run the previous controller left running was interrupted."""
        with self.store.transaction() as tx:
            run = tx.get_test_run()
            if run is not None and run.state is RunState.RUNNING:
                run.state = RunState.INTERRUPTED
                tx.save_test_run(run)
                kept = tx.get_cable_verdicts(run.cluster_id)
                if kept is not None:
                    kept.run_state = run.state
                    tx.save_cable_verdicts(run.cluster_id, kept)

    def start(self, cluster_id: str, tests: set[TestType], wait: bool, wait_seconds: float = WAIT_SECONDS,
              machines: tuple[str, ...] = ()) -> TestRun:
        """Start a run of `tests` (all, if none) on the cluster, or on some of its machines alone
        (and the cables between them): drained ones, for a test that drives links; with `wait`,
        wait for it to end (up to `wait_seconds`, after which the run goes on). An idle-time run
        under way steps aside first. The run's place is taken under the lock; the claim of the
        machines and the first save are made outside it."""
        context = self._context(cluster_id, among=machines or None)
        planned = judge.plan(tests)
        claimed = bool(DISRUPTIVE & set(planned))
        self._step_aside(f"a test of cluster {cluster_id} was started")
        self._reserve(cluster_id)
        run = TestRun(cluster_id, RunState.RUNNING, planned)
        try:
            if claimed:
                self._claim(cluster_id, context.among or ())
            try:
                self._save(run, context)
            except BaseException:
                if claimed:
                    self._give_back(cluster_id)
                raise
        except BaseException:
            with self._lock:
                self._starting = ""
            raise
        thread = self._begin(run, context, claimed)
        log.info("cluster test of %s%s started: %s", cluster_id, f" ({', '.join(context.among)} alone)" if context.among else "",
                 ", ".join(t.value for t in planned))
        if wait:
            thread.join(wait_seconds)
        return run

    def _context(self, cluster_id: str, loan: Loan | None = None, among: tuple[str, ...] | None = None) -> _Context:
        configuration = self.store.configuration()
        cluster = configuration.clusters.get(cluster_id)
        if cluster is None:
            raise NotFound(f"cluster {shown(cluster_id)} does not exist")
        strangers = [a for a in among or () if a not in cluster.agent_ids]
        if strangers:
            raise InvalidArgument(f"{', '.join(shown(a) for a in strangers)} {'is' if len(strangers) == 1 else 'are'} not in "
                                  f"cluster {cluster_id}")
        agents: dict[str, Agent] = {}
        for agent_id in cluster.agent_ids:
            agent = configuration.agents.get(agent_id)
            if agent is None:  # not while the cluster exists: the store's foreign keys keep its agents
                raise NotFound(f"agent {shown(agent_id)} does not exist")
            agents[agent_id] = agent
        layout = ClusterLayout.of(cluster)
        return _Context(layout, agents, loan, None if among is None else tuple(a for a in layout.agent_ids if a in among))

    def _reserve(self, cluster_id: str) -> None:
        """Take the one run's place for a run of the cluster, or Conflict while another has it."""
        with self._lock:
            under_way = self._run.cluster_id if self._run is not None else self._starting
            if under_way:
                raise Conflict(f"a test in cluster {under_way} is in progress; only one cluster test runs at a time")
            if self._shutting_down:
                raise Unavailable("this vipu-server is stopping")
            self._starting = cluster_id

    def _begin(self, run: TestRun, context: _Context, claimed: bool) -> threading.Thread:
        """The run, its place reserved and its first save made, goes on in a thread of its own."""
        with self._lock:
            self._starting = ""
            self._run, self._loan = run, context.loan
            self._stop.clear()
            thread = self._thread = threading.Thread(target=self._execute, args=(run, context, claimed), name="cluster-test",
                                                     daemon=True)
            thread.start()
        return thread

    # Idle-time tests

    def run_idle(self, interval: float, tests: frozenset[TestType], stop: threading.Event) -> None:
        """Every `interval` seconds (counted from the end of the last round), test the free machines
        of each allocation in turn (`test_idle`), until `stop` is set."""
        while not stop.wait(interval):
            try:
                allocations = sorted(self.store.configuration().allocations)
            except VipuError as error:
                log.warning("idle-time tests wait for the next round: %s", error.message)
                continue
            for allocation_id in allocations:
                if stop.is_set():
                    return
                try:
                    self.test_idle(allocation_id, tests)
                except VipuError as error:
                    log.info("no idle-time test of allocation %s this round: %s", allocation_id, error.message)
                except Exception:
                    log.exception("the idle-time test of allocation %s failed", allocation_id)

    def test_idle(self, allocation_id: str, tests: frozenset[TestType] = IDLE_TESTS) -> TestRun | None:
        """Borrow the allocation's free machines from its owner and run `tests` (of IDLE_TESTS) on
        them and the cables between them, waiting for the run's end; the run, or None when none
        was run (another test runs, no machine is free, or none of the tests has anything to test
        on the free machines: Traffic needs a whole window of them)."""
        with self._lock:
            if self._run is not None or self._starting or self._shutting_down:
                return None
        owner = self.owners.owner(allocation_id)
        if owner is None:
            return None
        cluster_id = owner.snapshot.allocation.cluster_id
        command = owner.submit(LendMachines(test=f"idle-time test of cluster {cluster_id}", seconds=IDLE_LOAN_SECONDS))
        loan: Loan | None = command.reply.wait(CLAIM_SECONDS, f"the lending of allocation {allocation_id}'s free machines")
        if loan is None:
            return None
        try:
            context = self._context(cluster_id, loan)
            windows = judge.traffic_windows(context.layout, context.among)
            planned = [t for t in judge.ORDER if t in tests & IDLE_TESTS and (t is not TestType.TRAFFIC or windows)]
            if not planned:
                self._return(loan)
                return None
            self._reserve(cluster_id)
            run = TestRun(cluster_id, RunState.RUNNING, planned)
            try:
                self._save(run, context)
            except BaseException:
                with self._lock:
                    self._starting = ""
                raise
        except BaseException:
            self._return(loan)
            raise
        thread = self._begin(run, context, claimed=False)
        log.info("idle-time test of %s started on %s (of allocation %s): %s", cluster_id, ", ".join(loan.machines),
                 allocation_id, ", ".join(t.value for t in planned))
        thread.join(loan.seconds + STOP_WAIT_SECONDS)
        return run

    def _return(self, loan: Loan) -> None:
        """The lent machines go back to their owner: in its inbox even past its limit, not waited for."""
        owner = self.owners.owner(loan.allocation_id)
        if owner is None:
            return
        try:
            owner.submit(ReturnMachines(loan=loan, reply=Reply(waited=False)), always=True)
        except VipuError as error:  # the owner stopped: nothing of it is left to give back
            log.warning("allocation %s: could not be given back its machines: %s", loan.allocation_id, error.message)

    def _step_aside(self, why: str) -> None:
        """An idle-time run under way gives way: its loan ends (its step is cancelled) and its end is
        waited for, up to STOP_WAIT_SECONDS."""
        with self._lock:
            loan, thread = self._loan, self._thread
        if loan is None or thread is None:
            return
        loan.end(why)
        thread.join(STOP_WAIT_SECONDS)

    def _claim(self, cluster_id: str, machines: tuple[str, ...] = ()) -> None:
        """Take the cluster's machines (or these drained ones alone) from the owners of its
        allocations, or Conflict naming the partitions in the way, or the machines not drained (and
        nothing taken)."""
        test = f"cluster {cluster_id}"
        if machines:
            configuration = self.store.configuration()
            allocated = {a for allocation in configuration.allocations.values() for a in allocation.agent_ids}
            loose = [a for a in machines if a not in allocated and configuration.agents[a].drain is None]
            if loose:  # in no allocation: no owner holds them, and nothing is placed there until one is made
                raise Conflict(f"{judge.TESTED_ALONE}: {'; '.join(judge.not_drained(a) for a in loose)}")
        self.owners.test_starts(cluster_id, test, machines)
        in_the_way: list[str] = []
        try:
            for allocation in self._allocations(cluster_id):
                owner = self.owners.owner(allocation)
                if owner is None:
                    continue
                mine = tuple(a for a in machines if a in owner.snapshot.allocation.agent_ids)
                if machines and not mine:
                    continue
                command = ClaimMachines(test=test, machines=mine)
                owner.submit(command)
                in_the_way += command.reply.wait(CLAIM_SECONDS, f"the claim of the machines of allocation {allocation}")
        except BaseException:
            self._give_back(cluster_id)
            raise
        if in_the_way:
            self._give_back(cluster_id)
            raise Conflict(f"cluster {cluster_id} has partitions ({', '.join(sorted(in_the_way))}); remove them before running tests "
                           "that drive its links, or drain the machines to test and test them alone (vipu-admin test cluster "
                           "--agents)")

    def _give_back(self, cluster_id: str) -> None:
        """The cluster's machines go back to the owners of its allocations: in each inbox even past
        its limit, and not waited for (never withdrawn), so that no busy owner keeps them under test."""
        self.owners.test_ends(cluster_id)
        test = f"cluster {cluster_id}"
        for allocation in self._allocations(cluster_id):
            owner = self.owners.owner(allocation)
            if owner is None:
                continue
            try:
                owner.submit(ReleaseMachines(test=test, reply=Reply(waited=False)), always=True)
            except VipuError as error:  # the owner stopped: nothing of it is left to give back
                log.warning("allocation %s: could not be given back its machines: %s", allocation, error.message)

    def _allocations(self, cluster_id: str) -> list[str]:
        return sorted(a.id for a in self.store.configuration().allocations.values() if a.cluster_id == cluster_id)

    def status(self) -> TestRun:
        """The last finished run, or a Conflict saying why there are no results."""
        with self.store.reading() as tx:
            run = tx.get_test_run()
        if run is None:
            raise Conflict("No results available. No cluster test has run.")
        with self._lock:
            loan = self._loan if self._run is not None and self._run.cluster_id == run.cluster_id else None
        running = (f"An idle-time test of {', '.join(loan.machines)} (free machines of allocation {loan.allocation_id}, "
                   f"which a partition takes back at once) in cluster {run.cluster_id} is in progress."
                   if loan is not None else f"Test in cluster {run.cluster_id} is in progress.")
        reasons = {
            RunState.RUNNING: running,
            RunState.STOPPED: f"Last test in cluster {run.cluster_id} was stopped.",
            RunState.INTERRUPTED: f"Last test in cluster {run.cluster_id} was interrupted by a restart of the controller.",
        }
        if run.state in reasons:
            raise Conflict(f"No results available. {reasons[run.state]}")
        return run

    def progress(self) -> tuple[TestRun, TestType | None]:
        """The run under way with the test it is at, or else the last run, however it ended."""
        with self._lock:
            run, running_test = self._run, self._running_test
            if run is not None:
                return TestRun(run.cluster_id, run.state, list(run.tests), list(run.outcomes)), running_test
        with self.store.reading() as tx:
            last = tx.get_test_run()
        if last is None:
            raise Conflict("No results available. No cluster test has run.")
        return last, None

    def cabling(self, cluster_id: str) -> tuple[RunState | None, list[judge.CableResult]]:
        """The cluster's cables, each with the verdict of the last test of the cluster that
        judged it (the run under way included), and the state of the cluster's latest run; None,
        with every cable untested, when no test has run on the cluster."""
        with self.store.reading() as tx:
            cluster = tx.get_cluster(cluster_id)
            kept = tx.get_cable_verdicts(cluster_id) if cluster is not None else None
        if cluster is None:
            raise NotFound(f"cluster {shown(cluster_id)} does not exist")
        return kept.run_state if kept is not None else None, judge.kept_results(ClusterLayout.of(cluster), kept)

    def stop(self, wait: float = STOP_WAIT_SECONDS) -> str:
        """Stop the running test after its current step; the cluster it was testing. A step that
        runs on past `wait` seconds (each agent's call may take up to its test deadline) is left to
        end: the caller hears so, and the run stops after it."""
        with self._lock:
            run, thread, loan = self._run, self._thread, self._loan
            if run is None or thread is None:  # start sets both together
                raise Conflict("No cluster test is in progress.")
            self._stop.set()
        if loan is not None:  # an idle-time run's step is cancelled, not waited for
            loan.end("stopped by an operator")
        thread.join(wait)
        if thread.is_alive():
            raise Unavailable(f"the cluster test of {run.cluster_id} stops after its current step, still running after "
                              f"{wait:g} s; 'vipu-admin test cluster --status' tells when it has")
        return run.cluster_id

    def shutdown(self, timeout: float = 5.0) -> None:
        """The controller is stopping: end a running test after its current step, as interrupted.

        Called before the agents' channels and the store close, so that a run cannot race on with
        failing calls and record results that never were.
        """
        with self._lock:
            self._shutting_down = True
            self._stop.set()
            thread, loan = self._thread, self._loan
        if loan is not None:
            loan.end("this vipu-server is stopping")
        if thread is not None:
            thread.join(timeout)
        self._pool.shutdown(wait=False, cancel_futures=True)

    def _stopped_state(self) -> RunState:
        return RunState.INTERRUPTED if self._shutting_down else RunState.STOPPED

    def _execute(self, run: TestRun, context: _Context, claimed: bool) -> None:
        forced = len(run.tests) == 1
        loan = context.loan
        outcomes: dict[TestType, Outcome] = {}
        try:
            for test in run.tests:
                failpoints.hit("clustertest.step")
                if self._stop.is_set():
                    run.state = self._stopped_state()
                    break
                if loan is not None and loan.ended:
                    self._stepped_aside(run, test, loan)
                    break
                dependency = None if forced else judge.failed_dependency(test, outcomes)
                if dependency is not None:
                    outcome = judge.skipped(test, dependency)
                else:
                    started = time.monotonic()
                    self._running_test = test
                    if self.changes is not None:
                        self.changes.publish(Topic.TESTS)
                    outcome = self._steps[test](self, context)
                    outcome.duration = time.monotonic() - started
                if self._stop.is_set():
                    run.state = self._stopped_state()
                    break
                if loan is not None and loan.ended:  # its step was cut short: it judges nothing
                    self._stepped_aside(run, test, loan)
                    break
                if context.among is not None:
                    judge.on_machines(outcome, context.among, "Idle-time test" if loan is not None else "Test")
                outcomes[test] = outcome
                run.outcomes.append(outcome)
                self._save(run, context)
            else:
                run.state = RunState.FINISHED
        except Exception:
            log.exception("cluster test of %s failed", run.cluster_id)
            run.state = RunState.INTERRUPTED
        finally:
            try:
                self._save(run, context)
            except VipuError as error:
                log.warning("cluster test of %s: its end could not be saved: %s", run.cluster_id, error.message)
            if claimed:
                self._give_back(run.cluster_id)
            if loan is not None:
                self._return(loan)
            with self._lock:
                self._run = self._thread = self._running_test = self._loan = None
            log.info("%s of %s %s", "idle-time test" if loan is not None else "cluster test", run.cluster_id, run.state.value)

    @staticmethod
    def _stepped_aside(run: TestRun, test: TestType, loan: Loan) -> None:
        run.outcomes.append(judge.stepped_aside(test, loan.why, loan.machines))
        run.state = RunState.STEPPED_ASIDE
        log.info("idle-time test of %s steps aside at %s: %s", run.cluster_id, test.value, loan.why)

    def _save(self, run: TestRun, context: _Context) -> None:
        """The run as it stands, and the verdicts of the cables it has judged so far."""
        layout = context.layout
        with self.store.transaction() as tx:
            tx.save_test_run(run)
            tx.save_cable_verdicts(run.cluster_id, judge.kept_verdicts(tx.get_cable_verdicts(run.cluster_id), layout, run))
        if self.links is not None and run.outcomes:  # this run's verdicts only: a cable replaced since an older run starts afresh
            try:
                self.links.record_test("idle-time" if context.loan is not None else "cluster", judge.cable_results(layout, run.outcomes))
            except VipuError as error:
                log.warning("the link ledger did not take the cluster test's verdicts: %s", error.message)

    # The steps

    def _observe(self, c: _Context, probe: Probe) -> judge.Observations:
        agents = list(c.agents.values())
        return self._as_observations(agents, self.each(agents, lambda a: self._diagnose(c, a, probe, {}, 0)))

    def _diagnose(self, c: _Context, agent: Agent, probe: Probe, ipus: dict[int, int], seed: int) -> Observation:
        """One agent's step; an idle-time run's is counted on its machine, and cancelled when its loan ends."""
        if c.loan is None:
            return self.gateway.diagnose(agent.host, agent.port, probe, ipus, seed)
        with c.loan.stepping(agent.id) as cancellation:
            return self.gateway.diagnose(agent.host, agent.port, probe, ipus, seed, cancellation)

    @staticmethod
    def _as_observations(agents: list[Agent], replies: list) -> judge.Observations:
        """Each agent's observation, or None (and a log line) for one that failed to answer."""
        observations = {}
        for agent, reply in zip(agents, replies, strict=True):
            if isinstance(reply, VipuError):
                log.warning("agent %s: %s", agent.id, reply.message)
                reply = None
            observations[agent.id] = reply
        return observations

    def _sync(self, c: _Context) -> Outcome:
        return judge.judge_sync(c.layout, self._observe(c, Probe.SYNC), c.serials, c.among)

    def _cabling(self, c: _Context) -> Outcome:
        return judge.judge_cabling(c.layout, self._observe(c, Probe.CABLING), c.among)

    def _ipulink(self, c: _Context) -> Outcome:
        return judge.judge_ipulink(c.layout, self._observe(c, Probe.IPULINK), c.serials, c.among)

    def _traffic(self, c: _Context) -> Outcome:
        """Windows that share no machine run together, phase by phase."""
        windows = judge.traffic_windows(c.layout, c.among)
        if not windows and c.among is not None:
            return judge.no_traffic_window(c.layout, c.among)
        results: dict[int, judge.WindowResult] = {}
        for phase in judge.traffic_phases(windows):
            if self._stop.is_set() or (c.loan is not None and c.loan.ended):
                break
            results.update(self._traffic_phase(c, windows, phase))
        return judge.traffic_outcome([results[n] for n in sorted(results)])

    def _traffic_phase(self, c: _Context, windows: list[tuple[str, ...]], phase: list[int]) -> dict[int, judge.WindowResult]:
        """Run the windows of one phase at once; the program's seed is each window's number."""
        requests = {}  # agent id -> (its IPUs' routing ids in its window, the window's number)
        for number in phase:
            for position, agent in enumerate(windows[number - 1]):
                requests[agent] = ({i: position * IPUS_PER_MACHINE + i for i in range(IPUS_PER_MACHINE)}, number)
        agents = [c.agents[a] for a in requests]
        replies = self.each(agents, lambda a: self._diagnose(c, a, Probe.TRAFFIC, *requests[a.id]))
        observations = self._as_observations(agents, replies)
        return {
            number: judge.judge_traffic_window(number, windows[number - 1], c.layout, observations, c.serials, c.chips, number)
            for number in phase
        }

    def _gwlink(self, c: _Context) -> Outcome:
        if not c.layout.gwlink_cables(c.among):
            return judge.judge_gwlink(c.layout, {}, c.serials, c.among)
        return judge.judge_gwlink(c.layout, self._observe(c, Probe.GWLINK), c.serials, c.among)

    def _versions(self, c: _Context) -> Outcome:
        agents = list(c.agents.values())
        results = self.each(agents, lambda a: self.gateway.inventory(a.host, a.port))
        versions = {a.id: (None if isinstance(r, VipuError) else r.versions) for a, r in zip(agents, results, strict=True)}
        return judge.judge_versions(c.tested, versions)

    def _pfc(self, c: _Context) -> Outcome:
        return judge.judge_pfc(c.tested, self._observe(c, Probe.PFC))

    _steps: ClassVar[dict[TestType, Callable[[ClusterTestService, _Context], Outcome]]] = {
        TestType.SYNC: _sync,
        TestType.CABLING: _cabling,
        TestType.IPULINK: _ipulink,
        TestType.TRAFFIC: _traffic,
        TestType.GWLINK: _gwlink,
        TestType.VERSION: _versions,
        TestType.PFC: _pfc,
    }
