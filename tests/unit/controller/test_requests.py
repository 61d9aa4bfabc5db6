"""Requests waiting for room, served by the real services over simulated machines (test_services' pod).

Each allocation's owner passes over its queue after every change, as in vipu-server; tests wait
for outcomes with the same bounded waiting call clients use, never with sleeps.
"""

from __future__ import annotations

import contextlib
import dataclasses
import re
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.functional.harness import wait_until
from tests.ports import free_port
from tests.unit.controller.test_services import MACHINES
from vipu import failpoints
from vipu.api.protos.vipuuser_pb2_grpc import add_UserServiceServicer_to_server
from vipu.api.serving import serve
from vipu.api.status import GuardInterceptor
from vipu.client import user as client_user
from vipu.client.settings import ClientSettings
from vipu.client.user import UserClient
from vipu.controller.core import queueing
from vipu.controller.core.changes import MAX_WATCHERS, ChangeFeed
from vipu.controller.servicers.user import UserServicer
from vipu.controller.usecases.requests import RequestService, Waiting
from vipu.model.entities import Access, PartitionRequest, ReadyState
from vipu.model.errors import AlreadyExists, Conflict, InvalidArgument, NoRoom, NotFound, PermissionDenied, Unavailable
from vipu.store.store import Transaction

ANYONE = Access()  # open mode
ALICE = Access("alice", frozenset({"a1"}))
BOB = Access("bob", frozenset({"a1"}))
CAROL = Access("carol", frozenset())


@pytest.fixture
def queued(pod):
    return pod.requests


def wait(requests: RequestService, partition_id: str, access=ANYONE, timeout: float = 10.0):
    """The partition once it is settled (what a client's loop of waiting calls does), failing after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        settled = requests.wait(partition_id, deadline - time.monotonic(), access)
        if settled.waiting is None:
            return settled.partition
        assert time.monotonic() < deadline, f"partition {partition_id} still waits: {settled.waiting.reason}"


def queue_up(requests: RequestService, partition_id: str, size: int, access=ANYONE, seconds: float = 60) -> Waiting:
    result = requests.create(PartitionRequest(partition_id, size), access, wait_seconds=seconds)
    assert isinstance(result, Waiting), f"{partition_id} started at once"
    return result


def started_at_once(requests: RequestService, partition_id: str, size: int) -> list[str]:
    """Ask, willing to wait; the machines of the partition, which must have started at once."""
    result = requests.create(PartitionRequest(partition_id, size), wait_seconds=60)
    assert not isinstance(result, Waiting), f"{partition_id} waits: {result.reason}"
    return result[0].agent_ids


def on_machine(number: int) -> PartitionRequest:
    return PartitionRequest(f"on-ag{number}", 4, cluster_id="cl0", explicit_ipus=tuple((0, 4 * (number - 1) + i) for i in range(4)))


def until(requests: RequestService, condition, timeout: float = 10.0) -> None:
    """Until `condition()` holds, waking at each change an owner publishes."""
    deadline = time.monotonic() + timeout
    while True:
        seen = requests.owners.version
        if condition():
            return
        assert time.monotonic() < deadline, "timed out"
        requests.owners.wait_for_change(seen, deadline - time.monotonic())


def queue_of(pod, allocation_id: str = "a1"):
    """The allocation's queue as its owner last published it."""
    return pod.owners.owner(allocation_id).snapshot.queue


def test_requests_wait_in_arrival_order_and_start_as_room_appears(pod, queued):
    pod.partitions.create(PartitionRequest("x", 16))
    pod.partitions.create(PartitionRequest("y", 16))
    first = queue_up(queued, "big", 32)
    second = queue_up(queued, "small", 16)
    assert (first.position, second.position) == (1, 2)
    assert first.reason == ("first in the queue, ag1-ag8 held for it; no free 32-IPU run in allocation a1: all 32 of its IPUs "
                            "are in use; it fits when x and y are removed")
    pod.partitions.remove("x")  # room for small, but only on IPUs held for big: it waits
    assert queued.wait("small", 0.5).waiting.reason.startswith("number 2 in the queue, behind big (32 IPUs); no free 16-IPU run")
    pod.partitions.remove("y")
    assert wait(queued, "big").ready_state is ReadyState.ACTIVE
    assert queued.wait("small", 0.2).waiting.position == 1
    pod.partitions.remove("big")
    assert wait(queued, "small").ready_state is ReadyState.ACTIVE
    assert queued.list() == []


