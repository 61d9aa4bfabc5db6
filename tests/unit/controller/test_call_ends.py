"""What an owner remembers of its agent calls' ends, by which a health pass's read is judged or not."""

from __future__ import annotations

import time

from vipu.controller.core import agents
from vipu.controller.core.agents import AgentCall, CallEnds
from vipu.model.errors import Unavailable


def clear(agent_id: str, partition_id: str) -> AgentCall:
    return AgentCall(agent_id, "127.0.0.1", 1, partition_id=partition_id)


def test_a_read_is_older_than_a_call_about_that_partition_at_that_agent_that_ended_after_it_began():
    ends = CallEnds(horizon=60)
    now = time.monotonic()
    ends.record([clear("ag1", "p1"), clear("ag2", "p1")], [None, Unavailable("down")], now)
    assert ends.after("ag1", "p1", now - 1) and ends.after("ag1", "p1", now)
    assert not ends.after("ag1", "p1", now + 1)
    assert not ends.after("ag1", "p2", now - 1) and not ends.after("ag3", "p1", now - 1)
    assert ends.after("ag2", "p1", now - 1)  # a failed call may have changed it too
    assert ends.answered_after("ag1", now - 1) and not ends.answered_after("ag2", now - 1)  # only ag1 answered


def test_calls_past_the_horizon_are_forgotten_and_so_are_reads_that_old_or_older_than_the_owner(monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(agents.time, "monotonic", lambda: clock[0])
    ends = CallEnds(horizon=60)  # made at 1000
    ends.record([clear("ag1", "p1")], [None], 1000.0)
    ends.record([clear("ag1", "p2")], [None], 1061.0)  # p1's end falls out
    assert not ends.after("ag1", "p1", 999.0) and ends.after("ag1", "p2", 1000.0)
    clock[0] = 1070.0
    assert ends.forgotten(999.0)  # read before the owner was made: its predecessor's calls are unknown here
    assert ends.forgotten(1009.0)  # read 61 s ago: calls that ended since may be forgotten
    assert not ends.forgotten(1011.0)
