"""The operations on a partition, as its owner runs them a step at a time (`effects`).

Each is the sequence the life cycle (`vipu.model.lifecycle`) prescribes, written as it reads:

- create: commit (PENDING, CREATING), so its IPUs are taken; apply the settings to its agents, in
  parallel; commit (ACTIVE, IDLE). If an agent fails, what was applied is cleared again and the
  partition is abandoned (its IPUs free at once), or kept in ERROR with each agent's reason when
  its creator asked. A relocatable partition moves off the machines that failed it instead.
- reset: commit (PENDING, RESETTING), clear, apply, commit (ACTIVE, IDLE); ERROR if an agent fails.
- remove: commit REMOVING, clear, commit its removal; one an agent could not clear goes to ERROR,
  unless forced (then it is forgotten, and the health pass clears the agent when it answers).
- relocate: commit the move to new IPUs with its 'relocate' (its old IPUs stay taken until its
  old machines are cleared), clear the old machines that answer, configure the new ones.
- finish: complete what an interrupted operation left (after a restart, or a failed last write).
- grant: a waiting request's partition, committed with the end of the request, then as a create.

An ERROR partition is never configured on any agent. Errors are raised at the `yield` whose write
the store refused, or from the agents' outcomes, and reach the operation's asker.
"""

from __future__ import annotations

import logging
import time
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol

from vipu.controller.core.agents import POWER_SECONDS, AgentCall, Outcomes
from vipu.controller.core.commands import RemovePartition, Reply
from vipu.controller.core.effects import Body, Calls, Join, Operation, Write
from vipu.controller.core.placing import failed_machines, move_note, moved
from vipu.model import lifecycle
from vipu.model.compaction import BudgetSpent, Movable, Move, Plan, Report, frees_larger
from vipu.model.configuration import AgentSettings
from vipu.model.entities import Agent, OperationState, Partition
from vipu.model.errors import Conflict, HardwareFailure, NoRoom, Unavailable, VipuError
from vipu.model.hardware import PowerAction
from vipu.model.placement import Placement, shifted, try_place
from vipu.model.queue import WaitingRequest
from vipu.model.reasons import span
from vipu.model.times import utc_text

if TYPE_CHECKING:
    from vipu.controller.core.state import AllocationState

POWER_MARGIN_SECONDS = 60.0  # beyond a power action's own limit, before the machines it holds down are let go regardless
log = logging.getLogger("vipu.controller.core")


class Owner(Protocol):
    """What an operation asks of the owner of its allocation (`steps.Steps` is what gives it): the
    state it decides on, the writes and agent calls its steps are made of, and what it tells the
    owner it has done. Operations take their owner as this, so that they depend on no part of it."""

    id: str
    state: AllocationState
    on_partition: dict[str, Operation]  # partition id -> the operation holding it

    def partition(self, partition_id: str) -> Partition | None: ...
    def agents_of(self, partition: Partition) -> list[Agent]: ...
    def call(self, agent: Agent, settings: AgentSettings | None = None, partition_id: str = "") -> AgentCall: ...
    def applying(self, partition: Partition, agents: list[Agent], of_all: list[Agent] | None = None) -> Calls: ...
    def clearing(self, partition_id: str, agents: list[Agent]) -> Calls: ...
    def clears_under_way(self, partition_id: str, agents: list[Agent]) -> list[Operation]: ...
    def cleared(self, agent_id: str, partition_id: str) -> None: ...
    def keep_uncleared_of(self, agent_id: str, partition: Partition) -> None: ...
    def compaction_spent(self) -> BudgetSpent: ...
    def transit(self, partition: Partition, *transitions: tuple[str, dict[str, Any]]) -> Write: ...
    def inserting(self, partition: Partition) -> Write: ...
    def moving(self, partition: Partition, fields: dict[str, Any]) -> Write: ...
    def forgetting(self, partition: Partition, uncleared: list[str]) -> Write: ...
    def granting(self, request: WaitingRequest, partition: Partition) -> Write: ...
    def unlinger(self, partition_id: str) -> None: ...
    def ended(self, request: WaitingRequest, ending: VipuError) -> None: ...
    def start(self, operation: Operation, holds: tuple[str, ...] = ()) -> Operation: ...

Failures = dict[str, VipuError]


