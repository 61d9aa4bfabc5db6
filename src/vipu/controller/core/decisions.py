"""What an owner decides of each command: create, remove, reset, move, cancel, a cluster test's
claim and release, lending free machines to an idle-time test, what a health pass found,
finishing, recovering, and closing the allocation."""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable, Mapping, Set
from typing import Any, ClassVar

from vipu.controller.core import operations
from vipu.controller.core.commands import (
    AccountsChanged,
    AgentReport,
    ApplyTemplate,
    CancelRequest,
    ClaimMachines,
    CloseAllocation,
    Command,
    CompactAllocation,
    CreatePartition,
    DrainsChanged,
    FinishInterrupted,
    LendMachines,
    LinksChanged,
    Powering,
    RecoverFailed,
    ReleaseMachines,
    RelocatePartition,
    RemovePartition,
    Reserve,
    ResetPartition,
    ReturnMachines,
    Unreserve,
    UpdatePartition,
)
from vipu.controller.core.effects import Body, Join, Operation, Write
from vipu.controller.core.lending import Loan
from vipu.controller.core.placing import (
    LOST,
    due_for_relocation,
    due_for_reset,
    due_to_leave_draining,
    due_to_leave_unhealthy_links,
    partition_of,
    place_request,
)
from vipu.controller.core.queueing import Queue
from vipu.controller.core.sharing import Sharing
from vipu.controller.core.state import REMOVAL_RETRY_SECONDS
from vipu.controller.core.steps import Steps
from vipu.controller.core.turns import OPERATIONS_LIMIT, TurnEngine
from vipu.model import lifecycle
from vipu.model.clustertests import TESTED_ALONE, not_drained
from vipu.model.compaction import Report, plan_compaction
from vipu.model.entities import IPUS_PER_MACHINE, MAX_AUTO_RESETS, Access, Partition, PartitionRequest, ReadyState, shown
from vipu.model.errors import AlreadyExists, Conflict, InvalidArgument, NoRoom, NotFound, PermissionDenied, Unavailable, VipuError
from vipu.model.fragmentation import SizeMix
from vipu.model.hardware import Capability
from vipu.model.placement import Occupancy, Placement, shapes, shifted, try_place
from vipu.model.reasons import held_clause, span
from vipu.model.reservations import Ipu, Reservation, check_reservation, kept_refusal
from vipu.model.times import utc_text

log = logging.getLogger("vipu.controller.core")

REFUSALS_REMEMBERED = 256  # refused requests whose asking again the size mix does not count twice


