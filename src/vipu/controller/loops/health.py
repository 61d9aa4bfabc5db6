"""The health pass: ask every agent what it holds, and tell the owners what was found.

It runs once when the controller starts to serve and then every `--health-interval` seconds. It
configures nothing itself and holds no lock: each allocation's owner (`vipu.controller.core`)
decides what follows from what its agents hold, one thing at a time with everything else it
decides. A pass:

1. asks each owner to finish the operations nobody owns any more (a restart's, or one whose last
   store write failed);
2. asks every agent, in parallel, for the settings it holds (and, where its machine has the power
   or health capability, for its power, health and the health events since the last pass, each
   logged here), and records it Up or Down in the store, Down also where a capability of its
   machine fails (its BMC unreachable, say: its partitions keep running); its allocation's
   owner then clears what it should not hold (partitions unknown, or ERROR, there), applies again
   what an ACTIVE partition lost (a restarted agent), and puts the ACTIVE partitions of an agent
   that stopped answering in ERROR, saying why. Partitions that an operation under way owns are
   left to it, and so are those an agent call changed after the read began (the read may predate
   the call: the next pass reads again). A machine in no allocation is cleared of anything;
3. asks each owner to recover ERROR partitions as their policy allows: a relocatable one moves
   off the machines that failed it when there is room, one that an agent's absence failed is
   reset once every agent answers again, up to MAX_AUTO_RESETS times (a reset that fails is
   followed, once in the partition's life, by a power cycle of its machines and one more
   configuration); one that a fault of the hardware failed is left to its user, as a reset would
   only fail again.

Each step waits for the owners' answers with a deadline, and the pass goes on without an answer
that did not come in time: the owner finishes what it started, and the next pass looks again.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from vipu.controller.core.agents import AgentGateway
from vipu.controller.core.commands import AgentReport, Command, FinishInterrupted, RecoverFailed, Reply
from vipu.controller.core.owners import Owners
from vipu.model.configuration import AgentSettings
from vipu.model.entities import Agent, AgentStatus
from vipu.model.errors import PermissionDenied, Unavailable, VipuError
from vipu.model.hardware import Capability, HealthLevel, MachineCondition, PowerState
from vipu.store.store import Store

log = logging.getLogger(__name__)

KEPT_EVENTS = 20  # the latest health events an agent's record keeps, for `vipu-admin get agent` and the dashboard
STEP_SECONDS = 60.0  # how long a pass waits for the owners at each step: an agent call is bounded by the agent timeout


@dataclass
class _Found:
    """What one agent answered: the settings its machine is configured with, or why it did not answer."""

    agent: Agent
    configured: dict[str, AgentSettings] | None
    error: VipuError | None = None
    returned: bool = False  # it was Down and answers again (its inventory was read afresh)
    condition: MachineCondition | None = None  # its machine's power and health, where its agent has either
    asked_at: float = field(kw_only=True)  # monotonic, when the pass began to read it

    @property
    def down_reason(self) -> str:
        """Why the agent is Down: its fabric does not answer, its machine is off or being powered,
        or a capability of its machine fails (its partitions keep running then, as long as the
        fabric answers)."""
        if self.error is not None:
            return self.error.message
        unpowered = self.unpowered
        if unpowered is not None:
            return unpowered.message
        return "; ".join(self.condition.problems) if self.condition is not None else ""

    @property
    def unpowered(self) -> Unavailable | None:
        """Why its machine cannot take a partition although its agent answers: it is off, or
        between on and off (its BMC says so); None when it is on, or nothing says."""
        state = PowerState(self.condition.power_state) if self.condition is not None and self.condition.power_state else None
        if state in (PowerState.OFF, PowerState.POWERING_ON, PowerState.POWERING_OFF):
            return Unavailable(f"its machine is {'powered off' if state is PowerState.OFF else state.value}")
        return None


class HealthPass:
    def __init__(self, store: Store, owners: Owners, gateway: AgentGateway, workers: int = 32):
        self.store = store
        self.owners = owners
        self.gateway = gateway
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="health")

    def recover(self) -> None:
        """On starting to serve: make the owners from the store, then a pass."""
        self.owners.load()
        self.check_all()

    def check_all(self, seconds: float = STEP_SECONDS) -> None:
        """One health pass (see the module's docstring)."""
        self._ask_every_owner(FinishInterrupted, seconds)
        agents = list(self.store.configuration().agents.values())
        allocation_of = {a: allocation.id for allocation in self.store.configuration().allocations.values() for a in allocation.agent_ids}
        replies: list[tuple[str, Reply]] = []
        for found in self._pool.map(self._ask, agents):
            self._record_status(found)
            allocation_id = allocation_of.get(found.agent.id)
            owner = self.owners.owner(allocation_id) if allocation_id else None
            if owner is not None:
                command = AgentReport(agent_id=found.agent.id, configured=found.configured, error=found.error or found.unpowered,
                                      asked_at=found.asked_at)
                try:
                    owner.submit(command)
                    replies.append((f"agent {found.agent.id}", command.reply))
                except VipuError as error:
                    log.warning("health pass: agent %s: %s", found.agent.id, error.message)
            elif found.configured:
                self.owners.clear_unallocated(found.agent, sorted(found.configured), seconds)
        self._wait(replies, seconds)
        self._ask_every_owner(RecoverFailed, seconds)

    def _ask_every_owner(self, kind: type[Command], seconds: float) -> None:
        replies = []
        for owner in self.owners.all():
            command = kind()
            try:
                owner.submit(command)
                replies.append((f"allocation {owner.id}", command.reply))
            except VipuError as error:
                log.warning("health pass: allocation %s: %s", owner.id, error.message)
        self._wait(replies, seconds)

    @staticmethod
    def _wait(replies: list[tuple[str, Reply]], seconds: float) -> None:
        deadline = time.monotonic() + seconds
        for what, reply in replies:
            left = max(0.0, deadline - time.monotonic())
            try:
                reply.wait(left, f"the health pass's look at {what}", left)
            except VipuError as error:
                log.warning("health pass: %s: %s", what, error.message)

    def _ask(self, agent: Agent) -> _Found:
        returning = not agent.answering
        condition = None
        asked_at = time.monotonic()
        try:
            if agent.inventory.has(Capability.POWER) or agent.inventory.has(Capability.HEALTH):
                condition = self._condition(agent)
            configured = {s.partition_id: s for s in self.gateway.partitions(agent.host, agent.port)}
            if returning:
                agent.inventory = self.gateway.inventory(agent.host, agent.port)
        except (Unavailable, PermissionDenied) as error:  # not there, or obeying another controller
            return _Found(agent, None, error, condition=condition, asked_at=asked_at)
        return _Found(agent, configured, returned=returning, condition=condition, asked_at=asked_at)

    def _condition(self, agent: Agent) -> MachineCondition:
        """The machine's power and health, with the events since those last recorded (each logged:
        the agent's report of them as they come); as last recorded if the agent does not answer,
        with a problem saying so (a BMC slower than the agent timeout, say)."""
        known = agent.inventory.condition.events
        try:
            condition = self.gateway.condition(agent.host, agent.port, known[-1].sequence if known else 0)
        except Unavailable as error:
            return dataclasses.replace(agent.inventory.condition, problems=(f"power and health not read: {error.message}",))
        for event in condition.events:
            log.log(logging.INFO if event.severity is HealthLevel.OK else logging.WARNING, "agent %s: %s: %s (%s)", agent.id,
                    event.component, event.message, event.severity.value)
        return dataclasses.replace(condition, events=(*known, *condition.events)[-KEPT_EVENTS:])

    def _record_status(self, found: _Found) -> None:
        """An agent's status in the store; written only when something changed."""
        agent = found.agent
        reason = found.down_reason
        status = AgentStatus.DOWN if reason else AgentStatus.UP
        condition = found.condition if found.condition is not None else agent.inventory.condition
        if agent.status is status and agent.last_error == reason and not found.returned and condition == agent.inventory.condition:
            return
        inventory = dataclasses.replace(agent.inventory, condition=condition)  # the configuration read is shared: not changed in place
        if agent.status is not status:
            log.info("agent %s is %s%s", agent.id, status.value, f": {reason}" if reason else "")
        try:
            with self.store.transaction() as tx:
                current = tx.get_agent(agent.id)
                if current is not None:
                    current.status, current.last_error, current.inventory = status, reason, inventory
                    tx.update_agent(current)
        except VipuError as error:
            log.warning("agent %s: its status could not be recorded: %s", agent.id, error.message)

    def run(self, interval: float, stop: threading.Event) -> None:
        """Health passes every `interval` seconds until `stop` is set."""
        while not stop.wait(interval):
            try:
                self.check_all()
            except Exception:
                log.exception("health pass failed")

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