def _failures(agents: list[Agent], outcomes: Outcomes) -> Failures:
    return {agent.id: error for agent, error in zip(agents, outcomes, strict=True) if error is not None}


def configure(owner: Owner, partition: Partition, on_failure: str) -> Body:
    """Apply the partition's settings to its agents and make it ACTIVE. If any agent fails, what
    was applied is cleared again and the partition takes the transition `on_failure` ('abandon':
    it is forgotten, its IPUs free; 'fail': it stays in ERROR), and the error is raised."""
    agents = owner.agents_of(partition)
    clears = owner.clears_under_way(partition.id, agents)
    if clears:  # old settings of its id are being cleared there: those calls first
        yield Join(clears)
    failures = _failures(agents, (yield owner.applying(partition, agents)))
    if failures:
        undone = _failures(agents, (yield owner.clearing(partition.id, agents)))
        for agent_id, error in undone.items():
            if agent_id not in failures:
                log.warning("could not undo partition %s on agent %s: %s", partition.id, agent_id, error.message)
        summary = (f"partition {partition.id} is in ERROR" if on_failure == "fail"
                   else f"partition {partition.id} could not be created and was not kept")
        raise (yield from fail(owner, partition, failures, summary, on_failure))
    partition = yield owner.transit(partition, ("configured", {"errors": []}))
    log.info("partition %s is ACTIVE on %s", partition.id, ", ".join(partition.agent_ids))
    return partition


def fail(owner: Owner, partition: Partition, failures: Failures, summary: str, transition: str, hint: str = "") -> Body:
    """Record the agents' reasons by the transition 'fail' (ERROR) or 'abandon' (gone); returns the
    error to raise, `summary: reasons`."""
    reasons = [f"agent {agent_id}: {error.message}" for agent_id, error in sorted(failures.items())]
    yield owner.transit(partition, (transition, {"errors": reasons if transition == "fail" else None}))
    family = Unavailable if all(e.temporary for e in failures.values()) else HardwareFailure
    log.warning("partition %s: %s", partition.id, "; ".join(reasons))
    return family(f"{summary}: {'; '.join(reasons)}{hint}")


def create(owner: Owner, partition: Partition, keep_on_error: bool) -> Body:
    """A partition placed by the owner: recorded, then configured."""
    yield owner.inserting(partition)
    return (yield from configure_new(owner, partition, keep_on_error))


def grant(owner: Owner, request: WaitingRequest, partition: Partition) -> Body:
    """A waiting request's partition, recorded in the transaction that ends the request, then
    configured as a create is. Should the request's row have gone meanwhile (its allocation
    removed), it waits no more; should the store refuse otherwise, it waits on for the next pass."""
    yield owner.granting(request, partition)
    log.info("partition %s of %d IPUs starts in allocation %s after waiting %.1f s", partition.id, partition.size,
             partition.allocation_id, (datetime.now(UTC) - request.since).total_seconds())
    try:
        return (yield from configure_new(owner, partition, request.keep_on_error))
    except VipuError as error:
        if owner.partition(partition.id) is None:
            owner.ended(request, error)  # for its waiting clients: no partition came of it
        raise


def configure_new(owner: Owner, partition: Partition, keep_on_error: bool) -> Body:
    """Configure a partition just recorded (PENDING, CREATING); a relocatable one that fails at some
    machines moves off them, and is kept in ERROR if asked, or else removed, if it can move nowhere."""
    if not partition.relocatable:
        return (yield from configure(owner, partition, "fail" if keep_on_error else "abandon"))
    try:
        return (yield from configure(owner, partition, "fail"))
    except VipuError as failure:
        moved_partition = yield from moved_after_failure(owner, partition.id, failure)
        if moved_partition is not None:
            return moved_partition
        if keep_on_error:
            raise
        current = owner.partition(partition.id)
        if current is None:
            raise
        current = yield from begin_remove(owner, current)
        yield from finish_remove(owner, current, force=True)
        reasons = "; ".join(current.errors) or failure.message
        raise type(failure)(f"partition {partition.id} could not be created and was not kept: {reasons}") from None