class Decisions:
    """What the owner decides of each command, on its engine's state: the operations it starts
    are the engine's, their steps `Steps`, and a request that must wait goes to the `Queue`."""

    def __init__(self, engine: TurnEngine, steps: Steps, queue: Queue, sharing: Sharing):
        self.engine = engine
        self.steps = steps
        self.queue = queue
        self.sharing = sharing
        self.id = engine.id
        self.state = engine.state
        self.owners = engine.owners
        self.changes = engine.changes
        self.start = engine.start  # begin an operation in this turn
        self.on_partition = engine.on_partition  # partition id -> the operation holding it
        self.under_way = engine.under_way  # every operation started and not ended
        self.clears = engine.clears  # (agent, partition id) -> the reconciliation clearing old settings there

    def decide(self, command: Command) -> None:
        self._HANDLERS[type(command)](self, command)

    def _visible(self, partition_id: str, access: Access) -> Partition:
        partition = self.state.partitions.get(partition_id)
        if partition is None or not access.may_use(self.id):
            raise NotFound(f"partition {shown(partition_id)} does not exist")
        return partition

    def _holding(self, partition_id: str, command: Command, wait: bool) -> bool:
        """Whether an operation holds the partition: then the command waits for it to end (when
        `wait`, or behind the owner's own upkeep) or is refused as busy."""
        operation = self.on_partition.get(partition_id)
        if operation is None:
            return False
        if wait or operation.system:
            command.reply.requeue()
            operation.followers.append(command)
            return True
        raise Conflict(f"partition {partition_id} is busy ({operation.kind})")

    @staticmethod
    def _refuse_if_busy(partition: Partition) -> None:
        if lifecycle.state_of(partition) in lifecycle.BUSY:
            raise Conflict(f"partition {partition.id} is busy ({partition.operation_state.value.lower()})")

    def _refuse_if_tested(self) -> None:
        """Refused while a disruptive test holds the machines, or the allocation is being removed."""
        if self.state.closing:
            raise Conflict(f"allocation {self.id} is being removed")
        if self.state.test:
            raise Conflict(f"{self.state.test} is under test; no partition is configured in it until the test ends")

    def _create(self, command: CreatePartition) -> None:
        request = command.request
        if self.state.closing:
            raise Conflict(f"allocation {self.id} is being removed")
        if request.id in self.state.partitions or self.state.queue.get(request.id) is not None:
            raise AlreadyExists(f"partition {request.id} already exists")
        self.sharing.assign(request, command.access)  # first: a reservation may be for the account
        self._check_reservation_user(request, command.access)
        try:
            self.sharing.refuse_over_quota(request)
            partition = self._place_new(request, command.access)
        except NoRoom as refusal:
            if not command.may_queue:
                raise
            self.state.refused.pop((request.id, request.size), None)  # it waits, counted once: asking again is refused as existing
            self.start(Operation("queueing", self.queue.enqueue(command, refusal), command.reply))
            command.placed = True
            return
        self.start(Operation("creating", operations.create(self.steps, partition, command.keep_on_error), command.reply, partition.id))
        command.placed = True

    def _place_new(self, request: PartitionRequest, access: Access) -> Partition:
        state = self.state
        if state.test:
            raise NoRoom(f"{state.test} is under test; no partition can be created in it until the test ends")
        asked = (request.id, request.size)
        mix = state.mix if asked in state.refused else state.mix.saw(request.size)
        try:
            placement = self._placed(request, mix)  # InvalidArgument: not counted in the mix
        except NoRoom:
            state.mix = mix
            state.refused.pop(asked, None)  # the latest refusals are remembered longest
            state.refused[asked] = None
            if len(state.refused) > REFUSALS_REMEMBERED:
                del state.refused[next(iter(state.refused))]
            raise
        state.mix = mix
        state.refused.pop(asked, None)
        return partition_of(request, access.user_id, state.allocation, placement)

    def _placed(self, request: PartitionRequest, mix: SizeMix, used: Mapping[str, Set[int]] | None = None) -> Placement:
        """The request placed as `_placed_around` places it (among the IPUs free in `used`, by
        default those of the state), kept off the IPUs of reservations it may not use
        (`AllocationState.kept_for_reservations`); where they alone keep it off, the refusal names
        the reservations holding free IPUs, and why it may not use them."""
        state, now = self.state, time.time()
        used = state.used if used is None else used
        named = self._reservation_of(request, now)
        kept = state.kept_for_reservations(request.reservation, request.expected_seconds, now)
        if not kept:
            return self._placed_around(request, mix, used)

        def holders() -> dict[Ipu, str]:
            """Who keeps each IPU from it, reservations too, for a refusal's "it fits when ... are removed"."""
            holding = state.holders()
            return {**holding, **{ipu: f"{holding[ipu]} and reservation {r.name}" if ipu in holding else f"reservation {r.name}"
                                  for ipu, r in kept.items()}}

        try:
            return self._placed_around(request, mix, shifted(used, on=kept), holders)
        except NoRoom as refusal:
            if named is not None:
                raise NoRoom(self.queue.refusal_in(request, named, kept, Occupancy(state.holders), refusal.message),
                             held_free=refusal.held_free) from None
            try:
                self._placed_around(request, mix, used)
            except VipuError:
                raise refusal from None  # the reservations alone do not keep it off
            raise NoRoom(kept_refusal(request.size, f"allocation {self.id}", kept, used, request.expected_seconds, now,
                                      state.layout), held_free=refusal.held_free) from None

    def _reservation_of(self, request: PartitionRequest, now: float) -> Reservation | None:
        """The reservation the request is to be made in, if it names one: NotFound if the allocation
        has none of that name, NoRoom until it starts (a request may wait for that), Conflict once
        it is over. Who may use it is checked by `_check_reservation_user`."""
        if not request.reservation:
            return None
        reservation = self.state.reservations.get(request.reservation)
        if reservation is None:
            raise NotFound(f"reservation {shown(request.reservation)} does not exist in allocation {self.id}")
        closed = reservation.closed(now)
        if closed:
            raise (Conflict if reservation.ended(now) else NoRoom)(closed)
        return reservation

    def _check_reservation_user(self, request: PartitionRequest, access: Access) -> None:
        """PermissionDenied for a user the reservation the request names is not for."""
        reservation = self.state.reservations.get(request.reservation) if request.reservation else None
        if reservation is not None and not reservation.admits(access.user_id, access.unrestricted, request.account):
            raise PermissionDenied(reservation.refusal(access.user_id, request.account))

    def _placed_around(self, request: PartitionRequest, mix: SizeMix, used: Mapping[str, Set[int]],
                       holders: Callable[[], Mapping[Ipu, str]] | None = None) -> Placement:
        """The request placed among the free IPUs of `used` around the IPUs held for the first
        waiting request, or on some of them if it is expected to end before they are needed
        (`held_needed_at`), as the queue backfills. A refusal says why it does not fit around them
        (naming what stands in the way by `holders`, the partitions if not given), and, where they
        alone keep it off, why its expected duration does not let it start on them."""
        state = self.state
        holding = holders or state.holders
        first = state.queue.get(state.held_for) or state.queue.first()
        left_out = self.queue.machines_left_out()
        if first is None or not state.held:
            return place_request(state.layout, state.allocation, used, request, Occupancy(holding), state.links, mix, left_out)
        try:
            return place_request(state.layout, state.allocation, used, request,
                                 Occupancy(holding, state.held, first.partition_id), state.links, mix, left_out)
        except NoRoom as refusal:
            if not refusal.held_free:
                raise  # no free IPU was held from it: without the held shape it fits no better
            try:
                placement = place_request(state.layout, state.allocation, used, request, Occupancy(holding), state.links,
                                          mix, left_out)
            except NoRoom:
                raise refusal from None
            why_not = held_clause(request.expected_seconds, first.partition_id, self.queue.held_needed_at(), time.time())
            if not why_not:
                return placement
            raise NoRoom(f"{refusal.message}; {why_not}", held_free=refusal.held_free) from None

    def _remove(self, command: RemovePartition) -> None:
        partition = self._visible(command.partition_id, command.access)
        access = command.access
        if not access.unrestricted and partition.owner and partition.owner != access.user_id:
            raise PermissionDenied(f"partition {partition.id} belongs to user {partition.owner}; only its owner or an administrator "
                                   "removes it")
        if self._holding(partition.id, command, wait=command.force):
            return
        if not command.force:
            self._refuse_if_busy(partition)
        self.start(Operation("removing", operations.remove(self.steps, partition, command.force), command.reply, partition.id))

    def _reset(self, command: ResetPartition) -> None:
        partition = self._to_configure_again(command)
        if partition is not None:
            self.start(Operation("resetting", operations.reset(self.steps, partition, command.automatic), command.reply, partition.id))

    def _relocate(self, command: RelocatePartition) -> None:
        partition = self._to_configure_again(command)
        if partition is not None:
            body = operations.relocate_asked(self.steps, partition, command.access.user_id, command.automatic, command.only_off_failed)
            self.start(Operation("relocating", body, command.reply, partition.id))

    def _to_configure_again(self, command: ResetPartition | RelocatePartition) -> Partition | None:
        """The partition a reset or a move configures again; refused while busy or under a disruptive
        test; None when the command waits behind an operation that holds the partition."""
        partition = self._visible(command.partition_id, command.access)
        if self._holding(partition.id, command, wait=False):
            return None
        self._refuse_if_busy(partition)
        self._refuse_if_tested()
        return partition

    def _cancel(self, command: CancelRequest) -> None:
        request = self.state.queue.get(command.partition_id)
        access = command.access
        if request is None and self._holding(command.partition_id, command, wait=True):
            return  # its grant (or its enqueue's end) is under way: decided again once that is committed, or refused
        if request is None:
            if command.partition_id in self.state.partitions and access.may_use(self.id):
                raise Conflict(f"the request of partition {command.partition_id} started meanwhile; remove the partition instead")
            raise NotFound(f"no request of partition {shown(command.partition_id)} waits")
        if not access.may_use(self.id):
            raise NotFound(f"no request of partition {shown(command.partition_id)} waits")
        if not access.unrestricted and request.owner and request.owner != access.user_id:
            raise PermissionDenied(f"the request of partition {request.partition_id} is user {request.owner}'s; only its owner or an "
                                   "administrator cancels it")
        who = f" by {access.user_id}" if access.user_id else ""
        ending = Conflict(f"the request of partition {request.partition_id} was cancelled{who}")
        self.start(Operation("cancelling", self.queue.ending(request, "cancel", ending), command.reply))

    def _claim(self, command: ClaimMachines) -> None:
        """A disruptive test's claim: the partitions in its way (settled ERROR ones are configured
        nowhere), or none and the machines are its own."""
        if command.machines:
            self._claim_drained(command)
            return
        in_the_way = sorted({p.id for p in self.state.partitions.values() if p.ready_state is not ReadyState.ERROR}
                            | set(self.on_partition))
        if not in_the_way:
            self.engine.take_back(f"{command.test} claims every machine for its test")
            self.state.test = command.test
            self.changes.state = self.changes.room = True
        command.reply.resolve(in_the_way)

    def _claim_drained(self, command: ClaimMachines) -> None:
        """A test of drained machines alone claims them, or is refused with why for each that is not
        drained: one not drained, or still with a partition, IPUs not yet cleared or a power
        action on it, or another test's already."""
        state = self.state
        kept_out = {agent for ipus in state.kept_out().values() for agent, _ in ipus}
        refusals = []
        for agent_id in command.machines:
            on_it = sorted(p.id for p in state.on_agent(agent_id))
            claimant = state.claimed.get(agent_id, command.test)  # its own claim may be there already: an owner made as
            other_test = state.test or (claimant if claimant != command.test else "")  # the claim began starts with it
            if agent_id not in state.draining:
                refusals.append(not_drained(agent_id))
            elif on_it:
                refusals.append(f"agent {agent_id} is still draining ({', '.join(on_it)} left)")
            elif agent_id in state.used or agent_id in kept_out or state.powering(agent_id):
                refusals.append(f"agent {agent_id} is not settled yet (IPUs not yet seen free, or a power action under way)")
            elif other_test:
                refusals.append(f"agent {agent_id} is under test ({other_test})")
        if refusals:
            command.reply.fail(Conflict(f"{TESTED_ALONE}: {'; '.join(refusals)}"))
            return
        state.claimed.update(dict.fromkeys(command.machines, command.test))
        self.changes.state = True
        command.reply.resolve([])

    def _release(self, command: ReleaseMachines) -> None:
        if self.state.test == command.test:
            self.state.test = ""
            self.changes.state = self.changes.room = True
        released = [agent for agent, test in self.state.claimed.items() if test == command.test]
        for agent in released:
            del self.state.claimed[agent]
        if released:
            self.changes.state = self.changes.room = True
        command.reply.resolve()

    def _lend(self, command: LendMachines) -> None:
        """Lend the free machines to an idle-time test: those with no IPU in use (by a partition, a
        move's old IPUs, settings not seen cleared) or held for the first waiting request, and not
        down. None while a disruptive test holds them, the allocation is being removed, or another
        loan is out."""
        state = self.state
        if state.test or state.closing or state.loan is not None:
            command.reply.resolve(None)
            return
        held = {agent for agent, _ in state.held}
        out = state.unplaceable()  # down, or being drained for a repair: no test of the idle time pokes at it
        free = tuple(a for a in state.allocation.agent_ids if a not in state.used and a not in held and a not in out)
        if not free:
            command.reply.resolve(None)
            return
        state.loan = Loan(command.test, self.id, free, command.seconds)
        self.changes.state = True
        command.reply.resolve(state.loan)

    def _return(self, command: ReturnMachines) -> None:
        if self.state.loan is command.loan:
            self.state.loan = None
            self.changes.state = True
        command.reply.resolve()

    def _report(self, command: AgentReport) -> None:
        """What a health pass found at an agent: lost partitions go to ERROR if it is down; else
        what it should not hold is cleared and what it lost applied again, except what an
        operation under way owns, or what a call that ended after the read began may have changed
        (the read may predate it: the next pass looks again)."""
        state, agent_id, asked_at = self.state, command.agent_id, command.asked_at
        agent = self.steps.agents().get(agent_id)
        children: list[Operation] = []
        if self.engine.call_ends.forgotten(asked_at):  # a new owner's first pass, every agent of it: routine, so not at INFO
            log.debug("agent %s: a health pass's read begun %.1f s ago is not judged: this owner no longer knows, or never knew, "
                      "the calls since (the next pass reads again)", agent_id, time.monotonic() - asked_at)
            command.reply.resolve()
            return
        if (state.powering(agent_id) and command.error is None) or (
                command.error is not None and self.engine.call_ends.answered_after(agent_id, asked_at)):
            command.reply.resolve()  # answering before the power action has gone through, or since the read that it did not
            return
        if command.error is not None or agent is None:
            if agent_id not in state.down:
                state.down.add(agent_id)
                self.changes.state = True
            reason = command.error.message if command.error is not None else "it was removed"
            for partition in state.on_agent(agent_id):
                if lifecycle.state_of(partition) == lifecycle.ACTIVE_IDLE and partition.id not in self.on_partition:
                    body = operations.mark_lost(self.steps, partition, f"agent {agent_id}{LOST}{reason}")
                    children.append(self.start(Operation("failing", body, partition_id=partition.id, system=True)))
        else:
            if agent_id in state.down:
                state.down.discard(agent_id)
                self.changes.state = self.changes.room = True
            configured = command.configured or {}

            def unchanged_since_read(partition_id: str) -> bool:
                return not self.engine.call_ends.after(agent_id, partition_id, asked_at)

            for kept_agent, partition_id in list(state.uncleared):
                if kept_agent == agent_id and partition_id not in configured and unchanged_since_read(partition_id):
                    self.steps.cleared(agent_id, partition_id)
            here = {p.id: p for p in state.on_agent(agent_id)}
            stray = [partition_id for partition_id in configured if partition_id not in self.on_partition and (
                partition_id not in here or lifecycle.state_of(here[partition_id]) == lifecycle.ERROR_FAILED)
                and unchanged_since_read(partition_id)]
            for partition_id in stray:  # out of placement until cleared (after a restart, nothing else says where they are)
                if (agent_id, partition_id) not in state.uncleared:
                    self.steps.keep_uncleared(agent_id, partition_id, [ipu.index for ipu in configured[partition_id].ipus])
            lost = []
            for partition in here.values():
                if (partition.id in self.on_partition or lifecycle.state_of(partition) != lifecycle.ACTIVE_IDLE
                        or not unchanged_since_read(partition.id)):
                    continue
                wanted = self.steps.settings_of(partition, self.steps.agents_of(partition))[agent_id]
                if configured.get(partition.id) != wanted:
                    lost.append((partition, wanted))
            if stray or lost:
                reconciling = Operation("reconciling", operations.reconcile(self.steps, agent, stray, lost), system=True)
                for partition_id in stray:  # settings of that id are applied there only once these are cleared
                    self.clears[(agent_id, partition_id)] = reconciling
                children.append(self.start(reconciling, holds=tuple(p.id for p, _ in lost)))
        self._answer_when_done(command, children)

    def reclear(self) -> None:
        """Ask each machine that did not confirm a clear to clear it again (`TurnEngine._keep_reclearing` says when)."""
        agents, state = self.steps.agents(), self.state
        by_agent: dict[str, list[str]] = {}
        for agent_id, partition_id in state.uncleared:
            made_again = partition_id in state.partitions and agent_id in state.partitions[partition_id].agent_ids  # a clear would wipe it
            if (agent_id, partition_id) not in self.clears and agent_id in agents and not state.powering(agent_id) and not made_again:
                by_agent.setdefault(agent_id, []).append(partition_id)
        for agent_id, partition_ids in sorted(by_agent.items()):
            clearing = Operation("reconciling", operations.clear_again(self.steps, agents[agent_id], sorted(partition_ids)), system=True)
            for partition_id in partition_ids:
                self.clears[(agent_id, partition_id)] = clearing
            self.start(clearing)

    def _powering(self, command: Powering) -> None:
        """An administrator's power action begins or ends (`Powering`)."""
        state, agent_id = self.state, command.agent_id
        if not command.begin:
            state.release_power([agent_id], command.token)  # down until a health pass finds it answering
            command.reply.resolve([])
            return
        here = state.on_agent(agent_id)
        busy = sorted(p.id for p in here if p.id in self.on_partition or lifecycle.state_of(p) in lifecycle.BUSY)
        if busy:
            raise Conflict(f"partition(s) {', '.join(busy)} on agent {agent_id} are busy: power {command.action} once they settle")
        tested = state.test or state.claimed.get(agent_id, "")
        if tested and not command.force:
            raise Conflict(f"agent {agent_id} is under test ({tested}): power {command.action} would spoil its results; stop the "
                           "test first (vipu-admin test cluster --stop), or use --force")
        active = sorted(p.id for p in here if lifecycle.state_of(p) == lifecycle.ACTIVE_IDLE)
        if active and not command.force:
            raise Conflict(f"agent {agent_id} holds ACTIVE partition(s) {', '.join(active)}: power {command.action} would fail them; "
                           "use --force to fail them, and they are reset once the machine answers again")
        if state.keep_down_for_power([agent_id], command.until, command.token):
            self.changes.state = True
        why = f"agent {agent_id}{LOST}power {command.action} of its machine by the administrator"
        children = [self.start(Operation("failing", operations.mark_lost(self.steps, partition, why), partition_id=partition.id,
                                         system=True))
                    for partition in here if partition.id in active]

        def failed() -> Body:
            yield Join(children)
            return active

        self.start(Operation("waiting", failed(), command.reply, system=True))

    def _drains_changed(self, command: DrainsChanged) -> None:
        """An operator drained or resumed machines (`DrainsChanged`): the drains as the store now
        holds them, and the moves they begin."""
        self._answer_when_done(command, self._steer())

    def _accounts_changed(self, command: AccountsChanged) -> None:
        self.changes.room = True  # a pass over the queue at the end of this turn
        command.reply.resolve(None)

    def _steer(self) -> list[Operation]:
        """Take up the drains (an operator's, a maintenance window's) as they stand now, and begin
        the moves off the machines drained; the moves begun."""
        self._read_drains()
        if not self.state.draining or self.state.test:
            return []
        return [self._leave_draining(partition) for partition in list(self.state.partitions.values())
                if partition.id not in self.on_partition and due_to_leave_draining(partition, self.state.draining.keys())]

    def _read_drains(self) -> None:
        """Take the allocation's drains from the configuration as committed last, so that words of
        drains and resumes that cross on the way can never leave the owner with an older one; and
        those of its maintenance windows under way."""
        agents, state, now = self.steps.agents(), self.state, time.time()
        turned = self._reservation_turned(now)
        draining = state.with_windows({agent_id: drain for agent_id in state.allocation.agent_ids
                                       if (agent := agents.get(agent_id)) is not None and (drain := agent.drain) is not None}, now)
        if draining != state.draining or turned:
            state.draining = draining
            self.changes.state = self.changes.room = self.changes.partitions = True  # placement, and what users are told, changed

    def _reservation_turned(self, now: float) -> bool:
        """Whether a reservation started or ended since the drains were last worked out."""
        state = self.state
        return any(state.steered_at < moment <= now for r in state.reservations.values() for moment in (r.start, r.end))

    def drains_due(self) -> None:
        """Remove, as a forced remove does, each partition left on a machine whose drain's deadline
        has passed (its user was told when, by its status); one whose removal fails is tried again
        REMOVAL_RETRY_SECONDS later."""
        state, now = self.state, time.time()
        if self._reservation_turned(now):
            self._steer()  # its machines drain or resume, and what may be placed where changed
        self.sharing.reclaims_due()
        if not state.draining:
            return
        state.removals_after = {p: after for p, after in state.removals_after.items() if p in state.partitions}
        for agent_id, drain in list(state.draining.items()):
            if not drain.deadline or drain.deadline > now:
                continue
            for partition in state.on_agent(agent_id):
                if partition.id in self.on_partition or now < state.removals_after.get(partition.id, 0.0):
                    continue
                log.warning("partition %s is removed: agent %s is %s, and its deadline, %s, has passed", partition.id, agent_id,
                            drain.describe(), utc_text(drain.deadline))
                body = operations.quietly(operations.remove(self.steps, partition, force=True), partition.id,
                                          "the removal at a drain's deadline")
                try:
                    self.start(Operation("removing", body, partition_id=partition.id))
                except Unavailable as busy:  # as many operations are under way as an owner takes: at a later turn
                    log.warning("partition %s: its removal at a drain's deadline waits: %s", partition.id, busy.message)
                    return
                state.removals_after[partition.id] = now + REMOVAL_RETRY_SECONDS

    def _leave_draining(self, partition: Partition) -> Operation:
        body = _leaving(operations.off_draining(self.steps, partition), partition.id, "the machines being drained")
        return self.start(Operation("relocating", body, partition_id=partition.id))

    def _links_changed(self, command: LinksChanged) -> None:
        """The ledger's word on the machines' links: placement (and the queue's next pass) steps
        around them from now on, and each partition that newly runs over an unhealthy link is told
        (its status, and the log). Word older than what the owner has is ignored."""
        state, before = self.state, self.state.links
        if command.faults.sequence < before.sequence:
            command.reply.resolve()
            return
        state.links = command.faults.within(set(state.allocation.agent_ids))
        if (state.links.failed, state.links.suspect) != (before.failed, before.suspect):
            for partition in state.partitions.values():
                ipus = [(ipu.agent_id, ipu.index) for ipu in partition.ipus]
                told = set(before.warnings(state.layout, ipus))
                for warning in state.links.warnings(state.layout, ipus):
                    if warning not in told:
                        log.warning("partition %s: %s", partition.id, warning)
            self.changes.state = self.changes.partitions = self.changes.room = True
        command.reply.resolve()

    def _answer_when_done(self, command: Command, children: list[Operation]) -> None:
        """Answer once the operations a command started have ended (the health pass waits for them)."""
        if not children:
            command.reply.resolve()
            return

        def joined() -> Body:
            yield Join(children)

        self.start(Operation("waiting", joined(), command.reply, system=True))

    def _finish_interrupted(self, command: FinishInterrupted) -> None:
        children = [self.start(Operation("finishing", operations.finish(self.steps, partition), partition_id=partition.id, system=True))
                    for partition in list(self.state.partitions.values())
                    if lifecycle.state_of(partition) in lifecycle.BUSY and partition.id not in self.on_partition]
        self._answer_when_done(command, children)

    def _recover_failed(self, command: RecoverFailed) -> None:
        """Move relocatable ERROR partitions off the machines that failed them, relocatable ACTIVE
        ones off machines being drained and the unhealthy links they run over while idle, and reset
        ERROR partitions whose agents all answer, as their automatic reset policy allows."""
        children = []
        self._read_drains()  # a word of a drain the owner missed is not missed for longer than a pass
        if not self.state.test:
            down = self.state.down
            for partition in list(self.state.partitions.values()):
                if partition.id in self.on_partition:
                    continue
                if due_for_relocation(partition, down):
                    body = operations.quietly(operations.relocate_asked(self.steps, partition, "", automatic=True,
                                                                        only_off_failed=False), partition.id, "automatic relocation")
                    children.append(self.start(Operation("relocating", body, partition_id=partition.id)))
                elif due_to_leave_draining(partition, self.state.draining.keys()):  # as the store held them at this pass
                    children.append(self._leave_draining(partition))
                elif due_to_leave_unhealthy_links(partition, self.state.links, self.state.layout):
                    body = _leaving(operations.off_unhealthy_links(self.steps, partition), partition.id, "its unhealthy links")
                    children.append(self.start(Operation("relocating", body, partition_id=partition.id)))
                elif due_for_reset(partition, down):
                    log.info("partition %s: automatic reset %d of %d", partition.id, partition.auto_reset_count + 1,
                             MAX_AUTO_RESETS)
                    reset = operations.reset(self.steps, partition, automatic=True, power_cycle=self._may_power_cycle(partition))
                    body = operations.quietly(reset, partition.id, "automatic reset")
                    children.append(self.start(Operation("resetting", body, partition_id=partition.id)))
        self._answer_when_done(command, children)

    def _may_power_cycle(self, partition: Partition) -> bool:
        """Whether an automatic reset that fails may power cycle the partition's machines: once in
        its life, where each has the power capability and holds no other partition."""
        if partition.power_cycled is not None:
            return False
        agents = self.steps.agents()
        for agent_id in partition.agent_ids:
            agent = agents.get(agent_id)
            if agent is None or not agent.inventory.has(Capability.POWER):
                return False
            if any(other.id != partition.id for other in self.state.on_agent(agent_id)):
                return False
        return True

    def _close(self, command: CloseAllocation) -> None:
        if self.state.closing:
            raise Conflict(f"allocation {self.id} is being removed")
        partitions = sorted(self.state.partitions)
        if partitions and not command.force:
            raise Conflict(f"allocation {self.id} holds {len(partitions)} partition(s) ({', '.join(partitions)}); "
                           "remove them first, or use --force to remove them with it")
        self.engine.take_back(f"allocation {self.id} is being removed")
        self.state.closing = True
        self.changes.state = True
        self.start(Operation("closing", self._closing(), command.reply))

    def _closing(self) -> Body:
        """Wait for every operation under way, cancel the waiting requests, remove every partition
        (forced), then delete the allocation; new creates and moves are refused meanwhile."""
        removed = []
        try:
            while others := [operation for operation in self.under_way if operation.kind != "closing"]:
                yield Join(others)
            for request in list(self.state.queue):
                ending = Conflict(f"the request of partition {request.partition_id} was cancelled: allocation {self.id} is removed")
                yield from self.queue.ending(request, "cancel", ending)
                removed.append(f"request of partition {request.partition_id}")
            while self.state.partitions:
                children = [self.start(Operation("removing", operations.remove(self.steps, partition, force=True),
                                                 partition_id=partition.id))
                            for partition in list(self.state.partitions.values()) if partition.id not in self.on_partition]
                others = [operation for operation in self.under_way if operation.kind != "closing" and operation not in children]
                errors = yield Join(children + others)
                failed = next((error for error in errors[:len(children)] if error is not None), None)
                if failed is not None:
                    raise failed
                removed += [f"partition {child.partition_id}" for child in children]
            yield Write(lambda tx: tx.delete_allocation(self.id))
        except Exception:
            self.state.closing = False
            self.changes.state = True
            raise
        self.owners.closed(self.engine)
        return removed

    # A user's change of a partition

    def _update(self, command: UpdatePartition) -> None:
        """Its owner's (or an administrator's) change of a partition, committed as a compare-and-set on
        its row once no operation holds it; nothing is written when it asks for what is already so."""
        partition = self._visible(command.partition_id, command.access)
        access = command.access
        if not access.unrestricted and partition.owner and partition.owner != access.user_id:
            raise PermissionDenied(f"partition {partition.id} belongs to user {partition.owner}; only its owner or an administrator "
                                   "changes it")
        if self._holding(partition.id, command, wait=True):
            return
        if partition.may_move == command.may_move:
            command.reply.resolve(partition)
            return
        self.start(Operation("updating", self._updating(partition, command.may_move, access.user_id), command.reply, partition.id))

    def _updating(self, partition: Partition, may_move: bool, user_id: str) -> Body:
        """The change's one write; the operation's result is the partition as it left it."""
        changed = lifecycle.copy(partition)
        changed.may_move = may_move
        updated = yield self.steps.partition_write(lambda tx: tx.update_partition(lifecycle.copy(partition), may_move), partition, changed,
                                              partition.id)
        log.info("partition %s %s to be moved while attached%s", partition.id, "consents" if may_move else "no longer consents",
                 f" (as {user_id} asked)" if user_id else "")
        return updated

    # Compaction

    def _compact(self, command: CompactAllocation) -> None:
        """Plan the moves that free the largest shape broken up now, within the budget, among the
        relocatable ACTIVE partitions no operation holds; carry the plan out unless a dry run."""
        self._refuse_if_tested()
        state = self.state
        spent, now = self.steps.compaction_spent(), time.time()
        room = spent.room(now)
        movable = operations.movable(self.steps, spent, now)
        allowed = set(state.allocation.agent_ids) - state.unplaceable()
        plan = plan_compaction(state.layout, allowed, state.taken(), state.holders(), movable, max_moves=room, mix=state.mix,
                               faults=state.links)
        if plan is None:
            why = (spent.spent(now) if not room else
                   "no relocatable partition's move frees a larger shape than fits now" if movable else
                   "no partition may move: none is relocatable, ACTIVE and left by the budget")
            command.reply.resolve(Report(self.id, state.layout, None, why, command.dry_run))
            return
        if command.dry_run:
            command.reply.resolve(Report(self.id, state.layout, plan, dry_run=True))
            return
        self.start(Operation("compacting", self.queue.compacting(operations.compact(self.steps, plan, spent, command.why)), command.reply))

    def _apply_template(self, command: ApplyTemplate) -> None:
        """Place every partition of a template on what is free now, each beside those placed before
        it, or refuse the whole at the first that does not fit, naming it; unless a dry run, make
        them (`operations.apply_template`: any that cannot be made undoes the others)."""
        self._refuse_if_tested()
        state = self.state
        if len(self.under_way) + len(command.requests) + 1 > OPERATIONS_LIMIT:
            raise Unavailable(f"template {command.template}: allocation {self.id} has {len(self.under_way)} operations under way, "
                              f"and its {len(command.requests)} creates would pass the limit of {OPERATIONS_LIMIT}; try again shortly")
        for request in command.requests:
            if request.id in state.partitions or state.queue.get(request.id) is not None:
                raise AlreadyExists(f"template {command.template}: partition {request.id} already exists; nothing was made")
            self.sharing.assign(request, command.access)
        try:  # held to its account's quota as a whole: each alone would fit where all together do not
            self.sharing.refuse_over_quota(dataclasses.replace(command.requests[0], size=sum(r.size for r in command.requests)))
        except NoRoom as refusal:
            raise NoRoom(f"template {command.template}: {refusal.message}; nothing was made") from None
        used = shifted(state.used)
        partitions: list[Partition] = []
        for request in command.requests:
            try:
                placement = self._placed(request, state.mix, used)
            except (NoRoom, InvalidArgument) as refusal:
                beside = f" beside the template's {len(partitions)} before it" if partitions else ""
                raise type(refusal)(f"template {command.template}: partition {request.id} ({request.size} IPUs) does not fit{beside}: "
                                    f"{refusal.message}; nothing was made") from None
            used = shifted(used, on=((ipu.agent_id, ipu.index) for ipu in placement.ipus))
            partitions.append(partition_of(request, command.access.user_id, state.allocation, placement))
        if command.dry_run:
            command.reply.resolve(partitions)
            return
        self.start(Operation("templating", operations.apply_template(self.steps, command.template, partitions), command.reply))

    # Reservations

    def _reserve(self, command: Reserve) -> None:
        """An administrator's reservation: checked, placed (a `size` is given a shape), checked
        against the allocation's other reservations and committed; a maintenance window under way
        drains its machines at once."""
        state, now = self.state, time.time()
        if state.closing:
            raise Conflict(f"allocation {self.id} is being removed")
        if command.name in state.reservations:
            raise AlreadyExists(f"reservation {command.name} already exists")
        asked = Reservation(command.name, self.id, frozenset(), max(command.start, now), command.end, command.reason,
                            command.maintenance, command.users, command.by, now, command.accounts)
        check_reservation(asked, now, command.size)
        if command.agent_ids:
            strangers = sorted(set(command.agent_ids) - set(state.allocation.agent_ids))
            if strangers:
                raise InvalidArgument(f"agent {strangers[0]} is not in allocation {self.id}")
            ipus = frozenset((agent, index) for agent in command.agent_ids for index in range(IPUS_PER_MACHINE))
        else:
            ipus = self._reservation_shape(asked, command.size)
        reservation = dataclasses.replace(asked, ipus=ipus)
        clash = next((r for r in state.reservations.values() if not r.ended(now) and r.overlaps(reservation)), None)
        if clash is not None:
            shared = clash.ipus & reservation.ipus
            raise Conflict(f"reservation {command.name} would hold {span(state.layout, set(shared))} while {clash.describe()} does")
        self.start(Operation("reserving", self._reserving(reservation), command.reply))

    def _reservation_shape(self, asked: Reservation, size: int) -> frozenset[tuple[str, int]]:
        """Where a reservation of `size` IPUs goes: a shape on machines that are up and not drained,
        free of the other reservations of its time, best-fit among those no partition is expected
        to be on at its start (one that is, or whose end is unknown, stays: it is not stopped for
        the reservation); else the shape the fewest such partitions stand on."""
        state = self.state
        total = len(state.allocation.agent_ids) * IPUS_PER_MACHINE
        if size > total:
            raise InvalidArgument(f"a reservation of {size} IPUs is larger than allocation {self.id} ({total} IPUs)")
        others = {ipu for r in state.reservations.values() if r.during(asked.start, asked.end) for ipu in r.ipus}
        staying = {(ipu.agent_id, ipu.index): p.id for p in state.partitions.values()
                   if (end := p.expected_end) is None or end.timestamp() > asked.start for ipu in p.ipus}
        allowed = set(state.allocation.agent_ids) - state.unplaceable()
        placed = try_place(state.layout, allowed, shifted({}, on=set(staying) | others), size, mix=state.mix)
        if placed is not None:
            return frozenset((ipu.agent_id, ipu.index) for ipu in placed.ipus)
        options = [shape for shape in shapes(state.layout, allowed, size) if shape.isdisjoint(others)]
        if not options:
            raise Conflict(f"no {size}-IPU shape of allocation {self.id} is free of other reservations from "
                           f"{utc_text(asked.start)} to {utc_text(asked.end)} on machines up and not drained")
        return min(options, key=lambda shape: len({staying[ipu] for ipu in shape if ipu in staying}))

    def _reserving(self, reservation: Reservation) -> Body:
        state = self.state

        def apply() -> None:
            state.reservations[reservation.name] = reservation
            self.changes.state = self.changes.room = True

        def undo() -> None:
            state.reservations.pop(reservation.name, None)

        yield Write(lambda tx: tx.add_reservation(reservation), apply, undo)
        log.info("allocation %s: %s made by %s, on %s", self.id, reservation.describe(), reservation.operator,
                 span(state.layout, set(reservation.ipus)))
        self._steer()  # a maintenance window under way: its machines drain, and the moves off them begin (not waited for)
        return reservation

    def _unreserve(self, command: Unreserve) -> None:
        reservation = self.state.reservations.get(command.name)
        if reservation is None:
            raise NotFound(f"reservation {shown(command.name)} does not exist")
        self.start(Operation("unreserving", self._unreserving(reservation), command.reply))

    def _unreserving(self, reservation: Reservation) -> Body:
        state = self.state

        def apply() -> None:
            state.reservations.pop(reservation.name, None)
            self.changes.state = self.changes.room = True

        def undo() -> None:
            state.reservations[reservation.name] = reservation

        yield Write(lambda tx: tx.delete_reservation(reservation), apply, undo)
        log.info("allocation %s: %s removed", self.id, reservation.describe())
        self._read_drains()  # a maintenance window under way: its machines resume
        return reservation

    _HANDLERS: ClassVar[dict[type, Callable[[Decisions, Any], None]]] = {
        Reserve: _reserve,
        Unreserve: _unreserve,
        CompactAllocation: _compact,
        ApplyTemplate: _apply_template,
        CreatePartition: _create,
        RemovePartition: _remove,
        ResetPartition: _reset,
        RelocatePartition: _relocate,
        CancelRequest: _cancel,
        ClaimMachines: _claim,
        ReleaseMachines: _release,
        LendMachines: _lend,
        ReturnMachines: _return,
        AgentReport: _report,
        Powering: _powering,
        DrainsChanged: _drains_changed,
        AccountsChanged: _accounts_changed,
        LinksChanged: _links_changed,
        FinishInterrupted: _finish_interrupted,
        RecoverFailed: _recover_failed,
        CloseAllocation: _close,
        UpdatePartition: _update,
    }


def _leaving(body: Body, partition_id: str, where: str) -> Body:
    """A move off `where` (unhealthy links, machines being drained), tried at every health pass
    until it happens: that it cannot yet (no room, a client attached) is no news."""
    try:
        return (yield from body)
    except (NoRoom, Conflict) as refusal:
        log.debug("partition %s stays on %s for now: %s", partition_id, where, refusal.message)
    except VipuError as error:
        log.warning("partition %s: the move off %s failed: %s", partition_id, where, error.message)
    return None