def test_backfill_starts_smaller_requests_outside_the_ipus_held_for_the_first_and_never_on_them(pod, queued):
    pod.partitions.create(on_machine(2))
    pod.partitions.create(on_machine(6))
    big = queue_up(queued, "big", 16)
    assert big.reason == ("first in the queue, ag1-ag4 held for it; no free 16-IPU run in allocation a1: 24 of 32 IPUs are free, "
                          "the largest free run is 8 IPUs (ag7-ag8); it fits when on-ag2 or on-ag6 is removed")
    # Behind big, these fit outside ag1-ag4 and start at once: backfill.
    assert started_at_once(queued, "s8", 8) == ["ag7", "ag8"]
    assert started_at_once(queued, "s4", 4) == ["ag5"]
    one = queue_up(queued, "s1", 1)  # only IPUs held for big are free
    assert one.reason == ("number 2 in the queue, behind big (16 IPUs); no free IPU in allocation a1: 12 of 32 IPUs are free, "
                          "12 free IPUs (ag1, ag3-ag4) are held for big, first in the queue; it fits when on-ag6, s4 or s8 is removed; "
                          "with no expected duration it may not start on the IPUs held for big")
    with pytest.raises(NoRoom):  # a create that does not wait is held off those IPUs too
        pod.partitions.create(PartitionRequest("now", 1))
    pod.partitions.remove("on-ag2")  # big starts at once, on what was held for it
    assert wait(queued, "big").agent_ids == ["ag1", "ag2", "ag3", "ag4"]
    assert queued.wait("s1", 0.2).waiting.position == 1  # nothing is free for it yet
    pod.partitions.remove("on-ag6")
    assert wait(queued, "s1").agent_ids == ["ag6"]


def test_a_request_expected_to_end_before_the_held_ipus_are_needed_starts_on_them_and_no_other(pod, queued):
    pod.partitions.create(dataclasses.replace(on_machine(2), expected_seconds=2 * 3600))  # the only one in big's way
    assert started_at_once(queued, "rest", 16) == ["ag5", "ag6", "ag7", "ag8"]
    queue_up(queued, "big", 16)
    assert queue_of(pod).held == {(f"ag{m}", i) for m in range(1, 5) for i in range(4)}
    # Only IPUs held for big are free: what ends before on-ag2 is expected to may use them meanwhile.
    queued.create(PartitionRequest("short", 4, expected_seconds=3600), wait_seconds=60)
    assert wait(queued, "short").agent_ids[0] in ("ag1", "ag3", "ag4")
    for late in (PartitionRequest("late", 4, expected_seconds=3 * 3600), PartitionRequest("unknown", 4)):
        queued.create(late, wait_seconds=60)
        assert queued.wait(late.id, 0.2).waiting is not None, f"{late.id} started in what is held for big"
    # Each is told, by its own duration, why the IPUs held for big are not for it.
    until(queued, lambda: {"late", "unknown"} <= {w.request.partition_id for w in queued.list() if "held for big, first" in w.reason})
    reasons = {w.request.partition_id: w.reason for w in queued.list()}
    assert reasons["unknown"].endswith("; with no expected duration it may not start on the IPUs held for big")
    assert re.search(r"; it is expected to run 3h, past \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC, when the IPUs held for big are expected "
                     r"to be needed$", reasons["late"]), reasons["late"]
    # A create that does not wait follows the same rule: one that ends in time starts on them at once.
    assert pod.partitions.create(PartitionRequest("now", 4, expected_seconds=1800)).agent_ids[0] in ("ag1", "ag3", "ag4")
    with pytest.raises(NoRoom, match=r"held for big, first in the queue; .*; it is expected to run 3h, past .* UTC, when the IPUs "
                                     r"held for big are expected to be needed$"):
        pod.partitions.create(PartitionRequest("late-now", 4, expected_seconds=3 * 3600))
    with pytest.raises(NoRoom, match=r"held for big, first in the queue; .*; with no expected duration it may not start on the IPUs "
                                     r"held for big$"):
        pod.partitions.create(PartitionRequest("unknown-now", 4))
    pod.partitions.remove("on-ag2")
    pod.partitions.remove("short")
    pod.partitions.remove("now")
    assert wait(queued, "big").agent_ids == ["ag1", "ag2", "ag3", "ag4"]  # never delayed by those that ended in time