def reset(owner: Owner, partition: Partition, automatic: bool, power_cycle: bool = False) -> Body:
    """Clear and configure the partition again; `automatic` counts it as an automatic reset. A
    relocatable one its user resets is configured elsewhere instead if that leaves a larger shape
    free, within the compaction budget (`compacter_place`). With `power_cycle`, a configuration
    that fails is followed by a power cycle of its machines and one more configuration
    (`power_cycled_reset`)."""
    elsewhere = None if automatic else compacter_place(owner, partition)
    if elsewhere is not None:
        log.info("partition %s: reset where it leaves a larger shape free", partition.id)
        return (yield from relocate(owner, partition, set(), "reset where it leaves a larger shape free", because_failed=False,
                                    target=elsewhere, compacting=True))
    partition = yield owner.transit(partition, ("reset", {"auto_reset_count": partition.auto_reset_count + 1 if automatic else None}))
    agents = owner.agents_of(partition)
    failures = _failures(agents, (yield owner.clearing(partition.id, agents)))
    if failures:
        raise (yield from fail(owner, partition, failures, f"cannot reset partition {partition.id}", "fail"))
    try:
        return (yield from configure(owner, partition, "fail"))
    except VipuError as failure:
        current = owner.partition(partition.id)
        if automatic and current is not None and current.power_cycled is not None:
            log.warning("partition %s: the reset did not bring it back, and its machines were power cycled once already (%s): "
                        "it is left to its user", partition.id, utc_text(current.power_cycled))
        if not power_cycle or current is None or lifecycle.state_of(current) != lifecycle.ERROR_FAILED:
            raise
        log.warning("partition %s: the reset did not bring it back (%s); power cycling %s", partition.id, failure.message,
                    ", ".join(current.agent_ids))
    return (yield from power_cycled_reset(owner, current))


def planned(state: AllocationState, partition: Partition, target: Placement) -> Placement:
    """A planned place for a partition, if it is still free now: off the IPUs in use (its own
    included, which it keeps until it has moved) and held, on machines that answer and are not
    draining (nor under test alone), and links not quarantined, nor kept for a reservation; NoRoom saying what changed
    otherwise."""
    taken = [(ipu.agent_id, ipu.index) for ipu in target.ipus
             if ipu.index in state.used.get(ipu.agent_id, ()) or (ipu.agent_id, ipu.index) in state.held]
    machines = {ipu.agent_id for ipu in target.ipus}
    down, draining = sorted(machines & state.down), sorted(machines & (state.draining.keys() | state.claimed.keys()) - state.down)
    quarantined = state.links.met(state.layout, [(ipu.agent_id, ipu.index) for ipu in target.ipus])[0]
    kept = state.kept_for_move(partition, time.time())
    reserved = sorted({kept[ipu].name for ipu in ((i.agent_id, i.index) for i in target.ipus) if ipu in kept})
    if taken or down or draining or quarantined or reserved:
        what = (f"{span(state.layout, set(taken))} was taken meanwhile" if taken else
                f"agent {', '.join(down)} is down" if down else f"agent {', '.join(draining)} is being drained" if draining else
                f"it is kept for reservation {', '.join(reserved)}" if reserved else
                f"it needs quarantined link {', '.join(map(str, quarantined))}")
        raise NoRoom(f"the planned place of partition {partition.id} is no longer free: {what}")
    return target


def placed_elsewhere(owner: Owner, partition: Partition) -> Placement | None:
    """Where placement would put the partition now among the IPUs free (none of its own, which
    it keeps until it has moved, none held for the queue or kept for a reservation, no machine
    down, no quarantined link, suspect ones while it can), off the machines that failed it while other room is left (as
    `placing.moved` keeps off them); None if nothing is free for it."""
    state = owner.state
    allowed = set(state.allocation.agent_ids) - state.unplaceable()
    taken = state.taken_for_move(partition, time.time())
    for machines in (allowed - set(partition.failed_on), allowed) if partition.failed_on else (allowed,):
        placement = try_place(state.layout, machines, taken, partition.size, num_gcds=partition.num_gcds,
                              num_segments=partition.num_segments, ipulink_routing=partition.ipulink_routing,
                              gw_routing=partition.gw_routing, faults=state.links, mix=state.mix)
        if placement is not None:
            return placement
    return None


