"""The partition life cycle's table: closed, every state reachable and able to end, refusals named."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from vipu.model import lifecycle
from vipu.model.entities import OperationState, ReadyState
from vipu.model.errors import Conflict
from vipu.model.lifecycle import ABSENT, ACTIVE_IDLE, BUSY, STATES, TRANSITIONS


def reachable_from(start):
    seen, frontier = {start}, [start]
    while frontier:
        state = frontier.pop()
        for moves in TRANSITIONS.values():
            if state in moves and moves[state] not in seen:
                seen.add(moves[state])
                frontier.append(moves[state])
    return seen


def test_every_state_is_reachable_from_nothing_and_can_end():
    assert reachable_from(ABSENT) == STATES | {ABSENT}
    for state in STATES:
        assert ABSENT in reachable_from(state), f"{lifecycle.named(state)} can never be removed"


def test_only_an_operation_under_way_leaves_a_busy_state():
    for moves in TRANSITIONS.values():
        for source, target in moves.items():
            if source in BUSY:
                assert target not in BUSY, "an operation ends in a settled state, or the partition goes"


def test_a_move_outside_the_table_is_a_conflict_naming_the_state_and_the_allowed_ones():
    with pytest.raises(Conflict) as refused:
        lifecycle.target("p1", "configured", ACTIVE_IDLE)
    assert refused.value.message == (
        "partition p1 is ACTIVE/IDLE: 'configured' applies only to a partition that is PENDING/CREATING, PENDING/RESETTING"
    )
    with pytest.raises(ValueError):
        lifecycle.target("p1", "teleport", ACTIVE_IDLE)


def test_a_partition_changed_meanwhile_is_refused_naming_both_states():
    refusal = lifecycle.moved_meanwhile("p1", "configured", lifecycle.PENDING_CREATING, lifecycle.ACTIVE_REMOVING)
    assert refusal.message == ("partition p1 is ACTIVE/REMOVING, not PENDING/CREATING as 'configured' expected: "
                               "another operation changed it meanwhile")


# Which operation states go with which ready state, as the user API's states mean them: a
# PENDING partition is being created or reset, an ACTIVE one is idle or being removed, an ERROR
# one has failed or is being removed.
MEANINGFUL = {
    ReadyState.PENDING: {OperationState.CREATING, OperationState.RESETTING},
    ReadyState.ACTIVE: {OperationState.IDLE, OperationState.REMOVING},
    ReadyState.ERROR: {OperationState.FAILED, OperationState.REMOVING},
}


@given(st.lists(st.sampled_from(sorted(TRANSITIONS)), max_size=40))
def test_any_sequence_of_transitions_reaches_only_meaningful_states(names):
    state = ABSENT
    for name in names:
        try:
            state = lifecycle.target("p", name, state)
        except Conflict:
            continue
        if state is not ABSENT:
            ready, operation = state
            assert operation in MEANINGFUL.get(ready, set()), f"'{name}' leads to {lifecycle.named(state)}"
