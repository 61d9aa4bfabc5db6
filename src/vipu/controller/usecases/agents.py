"""Agents: the IPU-Machines the controller manages, one agent each.

Registering an agent claims its machine: on the secure agent link the machine then obeys this
controller only, and removing the agent releases it. A machine another controller holds is
refused, unless the administrator takes it over with the site's agent-link authority.
"""

from __future__ import annotations

import builtins
import dataclasses
import logging
import math
import time
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from vipu.controller.core.agents import POWER_SECONDS, AgentGateway
from vipu.controller.core.commands import DrainsChanged, Powering
from vipu.controller.core.operations import POWER_MARGIN_SECONDS
from vipu.controller.core.owners import Owners
from vipu.controller.usecases.clusters import ClusterService
from vipu.model.entities import Agent, AgentStatus, Drain, check_id, checked_reason, natural_key, shown
from vipu.model.errors import (
    AlreadyExists,
    Conflict,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    Unavailable,
    VipuError,
)
from vipu.model.hardware import Capability, PowerAction, PowerState
from vipu.model.times import utc_text
from vipu.model.waiting import MAX_EXPECTED_SECONDS
from vipu.store.store import Store

log = logging.getLogger(__name__)

OWNER_SECONDS = 30.0  # how long a power action waits for its machine's owner, at its start and its end
# How long a drain waits for its owners to take the word, and as long again for the moves it begins: in
# all, well within the client's DRAIN_CALL_SECONDS.
DRAIN_WAIT_SECONDS = 60.0


def no_takeover(machine_serial: str) -> str:
    raise InvalidArgument("taking a machine over needs secure mode with the agent link's certificates")


@dataclass(frozen=True)
class IpuUse:
    index: int
    partition_id: str = ""
    partition_state: str = ""
    routing_id: int = 0
    gcd: int = 0


@dataclass
class AgentView:
    agent: Agent
    cluster_id: str = ""
    allocation_id: str = ""
    ipus: list[IpuUse] = field(default_factory=list)
    draining_partitions: tuple[str, ...] = ()  # while it drains: the partitions still on it (none: drained)


