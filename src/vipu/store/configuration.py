"""The slow-changing entities: agents, clusters and allocations, and the cache that serves them.

Every partition operation needs the agents, the cluster and the allocation, and they change
rarely, so transactions read them from `ConfigurationCache` rather than the database (see its
docstring); a transaction that changes them counts a new generation, for every cache.
"""

from __future__ import annotations

import dataclasses
import json
import threading
from dataclasses import dataclass
from typing import TypeVar

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from vipu.model.accounts import Account, Quota, ShapeLimit
from vipu.model.entities import Agent, AgentStatus, Allocation, Cluster, Drain, GwTopology, IldTopology, IpuInfo, MachineInventory
from vipu.model.errors import AlreadyExists, NotFound
from vipu.model.hardware import Cable, Component, ComponentHealth, HealthEvent, HealthLevel, MachineCondition
from vipu.store.schema import AccountRow, AgentRow, AllocationAgentRow, AllocationRow, ClusterAgentRow, ClusterRow, MetaRow
from vipu.store.transactions import CONFIGURATION_CHANGED, TransactionBase

GENERATION_KEY = "configuration_generation"
CONFIGURATION_GENERATION = select(MetaRow.value).where(MetaRow.key == GENERATION_KEY)
NEXT_GENERATION = "UPDATE vipu_meta SET value = CAST(CAST(value AS INTEGER) + 1 AS VARCHAR(256)) WHERE key = ?"
DELETE_ALLOCATION = "DELETE FROM allocations WHERE id = ?"
E = TypeVar("E")


def _inventory_to_json(inventory: MachineInventory) -> dict:
    return dataclasses.asdict(inventory)


def _inventory_from_json(data: dict) -> MachineInventory:
    data = dict(data)
    data["ipus"] = [IpuInfo(**ipu) for ipu in data.get("ipus", [])]
    if "capabilities" in data:  # an inventory stored before capabilities keeps the default
        data["capabilities"] = tuple(data["capabilities"])
    data["cables"] = tuple(Cable(**cable) for cable in data.get("cables", ()))
    data["components"] = tuple(Component(**component) for component in data.get("components", ()))
    condition = dict(data.get("condition") or {})
    condition["components"] = tuple(ComponentHealth(c["component"], HealthLevel(c["health"]), c.get("state", ""), c.get("message", ""))
                                    for c in condition.get("components", ()))
    condition["problems"] = tuple(condition.get("problems", ()))
    condition["events"] = tuple(HealthEvent(e["sequence"], e["at"], HealthLevel(e["severity"]), e["component"], e["message"])
                                for e in condition.get("events", ()))
    data["condition"] = MachineCondition(**condition)
    return MachineInventory(**data)


def _agent(row: AgentRow, inventory: dict | None = None) -> Agent:
    """The agent of a row, read from the database, or just written with its inventory as `inventory`."""
    return Agent(id=row.id, host=row.host, port=row.port, inventory=_inventory_from_json(row.inventory if inventory is None else inventory),
                 status=AgentStatus(row.status), discovery_mode=row.discovery_mode, last_error=row.last_error or "",
                 drain=Drain(row.drain["reason"], row.drain["by"], float(row.drain["since"]), float(row.drain.get("deadline", 0.0)))
                 if row.drain else None)


def _drain_to_json(drain: Drain | None) -> dict | None:
    return None if drain is None else {"reason": drain.reason, "by": drain.by, "since": drain.since, "deadline": drain.deadline}


def _cluster(row: ClusterRow) -> Cluster:
    return Cluster(id=row.id, agent_ids=tuple(m.agent_id for m in row.members), topology=IldTopology(row.topology),
                   num_ilds=row.num_ilds, gw_topology=GwTopology(row.gw_topology) if row.gw_topology else None)


def _allocation(row: AllocationRow) -> Allocation:
    return Allocation(id=row.id, cluster_id=row.cluster_id, agent_ids=tuple(m.agent_id for m in row.members))


def _account(row: AccountRow) -> Account:
    return Account(row.name, tuple(row.users or ()), row.cohort or "",
                   {allocation: Quota(int(q["ipus"]), tuple(ShapeLimit.parse(spec) for spec in q.get("limits", ())))
                    for allocation, q in (row.quotas or {}).items()}, float(row.created or 0.0))


def _account_values(account: Account) -> dict:
    return {"users": list(account.users), "cohort": account.cohort, "created": account.created,
            "quotas": {allocation: {"ipus": q.ipus, "limits": [limit.spec() for limit in q.limits]}
                       for allocation, q in sorted(account.quotas.items())}}


def _copy(entity: E | None) -> E | None:
    """A copy of a cached entity a caller may change, or None."""
    return dataclasses.replace(entity) if entity is not None else None  # type: ignore[type-var]


