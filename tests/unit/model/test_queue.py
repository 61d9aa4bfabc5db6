"""The queue's admission rule: first come, first served, with backfill that never delays the first."""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vipu.model import queue
from vipu.model.entities import IldTopology
from vipu.model.errors import Conflict
from vipu.model.placement import choose_reservation, try_place
from vipu.model.topology import ClusterLayout


@dataclass(frozen=True)
class Job:
    name: str
    size: int
    duration: float = 1.0


def pod(machines: int) -> ClusterLayout:
    return ClusterLayout([f"ag{i}" for i in range(1, machines + 1)], IldTopology.MESH)


def rules(layout: ClusterLayout):
    allowed = set(layout.agent_ids)
    return (lambda job, used: try_place(layout, allowed, used, job.size),
            lambda job, used, started: choose_reservation(layout, allowed, used, job.size))


def test_requests_start_in_arrival_order_while_each_fits():
    place, hold = rules(pod(2))
    admission = queue.admit([Job("a", 4), Job("b", 2), Job("c", 2)], {}, place, hold)
    assert [job.name for job, _ in admission.started] == ["a", "b", "c"]
    assert admission.first is None and admission.held == frozenset()


def test_a_smaller_request_starts_ahead_only_outside_the_ipus_held_for_the_first():
    layout = pod(4)
    place, hold = rules(layout)
    used = {"ag1": {0}, "ag3": {0}}  # one IPU in use on ag1 and on ag3: no two whole machines side by side
    admission = queue.admit([Job("big", 8), Job("one", 1), Job("four", 4), Job("pair", 2)], used, place, hold)
    assert admission.first.name == "big"
    assert admission.held == {(f"ag{m}", i) for m in (1, 2) for i in range(4)}  # one partition (on ag1) stands in its way
    started = {job.name: {(ipu.agent_id, ipu.index) for ipu in placement.ipus} for job, placement in admission.started}
    assert set(started) == {"one", "four", "pair"}
    assert all(not ipus & admission.held for ipus in started.values())
    plain = queue.admit([Job("big", 8), Job("one", 1)], used, place, hold, backfill=False)
    assert plain.started == () and plain.first.name == "big"


def test_what_is_held_stays_held_while_the_request_is_first():
    layout = pod(4)
    place, hold = rules(layout)
    held = frozenset((f"ag{m}", i) for m in (3, 4) for i in range(4))
    admission = queue.admit([Job("big", 8), Job("four", 4)], {"ag1": {0}, "ag3": {0}}, place, hold, held=held)
    assert admission.held == held
    assert [ipu.agent_id for ipu in admission.started[0][1].ipus][:1] == ["ag2"]  # neither ag3 nor ag4


def test_the_life_cycle_names_every_move_and_refuses_others():
    assert queue.target("p1", "enqueue", queue.ABSENT) == queue.WAITING
    for name in ("grant", "cancel", "expire"):
        assert queue.target("p1", name, queue.WAITING) is queue.ABSENT
    with pytest.raises(Conflict, match="the request for partition p1 is no longer waiting: 'cancel' does not apply"):
        queue.target("p1", "cancel", queue.ABSENT)
    with pytest.raises(ValueError):
        queue.target("p1", "jump", queue.WAITING)


def simulate(layout: ClusterLayout, jobs: list[Job], backfill: bool) -> dict[str, float]:
    """Every job arrives at time 0 in order, then runs for its duration; when each starts. Checks at
    every step that the first waiting job starts no later than the last partition on its held IPUs ends."""
    place, hold = rules(layout)
    used: dict[str, set[int]] = {}
    running: list[tuple[float, int, Job, tuple]] = []
    holders: dict[tuple[str, int], float] = {}  # IPU -> when its partition ends
    waiting, started, now, held, promise, count = list(jobs), {}, 0.0, frozenset(), None, 0
    while waiting or running:
        admission = queue.admit(waiting, used, place, hold, held=held, backfill=backfill)
        for job, placement in admission.started:
            started[job.name] = now
            waiting.remove(job)
            ipus = tuple((i.agent_id, i.index) for i in placement.ipus)
            for agent, index in ipus:
                used.setdefault(agent, set()).add(index)
                holders[(agent, index)] = now + job.duration
            count += 1
            heapq.heappush(running, (now + job.duration, count, job, ipus))
        if promise is not None and promise[0] in started:
            assert started[promise[0]] <= promise[1] + 1e-9, f"{promise[0]} started after its held IPUs were free"
        if admission.first is not None and (promise is None or promise[0] != admission.first.name):
            promise = (admission.first.name, max((holders.get(ipu, now) for ipu in admission.held), default=now))
        held = admission.held
        if not running:
            break
        now, _, job, ipus = heapq.heappop(running)
        for agent, index in ipus:
            used[agent].discard(index)
            del holders[(agent, index)]
    return started


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([1, 2, 4, 8, 16]), st.integers(1, 20)), min_size=1, max_size=25))
def test_backfill_never_delays_the_first_request_beyond_the_end_of_what_holds_its_ipus(trace):
    layout = pod(4)
    jobs = [Job(f"j{n}", size, duration / 4) for n, (size, duration) in enumerate(trace)]
    with_backfill = simulate(layout, jobs, backfill=True)
    in_order = simulate(layout, jobs, backfill=False)
    assert set(with_backfill) == set(in_order) == {job.name for job in jobs}  # every job runs in the end
    starts = [in_order[job.name] for job in jobs]
    assert starts == sorted(starts)  # plain FIFO starts jobs in arrival order