def compacter_place(owner: Owner, partition: Partition) -> Placement | None:
    """Where a relocatable partition its user resets goes instead of its IPUs, when placement
    there (`placed_elsewhere`) leaves a larger partition room to fit than its own IPUs do and the
    compaction budget allows the move, and no compaction is under way (whose planned places it
    could take); None if it stays."""
    state = owner.state
    if (not partition.relocatable or state.compactions or set(partition.agent_ids) & state.down
            or owner.compaction_spent().refusal(partition.id, time.time())):
        return None
    placement = placed_elsewhere(owner, partition)
    if placement is None:
        return None
    allowed = set(state.allocation.agent_ids) - state.unplaceable()
    larger = frees_larger(state.layout, allowed, state.taken(), off=((ipu.agent_id, ipu.index) for ipu in partition.ipus),
                          on=((ipu.agent_id, ipu.index) for ipu in placement.ipus), faults=state.links)
    return placement if larger else None


def power_cycled_reset(owner: Owner, partition: Partition) -> Body:
    """Power cycle the partition's machines and configure it again: what an operator does when a
    reset does not bring a partition back. Recorded on the partition (`power_cycled`), so it is
    done once in its life; not done if another partition is on its machines now. The machines are
    kept out of placement, and deaf to health passes, until it is done."""
    state, machines = owner.state, sorted(set(partition.agent_ids))
    others = sorted({other.id for agent_id in machines for other in state.on_agent(agent_id) if other.id != partition.id})
    if others:
        raise HardwareFailure(f"partition {partition.id} is in ERROR; its machines were not power cycled, as they now hold "
                              f"{', '.join(others)} too")
    token = object()
    state.keep_down_for_power(machines, time.monotonic() + POWER_SECONDS + POWER_MARGIN_SECONDS, token)
    configured = False
    try:
        partition = yield owner.transit(partition, ("reset", {"power_cycled": datetime.now(UTC)}))
        agents = owner.agents_of(partition)
        failures = _failures(agents, (yield Calls([AgentCall(a.id, a.host, a.port, power=PowerAction.CYCLE) for a in agents])))
        if failures:
            raise (yield from fail(owner, partition, failures, f"cannot power cycle the machines of partition {partition.id}", "fail"))
        partition = yield from configure(owner, partition, "fail")
        configured = True
        return partition
    finally:
        state.release_power(machines, token, answering=machines if configured else ())


def remove(owner: Owner, partition: Partition, force: bool) -> Body:
    """Clear a partition from its agents and forget it; forced, forget it whatever the agents
    answer. Returns the agents that did not confirm the clear (forced only)."""
    partition = yield from begin_remove(owner, partition)
    return (yield from finish_remove(owner, partition, force))


def begin_remove(owner: Owner, partition: Partition) -> Body:
    """Record that the partition is being removed. One that an interrupted create or reset left
    PENDING is failed first, as the life cycle removes only settled partitions."""
    state = lifecycle.state_of(partition)
    if state in (lifecycle.ACTIVE_REMOVING, lifecycle.ERROR_REMOVING):
        return partition  # a remove interrupted earlier: this one finishes it
    if state in lifecycle.BUSY:
        interrupted = f"its {partition.operation_state.value.lower()} was interrupted"
        return (yield owner.transit(partition, ("fail", {"errors": [interrupted]}), ("remove", {})))
    return (yield owner.transit(partition, ("remove", {})))


def finish_remove(owner: Owner, partition: Partition, force: bool) -> Body:
    agents = owner.agents_of(partition)
    failures = _failures(agents, (yield owner.clearing(partition.id, agents)))
    if failures and not force:
        raise (yield from fail(owner, partition, failures, f"cannot remove partition {partition.id}", "fail",
                               hint="; remove it with --force to forget it anyway"))
    for agent_id, error in failures.items():
        log.warning("partition %s forgotten while agent %s still may hold it (its IPUs there stay out of use until it is seen "
                    "cleared): %s", partition.id, agent_id, error.message)
    yield owner.forgetting(partition, sorted(failures))
    log.info("partition %s removed", partition.id)
    return sorted(failures)


