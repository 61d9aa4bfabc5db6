"""What an owner's operations use to take their steps: the partition writes of the life cycle, made
at once in the owner's state and taken back if the store refuses them, and the agent calls of a
partition (see `operations` for the operations, `effects` for the steps). `Steps` is what an
operation knows of its owner (`operations.Owner`)."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from vipu.controller.core.agents import AgentCall
from vipu.controller.core.effects import Calls, Operation, Write
from vipu.controller.core.turns import TurnEngine
from vipu.model import lifecycle
from vipu.model.compaction import BudgetSpent
from vipu.model.configuration import AgentSettings, agent_settings
from vipu.model.entities import Agent, Partition, shown
from vipu.model.errors import NotFound, VipuError
from vipu.model.queue import WaitingRequest
from vipu.model.usage import UsageRecord

if TYPE_CHECKING:
    from vipu.store.store import Transaction

log = logging.getLogger("vipu.controller.core")


class Steps:
    """The steps of the owner's operations, on its engine's state: each write marks what it changes."""

    def __init__(self, engine: TurnEngine):
        self.engine = engine
        self.id = engine.id
        self.state = engine.state
        self.owners = engine.owners
        self.changes = engine.changes
        self.on_partition = engine.on_partition

    def start(self, operation: Operation, holds: tuple[str, ...] = ()) -> Operation:
        """Begin an operation in this turn (`TurnEngine.start`)."""
        return self.engine.start(operation, holds)

    def compaction_spent(self) -> BudgetSpent:
        """The allocation's compaction moves of late (by compaction, and by resets that re-place),
        counted from what its partitions record the first time, then kept."""
        if self.state.compaction is None:
            moved = {p.id: p.compacted.timestamp() for p in self.state.partitions.values() if p.compacted is not None}
            self.state.compaction = BudgetSpent.recorded(self.owners.compaction_budget, moved, time.time())
        return self.state.compaction

    def partition(self, partition_id: str) -> Partition | None:
        return self.state.partitions.get(partition_id)

    def agents(self) -> dict[str, Agent]:
        return self.owners.store.configuration().agents

    def agents_of(self, partition: Partition) -> list[Agent]:
        agents = self.agents()
        found = []
        for agent_id in partition.agent_ids:
            agent = agents.get(agent_id)
            if agent is None:  # not while the partition exists: the store's foreign keys keep its agents
                raise NotFound(f"agent {shown(agent_id)} does not exist")
            found.append(agent)
        return found

    def call(self, agent: Agent, settings: AgentSettings | None = None, partition_id: str = "") -> AgentCall:
        return AgentCall(agent.id, agent.host, agent.port, settings, partition_id)

    def clears_under_way(self, partition_id: str, agents: list[Agent]) -> list[Operation]:
        """The reconciliations clearing old settings of that id from these agents, which its new
        settings must not race."""
        return list({id(f): f for a in agents if (f := self.engine.clears.get((a.id, partition_id))) is not None}.values())

    def settings_of(self, partition: Partition, agents: list[Agent]) -> dict[str, AgentSettings]:
        """What each of the partition's agents (`agents_of`) should hold for it."""
        return agent_settings(partition, self.state.layout, {a.id: a.inventory.serial for a in agents})

    def applying(self, partition: Partition, agents: list[Agent], of_all: list[Agent] | None = None) -> Calls:
        """Apply the partition's settings at `agents`; `of_all` (by default `agents`) are all of its
        machines (`agents_of`), whose serials each machine's settings name."""
        settings = self.settings_of(partition, agents if of_all is None else of_all)
        return Calls([self.call(agent, settings=settings[agent.id]) for agent in agents])

    def clearing(self, partition_id: str, agents: list[Agent]) -> Calls:
        return Calls([self.call(agent, partition_id=partition_id) for agent in agents])

    def partition_write(self, work: Callable[[Any], Any], before: Partition | None, after: Partition | None,
                         partition_id: str) -> Write:
        """A write of one partition: `after` (None: gone) in the state at once, `before` again if refused."""
        state = self.state
        moves = before is None or after is None or before.ipus != after.ipus  # the room changes: the queue looks again

        def put(partition: Partition | None) -> None:
            if partition is None:
                state.drop(partition_id)
            else:
                state.put(partition)

        def apply() -> None:
            put(after)
            self.changes.partitions = True
            self.changes.room = self.changes.room or moves

        def committed() -> None:
            if before is None and after is not None:
                self.owners.settle_id(partition_id, self.id)
            elif after is None:
                self.owners.release_id(partition_id, self.id)
                if before is not None and before.account:  # its usage record is written with its removal; fair share counts it from now
                    used = UsageRecord.of(before, time.time())
                    state.usage.record(used.account, used.size, used.started, used.ended)

        return Write(work, apply, lambda: put(before), committed, result=after, partition_id=partition_id)

    def transit(self, partition: Partition, *transitions: tuple[str, dict[str, Any]]) -> Write:
        """The life cycle's transitions of a partition, applied together as compare-and-sets; the
        operation gets the partition as it then is (None once it is gone)."""
        after = lifecycle.after(partition, transitions)

        def work(tx: Transaction) -> None:
            current = lifecycle.copy(partition)
            for name, fields in transitions:
                tx.transition(current, name, **{k: v for k, v in fields.items() if v is not None})

        return self.partition_write(work, partition, after, partition.id)

    def inserting(self, partition: Partition) -> Write:
        return self.partition_write(lambda tx: tx.add_partition(partition), None, partition, partition.id)

    def moving(self, partition: Partition, fields: dict[str, Any]) -> Write:
        """A partition's 'relocate' to new IPUs; its old IPUs stay taken (`unlinger`)."""
        write = self.transit(partition, ("relocate", fields))
        plain_apply, plain_undo = write.apply, write.undo

        def apply() -> None:
            self.state.linger(partition)
            plain_apply()

        def undo() -> None:
            plain_undo()
            self.state.unlinger(partition.id)

        write.apply, write.undo = apply, undo
        return write

    def unlinger(self, partition_id: str) -> None:
        if self.state.unlinger(partition_id):
            self.changes.state = self.changes.room = True

    def forgetting(self, partition: Partition, uncleared: list[str]) -> Write:
        """A partition's removal, committed although the agents `uncleared` did not confirm its
        clear: its IPUs there stay out of placement until they are seen cleared (`cleared`)."""
        write = self.transit(partition, ("removed", {}))
        plain_apply, plain_undo = write.apply, write.undo

        def apply() -> None:
            for agent_id in uncleared:
                self.keep_uncleared_of(agent_id, partition)
            plain_apply()

        def undo() -> None:
            plain_undo()
            for agent_id in uncleared:
                self.state.cleared(agent_id, partition.id)

        write.apply, write.undo = apply, undo
        return write

    def keep_uncleared(self, agent_id: str, partition_id: str, indices: list[int]) -> None:
        """IPUs of an agent that did not confirm the clear of a partition's settings (or holds
        settings nobody owns) stay out of placement until it is seen cleared (`cleared`)."""
        self.state.keep_uncleared(agent_id, partition_id, indices)
        self.changes.state = True

    def keep_uncleared_of(self, agent_id: str, partition: Partition) -> None:
        self.keep_uncleared(agent_id, partition.id, [i.index for i in partition.ipus if i.agent_id == agent_id])

    def cleared(self, agent_id: str, partition_id: str) -> None:
        """An agent is seen holding nothing of a partition: IPUs kept out for it are free again."""
        if self.state.cleared(agent_id, partition_id):
            log.info("agent %s: its IPUs of partition %s are seen cleared and free again", agent_id, partition_id)
            self.changes.state = self.changes.room = True

    def granting(self, request: WaitingRequest, partition: Partition) -> Write:
        """A request's grant: it ends, and its partition is recorded, in one transaction."""
        state = self.state

        def work(tx: Transaction) -> None:
            tx.end_request(request, "grant")
            tx.add_partition(partition)

        def apply() -> None:
            state.queue.remove(request.partition_id)
            state.put(partition)
            self.changes.partitions = self.changes.queue = self.changes.room = True

        def undo() -> None:
            state.drop(partition.id)
            state.queue.add(request)

        def committed() -> None:
            self.owners.leave_queue(request.owner)

        return Write(work, apply, undo, committed, result=partition, partition_id=partition.id)

    def ended(self, request: WaitingRequest, ending: VipuError) -> None:
        """A request that ended without a partition: its clients are told how, for a while."""
        self.owners.record_ending(request.partition_id, self.id, ending)
