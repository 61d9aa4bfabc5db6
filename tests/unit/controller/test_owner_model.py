"""The allocation's owner against a reference model, by hypothesis's stateful testing.

Creates (some willing to wait), removes (forced or not), resets, relocations, cancels, a cluster
test's claim and release of the machines, free machines lent to an idle-time test and returned,
agents going down and coming back, health passes, and
commits and agent calls held back or refused, at random and overlapping: every operation runs on
a thread of its own while failpoints hold the owner's agent calls and the store's commits. After
every step:

- no IPU is in two partitions;
- nothing is visible that is not committed: while the owner is held in a commit, and whenever it
  is quiet, what readers see of its partitions is exactly what the store holds;
- no newcomer takes the IPUs held for the first waiting request;
- while a disruptive test holds the machines, no partition there is configured or being made;
- no machine is both lent to an idle-time test and used (a partition there takes it back at once);
- a partition placed while nothing else was under way is where placement itself, given what was
  committed and held, puts it (the reference model of a decision);

and once everything is let go and the owner is idle: what clients were told holds (a create
answered is there unless removed, a remove answered is gone), nothing is stuck in an operation,
and every agent holds exactly what the committed state says. On SQLite and PostgreSQL. The
machines are real simulated IPU-Machines reached in memory (test_services' gateway).
"""

from __future__ import annotations

import itertools
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from tempfile import TemporaryDirectory

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule, run_state_machine_as_test

from tests.unit.controller.test_services import MACHINES, Pod
from vipu import failpoints
from vipu.controller.core.commands import ClaimMachines, LendMachines, ReleaseMachines, Reply, ReturnMachines
from vipu.controller.core.placing import place_request
from vipu.model import lifecycle
from vipu.model.entities import PartitionRequest, ReadyState
from vipu.model.errors import OutcomeUnknown, Unavailable, VipuError
from vipu.model.placement import Occupancy
from vipu.model.templates import Template

HELD_BACK = ("agent.apply", "agent.clear", "store.commit")
# Where a step fails once: a write the store refuses, an agent that does not answer, a commit whose
# answer is lost (its operations' outcome unknown) and a turn that raises (the owner is made again
# from the store).
REFUSED_ONCE = ("store.partition.create", "store.partition.configured", "store.partition.fail", "store.partition.abandon",
                "store.partition.lost", "store.partition.reset", "store.partition.relocate", "store.partition.remove",
                "store.partition.removed", "store.request.enqueue", "store.request.grant", "store.request.cancel",
                "store.request.expire", "store.commit", "store.commit.answer", "owner.turn", "agent.apply", "agent.clear")
SETTLE_SECONDS = 60.0
TEST = "cluster cl0"


def unknown(answer: VipuError) -> bool:
    """Whether an answer says the operation's outcome is unknown (it may be done, or not)."""
    return isinstance(answer, OutcomeUnknown) or "it goes on" in answer.message