def relocate(owner: Owner, partition: Partition, avoid: set[str], why: str, automatic: bool = False,
             because_failed: bool = True, target: Placement | None = None, compacting: bool = False) -> Body:
    """Move a settled partition off the machines `avoid` (and any machine down), to other IPUs of
    its allocation, and configure it there. `because_failed`: the machines of `avoid` failed it,
    and are kept off while other room is left. NoRoom if the allocation has no room for it
    elsewhere; the configuration's failure (the partition then in ERROR on its new IPUs) if that
    fails. Its old IPUs stay taken until its reachable old machines are cleared, so that nothing is
    placed on settings still there; an old machine that is down is cleared by the health pass
    when it answers again. With a `target` (compaction's plan), it moves there, or NoRoom if
    that is no longer free. `compacting`: the move is compaction's, spent from its budget and
    recorded on the partition (`compacted`) in the same write."""
    state = owner.state
    first = state.queue.first()
    if target is not None:
        placement = planned(state, partition, target)
    else:
        kept = state.kept_for_move(partition, time.time())
        placement = moved(state.layout, state.allocation, partition, shifted(state.used, on=kept) if kept else state.used,
                          state.holders(), state.held, state.held_for or (first.partition_id if first is not None else ""), avoid,
                          state.unplaceable(),
                          state.links)
    fields: dict[str, Any] = {"ipus": list(placement.ipus), "relocation": move_note(state.layout, partition, placement, why)}
    if because_failed:
        fields["failed_on"] = tuple(sorted(set(partition.failed_on) | avoid))
    if automatic:
        fields["auto_reset_count"] = partition.auto_reset_count + 1
    if compacting:
        fields["compacted"] = datetime.now(UTC)
    if {(ipu.agent_id, ipu.index) for ipu in placement.ipus} & state.held:  # that request is held another shape, at the next pass
        state.held = frozenset()
    spent = owner.compaction_spent() if compacting else None  # counted from the partitions as they were before this move
    before = partition
    partition = yield owner.moving(partition, fields)
    if spent is not None:
        spent.spend(partition.id, fields["compacted"].timestamp())
    log.warning("partition %s %s", partition.id, partition.relocation)
    uncleared = set(before.agent_ids)
    try:
        reachable = [agent for agent in owner.agents_of(before) if agent.answering and agent.id not in state.down]
        failures = _failures(reachable, (yield owner.clearing(partition.id, reachable)))
        uncleared = {agent.id for agent in owner.agents_of(before)} - {agent.id for agent in reachable if agent.id not in failures}
        for agent_id in sorted(uncleared):
            reason = failures[agent_id].message if agent_id in failures else "it does not answer"
            log.warning("partition %s moved; agent %s may still hold its old settings, and its old IPUs there stay out of use "
                        "until the health pass sees them cleared: %s", partition.id, agent_id, reason)
    finally:
        for agent_id in uncleared - set(partition.agent_ids):
            owner.keep_uncleared_of(agent_id, before)
        owner.unlinger(partition.id)
    return (yield from configure(owner, partition, "fail"))


FENCE_SECONDS = 60.0  # how long an idle partition's machines refuse IPUoF attaches while compaction moves it


def compact(owner: Owner, plan: Plan, spent: BudgetSpent, asked_by: str) -> Body:
    """Carry out a compaction plan one move at a time, each an operation on its partition, checked
    when it comes: the partition still where the plan found it and ACTIVE, the budget allowing it,
    its place still free. It stops at the first move that may not or does not happen, and says why."""
    moved: list[str] = []
    why = f"compaction{f' asked by {asked_by}' if asked_by else ''}, freeing {plan.size} IPUs at {span(owner.state.layout, plan.shape)}"
    for move in plan.moves:
        partition = owner.partition(move.partition_id)
        stop = _not_moving(owner, partition, move, spent)
        if stop:
            return Report(owner.id, owner.state.layout, plan, dry_run=False, moved=tuple(moved), stopped=stop)
        assert partition is not None
        child = owner.start(Operation("compacting", compaction_move(owner, partition, move, why), partition_id=partition.id))
        (error,) = yield Join([child])
        if error is not None:
            return Report(owner.id, owner.state.layout, plan, dry_run=False, moved=tuple(moved),
                          stopped=f"partition {partition.id} did not move: {getattr(error, 'message', error)}")
        moved.append(partition.id)
    log.info("allocation %s compacted: %s moved, freeing %d IPUs at %s", owner.id, ", ".join(moved), plan.size,
             span(owner.state.layout, plan.shape))
    return Report(owner.id, owner.state.layout, plan, dry_run=False, moved=tuple(moved))


