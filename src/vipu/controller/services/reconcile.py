"""Keeping agents and the store in agreement.

The store is the truth. For each agent, the reconciler asks what the machine holds and then:

- clears configuration of partitions the store does not know, or knows as ERROR (an ERROR
  partition is never configured anywhere);
- re-applies ACTIVE partitions the machine lost (it restarted) or holds differently;
- leaves alone partitions whose create, reset or remove is under way: their operation owns them.

It runs once at start-up, after interrupted operations are finished, and then on every health
pass, which also records each agent as Up or Down.
"""

from __future__ import annotations

import logging
import threading

from vipu.controller.services.hardware import Hardware
from vipu.controller.services.partitions import BUSY, PartitionService
from vipu.model.configuration import agent_settings
from vipu.model.entities import Agent, AgentStatus, OperationState, ReadyState
from vipu.model.errors import Unavailable, VipuError
from vipu.model.topology import ClusterLayout
from vipu.store.store import Store

log = logging.getLogger(__name__)


class Reconciler:
    def __init__(self, store: Store, hardware: Hardware, partitions: PartitionService):
        self.store = store
        self.hardware = hardware
        self.partitions = partitions

    def recover(self) -> None:
        """At start-up: finish interrupted operations, then reconcile every agent."""
        self.partitions.finish_interrupted()
        self.check_all()

    def check_all(self) -> None:
        with self.store.reading() as tx:
            agents = tx.list_agents()
        self.hardware.each(agents, self.check_agent)

    def check_agent(self, agent: Agent) -> None:
        gateway = self.hardware.gateway
        with self.hardware.locks.hold_alone(agent.id):
            returning = agent.status is AgentStatus.DOWN
            try:
                held = {s.partition_id: s for s in gateway.partitions(agent.host, agent.port)}
                if returning:
                    agent.inventory = gateway.inventory(agent.host, agent.port)
            except Unavailable as error:
                self._set_status(agent, AgentStatus.DOWN, error.message)
                return
            with self.store.reading() as tx:
                known = {p.id: p for p in tx.partitions_on_agent(agent.id)}
                peers = {a for p in known.values() for a in p.agent_ids}
                serials = {a: tx.get_agent(a).inventory.serial for a in peers}
                layouts = {c: ClusterLayout.of(tx.get_cluster(c)) for c in {p.cluster_id for p in known.values()}}
            for partition_id in held:
                partition = known.get(partition_id)
                if partition is None or (partition.ready_state is ReadyState.ERROR and partition.operation_state not in BUSY):
                    self._clear(agent, partition_id)
            for partition in known.values():
                if partition.ready_state is not ReadyState.ACTIVE or partition.operation_state is not OperationState.IDLE:
                    continue
                wanted = agent_settings(partition, layouts[partition.cluster_id], serials)[agent.id]
                if held.get(partition.id) != wanted:
                    self._reapply(agent, partition, wanted)
            self._set_status(agent, AgentStatus.UP, "", inventory_changed=returning)

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
            reason = f"agent {agent.id}: {error.message}"
            log.warning("partition %s goes to ERROR: %s", partition.id, reason)
            with self.store.transaction() as tx:
                tx.set_partition_state(partition.id, ReadyState.ERROR, OperationState.FAILED, errors=[reason])

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