def test_every_waiting_request_is_told_why_however_far_back_with_placement_asked_once_per_shape(pod, queued, monkeypatch):
    pod.partitions.create(PartitionRequest("whole", 32))
    passes: list[list[int]] = []  # the sizes placement was asked about, by each pass that explained the queue
    real_place, real_explain = queueing.place_partition, queueing.Queue._explain

    def explain(*args, **kwargs):
        passes.append([])
        real_explain(*args, **kwargs)

    monkeypatch.setattr(queueing, "place_partition", lambda *a, **k: passes[-1].append(a[3]) or real_place(*a, **k))
    monkeypatch.setattr(queueing.Queue, "_explain", explain)
    queue_up(queued, "first", 32)
    for n in range(2, 41):
        queue_up(queued, f"r{n}", 8 if n % 2 else 4)
    until(queued, lambda: {w.request.partition_id for w in queued.list() if "; " in w.reason} == {"first"} |
          {f"r{n}" for n in range(2, 41)})
    back = {w.request.partition_id: w for w in queued.list()}
    assert back["r40"].reason == ("number 40 in the queue, behind first (32 IPUs); no free 4-IPU run in allocation a1: "
                                  "all 32 of its IPUs are in use; the IPUs it could take are held for first, first in the queue")
    assert back["r39"].reason.startswith("number 39 in the queue, behind first (32 IPUs); no free 8-IPU run in allocation a1")
    assert all(sorted(sizes) == sorted(set(sizes)) for sizes in passes), passes  # each shape once a pass, however many wait
    assert [4, 8, 32] in [sorted(sizes) for sizes in passes]  # the pass that explained the whole queue


def test_requests_alike_but_for_their_index_are_each_told_what_stands_in_their_own_place(pod, queued):
    for number in range(1, 9):
        pod.partitions.create(on_machine(number))
    first = PartitionRequest("first", 8, cluster_id="cl0", explicit_ipus=tuple((0, 24 + i) for i in range(8)))  # ag7-ag8
    assert isinstance(queued.create(first, wait_seconds=60), Waiting)
    for index in (0, 1):  # the index-th run of 4 IPUs of the allocation: ag1's, then ag2's
        assert isinstance(queued.create(PartitionRequest(f"at{index}", 4, reconfigurable=True, index=index), wait_seconds=60), Waiting)
    until(queued, lambda: all("; " in w.reason for w in queued.list()))
    reasons = {w.request.partition_id: w.reason for w in queued.list()}
    assert reasons["at0"].endswith("it fits when on-ag1 is removed"), reasons["at0"]
    assert reasons["at1"].endswith("it fits when on-ag2 is removed"), reasons["at1"]


def test_the_queue_outlives_a_restart_with_what_is_held(pod, queued):
    pod.partitions.create(PartitionRequest("x", 16))
    pod.partitions.create(PartitionRequest("y", 16))
    queue_up(queued, "big", 32)
    queue_up(queued, "later", 4)
    held = queue_of(pod).held
    assert len(held) == 32
    # The controller stops, its owners and their memory gone; a new one starts on the same store:
    # it finds the queue, in order, and what is held for the first.
    again = pod.restarted().requests
    assert [(w.request.partition_id, w.position) for w in again.list()] == [("big", 1), ("later", 2)]
    assert again.owners.owner("a1").snapshot.queue.held == held
    again.partitions.remove("x")
    again.partitions.remove("y")
    assert wait(again, "big").ready_state is ReadyState.ACTIVE