def apply_template(owner: Owner, template: str, partitions: list[Partition]) -> Body:
    """A template's partitions, placed together by the owner: each created as a create is, at once,
    and should any not be made (a machine refuses it, the store refuses its row), the others are
    removed again, so that the template is made whole or not at all. The partitions as made."""
    children = [owner.start(Operation("creating", create(owner, partition, keep_on_error=False), partition_id=partition.id))
                for partition in partitions]
    errors = yield Join(children)
    failed = [(partition, error) for partition, error in zip(partitions, errors, strict=True) if error is not None]
    # Its own partitions, by their attach keys: one removed meanwhile may have been made again by someone else.
    made = [current for partition in partitions
            if (current := owner.partition(partition.id)) is not None and current.attach_key == partition.attach_key]
    if not failed:
        log.info("template %s made in allocation %s: %s", template, owner.id, ", ".join(p.id for p in made))
        return made
    left: list[str] = []  # made, and not removed again
    # One under an operation that waited for its create (a forced remove, a change of consent) is
    # removed after it, by a forced remove waiting as that operation's followers do.
    behind = [partition.id for partition in made if partition.id in owner.on_partition]
    for partition_id in behind:
        owner.on_partition[partition_id].followers.append(RemovePartition(partition_id=partition_id, force=True,
                                                                          reply=Reply(waited=False)))
    made = [partition for partition in made if partition.id not in behind]
    removals = []
    for partition in made:
        try:
            removals.append(owner.start(Operation("removing", remove(owner, partition, force=True), partition_id=partition.id)))
        except Unavailable:  # the allocation's limit of operations under way, reached meanwhile
            left.append(partition.id)
    if removals:
        errors = yield Join(removals)
        left += [removal.partition_id for removal, error in zip(removals, errors, strict=True) if error is not None]
    partition, error = failed[0]
    reason = getattr(error, "message", str(error))
    others = f" (and {len(failed) - 1} more)" if len(failed) > 1 else ""
    undone = f"; the {len(made) - len(left)} made with it were removed" if len(made) > len(left) else ""
    undone += f"; {', '.join(behind)} will be, after the operation under way on {'them' if len(behind) > 1 else 'it'}" if behind else ""
    ending = f"; {', '.join(left)} could not be removed: remove them by hand" if left else "" if behind else "; nothing was made"
    family = type(error) if isinstance(error, VipuError) else Unavailable
    raise family(f"template {template}: partition {partition.id} could not be made{others}: {reason}{undone}{ending}")


def movable(owner: Owner, spent: BudgetSpent, now: float) -> dict[str, Movable]:
    """The partitions compaction may move now (`not_movable`), as the planner sees them."""
    return {p.id: Movable(p.id, frozenset((i.agent_id, i.index) for i in p.ipus), p.num_gcds, p.num_segments, p.ipulink_routing)
            for p in owner.state.partitions.values() if not not_movable(owner, p, spent, now)}


def not_movable(owner: Owner, partition: Partition, spent: BudgetSpent, now: float) -> str:
    """Why compaction may not move this partition now, in one line; empty if it may: only a
    relocatable, ACTIVE partition no operation holds, as the budget allows."""
    if not partition.relocatable:
        return f"partition {partition.id} is not relocatable"
    if partition.id in owner.on_partition or lifecycle.state_of(partition) != lifecycle.ACTIVE_IDLE:
        return f"partition {partition.id} is busy or not ACTIVE"
    return spent.refusal(partition.id, now)


def _not_moving(owner: Owner, partition: Partition | None, move: Move, spent: BudgetSpent) -> str:
    """Why a planned move may not be made now, in one line; empty if it may."""
    if partition is None:
        return f"partition {move.partition_id} is gone"
    if frozenset((ipu.agent_id, ipu.index) for ipu in partition.ipus) != move.before:
        return f"partition {partition.id} has moved since the plan was made"
    return not_movable(owner, partition, spent, time.time())


def compaction_move(owner: Owner, partition: Partition, move: Move, why: str) -> Body:
    """One move of a compaction plan: only while idle (`fenced`), then to the planned place, which
    is checked free before any fence is made."""
    planned(owner.state, partition, move.after)
    partition = yield from fenced(owner, partition)
    return (yield from relocate(owner, partition, set(), why, because_failed=False, target=move.after, compacting=True))


