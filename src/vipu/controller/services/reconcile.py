"""Keeping agents and the store in agreement.

The store is the truth. For each agent, the reconciler asks what the machine holds and then:

- clears configuration of partitions the store does not know, or knows as ERROR (an ERROR
  partition is never configured anywhere);
- re-applies ACTIVE partitions the machine lost (it restarted) or holds differently;
- leaves alone partitions whose create, reset or remove is under way: their operation owns them.

It runs once when the controller starts to serve and then on every health pass, which first
finishes the partition operations nobody owns any more and also records each agent as Up or
Down. An agent a partition operation holds is skipped, never waited for. An agent that stops answering puts its ACTIVE
partitions in ERROR with the reason. Once every agent of such a partition answers again, the
pass resets it, unless it was created with automatic reset disabled, up to MAX_AUTO_RESETS times
(the partition's status counts them). Partitions in ERROR for a fault of the hardware are left
to their users: a reset would only fail again. A partition created relocatable moves instead,
at once, off the machines that failed it, when its allocation has room (`relocation`).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from vipu.controller.services import relocation
from vipu.controller.services.hardware import Hardware, Work
from vipu.controller.services.partitions import PartitionService
from vipu.model import lifecycle
from vipu.model.configuration import AgentSettings, agent_settings
from vipu.model.entities import (
    MAX_AUTO_RESETS,
    Agent,
    AgentStatus,
    OperationState,
    Partition,
    ReadyState,
)
from vipu.model.errors import NoRoom, PermissionDenied, Unavailable, VipuError
from vipu.model.topology import ClusterLayout
from vipu.store.store import Store

log = logging.getLogger(__name__)

LOST = " is down: "  # in the error of a partition whose agent stopped answering


@dataclass
class Expectation:
    """The partitions the store holds on one agent, with what it takes to work out their settings."""

    known: dict[str, Partition]
    serials: dict[str, str]
    layouts: dict[str, ClusterLayout]

    def differences(self, agent_id: str, held: dict[str, AgentSettings]) -> tuple[list[str], list[tuple[Partition, AgentSettings]]]:
        """(partitions the agent holds but should not, (partition, settings) it should hold but does not)."""
        stray = [
            partition_id for partition_id in held
            if (p := self.known.get(partition_id)) is None or lifecycle.state_of(p) == lifecycle.ERROR_FAILED
        ]
        lost = []
        for partition in self.known.values():
            if partition.ready_state is not ReadyState.ACTIVE or partition.operation_state is not OperationState.IDLE:
                continue
            wanted = agent_settings(partition, self.layouts[partition.cluster_id], self.serials)[agent_id]
            if held.get(partition.id) != wanted:
                lost.append((partition, wanted))
        return stray, lost


class Reconciler:
    def __init__(self, store: Store, hardware: Hardware, partitions: PartitionService):
        self.store = store
        self.hardware = hardware
        self.partitions = partitions

    def recover(self) -> None:
        """On starting to serve: take the partitions from the store, finish interrupted operations,
        then reconcile every agent."""
        self.partitions.load()
        self.check_all()

    def check_all(self) -> None:
        """One health pass: finish the operations nobody owns any more, then check every agent.

        The store is read once for all agents; an agent whose holdings agree with that reading
        needs nothing. One that disagrees is compared again with a fresh reading taken while the
        agent is held, since the first may predate an operation that finished since. An agent a
        partition operation holds is skipped and tried again once the others are done; one still
        held then is checked at the next pass.
        """
        self.partitions.finish_interrupted()
        with self.store.reading() as tx:
            agents = tx.list_agents()
            expected = self._expectations(tx, [a.id for a in agents])
        for _ in range(2):
            checked = self.hardware.each(agents, lambda agent: self.check_agent(agent, expected), Work.HEALTH)
            agents = [agent for agent, done in zip(agents, checked, strict=True) if done is False]
            if not agents:
                break
        if agents:
            log.debug("health pass: agents %s are busy with partition operations; next pass", ", ".join(a.id for a in agents))
        self.reset_failed()

    def reset_failed(self) -> None:
        """Move relocatable ERROR partitions off the machines that failed them, and reset ERROR
        partitions whose agents all answer, as their automatic reset policy allows."""
        with self.store.reading() as tx:
            agents = tx.list_agents()
            partitions = tx.list_partitions()
        down = {a.id for a in agents if a.status is AgentStatus.DOWN}
        moved = set()
        for partition in partitions:
            if relocation.due_for_relocation(partition, down, LOST):
                try:
                    self.partitions.relocate(partition.id, automatic=True)
                    moved.add(partition.id)
                except NoRoom as refusal:  # it waits in ERROR for room, or for its machines to answer again
                    log.debug("partition %s cannot move yet: %s", partition.id, refusal.message)
                except VipuError as error:
                    log.warning("partition %s: automatic relocation failed: %s", partition.id, error.message)
        due = [p for p in partitions
               if p.id not in moved and lifecycle.state_of(p) == lifecycle.ERROR_FAILED and not p.disable_auto_reset
               and p.errors and all(LOST in e for e in p.errors)  # a fault of the hardware would only fail again
               and p.auto_reset_count < MAX_AUTO_RESETS and not set(p.agent_ids) & down]
        for partition in due:
            log.info("partition %s: automatic reset %d of %d", partition.id, partition.auto_reset_count + 1, MAX_AUTO_RESETS)
            try:
                self.partitions.reset(partition.id, automatic=True)
            except VipuError as error:
                log.warning("partition %s: automatic reset failed: %s", partition.id, error.message)

    def check_agent(self, agent: Agent, expected: dict[str, Expectation] | None = None) -> bool:
        """Check one agent if no partition operation holds it; whether it was checked."""
        gateway = self.hardware.gateway
        with self.hardware.locks.hold_alone(agent.id) as taken:
            if not taken:
                return False
            returning = agent.status is AgentStatus.DOWN
            try:
                held = {s.partition_id: s for s in gateway.partitions(agent.host, agent.port)}
                if returning:
                    agent.inventory = gateway.inventory(agent.host, agent.port)
            except (Unavailable, PermissionDenied) as error:  # not there, or obeying another controller
                self._set_status(agent, AgentStatus.DOWN, error.message)
                self._lost_with(agent, error.message)
                return True
            stray, lost = expected[agent.id].differences(agent.id, held) if expected else ([], [])
            if expected is None or stray or lost:
                with self.store.reading() as tx:
                    stray, lost = self._expectations(tx, [agent.id])[agent.id].differences(agent.id, held)
            for partition_id in stray:
                self._clear(agent, partition_id)
            for partition, wanted in lost:
                self._reapply(agent, partition, wanted)
            self._set_status(agent, AgentStatus.UP, "", inventory_changed=returning)
            return True

    @staticmethod
    def _expectations(tx, agent_ids: list[str]) -> dict[str, Expectation]:
        """What the store says each agent should hold."""
        partitions = tx.partitions_on_agent(agent_ids[0]) if len(agent_ids) == 1 else tx.list_partitions()
        serials = {a.id: a.inventory.serial for a in tx.list_agents()}
        layouts = {c: ClusterLayout.of(tx.get_cluster(c)) for c in {p.cluster_id for p in partitions}}
        expected = {a: Expectation({}, serials, layouts) for a in agent_ids}
        for partition in partitions:
            for agent_id in partition.agent_ids:
                if agent_id in expected:
                    expected[agent_id].known[partition.id] = partition
        return expected

    def _lost_with(self, agent: Agent, reason: str) -> None:
        """The ACTIVE partitions on an agent that stopped answering go to ERROR, saying why."""
        for partition in self.partitions.ledger.list():
            if agent.id in partition.agent_ids:
                self.partitions.mark_lost(partition.id, f"agent {agent.id}{LOST}{reason}")

    def _clear(self, agent: Agent, partition_id: str) -> None:
        try:
            self.hardware.gateway.clear(agent.host, agent.port, partition_id)
            log.info("agent %s: cleared partition %s, which the store does not hold as active", agent.id, partition_id)
        except VipuError as error:
            log.warning("agent %s: could not clear partition %s: %s", agent.id, partition_id, error.message)

    def _reapply(self, agent: Agent, partition, wanted) -> None:
        try:
            self.hardware.gateway.apply(agent.host, agent.port, wanted)
            log.info("agent %s: re-applied partition %s", agent.id, partition.id)
        except VipuError as error:
            self.partitions.mark_lost(partition.id, f"agent {agent.id}: {error.message}")

    def _set_status(self, agent: Agent, status: AgentStatus, reason: str, inventory_changed: bool = False) -> None:
        """Record an agent's status; the store is written only when something changed."""
        if agent.status is status and agent.last_error == reason and not inventory_changed:
            return
        if agent.status is not status:
            log.info("agent %s is %s%s", agent.id, status.value, f": {reason}" if reason else "")
        agent.status, agent.last_error = status, reason
        with self.store.transaction() as tx:
            current = tx.get_agent(agent.id)
            if current is not None:
                current.status, current.last_error, current.inventory = status, reason, agent.inventory
                tx.update_agent(current)

    def run(self, interval: float, stop: threading.Event) -> None:
        """Health passes every `interval` seconds until `stop` is set."""
        while not stop.wait(interval):
            try:
                self.check_all()
            except Exception:
                log.exception("health pass failed")
