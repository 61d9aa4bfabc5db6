"""The allocations' owners, and the little they share: partition ids, the queues' bounds, how
requests ended, and word of every change.

An owner is made for each allocation when the controller starts to serve (from the store), or
when an allocation is first used after it was created; it goes when its allocation is removed.
A partition id is unique across allocations: a create claims it here before asking any owner,
and the owner that commits something under it settles it, so two allocations never make the same
id and a refusal names the id at once. What owners share is guarded by one small lock, held over
a few dictionary operations and never across a store write or an agent call.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections import Counter

from vipu import failpoints
from vipu.controller.core.agents import AgentCall, AgentCalls, Outcomes
from vipu.controller.core.changes import ChangeFeed, Topic
from vipu.controller.core.commands import FinishInterrupted, LinksChanged, Reply
from vipu.controller.core.owner import allocation_owner
from vipu.controller.core.sharing import DEFAULT_SHARING, SharingPolicy, fair_share_of, usage_since
from vipu.controller.core.snapshot import AllocationSnapshot
from vipu.controller.core.state import AllocationState
from vipu.controller.core.turns import TurnEngine
from vipu.model.compaction import DEFAULT_BUDGET, Budget
from vipu.model.entities import Agent, Allocation, Drain, ReadyState
from vipu.model.errors import Conflict, Unavailable, VipuError
from vipu.model.linkhealth import NO_FAULTS, LinkFaults
from vipu.model.topology import ClusterLayout
from vipu.model.waiting import DEFAULT_LIMITS, QueueLimits
from vipu.store.store import Configuration, Store

log = logging.getLogger("vipu.controller.core")

# An id's holder while a create or an enqueue of it is under way and nothing of it is committed:
# CLAIMED, then CLAIMED and the allocation it is being offered to.
CLAIMED = "\0claimed:"
CLEARING = "\0clearing"  # an id's holder while a health pass clears old settings of it from a machine in no allocation
IN_FLIGHT_WAIT_SECONDS = 5.0  # how long a look for an id's owner waits for a create of it to be offered somewhere
# How long a request ended without a partition (expired, cancelled, failed) is told to a client that asks after it.
ENDINGS_KEPT_SECONDS = 600.0
CLEARING_WAIT_SECONDS = 30.0  # a create of an id being cleared waits this long for it: one agent call
REBUILD_JOIN_SECONDS = 60.0  # how long a rebuild waits for the failed owner's turn to end: its commit is bounded by the statement deadline
REBUILD_TRY_SECONDS = 300.0  # how long a rebuild tries to read the store (a stalled database), once a second
REBUILD_RETRY_SECONDS = 1.0


def _machines_out(configuration: Configuration, allocation: Allocation) -> tuple[set[str], dict[str, Drain]]:
    """The allocation's machines that are down (their fabric does not answer), and those an operator drains."""
    agents = [agent for a in allocation.agent_ids if (agent := configuration.agents.get(a)) is not None]
    return {agent.id for agent in agents if not agent.answering}, {agent.id: agent.drain for agent in agents if agent.drain}


