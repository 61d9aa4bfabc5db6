"""The partition life cycle: the one table of how a partition's state may change.

A partition's state is the pair (ready state, operation state). It changes only by a named
transition of this table, which the store applies as a compare-and-set on the state the caller
last saw: a transition that is not in the table, or whose partition has meanwhile changed, is
refused with a `Conflict` naming both states. `ABSENT` stands for "no such partition", the state
before `create` and after `removed` or `abandon`.

    create      ABSENT                              -> PENDING/CREATING
    configured  PENDING/CREATING, PENDING/RESETTING -> ACTIVE/IDLE
    fail        PENDING/CREATING, PENDING/RESETTING,
                ACTIVE/REMOVING, ERROR/REMOVING     -> ERROR/FAILED
    abandon     PENDING/CREATING                    -> ABSENT (a failed create leaves nothing)
    lost        ACTIVE/IDLE                         -> ERROR/FAILED (an agent stopped answering
                                                       or lost the partition's settings)
    reset       ACTIVE/IDLE, ERROR/FAILED           -> PENDING/RESETTING
    relocate    ACTIVE/IDLE, ERROR/FAILED           -> PENDING/RESETTING, on other IPUs of its
                                                       allocation (the store replaces its IPUs in
                                                       the same compare-and-set)
    remove      ACTIVE/IDLE -> ACTIVE/REMOVING, ERROR/FAILED -> ERROR/REMOVING
    removed     ACTIVE/REMOVING, ERROR/REMOVING     -> ABSENT
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

from vipu.model.entities import OperationState, Partition, PlacedIpu, ReadyState
from vipu.model.errors import Conflict

State = tuple[ReadyState, OperationState]
ABSENT = None  # the state of a partition that does not exist

PENDING_CREATING: State = (ReadyState.PENDING, OperationState.CREATING)
PENDING_RESETTING: State = (ReadyState.PENDING, OperationState.RESETTING)
ACTIVE_IDLE: State = (ReadyState.ACTIVE, OperationState.IDLE)
ACTIVE_REMOVING: State = (ReadyState.ACTIVE, OperationState.REMOVING)
ERROR_FAILED: State = (ReadyState.ERROR, OperationState.FAILED)
ERROR_REMOVING: State = (ReadyState.ERROR, OperationState.REMOVING)

TRANSITIONS: dict[str, dict[State | None, State | None]] = {
    "create": {ABSENT: PENDING_CREATING},
    "configured": {PENDING_CREATING: ACTIVE_IDLE, PENDING_RESETTING: ACTIVE_IDLE},
    "fail": {PENDING_CREATING: ERROR_FAILED, PENDING_RESETTING: ERROR_FAILED,
             ACTIVE_REMOVING: ERROR_FAILED, ERROR_REMOVING: ERROR_FAILED},
    "abandon": {PENDING_CREATING: ABSENT},
    "lost": {ACTIVE_IDLE: ERROR_FAILED},
    "reset": {ACTIVE_IDLE: PENDING_RESETTING, ERROR_FAILED: PENDING_RESETTING},
    "relocate": {ACTIVE_IDLE: PENDING_RESETTING, ERROR_FAILED: PENDING_RESETTING},
    "remove": {ACTIVE_IDLE: ACTIVE_REMOVING, ERROR_FAILED: ERROR_REMOVING},
    "removed": {ACTIVE_REMOVING: ABSENT, ERROR_REMOVING: ABSENT},
}

STATES: frozenset[State] = frozenset(
    state for moves in TRANSITIONS.values() for pair in moves.items() for state in pair if state is not ABSENT
)
# States in which an operation owns the partition: its create, reset or remove is under way.
BUSY: frozenset[State] = frozenset({PENDING_CREATING, PENDING_RESETTING, ACTIVE_REMOVING, ERROR_REMOVING})


def state_of(partition: Partition) -> State:
    return partition.ready_state, partition.operation_state


def named(state: State | None) -> str:
    return "absent" if state is ABSENT else f"{state[0].value}/{state[1].value}"


def target(partition_id: str, transition: str, source: State | None) -> State | None:
    """The state `transition` takes the partition to from `source`; a `Conflict` if the table has no such move."""
    moves = TRANSITIONS.get(transition)
    if moves is None:
        raise ValueError(f"no transition named {transition!r} in the partition life cycle")
    if source not in moves:
        allowed = ", ".join(named(s) for s in moves)
        raise Conflict(f"partition {partition_id} is {named(source)}: '{transition}' applies only to a partition that is {allowed}")
    return moves[source]


def moved_meanwhile(partition_id: str, transition: str, expected: State | None, found: State | None) -> Conflict:
    """The refusal of a transition whose partition another operation changed since it was read."""
    return Conflict(f"partition {partition_id} is {named(found)}, not {named(expected)} as '{transition}' expected: "
                    "another operation changed it meanwhile")


def apply(partition: Partition, name: str, errors: list[str] | None = None, auto_reset_count: int | None = None,
          ipus: list[PlacedIpu] | None = None, relocation: str | None = None, failed_on: tuple[str, ...] | None = None,
          now: datetime | None = None, power_cycled: datetime | None = None, compacted: datetime | None = None) -> State | None:
    """Change `partition` as the transition `name` (with its fields) does; the state it goes to
    (ABSENT: it is gone, and the object is left as it was). A Conflict if the table has no such move."""
    moved_to = target(partition.id, name, state_of(partition))
    if moved_to is ABSENT:
        return ABSENT
    partition.ready_state, partition.operation_state = moved_to
    if errors is not None:
        partition.errors = list(errors)
    if auto_reset_count is not None:
        partition.auto_reset_count = auto_reset_count
        partition.last_auto_reset = now or datetime.now(UTC)
    if ipus is not None:
        partition.ipus = list(ipus)
    if relocation is not None:
        partition.relocation = relocation
    if failed_on is not None:
        partition.failed_on = tuple(failed_on)
    if power_cycled is not None:
        partition.power_cycled = power_cycled
    if compacted is not None:
        partition.compacted = compacted
    return moved_to


def copy(partition: Partition) -> Partition:
    """A copy that may be changed without changing `partition` (its fields copied as they are, not
    built again through `dataclasses.replace`, which checks every field: copies are on every
    owner's hot path)."""
    duplicate = object.__new__(Partition)
    duplicate.__dict__.update(partition.__dict__)
    duplicate.ipus, duplicate.errors = list(partition.ipus), list(partition.errors)
    return duplicate


def after(partition: Partition, transitions: Iterable[tuple[str, dict[str, Any]]]) -> Partition | None:
    """The partition as these transitions, one after the other, leave it (None once it is gone),
    leaving `partition` itself unchanged; a Conflict if the table has no such move."""
    changed = copy(partition)
    for name, fields in transitions:
        if apply(changed, name, **{k: v for k, v in fields.items() if v is not None}) is ABSENT:
            return None
    return changed