def test_a_waiting_request_is_cancelled_by_its_user_or_an_administrator_only(pod, queued):
    pod.partitions.create(PartitionRequest("full", 32))
    queue_up(queued, "a", 4, ALICE)
    queue_up(queued, "b", 4, BOB)
    assert [(w.request.partition_id, w.request.owner, w.position) for w in queued.list(access=BOB)] == [("a", "alice", 1),
                                                                                                      ("b", "bob", 2)]
    assert queued.list(access=CAROL) == []
    with pytest.raises(PermissionDenied, match="the request of partition a is user alice's; only its owner or an administrator"):
        queued.cancel("a", BOB)
    with pytest.raises(NotFound, match="no request of partition a waits"):
        queued.cancel("a", CAROL)
    with pytest.raises(AlreadyExists, match="partition a already waits for room in allocation a1"):
        pod.partitions.create(PartitionRequest("a", 1), BOB)
    with pytest.raises(AlreadyExists, match=r"^partition b already waits for room$"):  # not where, to another tenant
        pod.partitions.create(PartitionRequest("b", 1), CAROL)
    queued.cancel("a", ALICE)
    with pytest.raises(Conflict, match="the request of partition a was cancelled by alice"):
        queued.wait("a", 1, ALICE)
    with pytest.raises(NotFound, match="partition a does not exist and no request of it waits"):  # nor how it ended
        queued.wait("a", 1, CAROL)
    queued.remove("b", access=ANYONE)  # removing a partition that only waits cancels its request
    assert queued.list() == []
    with pod.store.reading() as tx:
        assert tx.list_requests() == []
    pod.partitions.remove("full")
    with pytest.raises(NotFound):
        pod.partitions.get("a")


def test_a_request_goes_at_its_deadline_saying_why_it_waited(pod, queued):
    pod.partitions.create(PartitionRequest("full", 32))
    queue_up(queued, "late", 8, seconds=1)
    with pytest.raises(NoRoom, match=r"^no room for partition late after waiting 1 s: first in the queue, ag1-ag2 held for it; "
                                     r"no free 8-IPU run in allocation a1: all 32 of its IPUs are in use; it fits when full is removed$"):
        wait(queued, "late")
    assert queued.list() == []


def test_bad_waits_are_refused_and_requests_that_never_fit_do_not_wait(pod, queued):
    for seconds in (-1, 8 * 24 * 3600):
        with pytest.raises(InvalidArgument, match="a request waits from 1 s to 604800 s"):
            queued.create(PartitionRequest("p", 4), wait_seconds=seconds)
    with pytest.raises(InvalidArgument, match="larger than the cluster's 32 IPUs"):
        queued.create(PartitionRequest("p", 64), wait_seconds=10)
    with pytest.raises(NotFound, match="partition nope does not exist and no request of it waits"):
        queued.wait("nope", 1)
    assert queued.list() == []


def test_racing_waiting_requests_and_removals_each_start_once_on_ipus_of_their_own(pod, queued):
    """16 clients at once ask for 4 IPUs each, willing to wait, while the 8 machines' partitions go."""
    for n in range(1, MACHINES + 1):
        pod.partitions.create(on_machine(n))
    start = threading.Barrier(16 + 1)

    def ask(n: int) -> None:
        start.wait()
        queued.create(PartitionRequest(f"w{n}", 4), wait_seconds=60)

    with ThreadPoolExecutor(16) as pool:
        asked = [pool.submit(ask, n) for n in range(16)]
        start.wait()
        for n in range(1, MACHINES + 1):
            pod.partitions.remove(f"on-ag{n}")
        for future in asked:
            future.result()
    until(queued, lambda: len(queued.list()) == 16 - MACHINES)
    first_wave = sorted(p.id for p in pod.partitions.list())
    assert len(first_wave) == MACHINES and all(wait(queued, name).ready_state is ReadyState.ACTIVE for name in first_wave)
    for name in first_wave:
        pod.partitions.remove(name)
    second_wave = sorted(f"w{n}" for n in range(16) if f"w{n}" not in first_wave)
    assert all(wait(queued, name).ready_state is ReadyState.ACTIVE for name in second_wave)
    assert sorted(p.id for p in pod.partitions.list()) == second_wave and queued.list() == []
    assert [len(pod.held(f"ag{m}")) for m in range(1, MACHINES + 1)] == [1] * MACHINES  # each machine one partition


