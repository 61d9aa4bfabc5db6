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
from vipu.model.placement import choose_held_shape, try_place
from vipu.model.topology import ClusterLayout


@dataclass(frozen=True)
class Job:
    name: str
    size: int
    duration: float = 1.0
    known: bool = True  # whether the queue is told its duration


def pod(machines: int) -> ClusterLayout:
    return ClusterLayout([f"ag{i}" for i in range(1, machines + 1)], IldTopology.MESH)


def rules(layout: ClusterLayout):
    allowed = set(layout.agent_ids)
    return (lambda job, used: try_place(layout, allowed, used, job.size),
            lambda job, used, started: choose_held_shape(layout, allowed, used, job.size))


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


def simulate(layout: ClusterLayout, jobs: list[Job], backfill: bool, durations: bool = False) -> dict[str, float]:
    """Every job arrives at time 0 in order, then runs for its duration (told to the queue, with
    `durations`, for the jobs that are `known`); when each starts. Checks at every step that the
    first waiting job starts no later than the last partition on its held IPUs ends, nor than
    the expected start the queue gave when it became first."""
    place, hold = rules(layout)
    told = {"expected_duration": lambda job: job.duration if job.known else None} if durations else {}
    expected: tuple[str, float | None] | None = None
    used: dict[str, set[int]] = {}
    running: list[tuple[float, int, Job, tuple]] = []
    holders: dict[tuple[str, int], float] = {}  # IPU -> when its partition ends
    owners: dict[tuple[str, int], Job] = {}  # IPU -> the job on it
    waiting, started, now, held, promise, count = list(jobs), {}, 0.0, frozenset(), None, 0
    while waiting or running:
        ends = {ipu: end for ipu, end in holders.items() if owners[ipu].known}
        admission = queue.admit(waiting, used, place, hold, held=held, backfill=backfill, expected_ends=ends, now=now, **told)
        for job, placement in admission.started:
            started[job.name] = now
            waiting.remove(job)
            ipus = tuple((i.agent_id, i.index) for i in placement.ipus)
            for agent, index in ipus:
                used.setdefault(agent, set()).add(index)
                holders[(agent, index)] = now + job.duration
                owners[(agent, index)] = job
            count += 1
            heapq.heappush(running, (now + job.duration, count, job, ipus))
        if promise is not None and promise[0] in started:
            assert started[promise[0]] <= promise[1] + 1e-9, f"{promise[0]} started after its held IPUs were free"
        if admission.first is not None and (promise is None or promise[0] != admission.first.name):
            promise = (admission.first.name, max((holders.get(ipu, now) for ipu in admission.held), default=now))
        if expected is not None and expected[0] in started and expected[1] is not None:
            assert started[expected[0]] <= expected[1] + 1e-9, f"{expected[0]} started after its expected start"
        if admission.first is not None and (expected is None or expected[0] != admission.first.name):
            expected = (admission.first.name, admission.expected_start)
        held = admission.held
        if not running:
            break
        now, _, job, ipus = heapq.heappop(running)
        for agent, index in ipus:
            used[agent].discard(index)
            del holders[(agent, index)], owners[(agent, index)]
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


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from([1, 2, 4, 8, 16]), st.integers(1, 20), st.booleans()), min_size=1, max_size=25))
def test_backfill_by_duration_never_delays_the_first_request_beyond_its_expected_start(trace):
    """With every duration told exactly, and with some of them unknown, the first request starts
    by the time the queue expected (`simulate` checks it at every step), and every job runs."""
    layout = pod(4)
    exact = [Job(f"j{n}", size, duration / 4) for n, (size, duration, _) in enumerate(trace)]
    partly = [Job(f"j{n}", size, duration / 4, known) for n, (size, duration, known) in enumerate(trace)]
    assert set(simulate(layout, exact, backfill=True, durations=True)) == {job.name for job in exact}
    assert set(simulate(layout, partly, backfill=True, durations=True)) == {job.name for job in partly}