class AgentService:
    def __init__(self, store: Store, gateway: AgentGateway, clusters: ClusterService, owners: Owners,
                 takeover_grant: Callable[[str], str] = no_takeover):
        """`takeover_grant(machine_serial)`: the site authority's grant for this controller to take that machine."""
        self.store = store
        self.owners = owners
        self.gateway = gateway
        self.clusters = clusters
        self.takeover_grant = takeover_grant

    def create(self, agent_id: str, host: str, port: int, discovery_mode: str = "Manual", take_over: bool = False,
               takeover_grant: str = "") -> Agent:
        """Register an agent and claim its machine; `take_over` takes the machine from the controller
        holding it (whose partitions on it are cleared) with a grant this controller makes, or with
        `takeover_grant` if given, made for it by the site's orchestration. A machine claimed here whose registration then
        loses a race stays held by this controller, which can register it again."""
        check_id("agent", agent_id)
        if not host or any(c.isspace() for c in host):
            raise InvalidArgument(f"invalid host {host!r}")
        if not 1 <= port <= 65535:
            raise InvalidArgument(f"port must be from 1 to 65535, not {port}")
        with self.store.reading() as tx:
            self._refuse_duplicate(tx, agent_id, host, port)
        try:
            inventory = self.gateway.inventory(host, port)
        except Unavailable as error:
            raise Unavailable(f"cannot reach agent {agent_id} at {host}:{port}: {error.message}") from error
        with self.store.reading() as tx:  # before any claim: a takeover would clear the machine
            self._refuse_duplicate_machine(tx, host, port, inventory.serial)
        grant = takeover_grant or (self.takeover_grant(inventory.serial) if take_over else "")
        try:
            previous = self.gateway.claim(host, port, grant)
        except (PermissionDenied, Unavailable) as error:
            raise type(error)(f"agent {agent_id} at {host}:{port}: {error.message}") from error
        if previous:
            log.warning("agent %s: machine %s taken over from controller %s", agent_id, inventory.serial, previous)
        agent = Agent(agent_id, host, port, inventory, AgentStatus.UP, discovery_mode)
        with self.store.transaction() as tx:
            self._refuse_duplicate(tx, agent_id, host, port)
            self._refuse_duplicate_machine(tx, host, port, inventory.serial)
            tx.add_agent(agent)
        return agent

    @staticmethod
    def _refuse_duplicate(tx, agent_id: str, host: str, port: int) -> None:
        if tx.get_agent(agent_id) is not None:
            raise AlreadyExists(f"agent {agent_id} already exists")
        other = tx.agent_with_address(host, port)
        if other is not None:
            raise AlreadyExists(f"agent {other.id} already uses {host}:{port}")

    @staticmethod
    def _refuse_duplicate_machine(tx, host: str, port: int, serial: str) -> None:
        for other in tx.list_agents():
            if other.inventory.serial == serial:
                raise Conflict(f"the machine at {host}:{port} (serial {serial}) is already agent {other.id}")

    def auto_add(self, addresses: list[tuple[str, int]]) -> tuple[list[str], list[str]]:
        """Register the agents at these addresses that are not registered yet, as HOST-PORT.

        The ids added, and a line for each that could not be.
        """
        with self.store.reading() as tx:
            registered = {(a.host, a.port) for a in tx.list_agents()}
        added, failures = [], []
        for host, port in addresses:
            if (host, port) in registered:
                continue
            agent_id = f"{host}-{port}"
            try:
                self.create(agent_id, host, port, discovery_mode="Auto")
                added.append(agent_id)
            except VipuError as error:
                failures.append(f"{agent_id}: {error.message}")
        return added, failures

    def list(self) -> list[AgentView]:
        with self.store.reading() as tx:
            clusters, allocations = tx.cluster_of_agents(), tx.allocation_of_agents()
            agents = sorted(tx.list_agents(), key=lambda a: natural_key(a.id))
        views = []
        for agent in agents:
            drained = self._as_drained(agent, allocations.get(agent.id, ""))
            views.append(AgentView(drained, clusters.get(agent.id, ""), allocations.get(agent.id, ""),
                                   draining_partitions=self._still_on(drained, allocations.get(agent.id, ""))))
        return views

    def _as_drained(self, agent: Agent, allocation_id: str) -> Agent:
        """The agent with the drain its allocation's owner holds for it when an operator's is not
        there: a maintenance window's, while it lasts."""
        owner = self.owners.owner(allocation_id) if agent.drain is None and allocation_id else None
        window = owner.snapshot.draining.get(agent.id) if owner is not None else None
        return agent if window is None else dataclasses.replace(agent, drain=window)

    def _still_on(self, agent: Agent, allocation_id: str) -> tuple[str, ...]:
        """The partitions on a machine being drained, as its owner last committed them; () for one not drained."""
        if agent.drain is None or not allocation_id:
            return ()
        owner = self.owners.owner(allocation_id)
        partitions = owner.snapshot.partitions.values() if owner is not None else ()
        return tuple(sorted((p.id for p in partitions if agent.id in p.agent_ids), key=natural_key))

    def drain(self, agent_ids: builtins.list[str], reason: str, by: str, deadline: float = 0.0) -> builtins.list[AgentView]:
        """Drain the agents' machines, all or none: nothing is placed on them from now on, and their
        relocatable partitions move off while idle (now, and at each health pass until none is left);
        the others are left to finish, or, given a `deadline` (seconds since the epoch), are removed
        then as a forced remove removes them. Draining one again for the same reason changes nothing
        but a deadline given; for another reason, it is refused (resume it first). Stored, so it
        survives restarts and leaders."""
        reason, now = checked_reason(reason, "a drain"), time.time()
        if deadline and not (math.isfinite(deadline) and now < deadline <= now + MAX_EXPECTED_SECONDS):
            written = utc_text(deadline) if math.isfinite(deadline) and 0 < deadline < now + MAX_EXPECTED_SECONDS else repr(deadline)
            raise InvalidArgument(f"a drain's deadline (--by) is a time to come within {MAX_EXPECTED_SECONDS} s, not {written}")
        with self.store.transaction() as tx:
            agents = self._named(tx, agent_ids)
            for agent in agents:
                if agent.drain is not None and agent.drain.reason != reason:
                    raise Conflict(f"agent {agent.id} is already {agent.drain.describe()}; resume it first to drain it for another reason")
            changed = {agent.id: dataclasses.replace(agent.drain, deadline=deadline) if agent.drain else Drain(reason, by, now, deadline)
                       for agent in agents if agent.drain is None or (deadline and agent.drain.deadline != deadline)}
            for agent_id, drain in changed.items():
                tx.set_drain(agent_id, drain)
            allocations = tx.allocation_of_agents()
        removed = f"; what is left there is removed at {utc_text(deadline)}" if deadline else ""
        for agent_id, drain in changed.items():
            log.info("agent %s is %s%s", agent_id, drain.describe(), removed)
        self._tell_owners(changed, allocations)
        return self._as_they_are(agents)

    def resume(self, agent_ids: builtins.list[str]) -> builtins.list[AgentView]:
        """End the drain of the agents' machines, all or none: partitions are placed there again.
        A maintenance window's drain ends with the window (or its removal), not by a resume."""
        configuration = self.store.configuration()
        for agent_id in agent_ids:
            agent = configuration.agents.get(agent_id)
            if agent is None or agent.drain is not None:
                continue
            window = self._as_drained(agent, configuration.allocation_of(agent_id)).drain
            if window is not None:
                raise Conflict(f"agent {agent_id} is {window.describe()}; it resumes at the window's end, or when the reservation "
                               "is removed (vipu-admin remove reservation)")
        with self.store.transaction() as tx:
            agents = self._named(tx, agent_ids)
            undrained = [agent.id for agent in agents if agent.drain is None]
            if undrained:
                raise Conflict(f"agent {', '.join(undrained)} {'is' if len(undrained) == 1 else 'are'} not drained: nothing to resume")
            for agent in agents:
                tx.set_drain(agent.id, None)
            allocations = tx.allocation_of_agents()
        for agent in agents:
            log.info("agent %s resumed after %s", agent.id, typing.cast(Drain, agent.drain).describe())
        self._tell_owners([agent.id for agent in agents], allocations)
        return self._as_they_are(agents)

    @staticmethod
    def _named(tx, agent_ids: builtins.list[str]) -> builtins.list[Agent]:
        if not agent_ids:
            raise InvalidArgument("name at least one agent")
        agents = []
        for agent_id in dict.fromkeys(agent_ids):
            agent = tx.get_agent(agent_id)
            if agent is None:
                raise NotFound(f"agent {shown(agent_id)} does not exist")
            agents.append(agent)
        return agents

    def _tell_owners(self, agent_ids: Iterable[str], allocations: dict[str, str]) -> None:
        """Tell the owners of the machines' allocations that their drains changed, all at once, and
        wait for the moves the drains begin (`DRAIN_WAIT_SECONDS`). The store holds the drains
        already: each owner reads them there, now or, should this word not reach it, at the next
        health pass; a move not made now is tried at each pass."""
        told = []
        for allocation_id in dict.fromkeys(allocations[a] for a in agent_ids if a in allocations):
            command = DrainsChanged()
            try:
                owner = self.owners.owner(allocation_id)
                if owner is not None:
                    owner.submit(command, always=True)
                    told.append((allocation_id, command))
            except VipuError as error:
                log.warning("allocation %s: its owner learns of the drains at the next health pass: %s", allocation_id, error.message)
        deadline = time.monotonic() + DRAIN_WAIT_SECONDS
        for allocation_id, command in told:
            left = max(0.0, deadline - time.monotonic())
            try:
                command.reply.wait(left, f"allocation {allocation_id}'s owner", left)
            except VipuError as error:
                log.warning("allocation %s: the moves off its machines being drained go on: %s", allocation_id, error.message)

    def _as_they_are(self, agents: builtins.list[Agent]) -> builtins.list[AgentView]:
        """The agents as they are now, those removed meanwhile left out: the answer of a change already committed."""
        views = {view.agent.id: view for view in self.list()}
        return [views[agent.id] for agent in agents if agent.id in views]

    def get(self, agent_id: str) -> AgentView:
        """The agent, and which partition holds each of its IPUs (as its allocation's owner last committed)."""
        with self.store.reading() as tx:
            agent = tx.get_agent(agent_id)
            if agent is None:
                raise NotFound(f"agent {shown(agent_id)} does not exist")
            cluster_id, allocation_id = tx.cluster_of_agents().get(agent_id, ""), tx.allocation_of_agents().get(agent_id, "")
        owner = self.owners.owner(allocation_id) if allocation_id else None
        holders = {}
        for partition in owner.snapshot.partitions.values() if owner is not None else ():
            for ipu in partition.ipus_on(agent_id):
                holders[ipu.index] = IpuUse(ipu.index, partition.id, partition.ready_state.value, ipu.routing_id, ipu.gcd)
        drained = self._as_drained(agent, allocation_id)
        return AgentView(drained, cluster_id, allocation_id, [holders.get(i.index, IpuUse(i.index)) for i in agent.inventory.ipus],
                         self._still_on(drained, allocation_id))

    def power(self, agent_id: str, action: PowerAction | None, force: bool = False) -> tuple[PowerState, builtins.list[str]]:
        """Power the agent's machine (`action`), or read its power state (None); its power state then,
        and the ACTIVE partitions a forced action failed. Only on a machine with the power
        capability; other than on, refused while a partition is ACTIVE there, unless forced: those
        partitions then fail as after the agent's loss, and are reset once it answers again."""
        view = self.get(agent_id)
        agent = view.agent
        if not agent.inventory.has(Capability.POWER):
            raise InvalidArgument(f"agent {agent_id} has no power capability: its machine offers {', '.join(agent.inventory.capabilities)}")
        if action is None:
            condition = self.gateway.condition(agent.host, agent.port)
            problem = next((p for p in condition.problems if Capability.POWER.value in p.split(": ", 1)[0].split(", ")), "")
            if problem:
                raise Unavailable(f"agent {agent_id}: {problem}")
            return PowerState(condition.power_state), []
        owner = self.owners.owner(view.allocation_id) if view.allocation_id and action is not PowerAction.ON else None
        token, failed = object(), []
        try:
            if owner is not None:  # its owner decides what runs there, and keeps it down until the action ends
                begin = Powering(agent_id, action.value, token, force=force, until=time.monotonic() + POWER_SECONDS + POWER_MARGIN_SECONDS)
                owner.submit(begin)
                failed = begin.reply.wait(OWNER_SECONDS, f"the start of agent {agent_id}'s power {action.value}", OWNER_SECONDS)
            try:
                return self.gateway.power(agent.host, agent.port, action, POWER_SECONDS), failed
            except VipuError as error:
                raise type(error)(f"agent {agent_id}: power {action.value}: {error.message}") from error
        finally:
            if owner is not None:
                self._tell_end(owner, Powering(agent_id, action.value, token, begin=False))

    @staticmethod
    def _tell_end(owner, end: Powering) -> None:
        """Tell the owner a power action ended, so that it holds the machine down no longer (it
        would let go at the action's deadline anyway)."""
        try:
            owner.submit(end)
            end.reply.wait(OWNER_SECONDS, f"the end of agent {end.agent_id}'s power {end.action}", OWNER_SECONDS)
        except VipuError as error:
            log.warning("agent %s: the end of its power %s was not told to its owner, which lets go of it at the action's deadline: %s",
                        end.agent_id, end.action, error.message)

    def remove(self, agent_id: str, force: bool = False, gone: bool = False) -> builtins.list[str]:
        """Remove an agent; with `force`, its cluster (and what is in it) first. `gone`: its machine
        is known to be gone (a rebuilt simulated pod's), so no release is asked of it."""
        view = self.get(agent_id)
        removed: builtins.list[str] = []
        if view.cluster_id:
            if not force:
                raise Conflict(
                    f"agent {agent_id} is in cluster {view.cluster_id}; remove the cluster first, "
                    f"or use --force to remove cluster {view.cluster_id}, its allocations and partitions with it"
                )
            removed += self.clusters.remove(view.cluster_id, force=True)
            removed.append(f"cluster {view.cluster_id}")
        with self.store.transaction() as tx:
            tx.delete_agent(agent_id)
            tx.forget_links(agent_id)
            tx.forget_log_lines(agent_id)
        try:
            if not gone:
                self.gateway.release(view.agent.host, view.agent.port)
        except VipuError as error:
            log.warning("agent %s removed, but its machine was not released (another controller may take it over): %s",
                        agent_id, error.message)
        self.gateway.forget(view.agent.host, view.agent.port)
        return removed