@dataclass(frozen=True)
class Configuration:
    """Agents, clusters and allocations (by id, in id order) as of one configuration generation.
    Shared by every reader: never change what it holds (the repository hands out copies)."""

    generation: int
    agents: dict[str, Agent]
    clusters: dict[str, Cluster]
    allocations: dict[str, Allocation]
    accounts: dict[str, Account] = dataclasses.field(default_factory=dict)

    def allocation_of(self, agent_id: str) -> str:
        """The allocation the agent's machine is given to; "" if none."""
        return next((a.id for a in self.allocations.values() if agent_id in a.agent_ids), "")

    @classmethod
    def load(cls, session: Session, generation: int) -> Configuration:
        def rows(kind):
            return session.scalars(select(kind).order_by(kind.id))

        return cls(generation, {r.id: _agent(r) for r in rows(AgentRow)}, {r.id: _cluster(r) for r in rows(ClusterRow)},
                   {r.id: _allocation(r) for r in rows(AllocationRow)},
                   {r.name: _account(r) for r in session.scalars(select(AccountRow).order_by(AccountRow.name))})


class ConfigurationCache:
    """The slow-changing entities, kept between transactions.

    The store keeps a generation counter that every transaction changing them increments; a
    transaction reads the counter (one small query) and reuses the entities loaded at that
    generation, so several controllers on one database never see each other's stale copies.

    A controller that serves is the store's only writer (replicas standing by write nothing), so
    once it says so (`own`) the cache trusts itself: it counts the changes this process commits
    and reads nothing, not even the counter, until one of them empties it.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._latest: Configuration | None = None
        self._owned = False
        self._commits = 0  # configuration changes committed by this process while it owns the store

    def own(self, owned: bool) -> None:
        with self._lock:
            self._owned, self._latest = owned, None
            self._commits += 1

    def changed(self, agents: dict[str, Agent] | None = None, read_at: int | None = None) -> None:
        """A transaction of this process that changed the configuration has committed (or may
        have). Given `agents`, the only change it made (those agents' rows rewritten) and the
        generation of the configuration it read them from, `read_at`: when no other change has
        committed since, the cache takes them in place of the loaded ones rather than loading
        everything again (a health pass rewrites an agent at a time: reloading each of N agents'
        inventories for each of N agents made a pass that changes them all cost N squared)."""
        with self._lock:
            latest = self._latest
            self._commits += 1
            if self._owned and latest is not None and agents is not None and read_at == latest.generation == self._commits - 1:
                self._latest = dataclasses.replace(latest, generation=self._commits, agents={**latest.agents, **agents})
            else:
                self._latest = None

    def cached(self) -> Configuration | None:
        """What an owning controller may use without reading: the configuration as it committed it last."""
        return self._latest if self._owned else None

    def current(self, transaction: TransactionBase) -> Configuration:
        latest = self._latest
        if self._owned:
            if latest is not None:
                return latest
            commits = self._commits
            loaded = Configuration.load(transaction.session, commits)
            with self._lock:  # kept only if no change committed while it was read
                if self._owned and self._commits == commits:
                    self._latest = loaded
            return loaded
        generation = int(transaction.connection.execute(CONFIGURATION_GENERATION).scalar_one())
        if latest is not None and latest.generation == generation:
            return latest
        loaded = Configuration.load(transaction.session, generation)
        with self._lock:
            if not self._owned and (self._latest is None or self._latest.generation <= generation):
                self._latest = loaded
        return loaded


class ConfigurationRepository(TransactionBase):
    """Agents, clusters and allocations, served from the configuration cache."""

    def configuration(self) -> Configuration:
        """This transaction's view of the slow-changing entities: the shared cache's, or, once
        the transaction has changed them itself, its own reading of them. Shared: never change it."""
        if self._seen is None:
            if self._changed_configuration:
                self._seen = Configuration.load(self.session, -1)
            else:
                self._seen = self._cache.current(self)
                self._read_generation = self._seen.generation
        return self._seen

    def _configuration_changes(self, rewritten: Agent | None = None) -> None:
        """Record that this transaction changes agents, clusters or allocations (for every cache);
        `rewritten`: the change is that agent's row, written whole, which the cache can take as it is."""
        if rewritten is None:
            self._rewritten_agents = None
        elif self._rewritten_agents is not None:
            self._rewritten_agents[rewritten.id] = rewritten
        self._seen = None
        self._changed.add(CONFIGURATION_CHANGED)
        if not self._changed_configuration:
            self._changed_configuration = True
            cursor = self.driver.cursor()
            try:
                cursor.execute(NEXT_GENERATION if self.is_sqlite else NEXT_GENERATION.replace("?", "%s"), (GENERATION_KEY,))
            finally:
                cursor.close()

    def get_agent(self, agent_id: str) -> Agent | None:
        return _copy(self.configuration().agents.get(agent_id))

    def list_agents(self) -> list[Agent]:
        return [dataclasses.replace(a) for a in self.configuration().agents.values()]

    def add_agent(self, agent: Agent) -> None:
        self._configuration_changes()
        if self.session.get(AgentRow, agent.id) is not None:
            raise AlreadyExists(f"agent {agent.id} already exists")
        self.session.add(AgentRow(id=agent.id, host=agent.host, port=agent.port, status=agent.status.value,
                                  discovery_mode=agent.discovery_mode, last_error=agent.last_error,
                                  inventory=_inventory_to_json(agent.inventory), drain=_drain_to_json(agent.drain)))
        self.flush(f"agent {agent.id} already exists")

    def update_agent(self, agent: Agent) -> None:
        row = self.session.get(AgentRow, agent.id)
        if row is None:
            self._configuration_changes()
            return
        row.status = agent.status.value
        row.last_error = agent.last_error[:1024]
        row.inventory = _inventory_to_json(agent.inventory)  # its drain is an operator's, written by `set_drain` alone
        # As the next load would read it back (the JSON column's own round trip: tuples become lists).
        self._configuration_changes(rewritten=_agent(row, json.loads(json.dumps(row.inventory))))

    def set_drain(self, agent_id: str, drain: Drain | None) -> None:
        """Drain the agent's machine, or resume it (None); the health pass's writes leave this alone."""
        self._configuration_changes()
        row = self.session.get(AgentRow, agent_id)
        if row is not None:
            row.drain = _drain_to_json(drain)

    def delete_agent(self, agent_id: str) -> None:
        self._configuration_changes()
        self.session.execute(delete(AgentRow).where(AgentRow.id == agent_id))

    def agent_with_address(self, host: str, port: int) -> Agent | None:
        return next((a for a in self.list_agents() if (a.host, a.port) == (host, port)), None)

    def get_cluster(self, cluster_id: str) -> Cluster | None:
        return _copy(self.configuration().clusters.get(cluster_id))

    def list_clusters(self) -> list[Cluster]:
        return [dataclasses.replace(c) for c in self.configuration().clusters.values()]

    def cluster_of_agents(self) -> dict[str, str]:
        return {a: c.id for c in self.configuration().clusters.values() for a in c.agent_ids}

    def add_cluster(self, cluster: Cluster) -> None:
        self._configuration_changes()
        if self.session.get(ClusterRow, cluster.id) is not None:
            raise AlreadyExists(f"cluster {cluster.id} already exists")
        self.session.add(ClusterRow(id=cluster.id, topology=cluster.topology.value, num_ilds=cluster.num_ilds,
                                    gw_topology=cluster.gw_topology.value if cluster.gw_topology else None,
                                    members=[ClusterAgentRow(position=i, agent_id=a) for i, a in enumerate(cluster.agent_ids)]))
        self.flush(f"cluster {cluster.id} or one of its agents is taken by a concurrent change")

    def delete_cluster(self, cluster_id: str) -> None:
        self._configuration_changes()
        row = self.session.get(ClusterRow, cluster_id)
        if row is not None:
            self.session.delete(row)
            self.session.flush()

    def get_allocation(self, allocation_id: str) -> Allocation | None:
        return _copy(self.configuration().allocations.get(allocation_id))

    def list_allocations(self, cluster_id: str | None = None) -> list[Allocation]:
        return [dataclasses.replace(a) for a in self.configuration().allocations.values()
                if cluster_id is None or a.cluster_id == cluster_id]

    def allocation_of_agents(self) -> dict[str, str]:
        return {a: alloc.id for alloc in self.configuration().allocations.values() for a in alloc.agent_ids}

    def add_allocation(self, allocation: Allocation) -> None:
        self._configuration_changes()
        if self.session.get(AllocationRow, allocation.id) is not None:
            raise AlreadyExists(f"allocation {allocation.id} already exists")
        self.session.add(AllocationRow(id=allocation.id, cluster_id=allocation.cluster_id,
                                       members=[AllocationAgentRow(position=i, agent_id=a)
                                                for i, a in enumerate(allocation.agent_ids)]))
        self.flush(f"allocation {allocation.id} or one of its machines is taken by a concurrent change")

    def delete_allocation(self, allocation_id: str) -> None:
        """The allocation goes, its machines and waiting requests with it (the schema's cascades);
        on the driver, so that its owner's last write joins the group commit."""
        self._configuration_changes()
        cursor = self.driver.cursor()
        try:
            cursor.execute(DELETE_ALLOCATION if self.is_sqlite else DELETE_ALLOCATION.replace("?", "%s"), (allocation_id,))
        finally:
            cursor.close()

    def add_account(self, account: Account) -> None:
        self._configuration_changes()
        if self.session.get(AccountRow, account.name) is not None:
            raise AlreadyExists(f"account {account.name} already exists")
        self.session.add(AccountRow(name=account.name, **_account_values(account)))
        self.flush(f"account {account.name} already exists")

    def update_account(self, account: Account) -> None:
        """Write an account whole (its users, cohort and quotas); NotFound if it is gone."""
        self._configuration_changes()
        row = self.session.get(AccountRow, account.name)
        if row is None:
            raise NotFound(f"account {account.name} does not exist")
        for name, value in _account_values(account).items():
            setattr(row, name, value)
        self.session.flush()

    def delete_account(self, name: str) -> None:
        self._configuration_changes()
        row = self.session.get(AccountRow, name)
        if row is None:
            raise NotFound(f"account {name} does not exist")
        self.session.delete(row)
        self.session.flush()
