"""One allocation's owner: the one place that decides anything about its partitions, IPUs and queue.

It is composed, not inherited: a turn engine (`turns.TurnEngine`: the inbox, the turn, the
operations under way, the commits and what is published) and its parts, each an object of its
own given the engine and the parts it uses. `decisions.Decisions` says what each command does;
`queueing.Queue` keeps the waiting requests, their deadlines and leases, and the pass over them;
`steps.Steps` makes the writes and agent calls that operations are made of, and is what an
operation knows of its owner (`operations.Owner`). The engine asks its parts only what
`turns.Deciding` and `turns.Queueing` say; the parts change the allocation's state (`state`),
mark what they changed (`turns.Changes`), start operations (`TurnEngine.start`), take a loan back
(`take_back`) and have a pass over the queue tried again (`pass_again`), and read the rest of the
engine's public attributes only (the operations holding partitions and under way, the clears
under way, when agent calls came back, the last snapshot).

Commands arrive in a bounded inbox (a full inbox refuses at once, as temporarily unavailable,
which clients retry) and are decided in turns, one thing at a time. Whichever thread brings work
and finds the turn free takes it and runs turns until no work is left; a thread that finds it
taken leaves its command for the one holding it (flat combining, `_drive`): nobody waits for a
turn, and a lone request is decided on its own thread without a hand-off. In a turn the owner
places against its own state (`state`), runs each operation a step at a time (`operations`, whose
steps are `effects`), groups the store writes of the turn into one commit, takes back in its
state any the store refused, and only then publishes an immutable snapshot that every reader
reads without a lock (`snapshot`).

Agent calls run outside the turn: the thread waiting for the operation's answer makes them (the
request's own thread does its network work, as it would without an owner), or, for the owner's
own upkeep, a pool does (`agents.AgentCalls`); their outcomes come back as the operation's next
step, in a turn. So no turn ever waits for an agent, nor holds anything across a network call;
an operation waits for nothing but its own steps, each bounded.

One operation at a time holds a partition: another's command is refused as busy, or waits for
it (a forced remove; any command behind the owner's own upkeep, which is brief). The queue of
waiting requests is the owner's too: after each turn that changed the room or the queue, one
pass starts what now fits (`vipu.model.queue.admit`, placement asked once per shape of request)
and works out why the others wait. A thread of the owner's keeps time (requests' deadlines, a pass
tried again, the end of a loan) while anything is due, and lets go when nothing is.

The owner may lend its free machines to an idle-time test (`lending`); placement does not see the
loan, and a turn that commits a partition on a lent machine takes the loan back, ending it
before any agent call of that turn is made (whose calls to those machines first wait, bounded, for
the test's cancelled step there to stop).
"""

from __future__ import annotations

from vipu.controller.core.decisions import Decisions
from vipu.controller.core.queueing import Queue
from vipu.controller.core.sharing import Sharing
from vipu.controller.core.state import AllocationState
from vipu.controller.core.steps import Steps
from vipu.controller.core.turns import Registry, TurnEngine


def allocation_owner(owners: Registry, state: AllocationState) -> TurnEngine:
    """One allocation's owner, composed of its parts: the turn engine (`turns`), which runs what
    the decisions (`decisions`) and the queue (`queueing`) start, operations whose steps (`steps`)
    change the engine's state. Each part is given the engine and the parts it uses; none inherits
    from another. What the rest of the controller holds of an owner is its engine."""
    engine = TurnEngine(owners, state)
    steps = Steps(engine)
    sharing = Sharing(engine, steps)
    queue = Queue(engine, steps, sharing)
    engine.attach(Decisions(engine, steps, queue, sharing), queue)
    return engine