def test_a_cancel_racing_the_grant_of_its_request_ends_one_way_or_the_other_with_nothing_lost(pod, queued):
    """Round after round, the partition in the way goes while its waiting request is cancelled: the
    request either became its partition or went, never both, and the store, the owner and the
    machines agree. Which way a round goes is the race's: both are correct, so each round's checks
    are the proof."""
    for _ in range(12):
        pod.partitions.create(PartitionRequest("full", 32))
        queue_up(queued, "r", 32)
        start = threading.Barrier(2)

        def free(start=start) -> None:
            start.wait()
            pod.partitions.remove("full")

        def cancel(start=start) -> None:
            start.wait()
            with contextlib.suppress(Conflict, NotFound, Unavailable):  # it started first
                queued.cancel("r")

        with ThreadPoolExecutor(2) as pool:
            for done in [pool.submit(free), pool.submit(cancel)]:
                done.result()
        assert pod.owners.wait_quiet(10)  # the grant or the cancel done
        snapshot = pod.owners.owner("a1").snapshot
        assert snapshot.queue.get("r") is None
        with pod.store.reading() as tx:
            assert tx.list_requests() == []
            assert [p.id for p in tx.list_partitions()] == [p.id for p in pod.partitions.list()]
        started = "r" in snapshot.partitions
        if started:
            assert snapshot.partitions["r"].ready_state is ReadyState.ACTIVE
            assert pod.held_anywhere("r") == [f"ag{m}" for m in range(1, MACHINES + 1)]
            pod.partitions.remove("r")
        assert pod.partitions.list() == [] and not any(pod.owners.owner("a1").snapshot.used.values())
        assert all(pod.held(f"ag{m}") == set() for m in range(1, MACHINES + 1))


def test_a_waiting_relocatable_request_granted_onto_a_failing_machine_starts_elsewhere(pod, queued):
    pod.partitions.create(PartitionRequest("full", 32))
    assert isinstance(queued.create(PartitionRequest("r", 4, relocatable=True), wait_seconds=60), Waiting)
    pod.fault("m01", "IPU 2 failed")  # where r would go
    pod.partitions.remove("full")
    partition = wait(queued, "r")
    assert (partition.ready_state, partition.agent_ids) == (ReadyState.ACTIVE, ["ag2"])
    assert partition.relocation.startswith("moved from ag1 to ag2 on ") and partition.relocation.endswith(
        "UTC: agent ag1: m01: IPU 2 failed")


@contextlib.contextmanager
def user_end_point(pod, requests: RequestService) -> Iterator[UserClient]:
    """The pod's user end-point served over gRPC, as vipu-server serves it, and a client of it."""
    port = free_port()
    server = serve(lambda s: add_UserServiceServicer_to_server(UserServicer(pod.partitions, requests, ChangeFeed()), s),
                   "127.0.0.1", port, GuardInterceptor())
    try:
        with UserClient(ClientSettings(host="127.0.0.1", port=port), 30) as user:
            yield user
    finally:
        server.stop(0)