class OwnerMachine(RuleBasedStateMachine):
    store_url: str | None = None  # set by each test: None for a SQLite file of the example's own

    @initialize()
    def start(self):
        self.directory = TemporaryDirectory(prefix="vipu-model-")
        self.pod = Pod(Path(self.directory.name), store_url=type(self).make_store())
        self.pool = ThreadPoolExecutor(16)
        self.names = (f"p{n}" for n in itertools.count())
        self.under_way: list[tuple[str, str, Future]] = []  # (what, partition id, its outcome)
        self.answered: list[tuple[str, str, object]] = []
        self.asked_remove: set[str] = set()
        self.kept: set[str] = set()  # creates asked to keep a partition that failed at a machine, in ERROR
        self.asked: list[str] = []  # every name a create was asked for: what the other operations choose from (a gone one is NotFound)
        self.paused: dict[str, failpoints.Failpoint] = {}
        self.claimed = False
        self.lendings: list[LendMachines] = []  # idle-time tests' asks for the free machines, not yet returned
        self.returning: list[LendMachines] = []  # asks to be returned once answered

    @classmethod
    def make_store(cls) -> str | None:
        return cls.store_url() if callable(cls.store_url) else cls.store_url

    def teardown(self):
        try:
            self.settle()
        finally:
            failpoints.disarm()
            self.pool.shutdown(wait=True, cancel_futures=True)
            self.pod.close()
            self.directory.cleanup()

    # What the clients and the world do

    def owner(self):
        return self.pod.owners.owner("a1")

    def _submit(self, command):
        """The command, submitted to the allocation's owner; None if that owner stopped between
        being found and being asked (a turn of another thread failed, or its commit's answer was
        lost), which a client is told as Unavailable, with why it stopped, and which promises nothing."""
        owner = self.owner()
        try:
            return owner.submit(command)
        except Unavailable as refused:
            assert refused.message == owner._stopped, refused.message  # stopped, not refusing for a full inbox
            return None

    def _run(self, what: str, partition_id: str, work) -> None:
        self.under_way.append((what, partition_id, self.pool.submit(work)))

    def _quiet_now(self) -> bool:
        return not self.paused and not any(not f.done() for _, _, f in self.under_way)

    @rule(size=st.sampled_from([1, 2, 4, 8, 16]), keep=st.booleans(), relocatable=st.booleans(), wait=st.booleans())
    def create(self, size, keep, relocatable, wait):
        name = next(self.names)
        self.asked.append(name)
        if keep:
            self.kept.add(name)
        request = PartitionRequest(name, size, relocatable=relocatable)
        if self._quiet_now() and not wait:
            self._placed_as_the_model_says(request, keep)
            return
        def work():
            before = self.owner().snapshot
            created = self.pod.requests.create(request, keep_on_error=keep, wait_seconds=30 if wait else 0)
            self._took_no_held_ipus(before, self.owner().snapshot, created)
            return created

        self._run("create", name, work)

    def _placed_as_the_model_says(self, request: PartitionRequest, keep: bool) -> None:
        """With nothing else under way, the owner places a partition where placement puts it, around
        what is committed and what is held for the first waiting request."""
        assert self.pod.owners.wait_quiet(SETTLE_SECONDS)
        snapshot = self.owner().snapshot
        first = snapshot.queue.first.partition_id if snapshot.queue.first is not None else ""
        occupancy = Occupancy(snapshot.holders(), snapshot.queue.held if first else frozenset(), first)
        try:
            state = self.owner().state  # quiet: what it weighs besides the snapshot: the mix of sizes asked for, the links, machines down
            mix = state.mix if (request.id, request.size) in state.refused else state.mix.saw(request.size)
            expected = {(i.agent_id, i.index) for i in place_request(snapshot.layout, snapshot.allocation, snapshot.used_ipus(),
                                                                      request, occupancy, state.links, mix,
                                                                      dict.fromkeys(state.down, "down")).ipus}
        except VipuError:
            expected = None
        try:
            created = self.pod.partitions.create(request, keep_on_error=keep)
        except VipuError as error:  # refused, or placed and then failed at a machine
            self.answered.append(("create", request.id, error))
            return
        self.answered.append(("create", request.id, created))
        assert expected is not None, f"{request.id} was placed where placement finds no room"
        placed = {(i.agent_id, i.index) for i in created.ipus}
        assert placed == expected or created.relocation, f"{request.id} at {sorted(placed)}, placement says {sorted(expected)}"

    @staticmethod
    def _took_no_held_ipus(before, after, created) -> None:
        """A partition made while the same request was first, with the same IPUs held for it, took none of those."""
        if not isinstance(created, tuple) or before.queue.first is None or after.queue.first is None or not before.queue.held:
            return
        first = before.queue.first.partition_id
        if after.queue.first.partition_id != first or after.queue.held != before.queue.held:
            return
        partition = created[0]
        if partition.relocation:
            return  # a relocatable create that failed and moved: a move may take held IPUs
        taken = {(i.agent_id, i.index) for i in partition.ipus}
        assert not taken & before.queue.held, f"{partition.id} took IPUs held for {first}"

    @rule(sizes=st.lists(st.sampled_from([2, 4, 8]), min_size=2, max_size=4))
    def template(self, sizes):
        """A template of partitions of these sizes, made all or none."""
        template = Template.parse("+".join(f"1x{size}" for size in sizes))
        prefix = f"{next(self.names)}-"
        ids = template.partition_ids(prefix)
        self.asked.extend(ids)
        self._run("template", ",".join(ids), lambda: self.pod.allocations.apply_template("a1", template, prefix))

    @precondition(lambda self: bool(self.asked))
    @rule(data=st.data(), force=st.booleans())
    def remove(self, data, force):
        name = data.draw(st.sampled_from(self.asked))
        self.asked_remove.add(name)
        self._run("remove", name, lambda: self.pod.requests.remove(name, force=force))

    @precondition(lambda self: bool(self.asked))
    @rule(data=st.data(), move=st.booleans())
    def reset(self, data, move):
        name = data.draw(st.sampled_from(self.asked))
        self._run("reset", name, (lambda: self.pod.partitions.relocate(name)) if move else (lambda: self.pod.partitions.reset(name)))

    @precondition(lambda self: bool(self.asked))
    @rule(data=st.data())
    def cancel(self, data):
        name = data.draw(st.sampled_from(self.asked))
        self.asked_remove.add(name)
        self._run("cancel", name, lambda: self.pod.requests.cancel(name))

    @rule(point=st.sampled_from(HELD_BACK))
    def hold_back(self, point):
        if point not in self.paused:
            self.paused[point] = failpoints.arm(point, "pause")

    @precondition(lambda self: bool(self.paused))
    @rule(data=st.data())
    def let_go(self, data):
        point = data.draw(st.sampled_from(sorted(self.paused)))
        failpoints.disarm(point)
        del self.paused[point]

    @rule(point=st.sampled_from(REFUSED_ONCE))
    def refuse_once(self, point):
        if point not in self.paused:
            failpoints.arm(point, "1*fail(refused by the test)")

    @rule(machine=st.integers(1, MACHINES), restarted=st.booleans())
    def agent_goes_or_comes_back(self, machine, restarted):
        address = self.pod.address(f"ag{machine}")
        if address in self.pod.gateway.unreachable:
            self.pod.gateway.unreachable.discard(address)
            if restarted:
                self.pod.gateway.restart(*address)
        else:
            self.pod.gateway.unreachable.add(address)

    @rule()
    def health_pass(self):
        self._run("health", "", lambda: self.pod.health.check_all(seconds=SETTLE_SECONDS))

    @precondition(lambda self: not self.claimed)
    @rule()
    def claim_for_a_test(self):
        self.pod.owners.test_starts("cl0", TEST)
        command = ClaimMachines(test=TEST)
        if self._submit(command) is not None:
            self._run("claim", "", lambda: command.reply.wait(SETTLE_SECONDS, "the claim"))
        self.claimed = True  # or refused, which the release then finds nothing to give back of

    @precondition(lambda self: self.claimed)
    @rule()
    def release_the_test(self):
        self.pod.owners.test_ends("cl0")
        command = ReleaseMachines(test=TEST)
        if self._submit(command) is not None:
            self._run("release", "", lambda: command.reply.wait(SETTLE_SECONDS, "the release"))
        self.claimed = False

    @rule()
    def lend_for_an_idle_test(self):
        asked = LendMachines(test="idle-time test of cluster cl0", seconds=SETTLE_SECONDS, reply=Reply(waited=False))
        if self._submit(asked) is not None:
            self.lendings.append(asked)

    @precondition(lambda self: bool(self.lendings))
    @rule()
    def return_what_was_lent(self):
        """Give back each loan answered so far; an ask still unanswered (its owner held back) is
        tried again at the next return. The precondition counts asks, never answers, which come
        when they come: hypothesis must find the same rules enabled when it replays the same steps."""
        self.returning.extend(self.lendings)
        self.lendings.clear()
        for asked in [asked for asked in self.returning if asked.reply.done]:
            self.returning.remove(asked)
            try:
                loan = asked.reply.outcome()
            except VipuError:  # refused: its owner failed a turn and was made again
                continue
            if loan is not None:
                self._submit(ReturnMachines(loan=loan, reply=Reply(waited=False)))

    @rule()
    def settle(self):
        """Let everything go, wait for every answer, and check what the clients were told."""
        failpoints.disarm()
        self.paused.clear()
        for what, name, future in self.under_way:
            try:
                self.answered.append((what, name, future.result(timeout=SETTLE_SECONDS)))
            except VipuError as error:
                self.answered.append((what, name, error))
        self.under_way.clear()
        if self.claimed:
            self.release_the_test()
            self.under_way.pop()[2].result(timeout=SETTLE_SECONDS)
        self.pod.gateway.unreachable.clear()
        self.pod.health.check_all(seconds=SETTLE_SECONDS)
        self.pod.health.check_all(seconds=SETTLE_SECONDS)  # the first resets what the returning agents' loss failed
        assert self.pod.owners.wait_quiet(SETTLE_SECONDS), "the owner is still busy"
        snapshot = self.owner().snapshot
        for what, name, outcome in self.answered:
            if what == "create" and not isinstance(outcome, VipuError) and name not in self.asked_remove and not hasattr(outcome, "reason"):
                assert name in snapshot.partitions, f"{name} was created, never removed, and is gone"
            if what == "create" and isinstance(outcome, VipuError) and name not in self.kept and not unknown(outcome):
                assert name not in snapshot.partitions, f"{name}: its create was refused ({outcome.message}), and it is there"
            if what in ("remove", "cancel") and not isinstance(outcome, VipuError):
                assert name not in snapshot.partitions, f"{name} was removed, and is there"
            if what == "template" and not isinstance(outcome, VipuError):
                gone = [p for p in name.split(",") if p not in snapshot.partitions and p not in self.asked_remove]
                assert not gone, f"a template was made, never removed, and {gone} of it are gone"
            if what == "template" and isinstance(outcome, VipuError) and not unknown(outcome):
                there = [p for p in name.split(",") if p in snapshot.partitions]
                assert not there, f"a template was refused ({outcome.message}), and {there} of it are there"
        self.answered.clear()
        for partition in snapshot.partitions.values():
            assert lifecycle.state_of(partition) not in lifecycle.BUSY, f"{partition.id} is left {partition.operation_state.value}"
        self._committed_is_visible(snapshot)
        assert not snapshot.kept_out, f"IPUs kept out of use with every agent answering: {dict(snapshot.kept_out)}"
        for n in range(1, MACHINES + 1):
            agent_id = f"ag{n}"
            wanted = {p.id for p in snapshot.partitions.values() if agent_id in p.agent_ids and p.ready_state is ReadyState.ACTIVE}
            assert self.pod.held(agent_id) == wanted, f"{agent_id} holds {sorted(self.pod.held(agent_id))}, the owner says {sorted(wanted)}"

    # What holds after every step

    @invariant()
    def no_ipu_in_two_partitions(self):
        taken: dict[tuple[str, int], str] = {}
        for partition in self.owner().snapshot.partitions.values():
            for ipu in partition.ipus:
                key = (ipu.agent_id, ipu.index)
                assert key not in taken, f"{key} is in {partition.id} and {taken[key]}"
                taken[key] = partition.id

    @invariant()
    def nothing_visible_is_uncommitted(self):
        commit = self.paused.get("store.commit")
        owner = self.owner()
        if commit is not None and commit.reached.is_set() and owner.in_turn and not self._health_under_way():
            self._committed_is_visible(owner.snapshot)  # the owner waits inside a commit: nothing moves
        elif not self.paused and not any(not f.done() for _, _, f in self.under_way) and owner.wait_quiet(0):
            self._committed_is_visible(owner.snapshot)

    def _health_under_way(self) -> bool:
        """A health pass's write of an agent's status may be the commit held (the owner may then move on)."""
        return any(what == "health" and not f.done() for what, _, f in self.under_way)

    def _committed_is_visible(self, snapshot) -> None:
        with self.pod.store.reading() as tx:
            stored = {p.id: lifecycle.state_of(p) for p in tx.list_partitions()}
        shown = {p.id: lifecycle.state_of(p) for p in snapshot.partitions.values()}
        assert shown == stored, f"readers see {shown}, the store holds {stored}"

    @invariant()
    def no_lent_machine_is_used(self):
        snapshot = self.owner().snapshot
        both = set(snapshot.lent) & set(snapshot.used)
        assert not both, f"{sorted(both)} lent to an idle-time test and used at once"

    @invariant()
    def no_partition_is_made_on_machines_under_test(self):
        snapshot = self.owner().snapshot
        if snapshot.test:
            making = {p: kind for p, kind in snapshot.busy.items() if kind in ("creating", "resetting", "relocating")}
            assert not making, f"under test, yet {making}"
            for partition in snapshot.partitions.values():
                assert partition.ready_state is not ReadyState.ACTIVE or partition.id in snapshot.busy, (
                    f"{partition.id} is ACTIVE on machines under test")


def run(store_url, examples: int, steps: int) -> None:
    OwnerMachine.store_url = store_url
    run_state_machine_as_test(OwnerMachine, settings=settings(max_examples=examples, stateful_step_count=steps, deadline=None,
                                                              suppress_health_check=list(HealthCheck)))


def test_the_owner_keeps_every_promise_on_sqlite():
    run(None, examples=40, steps=30)


@pytest.mark.postgres
def test_the_owner_keeps_every_promise_on_postgresql(postgres):
    run(lambda: postgres.url(postgres.create_database()), examples=8, steps=25)