def fenced(owner: Owner, partition: Partition) -> Body:
    """A partition about to move of its own accord (not because it failed): unless its owner
    consented to moves while attached, only if no IPUoF client is attached at any of its machines,
    which then refuse attaches until it has moved (`FENCE_SECONDS` at most). A Conflict names an
    attached client: found by a look at every machine first, or by the fence itself (a client
    attaching meanwhile), whose fences made at the other machines are then lifted. The partition
    as it is then."""
    if partition.may_move:
        return partition
    agents = owner.agents_of(partition)
    looked = [outcome for outcome in (yield Calls([AgentCall(a.id, a.host, a.port, partition_id=partition.id, checking=True)
                                                    for a in agents])) if outcome is not None]
    if looked:  # refused before any fence is made (a move tried at every health pass is refused so, quietly)
        raise ([r for r in looked if isinstance(r, Conflict)] or looked)[0]  # an attached client first, then a machine's failure
    outcomes = yield Calls([AgentCall(a.id, a.host, a.port, partition_id=partition.id, fence_seconds=FENCE_SECONDS)
                            for a in agents])
    refusals = [outcome for outcome in outcomes if outcome is not None]
    if refusals:
        fenced_at = [agent for agent, outcome in zip(agents, outcomes, strict=True) if outcome is None]
        if fenced_at:  # it does not move: its settings applied again lift the fences that were made (they would lapse anyway)
            yield owner.applying(partition, fenced_at, of_all=agents)
        attached = [r for r in refusals if isinstance(r, Conflict)]
        raise (attached or refusals)[0]
    current = owner.partition(partition.id)
    if current is None:
        raise NoRoom(f"partition {partition.id} is gone")
    return current


def off_unhealthy_links(owner: Owner, partition: Partition) -> Body:
    """A relocatable partition running over a link gone bad (failed or suspect), moved while idle
    to IPUs of its allocation whose links are all healthy, keeping off those held for the queue.
    NoRoom if there are none; a Conflict while a client is attached (it is tried at the next health
    pass)."""
    state = owner.state
    warnings = state.links.warnings(state.layout, [(ipu.agent_id, ipu.index) for ipu in partition.ipus])
    placement = placed_elsewhere(owner, partition)
    if placement is None or state.links.warnings(state.layout, [(ipu.agent_id, ipu.index) for ipu in placement.ipus]):
        raise NoRoom(f"partition {partition.id}: no room away from its unhealthy links")
    partition = yield from fenced(owner, partition)
    return (yield from relocate(owner, partition, set(), f"away from an unhealthy link ({warnings[0]})", because_failed=False,
                                target=placement))


def off_draining(owner: Owner, partition: Partition) -> Body:
    """A relocatable partition on a machine its operator drains, moved while idle to IPUs of its
    allocation elsewhere, keeping off those held for the queue (as `off_unhealthy_links` moves
    one). NoRoom if there are none; a Conflict while a client is attached (it is tried at the
    next health pass)."""
    state = owner.state
    drained = sorted(set(partition.agent_ids) & state.draining.keys())
    if not drained:
        return None  # resumed meanwhile
    why = f"off agent {drained[0]}, {state.draining[drained[0]].describe()}"
    no_room = NoRoom(f"partition {partition.id}: no room off the machines being drained ({', '.join(drained)})")
    if placed_elsewhere(owner, partition) is None:
        raise no_room  # before any fence is made
    partition = yield from fenced(owner, partition)
    placement = placed_elsewhere(owner, partition)  # again: another move off the machine may have taken that place meanwhile
    if placement is None:
        yield owner.applying(partition, owner.agents_of(partition))  # its fences lifted (they would lapse anyway)
        raise no_room
    return (yield from relocate(owner, partition, set(), why, because_failed=False, target=placement))


def moved_after_failure(owner: Owner, partition_id: str, failure: VipuError, attempts: int = 2) -> Body:
    """A relocatable partition that failed at some agents, now in ERROR, moved off them and
    configured elsewhere; None if its allocation has no room elsewhere, or it failed there too."""
    for _ in range(attempts):
        current = owner.partition(partition_id)
        if current is None or lifecycle.state_of(current) != lifecycle.ERROR_FAILED:
            return None
        try:
            return (yield from relocate(owner, current, failed_machines(current, owner.state.down),
                                        "; ".join(current.errors) or failure.message))
        except NoRoom as refusal:
            log.info("partition %s stays in ERROR: %s", partition_id, refusal.message)
            return None
        except VipuError as again:  # it failed on its new machines too: those are avoided next
            failure = again
    return None