def test_a_client_finding_every_waiting_place_taken_pauses_between_calls_instead_of_spinning(pod, monkeypatch):
    requests = RequestService(pod.partitions, workers=MAX_WATCHERS + 2)  # one place for a waiting call
    pod.partitions.create(PartitionRequest("full", 32))
    queue_up(requests, "holder", 4)
    queue_up(requests, "patient", 4)
    with ThreadPoolExecutor(1) as pool, user_end_point(pod, requests) as user:
        def hold_the_place() -> None:
            while requests.wait("holder", 20).busy:  # the poll below had it for a moment
                pass

        holding = pool.submit(hold_the_place)
        deadline = time.monotonic() + 10
        while not requests.wait("patient", 0.05).busy:
            assert time.monotonic() < deadline, "the holder never took the place"
        calls = []
        served = requests.wait
        monkeypatch.setattr(requests, "wait", lambda *args: calls.append(args) or served(*args))
        monkeypatch.setattr(client_user, "DEADLINE_GRACE_SECONDS", 0.0)
        with pytest.raises(NoRoom, match="partition patient did not start within 3 s"):
            user.wait_partition("patient", 3)
        # Told busy each time, it paused 0.2, 0.4, 0.8, 1.6 s: calling again at once would make hundreds of calls.
        assert 2 <= len(calls) <= 6, len(calls)
        assert queue_of(pod).get("patient") is None  # withdrawn at its deadline
        requests.cancel("holder")
        with pytest.raises(Conflict, match="the request of partition holder was cancelled"):
            holding.result(timeout=10)


def test_a_client_giving_up_a_request_that_started_meanwhile_removes_its_partition(pod, queued, monkeypatch):
    def start(partition_id: str) -> None:
        pod.partitions.remove("full")
        until(queued, lambda: (p := pod.owners.owner("a1").snapshot.partitions.get(partition_id)) is not None
              and p.ready_state is ReadyState.ACTIVE)

    def interrupt(_queued) -> None:  # told where it waits, the user presses Ctrl-C just as it starts
        start("r")
        raise KeyboardInterrupt

    with user_end_point(pod, queued) as user:
        pod.partitions.create(PartitionRequest("full", 32))
        with pytest.raises(KeyboardInterrupt):
            user.create_partition("r", 4, wait=60, on_wait=interrupt)
        assert pod.partitions.list() == [] and pod.held_anywhere("r") == [] and queued.list() == []

        pod.partitions.create(PartitionRequest("full", 32))  # its client's deadline passes just as it starts
        queue_up(queued, "s", 4)
        start("s")
        monkeypatch.setattr(client_user, "DEADLINE_GRACE_SECONDS", 0.0)
        with pytest.raises(NoRoom, match="partition s did not start within 0 s"):
            user.wait_partition("s", 0)
        assert pod.partitions.list() == [] and pod.held_anywhere("s") == []


def test_nothing_starts_on_or_is_held_on_a_machine_that_is_down(pod, queued):
    pod.partitions.create(PartitionRequest("full", 32))
    pod.gateway.unreachable.add(pod.address("ag1"))
    pod.health.check_all()  # ag1 is down, full in ERROR
    queue_up(queued, "r", 16)
    held_on = {agent for agent, _ in queue_of(pod).held}
    assert len(held_on) == 4 and "ag1" not in held_on, held_on
    pod.partitions.remove("full", force=True)
    partition = wait(queued, "r")
    assert partition.ready_state is ReadyState.ACTIVE and "ag1" not in partition.agent_ids


def test_the_shape_held_for_the_first_request_counts_the_partitions_started_in_the_same_pass(pod, queued):
    pod.partitions.create(PartitionRequest("f", 8, explicit_ipus=tuple((0, i) for i in range(8)), cluster_id="cl0"))  # ag1-ag2
    pod.partitions.create(PartitionRequest("p", 4, explicit_ipus=tuple((0, 16 + i) for i in range(4)), cluster_id="cl0"))  # ag5
    a = PartitionRequest("a", 8, explicit_ipus=tuple((0, i) for i in range(8)), cluster_id="cl0")  # where f is
    assert isinstance(queued.create(a, wait_seconds=60), Waiting)
    assert isinstance(queued.create(PartitionRequest("b", 16), wait_seconds=60), Waiting)
    pod.partitions.remove("f")  # the pass that follows starts a on ag1-ag2; b is first now
    assert wait(queued, "a").agent_ids == ["ag1", "ag2"]
    held_on = {agent for agent, _ in queue_of(pod).held}
    # Around a, ag1-ag4 is blocked by one partition as much as ag3-ag6, ag4-ag7 or ag5-ag8 by p, but with 8 IPUs in use, not 4.
    assert len(held_on) == 4 and not held_on & {"ag1", "ag2"}, held_on