class Owners:
    def __init__(self, store: Store, calls: AgentCalls, changes: ChangeFeed | None = None, limits: QueueLimits = DEFAULT_LIMITS,
                 compaction_budget: Budget = DEFAULT_BUDGET, sharing: SharingPolicy = DEFAULT_SHARING):
        self.store = store
        self.sharing = sharing
        self.calls = calls
        self.changes = changes
        self.limits = limits
        self.compaction_budget = compaction_budget
        self._lock = threading.Lock()
        self._ids_freed = threading.Condition(self._lock)
        self._owners: dict[str, TurnEngine] = {}
        self._ids: dict[str, str] = {}  # partition id -> the allocation holding a partition or request of it; or CLAIMED..., CLEARING
        self._waiting_by_user: Counter[str] = Counter()
        self._waiting = 0
        self._endings: dict[str, tuple[float, str, VipuError]] = {}  # partition id -> (when, allocation, how it ended)
        self._tests: dict[str, tuple[str, tuple[str, ...]]] = {}  # cluster id -> the disruptive test claiming its machines,
        # and the drained ones it claims alone (none: all of them)
        self._stopped = ""
        self._links = NO_FAULTS  # every unhealthy link, as the link ledger last said: what a new owner starts from
        # Per allocation, owners made and removals: an owner made from a store read begun before either
        # is not kept (another owner of the allocation may have committed meanwhile, and failed since).
        self._owner_changes: Counter[str] = Counter()
        self._failed: dict[str, TurnEngine] = {}  # allocation id -> its owner that failed, until a new one is made from the store
        self.changed = threading.Condition()  # notified after every snapshot published
        self.version = 0  # counts the snapshots published, so that a waiter misses none

    # The owners

    def load(self) -> None:
        """Make an owner of every allocation from what the store holds: at start-up, and when this
        controller takes the lead. Nothing runs yet that a health pass would not start."""
        with self.store.reading() as tx:
            configuration = tx.configuration()
            partitions = tx.list_partitions()
            requests = tx.list_requests()
            reservations = tx.list_reservations()
            unhealthy = tx.unhealthy_links()
            now = time.time()
            usage = tx.usage_records(usage_since(self.sharing, now), now)
        with self._lock:
            self._links = LinkFaults.of(unhealthy, sequence=self._links.sequence)
            links = self._links
        owners = {}
        for allocation in configuration.allocations.values():
            cluster = configuration.clusters[allocation.cluster_id]
            state = AllocationState.of(allocation, ClusterLayout.of(cluster), [p for p in partitions if p.allocation_id == allocation.id],
                                       [r for r in requests if r.allocation_id == allocation.id], *_machines_out(configuration, allocation),
                                       links=links, reservations=[r for r in reservations if r.allocation_id == allocation.id])
            self._hold_for_test(state)
            state.usage = fair_share_of([u for u in usage if u.allocation_id == allocation.id], self.sharing, now)
            owners[allocation.id] = allocation_owner(self, state)
        with self._lock:
            self._owners = owners
            self._failed.clear()  # every owner is made from the store now
            self._ids = {p.id: p.allocation_id for p in partitions} | {r.partition_id: r.allocation_id for r in requests}
            self._waiting_by_user = Counter(r.owner for r in requests if r.owner)
            self._waiting = len(requests)
        for owner in owners.values():
            if len(owner.state.queue):
                owner.wake()  # its requests' deadlines and a first pass over its queue

    def owner(self, allocation_id: str) -> TurnEngine | None:
        """The allocation's owner, made when it is first asked for; None if there is no such allocation."""
        while True:
            with self._lock:
                found = self._owners.get(allocation_id)
                changes = self._owner_changes[allocation_id]
            if found is not None:
                return found
            configuration = self.store.configuration()
            allocation = configuration.allocations.get(allocation_id)
            if allocation is None:
                return None
            with self._lock:
                told = self._links.sequence  # the ledger's word, as far as the store read below holds it at least
            with self.store.reading() as tx:  # an allocation just made holds nothing, but a restart's may
                partitions = tx.list_partitions(allocation_id=allocation_id)
                requests = tx.list_requests(allocation_id)
                reservations = tx.list_reservations(allocation_id)
                links = LinkFaults.of(tx.unhealthy_links(), set(allocation.agent_ids), told)
                now = time.time()
                usage = fair_share_of(tx.usage_records(usage_since(self.sharing, now), now, allocation_id), self.sharing, now)
            failpoints.hit("owner.read")
            cluster = configuration.clusters[allocation.cluster_id]
            with self._lock:
                found = self._owners.get(allocation_id)
                if found is not None:
                    return found
                if self._stopped:
                    raise Unavailable(self._stopped)
                if self._owner_changes[allocation_id] != changes:
                    continue  # an owner was made (and failed since), or an allocation removed, while this read: read again
                state = AllocationState.of(allocation, ClusterLayout.of(cluster), partitions, requests,
                                           *_machines_out(configuration, allocation), links=links, reservations=reservations)
                self._hold_for_test(state)
                state.usage = usage
                failed = self._failed.get(allocation_id)
                if failed is not None:
                    state.keep_out_as(failed.state)
                owner = self._owners[allocation_id] = allocation_owner(self, state)
                self._owner_changes[allocation_id] += 1
                later = self._links if self._links.sequence != told else None
            break
        if later is not None:  # word the ledger gave while the store was read, which may have missed it
            with contextlib.suppress(Unavailable):
                owner.submit(LinksChanged(later, reply=Reply(waited=False)), always=True)
        return owner

    def rebuild(self, failed: TurnEngine, why: str) -> None:
        """An owner met what it did not expect (a turn raised; a commit's outcome is unknown), so
        what it holds in memory may not be what the store holds: it stops at once, and a new owner of
        its allocation is made from the store as at a takeover, which finishes the operations the
        old one left (FinishInterrupted). Until then the next request for the allocation makes it."""
        with self._lock:
            if self._owners.get(failed.id) is failed:
                del self._owners[failed.id]
                self._failed[failed.id] = failed
        failed.stop(why)
        threading.Thread(target=self._remake, args=(failed,), name=f"rebuild-{failed.id}", daemon=True).start()

    def _remake(self, failed: TurnEngine) -> None:
        if not failed.join(REBUILD_JOIN_SECONDS):
            log.warning("allocation %s: the failed owner's turn did not end within %g s; its new owner is made all the same",
                        failed.id, REBUILD_JOIN_SECONDS)
        deadline = time.monotonic() + REBUILD_TRY_SECONDS
        while True:
            try:
                owner = self.owner(failed.id)
                break
            except VipuError as error:
                if self._stopped or time.monotonic() > deadline:
                    log.warning("allocation %s: its owner could not be made again from the store (%s); the next request makes it",
                                failed.id, error.message)
                    return
                log.warning("allocation %s: its owner cannot be made again from the store yet (%s); trying again", failed.id,
                            error.message)
                time.sleep(REBUILD_RETRY_SECONDS)
        with self._lock:
            if self._failed.get(failed.id) is failed:
                del self._failed[failed.id]
            self._ids_freed.notify_all()
            self._ids = {p: holder for p, holder in self._ids.items() if holder != failed.id}
            if owner is None:  # the allocation was removed meanwhile
                return
            self._ids.update({p: owner.id for p in owner.state.partitions} | {r.partition_id: owner.id for r in owner.state.queue})
            self._waiting_by_user.subtract(r.owner for r in failed.state.queue if r.owner)
            self._waiting_by_user.update(r.owner for r in owner.state.queue if r.owner)
            self._waiting_by_user = +self._waiting_by_user
            self._waiting += len(owner.state.queue) - len(failed.state.queue)
        log.info("allocation %s: its owner is made again from the store", owner.id)
        with contextlib.suppress(Unavailable):
            owner.submit(FinishInterrupted(reply=Reply(waited=False)), always=True)

    def all(self) -> list[TurnEngine]:
        with self._lock:
            return list(self._owners.values())

    def snapshots(self) -> list[AllocationSnapshot]:
        """Every allocation as last committed, in id order (those never used since the controller
        started are made, so that none is missed)."""
        allocations = self.store.configuration().allocations
        owners = [self.owner(allocation_id) for allocation_id in sorted(allocations)]
        return [owner.snapshot for owner in owners if owner is not None]

    def holding(self, partition_id: str, in_flight: bool = False) -> TurnEngine | None:
        """The owner of the allocation holding a partition or waiting request of that id, if any;
        with `in_flight`, also that of the allocation a create of it is being offered to (waiting
        briefly for the offer), whose inbox has the create ahead of anything sent now."""
        deadline = time.monotonic() + IN_FLIGHT_WAIT_SECONDS
        with self._lock:
            while True:
                holder = self._ids.get(partition_id)
                if holder is None or holder == CLEARING:
                    return None
                if not holder.startswith(CLAIMED):
                    found = self._owners.get(holder)
                    rebuilding = found is None and holder in self._failed
                    break
                if not in_flight:
                    return None
                offered = holder[len(CLAIMED):]
                if offered:
                    return self._owners.get(offered)
                if not self._ids_freed.wait(max(0.0, deadline - time.monotonic())):
                    return None
        return self.owner(holder) if rebuilding else found  # one being made again from the store is made now

    def closed(self, owner: TurnEngine) -> None:
        """An allocation is removed: its owner stops after this turn and goes."""
        with self._lock:
            self._owner_changes[owner.id] += 1
            if self._owners.get(owner.id) is owner:
                del self._owners[owner.id]
        threading.Thread(target=owner.stop, args=(f"allocation {owner.id} was removed",), daemon=True).start()

    def stop(self, reason: str, seconds: float = 10.0) -> None:
        """Every owner stops deciding at once (deposed, or the controller stops); waits up to `seconds` for their turns to end."""
        with self._lock:
            self._stopped = reason
            owners = list(self._owners.values())
        for owner in owners:
            owner.stop(reason)
        deadline = time.monotonic() + seconds
        for owner in owners:
            owner.join(max(0.0, deadline - time.monotonic()))

    def wait_quiet(self, seconds: float) -> bool:
        """Wait up to `seconds` until no owner has anything under way; whether none has."""
        deadline = time.monotonic() + seconds
        return all(owner.wait_quiet(max(0.0, deadline - time.monotonic())) for owner in self.all())

    # Partition ids

    def claim_id(self, partition_id: str) -> str | None:
        """Claim an id for a create or an enqueue: None if it is now the caller's, else who holds it
        (an allocation's id, or CLAIMED by another create under way). An id whose old settings are
        being cleared from a machine, or held by an allocation whose owner is being made again from
        the store, is waited for, briefly."""
        deadline = time.monotonic() + CLEARING_WAIT_SECONDS
        with self._lock:
            while (self._ids.get(partition_id) == CLEARING or self._ids.get(partition_id) in self._failed) \
                    and self._ids_freed.wait(max(0.0, deadline - time.monotonic())):
                pass  # an id being cleared, or held by an owner being made again: its outcome is known shortly
            holder = self._ids.get(partition_id)
            if holder is not None:
                return holder
            self._ids[partition_id] = CLAIMED
            self._endings.pop(partition_id, None)  # a new request or partition of that id: the old one's ending no longer applies
            return None

    def offering(self, partition_id: str, allocation_id: str) -> None:
        """A claimed id's create is offered to an allocation's owner (its command is in that inbox)."""
        with self._lock:
            if self._ids.get(partition_id, "").startswith(CLAIMED):
                self._ids[partition_id] = CLAIMED + allocation_id
                self._ids_freed.notify_all()

    def release_claim(self, partition_id: str) -> None:
        """A claimed id that nothing was committed under (every owner refused the create); or, if the
        owner it was offered to failed, one its new owner finds in the store or not."""
        with self._lock:
            holder = self._ids.get(partition_id, "")
            if holder.startswith(CLAIMED):
                offered = holder[len(CLAIMED):]
                if offered and offered in self._failed:
                    self._ids[partition_id] = offered  # until the owner made again from the store says
                else:
                    del self._ids[partition_id]
                self._ids_freed.notify_all()

    def settle_id(self, partition_id: str, allocation_id: str) -> None:
        with self._lock:
            self._ids[partition_id] = allocation_id
            self._ids_freed.notify_all()

    def release_id(self, partition_id: str, allocation_id: str) -> None:
        """The last partition or request of that id in the allocation is gone."""
        with self._lock:
            if self._ids.get(partition_id) == allocation_id:
                del self._ids[partition_id]
                self._ids_freed.notify_all()

    # The queues' bounds, and how requests ended

    def enter_queue(self, user: str) -> None:
        """A request is to wait: Conflict naming the limit when its user, or the controller, has as
        many waiting as it may."""
        with self._lock:
            if self._waiting >= self.limits.total:
                raise Conflict(f"{self._waiting} requests wait on this controller, the most it takes "
                               "(vipu-server --max-waiting); try again when some have started")
            if user and self._waiting_by_user[user] >= self.limits.per_user:
                raise Conflict(f"user {user} has {self._waiting_by_user[user]} requests waiting, the most one user may "
                               "(vipu-server --max-waiting-per-user); cancel one, or wait for one to start")
            self._waiting += 1
            if user:
                self._waiting_by_user[user] += 1

    def leave_queue(self, user: str) -> None:
        with self._lock:
            self._waiting -= 1
            if user:
                self._waiting_by_user[user] -= 1
                if self._waiting_by_user[user] <= 0:
                    del self._waiting_by_user[user]

    def record_ending(self, partition_id: str, allocation_id: str, ending: VipuError) -> None:
        now = time.monotonic()
        with self._lock:
            self._endings[partition_id] = (now, allocation_id, ending)
            self._endings = {p: e for p, e in self._endings.items() if now - e[0] < ENDINGS_KEPT_SECONDS}

    def ending(self, partition_id: str) -> tuple[str, VipuError] | None:
        """How the request of that id ended without a partition, if it did lately, and the allocation it waited in."""
        with self._lock:
            kept = self._endings.get(partition_id)
        if kept is None or time.monotonic() - kept[0] >= ENDINGS_KEPT_SECONDS:
            return None
        return kept[1], kept[2]

    # Cluster tests

    def test_starts(self, cluster_id: str, test: str, machines: tuple[str, ...] = ()) -> None:
        """A disruptive test is about to claim the cluster's machines (or those drained ones alone):
        an owner made meanwhile starts with them claimed."""
        with self._lock:
            self._tests[cluster_id] = (test, machines)

    def _hold_for_test(self, state: AllocationState) -> None:
        """An owner made now starts with its machines claimed by the disruptive test claiming its
        cluster's: all of them, unless partitions stand in its way there (an owner made again from
        the store while the claim was under way), which that claim is then refused for; or the
        drained ones it tests alone."""
        test, machines = self._tests.get(state.allocation.cluster_id, ("", ()))
        if machines:
            state.claimed = {agent: test for agent in machines if agent in state.allocation.agent_ids}
            return
        in_the_way = any(p.ready_state is not ReadyState.ERROR for p in state.partitions.values())
        state.test = "" if in_the_way else test

    def test_ends(self, cluster_id: str) -> None:
        with self._lock:
            self._tests.pop(cluster_id, None)

    # The link ledger's word

    def links_changed(self, faults: LinkFaults) -> None:
        """Every unhealthy link, as the ledger says after a change: each owner is told its machines'
        part (a command never refused for a full inbox; one whose part did not change publishes
        nothing); an older word than the last is dropped."""
        with self._lock:
            if faults.sequence < self._links.sequence:
                return
            self._links = faults
            owners = list(self._owners.values())
        for owner in owners:
            with contextlib.suppress(Unavailable):  # stopped: a new owner starts from the last word
                owner.submit(LinksChanged(faults, reply=Reply(waited=False)), always=True)

    # Word of changes

    def published(self, owner: TurnEngine, partitions_changed: bool) -> None:
        with self.changed:
            self.version += 1
            self.changed.notify_all()
        if partitions_changed and self.changes is not None:
            self.changes.publish(Topic.PARTITIONS, owner.id)

    def wait_for_change(self, seen: int, timeout: float) -> None:
        """Until an owner publishes after `version` was `seen`, or `timeout` seconds."""
        with self.changed:
            if self.version == seen:
                self.changed.wait(timeout)

    # Machines in no allocation

    def clear_unallocated(self, agent: Agent, partition_ids: list[str], seconds: float) -> None:
        """Clear what a machine in no allocation holds (an allocation removed while it was away). An
        id no partition has is held meanwhile, so that no create of it meets the clear."""
        claimed = []
        with self._lock:
            for partition_id in partition_ids:
                if partition_id not in self._ids:
                    self._ids[partition_id] = CLEARING
                    claimed.append(partition_id)
        done = threading.Event()
        try:
            calls = [AgentCall(agent.id, agent.host, agent.port, partition_id=p) for p in partition_ids]
            outcomes: Outcomes = []

            def answered(result: Outcomes) -> None:
                outcomes.extend(result)
                done.set()

            self.calls.start(calls, answered)
            done.wait(seconds)
        finally:
            with self._lock:
                for partition_id in claimed:
                    if self._ids.get(partition_id) == CLEARING:
                        del self._ids[partition_id]
                self._ids_freed.notify_all()
        for partition_id, error in zip(partition_ids, outcomes, strict=False):
            if error is None:
                log.info("agent %s: cleared partition %s, which the store does not hold as active", agent.id, partition_id)
            else:
                log.warning("agent %s: could not clear partition %s: %s", agent.id, partition_id, error.message)