def relocate_asked(owner: Owner, partition: Partition, asked_by: str, automatic: bool, only_off_failed: bool) -> Body:
    """A move someone asked for: off the machines that failed the partition, or off all of its own
    when none did; with `only_off_failed` (the published API's reset with `relocatable`), a
    partition that no machine failed is reset instead (`reset`: in place, or where it leaves a
    larger shape free)."""
    failed = failed_machines(partition, owner.state.down)
    if not failed and only_off_failed:
        return (yield from reset(owner, partition, automatic))
    if failed:
        why = "; ".join(partition.errors) or f"{', '.join(sorted(failed))} failed"
    else:
        why = f"asked by {asked_by}" if asked_by else "asked for"
    return (yield from relocate(owner, partition, failed or set(partition.agent_ids), why, automatic, because_failed=bool(failed)))


def finish(owner: Owner, partition: Partition) -> Body:
    """Finish the interrupted operation of a partition that no operation owns any more."""
    interrupted = partition.operation_state
    if interrupted is OperationState.REMOVING:
        yield from finish_remove(owner, partition, force=True)
    else:
        yield from configure(owner, partition, "abandon" if interrupted is OperationState.CREATING else "fail")
    log.info("finished the interrupted %s of partition %s", interrupted.value.lower(), partition.id)


def mark_lost(owner: Owner, partition: Partition, reason: str) -> Body:
    """An ACTIVE partition one of whose agents stopped answering or lost its settings goes to ERROR
    with the reason, and is cleared from its agents that answer: an ERROR partition is configured
    nowhere (so a disruptive test may then take its machines)."""
    yield owner.transit(partition, ("lost", {"errors": [reason]}))
    log.warning("partition %s goes to ERROR: %s", partition.id, reason)
    answering = [agent for agent in owner.agents_of(partition) if agent.id not in owner.state.down]
    if answering:
        for agent_id, error in _failures(answering, (yield owner.clearing(partition.id, answering))).items():
            log.warning("partition %s: could not clear it from agent %s: %s", partition.id, agent_id, error.message)


def clear_again(owner: Owner, agent: Agent, partition_ids: list[str]) -> Body:
    """Ask a machine once more to clear what it did not confirm clearing (it did not answer then):
    the IPUs kept out for it come back as soon as it answers. Not answering yet is no news."""
    outcomes = yield Calls([owner.call(agent, partition_id=p) for p in partition_ids])
    for partition_id, error in zip(partition_ids, outcomes, strict=True):
        if error is None:
            owner.cleared(agent.id, partition_id)


def reconcile(owner: Owner, agent: Agent, stray: list[str], lost: list[tuple[Partition, AgentSettings]]) -> Body:
    """Make one agent hold what the owner's state says: clear what it should not hold, apply again
    what it lost (an ACTIVE partition whose settings it cannot take back goes to ERROR)."""
    calls = [owner.call(agent, partition_id=p) for p in stray] + [owner.call(agent, settings=s) for _, s in lost]
    outcomes = yield Calls(calls)
    for partition_id, error in zip(stray, outcomes[:len(stray)], strict=True):
        if error is None:
            log.info("agent %s: cleared partition %s, which the store does not hold as active", agent.id, partition_id)
            owner.cleared(agent.id, partition_id)
        else:
            log.warning("agent %s: could not clear partition %s: %s", agent.id, partition_id, error.message)
    for (partition, _), error in zip(lost, outcomes[len(stray):], strict=True):
        if error is None:
            log.info("agent %s: re-applied partition %s", agent.id, partition.id)
            continue
        current = owner.partition(partition.id)
        if current is not None and lifecycle.state_of(current) == lifecycle.ACTIVE_IDLE:
            yield from mark_lost(owner, current, f"agent {agent.id}: {error.message}")


def quietly(body: Body, partition_id: str, what: str) -> Body:
    """An operation of the owner's own upkeep: its failure is logged, not raised (nobody asked for it)."""
    try:
        return (yield from body)
    except NoRoom as refusal:  # it waits in ERROR for room, or for its machines to answer again
        log.debug("partition %s cannot move yet: %s", partition_id, refusal.message)
    except VipuError as error:
        log.warning("partition %s: %s failed: %s", partition_id, what, error.message)
    return None