def test_a_grant_whose_write_fails_leaves_its_request_waiting_and_the_next_pass_starts_it(pod, queued):
    pod.partitions.create(PartitionRequest("full", 32))
    queue_up(queued, "r", 4)
    refused = failpoints.arm("store.request.grant", "1*fail(the disk is full)")
    try:
        pod.partitions.remove("full")
        assert wait(queued, "r").ready_state is ReadyState.ACTIVE and refused.hits == 1
    finally:
        failpoints.disarm()


def test_a_queue_whose_pass_fails_does_not_stop_the_passes_over_the_others(pod, queued, monkeypatch):
    pod.allocations.remove("a1")
    pod.allocations.create("a1", "cl0", agent_ids=("ag1", "ag2", "ag3", "ag4"))
    pod.allocations.create("a2", "cl0", agent_ids=("ag5", "ag6", "ag7", "ag8"))
    pod.partitions.create(PartitionRequest("full1", 16, allocation_id="a1"))
    pod.partitions.create(PartitionRequest("full2", 16, allocation_id="a2"))
    for name, allocation in (("r1", "a1"), ("r2", "a2")):
        assert isinstance(queued.create(PartitionRequest(name, 4, allocation_id=allocation), wait_seconds=60), Waiting)
    explicit_ipus = queueing.explicit_ipus

    def failing_in_a1(layout, allocation, request):
        if allocation.id == "a1":
            raise RuntimeError("a1's pass fails")
        return explicit_ipus(layout, allocation, request)

    monkeypatch.setattr(queueing, "explicit_ipus", failing_in_a1)
    pod.partitions.remove("full1")  # a1's pass fails, and is tried again
    pod.partitions.remove("full2")
    assert wait(queued, "r2").agent_ids == ["ag5"]
    monkeypatch.setattr(queueing, "explicit_ipus", explicit_ipus)  # a1's next pass succeeds
    assert wait(queued, "r1").agent_ids == ["ag1"]


def test_ipus_held_that_could_not_be_recorded_are_recorded_by_the_next_pass(pod, queued, monkeypatch):
    pod.partitions.create(PartitionRequest("full", 32))
    hold_for, failures = Transaction.hold_for, []

    def fail_once(tx, request, held):
        if not failures:
            failures.append("once")
            raise Unavailable("the store cannot be reached")
        return hold_for(tx, request, held)

    monkeypatch.setattr(Transaction, "hold_for", fail_once)
    assert isinstance(queued.create(PartitionRequest("r", 8), wait_seconds=60), Waiting)
    held = queue_of(pod).held
    assert held and failures == ["once"]

    def recorded() -> bool:
        with pod.store.reading() as tx:
            return tx.list_requests()[0].held == held

    deadline = time.monotonic() + 10
    while not recorded():  # the next pass comes a second later: the store is polled until then
        assert time.monotonic() < deadline, "the IPUs held were never recorded"
        time.sleep(0.05)


def test_no_request_is_left_waiting_in_an_allocation_being_removed(pod, queued):
    pod.partitions.create(PartitionRequest("full", 32))
    clearing = failpoints.arm("agent.clear", "pause")  # the removal's clear of full stalls
    try:
        with ThreadPoolExecutor(1) as pool:
            removing = pool.submit(pod.allocations.remove, "a1", True)
            assert clearing.reached.wait(10)
            with pytest.raises(Conflict, match=r"^allocation a1 is being removed"):
                queued.create(PartitionRequest("late", 4), wait_seconds=60)
            clearing.released.set()
            assert removing.result(10) == ["partition full"]
    finally:
        failpoints.disarm()
    with pod.store.reading() as tx:
        assert tx.list_requests() == [] and tx.list_allocations() == []