def held_pair() -> tuple:
    """A pod of four machines where a request for 8 IPUs waits with ag1 and ag2 held for it: ag3
    and ag4 are full, and one partition, expected to end at 10, is on ag1. The only free IPUs
    are in the held shape."""
    layout = pod(4)
    used = {"ag1": {0}, "ag3": set(range(4)), "ag4": set(range(4))}
    ends = {("ag1", 0): 10.0, **{(agent, index): 50.0 for agent in ("ag3", "ag4") for index in range(4)}}
    return layout, used, ends


def backfilled(jobs: list[Job], used, ends, now: float = 0.0) -> queue.Admission:
    place, hold = rules(pod(4))
    return queue.admit(jobs, used, place, hold, expected_duration=lambda job: job.duration if job.known else None,
                       expected_ends=ends, now=now)


def test_a_request_that_ends_before_the_held_shape_is_needed_starts_inside_it():
    _, used, ends = held_pair()
    admission = backfilled([Job("big", 8, 5.0), Job("four", 4, 4.0), Job("exactly", 2, 10.0)], used, ends)
    assert admission.first.name == "big" and admission.expected_start == 10.0
    assert admission.held == {(f"ag{m}", i) for m in (1, 2) for i in range(4)}
    started = {job.name: {(ipu.agent_id, ipu.index) for ipu in placement.ipus} for job, placement in admission.started}
    assert set(started) == {"four", "exactly"}  # one ends at 4, the other at 10 itself
    assert all(ipus <= admission.held for ipus in started.values())


def test_a_request_that_would_end_after_the_held_shape_is_needed_does_not_start_inside_it():
    _, used, ends = held_pair()
    admission = backfilled([Job("big", 8, 5.0), Job("four", 4, 4.0)], used, ends, now=7.0)  # it would end at 11
    assert admission.first.name == "big" and admission.expected_start == 10.0 and admission.started == ()


def test_a_request_of_unknown_duration_never_starts_inside_the_held_shape():
    _, used, ends = held_pair()
    admission = backfilled([Job("big", 8, 5.0), Job("four", 4, 0.1, known=False), Job("two", 2, 1.0)], used, ends)
    assert [job.name for job, _ in admission.started] == ["two"]  # the one behind it, told its duration, still starts


def test_a_partition_of_unknown_end_on_the_held_shape_keeps_it_for_the_first_request():
    _, used, ends = held_pair()
    del ends[("ag1", 0)]
    admission = backfilled([Job("big", 8, 5.0), Job("one", 1, 0.1)], used, ends)
    assert admission.first.name == "big" and admission.expected_start is None and admission.started == ()
    blocked = backfilled([Job("big", 8, 5.0), Job("one", 1, 0.1)], used, {**ends, ("ag1", 0): None})
    assert blocked.expected_start is None and blocked.started == ()


def test_a_request_started_ahead_of_the_first_in_the_same_pass_counts_towards_its_expected_start():
    _, used, ends = held_pair()
    admission = backfilled([Job("one", 1, 12.0), Job("big", 8, 5.0), Job("four", 4, 11.0)], used, ends)
    assert admission.held == {(f"ag{m}", i) for m in (1, 2) for i in range(4)}  # "one" went on ag1, in it
    assert admission.expected_start == 12.0
    assert [job.name for job, _ in admission.started] == ["one", "four"]  # four ends at 11: after 10, by 12
    unknown = backfilled([Job("one", 1, 12.0, known=False), Job("big", 8, 5.0), Job("four", 4, 1.0)], used, ends)
    assert [job.name for job, _ in unknown.started] == ["one"] and unknown.expected_start is None


def test_without_durations_nothing_starts_inside_the_held_shape():
    layout, used, ends = held_pair()
    place, hold = rules(layout)
    admission = queue.admit([Job("big", 8), Job("one", 1, 0.1)], used, place, hold, expected_ends=ends, now=0.0)
    assert admission.started == () and admission.expected_start is None
