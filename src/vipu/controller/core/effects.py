"""The steps an owner's operations take: a store write, agent calls, waiting for other operations.

An operation (`Operation`) is a generator the owner runs one step at a time: each `yield` hands the
owner an effect and suspends the operation until the effect has happened. A `Write` is staged
into the turn's commit and the operation resumes with its result once committed (or with the
store's refusal raised at the `yield`); `Calls` go to the agents outside the owner and the
operation resumes with their outcomes when they come back; `Join` resumes once other operations
have ended. So an operation reads as the sequence it is, while the owner, never blocked, decides
one thing at a time for everything else in its allocation meanwhile.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from vipu.controller.core.agents import AgentCall
from vipu.controller.core.commands import Command, Reply

if TYPE_CHECKING:
    from vipu.store.store import Transaction


def _nothing() -> None:
    pass


@dataclass
class Write:
    """One change to commit with the turn's others. `apply` makes it in the owner's state at once
    (the next placement of the same turn sees it), `undo` takes it back if the store refuses it,
    `committed` runs once it is committed; the operation gets `result` back. `work` may run more
    than once (a turn whose commit lost one write is committed again without it)."""

    work: Callable[[Transaction], Any]
    apply: Callable[[], None] = _nothing
    undo: Callable[[], None] = _nothing
    committed: Callable[[], None] = _nothing
    result: Any = None
    partition_id: str = ""  # the partition whose row it changes: re-read alone if another writer changed it


@dataclass
class Calls:
    """Agent calls to make once what came before is committed; resumes with each one's outcome."""

    calls: list[AgentCall]


@dataclass
class Join:
    """Resume once these operations have ended, with each one's error or None."""

    operations: list[Operation]


@dataclass
class AfterPass:
    """Resume after this turn's pass over the queue (a new request's place and reason come from it)."""


Effect = Write | Calls | Join | AfterPass
Body = Generator[Effect, Any, Any]


@dataclass(eq=False)
class Operation:
    """One operation under way in an owner: on a partition (`partition_id`), or on the allocation."""

    kind: str  # what it is doing, as a busy partition's refusal says: "creating", "removing", ...
    body: Body
    reply: Reply | None = None
    partition_id: str = ""
    system: bool = False  # the owner's own upkeep (finishing, reconciling): a user's operation waits for it
    parent: Operation | None = None
    followers: list[Command] = field(default_factory=list)  # commands waiting for it to end
    joined: list[Operation] = field(default_factory=list)  # the operations it waits for
    ended: bool = False
    error: BaseException | None = None
    committed: bool = False  # a write of it is committed: stopped short after that, it is left half done