def test_a_request_whose_row_went_without_the_queue_knowing_is_cancelled_all_the_same(pod, queued):
    pod.partitions.create(PartitionRequest("full", 32))
    queue_up(queued, "r", 4)
    with pod.store.transaction() as tx:  # as its allocation's removal deletes it
        tx.end_request(queue_of(pod).get("r"), "cancel")
    queued.cancel("r")
    assert queued.list() == []
    with pytest.raises(Conflict, match="the request of partition r was cancelled"):
        queued.wait("r", 1)
    queue_up(queued, "r", 4)  # its id is free again


def test_capacity_says_which_free_ipus_are_on_machines_down_and_which_are_held_for_the_first_request(pod):
    pod.partitions.create(PartitionRequest("p", 4, explicit_ipus=tuple((0, 4 + i) for i in range(4)), cluster_id="cl0"))  # ag2
    pod.partitions.create(PartitionRequest("rest", 16, explicit_ipus=tuple((0, 16 + i) for i in range(16)), cluster_id="cl0"))
    pod.gateway.unreachable.add(pod.address("ag1"))
    pod.health.check_all()  # ag1, free, is down
    assert isinstance(pod.requests.create(PartitionRequest("big", 16), wait_seconds=60), Waiting)  # held: ag3-ag6, ag1 being down
    room = pod.partitions.capacity()[0]
    assert (room.free_ipus, room.down_ipus, room.held_ipus, room.held_for) == (12, 4, 8, "big")


def test_a_request_whose_expiry_the_store_refused_goes_at_the_next_try(pod, queued):
    pod.partitions.create(PartitionRequest("full", 32))
    refused = failpoints.arm("store.request.expire", "1*fail(the disk is full)")
    try:
        queue_up(queued, "late", 8, seconds=1)
        with pytest.raises(NoRoom, match=r"^no room for partition late after waiting 1 s"):
            wait(queued, "late", timeout=10)
        assert refused.hits == 1  # refused once, then tried again (RETRY_SECONDS later), not left waiting for ever
    finally:
        failpoints.disarm()
    with pod.store.reading() as tx:
        assert tx.list_requests() == []


def test_a_forced_removal_of_an_allocation_waits_for_every_operation_under_way(pod, queued):
    """A create whose agent calls are held, and a remove asked meanwhile: the removal starts nothing
    beside them, and ends with every partition gone once they have ended."""
    pod.partitions.create(PartitionRequest("p2", 4))
    applying = failpoints.arm("agent.apply", "1*pause")  # p1's create stalls at its agent
    try:
        with ThreadPoolExecutor(3) as pool:
            creating = pool.submit(pod.partitions.create, PartitionRequest("p1", 4))
            assert applying.reached.wait(10)
            removing = pool.submit(pod.allocations.remove, "a1", True)
            wait_until(lambda: pod.owners.owner("a1").snapshot.closing, timeout=10, what="the removal to begin")
            with pytest.raises(Conflict, match=r"^allocation a1 is being removed"):
                pod.partitions.reset("p2")
            pod.partitions.remove("p2")  # a job's end meanwhile: its own removal, not a second one beside it
            applying.released.set()
            creating.result(10)
            assert sorted(removing.result(10)) == ["partition p1"]
    finally:
        failpoints.disarm()
    with pod.store.reading() as tx:
        assert tx.list_partitions() == [] and tx.list_allocations() == []
    assert all(not pod.held_anywhere(p) for p in ("p1", "p2"))


def test_no_snapshot_shows_a_request_both_waiting_and_started(pod, queued, monkeypatch):
    """Every snapshot an owner publishes, within a turn or at its end, shows a granted request as a
    partition or as waiting, never both."""
    both: list[str] = []
    publish = type(pod.owners).published

    def watched(owners, owner, partitions_changed):
        snapshot = owner.snapshot
        both.extend(p for p in snapshot.partitions if snapshot.queue.get(p) is not None)
        publish(owners, owner, partitions_changed)

    monkeypatch.setattr(type(pod.owners), "published", watched)
    pod.partitions.create(PartitionRequest("full", 32))
    for n in range(8):
        queue_up(queued, f"r{n}", 4)
    pod.partitions.remove("full")
    for n in range(8):
        assert wait(queued, f"r{n}").ready_state is ReadyState.ACTIVE
    assert both == []
