"""Requests waiting for room, served by the real services over simulated machines (test_services' pod).

The dispatcher runs in its own thread as in vipu-server; tests wait for outcomes with the same
bounded waiting call clients use, never with sleeps.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta

import pytest

from tests.ports import free_port
from tests.unit.controller.test_services import MACHINES
from vipu.api.protos.vipuuser_pb2_grpc import add_UserServiceServicer_to_server
from vipu.api.serving import serve
from vipu.api.status import GuardInterceptor
from vipu.client import user as client_user
from vipu.client.settings import ClientSettings
from vipu.client.user import UserClient
from vipu.controller.servicers.user import UserServicer
from vipu.controller.services import requests as requests_module
from vipu.controller.services.changes import MAX_WATCHERS, ChangeFeed
from vipu.controller.services.partitions import PartitionService
from vipu.controller.services.requests import RequestService, Waiting
from vipu.controller.services.waiting import WaitingRequests
from vipu.model.entities import Access, PartitionRequest, ReadyState
from vipu.model.errors import AlreadyExists, Conflict, InvalidArgument, NoRoom, NotFound, PermissionDenied, Unavailable
from vipu.model.queue import WaitingRequest
from vipu.store.store import Store, Transaction

ANYONE = Access()  # open mode
ALICE = Access("alice", frozenset({"a1"}))
BOB = Access("bob", frozenset({"a1"}))
CAROL = Access("carol", frozenset())


class Dispatching:
    """A RequestService over a pod, its dispatcher running, as vipu-server runs it."""

    def __init__(self, partitions: PartitionService, **options):
        self.requests = RequestService(partitions, **options)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.requests.run, args=(self.stop,), daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.stop.set()
        self.requests.queue.wake.set()
        self.thread.join(timeout=10)
        self.requests.close()


@pytest.fixture
def queued(pod):
    dispatching = Dispatching(pod.partitions)
    yield dispatching.requests
    dispatching.close()


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


def machines_of(requests: RequestService, partition_id: str) -> list[str]:
    return requests.partitions.get(partition_id).agent_ids


def started_at_once(requests: RequestService, partition_id: str, size: int) -> list[str]:
    """Ask, willing to wait; the machines of the partition, which must have started at once."""
    result = requests.create(PartitionRequest(partition_id, size), wait_seconds=60)
    assert not isinstance(result, Waiting), f"{partition_id} waits: {result.reason}"
    return result[0].agent_ids


def on_machine(number: int) -> PartitionRequest:
    return PartitionRequest(f"on-ag{number}", 4, cluster_id="cl0", explicit_ipus=tuple((0, 4 * (number - 1) + i) for i in range(4)))


def until(requests: RequestService, condition, timeout: float = 10.0) -> None:
    """Until `condition()` holds, waking at each change of the queue or the partitions."""
    deadline = time.monotonic() + timeout
    while True:
        seen = requests.queue.version
        if condition():
            return
        assert time.monotonic() < deadline, "timed out"
        requests.queue.wait_for_change(seen, deadline - time.monotonic())


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
                          "12 free IPUs (ag1, ag3-ag4) are held for big, first in the queue; it fits when on-ag6, s4 or s8 is removed")
    with pytest.raises(NoRoom):  # a create that does not wait is held off those IPUs too
        pod.partitions.create(PartitionRequest("now", 1))
    pod.partitions.remove("on-ag2")  # big starts at once, on what was held for it
    assert wait(queued, "big").agent_ids == ["ag1", "ag2", "ag3", "ag4"]
    assert queued.wait("s1", 0.2).waiting.position == 1  # nothing is free for it yet
    pod.partitions.remove("on-ag6")
    assert wait(queued, "s1").agent_ids == ["ag6"]


def test_every_waiting_request_is_told_why_however_far_back_with_placement_asked_once_per_shape(pod, queued, monkeypatch):
    pod.partitions.create(PartitionRequest("whole", 32))
    passes: list[list[int]] = []  # the sizes placement was asked about, by each pass that explained the queue
    real_place, real_explain = requests_module.place_partition, queued._explain

    def explain(*args, **kwargs):
        passes.append([])
        real_explain(*args, **kwargs)

    monkeypatch.setattr(requests_module, "place_partition", lambda *a, **k: passes[-1].append(a[3]) or real_place(*a, **k))
    monkeypatch.setattr(queued, "_explain", explain)
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


def test_two_passes_ending_together_work_out_the_reasons_one_at_a_time(pod, monkeypatch):
    pod.partitions.create(PartitionRequest("whole", 32))
    requests = RequestService(pod.partitions)  # passes only when called
    queue_up(requests, "r", 4)
    inside, most_inside, second_came = [0], [0], threading.Event()
    count = threading.Lock()
    real_place = requests_module.place_partition

    def place(*args, **kwargs):
        with count:
            inside[0] += 1
            most_inside[0] = max(most_inside[0], inside[0])
            if inside[0] > 1:
                second_came.set()
        second_came.wait(1.0)  # the first pass stays inside until a second joins it, or a second has gone by
        try:
            return real_place(*args, **kwargs)
        finally:
            with count:
                inside[0] -= 1

    monkeypatch.setattr(requests_module, "place_partition", place)

    def a_pass():
        requests._explained.clear()  # as after a change of the queue: the reasons are worked out again
        requests.dispatch("a1")

    try:
        with ThreadPoolExecutor(2) as passes:
            for done in [passes.submit(a_pass), passes.submit(a_pass)]:
                done.result(timeout=10)
        assert most_inside == [1]
        assert requests.list()[0].reason.startswith("first in the queue")
    finally:
        requests.close()


def test_a_pass_that_placed_before_another_leaves_the_reasons_to_it_when_it_comes_to_them_second(pod, monkeypatch):
    pod.partitions.create(PartitionRequest("whole", 32))
    requests = RequestService(pod.partitions)  # passes only when called
    queue_up(requests, "r", 4)
    requests._explained.clear()  # both passes below would explain
    explained_by: list[str] = []
    real_explain = requests._explain
    monkeypatch.setattr(requests, "_explain",
                        lambda *a: explained_by.append(threading.current_thread().name.partition("_")[0]) or real_explain(*a))
    later_done, placed = threading.Event(), threading.Event()

    class EarlierWaits:
        """The earlier pass, having placed, reaches the reasons only once the later one is done."""

        def __init__(self, lock):
            self.lock = lock

        def __enter__(self):
            if threading.current_thread().name.startswith("earlier"):
                placed.set()
                later_done.wait(10)  # the assertions below tell if it never came
            return self.lock.__enter__()

        def __exit__(self, *exc):
            return self.lock.__exit__(*exc)

    class Gated(dict):
        def setdefault(self, key, default=None):
            return EarlierWaits(super().setdefault(key, default))

    monkeypatch.setattr(requests, "_explaining", Gated())

    def later():
        assert placed.wait(10)  # the earlier pass has placed: this one, r2's, places after it
        queue_up(requests, "r2", 4)
        later_done.set()

    try:
        with ThreadPoolExecutor(1, thread_name_prefix="earlier") as earlier, ThreadPoolExecutor(1, thread_name_prefix="later") as late:
            passes = [earlier.submit(requests.dispatch, "a1"), late.submit(later)]
            for done in passes:
                done.result(timeout=10)
        assert later_done.is_set()
        assert explained_by == ["later"]  # not "earlier" after it, with what it saw before r2 came
        assert [w.request.partition_id for w in requests.list()] == ["r", "r2"]
    finally:
        requests.close()


def test_the_queue_outlives_a_restart_with_what_is_held(tmp_path, pod):
    before = Dispatching(pod.partitions)
    pod.partitions.create(PartitionRequest("x", 16))
    pod.partitions.create(PartitionRequest("y", 16))
    queue_up(before.requests, "big", 32)
    queue_up(before.requests, "later", 4)
    held = before.requests.queue.get("big").held
    assert len(held) == 32
    before.close()  # the controller stops: its dispatcher and its memory are gone
    # A new controller on the same database, through a store of its own: it finds the queue, in
    # order, and what is held for the first.
    store = Store(f"sqlite:///{tmp_path / 'vipu.db'}")
    again = Dispatching(PartitionService(store, pod.hardware, set()))
    try:
        assert [(w.request.partition_id, w.position) for w in again.requests.list()] == [("big", 1), ("later", 2)]
        assert again.requests.queue.get("big").held == held
        again.requests.partitions.remove("x")
        again.requests.partitions.remove("y")
        assert wait(again.requests, "big").ready_state is ReadyState.ACTIVE
    finally:
        again.close()
        store.close()


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
    request either became its partition or went, never both, and the store, the ledger and the
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
        until(queued, lambda: queued.queue.get("r") is None and not pod.partitions.holds.is_held("r") and (
            (p := pod.partitions.ledger.get("r")) is None or p.ready_state is ReadyState.ACTIVE))  # and the grant or cancel done
        with pod.store.reading() as tx:
            assert tx.list_requests() == []
            assert [p.id for p in tx.list_partitions()] == [p.id for p in pod.partitions.list()]
        started = pod.partitions.ledger.get("r") is not None
        if started:
            assert pod.held_anywhere("r") == [f"ag{m}" for m in range(1, MACHINES + 1)]
            pod.partitions.remove("r")
        assert pod.partitions.list() == [] and not any(pod.partitions.ledger.used_ipus("a1").values())
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
    dispatching = Dispatching(pod.partitions, workers=MAX_WATCHERS + 2)  # one place for a waiting call
    requests = dispatching.requests
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
        assert requests.queue.get("patient") is None  # withdrawn at its deadline
        requests.cancel("holder")
        with pytest.raises(Conflict, match="the request of partition holder was cancelled"):
            holding.result(timeout=10)
    dispatching.close()


def test_a_client_giving_up_a_request_that_started_meanwhile_removes_its_partition(pod, queued, monkeypatch):
    def start(partition_id: str) -> None:
        pod.partitions.remove("full")
        until(queued, lambda: (p := pod.partitions.ledger.get(partition_id)) is not None and p.ready_state is ReadyState.ACTIVE)

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
    pod.reconciler.check_all()  # ag1 is down, full in ERROR
    queue_up(queued, "r", 16)
    held_on = {agent for agent, _ in queued.queue.get("r").held}
    assert len(held_on) == 4 and "ag1" not in held_on, held_on
    pod.partitions.remove("full", force=True)
    partition = wait(queued, "r")
    assert partition.ready_state is ReadyState.ACTIVE and "ag1" not in partition.agent_ids


def test_while_the_first_request_is_granted_the_ipus_held_are_those_of_the_request_behind_it():
    waiting = WaitingRequests()
    now = datetime.now(UTC)
    for sequence, name in enumerate(("granted", "next"), start=1):
        waiting.add(WaitingRequest(PartitionRequest(name, 8), "a1", "", now, now + timedelta(seconds=60), sequence=sequence))
    shape = frozenset(("ag3", i) for i in range(4))
    waiting.hold("next", shape)  # what the pass that grants the first holds for the next
    waiting.granting("granted")
    assert waiting.held("a1") == (shape, "next")  # creates keep off it while the grant is recorded


def test_the_shape_held_for_the_first_request_counts_the_partitions_started_in_the_same_pass(pod):
    pod.partitions.create(PartitionRequest("f", 8, explicit_ipus=tuple((0, i) for i in range(8)), cluster_id="cl0"))  # ag1-ag2
    pod.partitions.create(PartitionRequest("p", 4, explicit_ipus=tuple((0, 16 + i) for i in range(4)), cluster_id="cl0"))  # ag5
    requests = RequestService(pod.partitions)  # passes only when called
    a = PartitionRequest("a", 8, explicit_ipus=tuple((0, i) for i in range(8)), cluster_id="cl0")  # where f is
    assert isinstance(requests.create(a, wait_seconds=60), Waiting)
    assert isinstance(requests.create(PartitionRequest("b", 16), wait_seconds=60), Waiting)
    pod.partitions.remove("f")
    requests.dispatch()  # a starts on ag1-ag2; b is first now
    held_on = {agent for agent, _ in pod.partitions.queue.get("b").held}
    # Around a, ag1-ag4 is blocked by one partition as much as ag3-ag6, ag4-ag7 or ag5-ag8 by p, but with 8 IPUs in use, not 4.
    assert len(held_on) == 4 and not held_on & {"ag1", "ag2"}, held_on
    requests.close()


def test_a_grant_failing_unexpectedly_leaves_its_request_waiting_and_the_next_pass_starts_it(pod, queued, monkeypatch):
    pod.partitions.create(PartitionRequest("full", 32))
    queue_up(queued, "r", 4)
    admitted, failures = pod.partitions.operations.admitted, []

    def fail_once():
        if not failures and threading.current_thread().name.startswith("grant"):
            failures.append("once")
            raise RuntimeError("something unforeseen")
        return admitted()

    monkeypatch.setattr(pod.partitions.operations, "admitted", fail_once)
    pod.partitions.remove("full")
    assert wait(queued, "r").ready_state is ReadyState.ACTIVE and failures == ["once"]


def test_a_queue_whose_pass_fails_does_not_stop_the_passes_over_the_others(pod, queued, monkeypatch):
    pod.allocations.remove("a1")
    pod.allocations.create("a1", "cl0", agent_ids=("ag1", "ag2", "ag3", "ag4"))
    pod.allocations.create("a2", "cl0", agent_ids=("ag5", "ag6", "ag7", "ag8"))
    pod.partitions.create(PartitionRequest("full1", 16, allocation_id="a1"))
    pod.partitions.create(PartitionRequest("full2", 16, allocation_id="a2"))
    for name, allocation in (("r1", "a1"), ("r2", "a2")):
        assert isinstance(queued.create(PartitionRequest(name, 4, allocation_id=allocation), wait_seconds=60), Waiting)
    explicit_ipus = pod.partitions.explicit_ipus

    def failing_in_a1(layout, allocation, request):
        if allocation.id == "a1":
            raise RuntimeError("a1's pass fails")
        return explicit_ipus(layout, allocation, request)

    monkeypatch.setattr(pod.partitions, "explicit_ipus", failing_in_a1)
    pod.partitions.remove("full2")
    assert wait(queued, "r2").agent_ids == ["ag5"]


def test_ipus_held_that_could_not_be_recorded_are_recorded_by_the_next_pass(pod, monkeypatch):
    pod.partitions.create(PartitionRequest("full", 32))
    hold_for, failures = Transaction.hold_for, []

    def fail_once(tx, request, held):
        if not failures:
            failures.append("once")
            raise Unavailable("the store cannot be reached")
        return hold_for(tx, request, held)

    monkeypatch.setattr(Transaction, "hold_for", fail_once)
    requests = RequestService(pod.partitions)  # passes only when called
    assert isinstance(requests.create(PartitionRequest("r", 8), wait_seconds=60), Waiting)
    held = pod.partitions.queue.get("r").held
    assert held and failures == ["once"]
    requests.dispatch()
    with pod.store.reading() as tx:
        assert tx.list_requests()[0].held == held
    requests.close()


def test_no_request_is_left_waiting_in_an_allocation_being_removed(pod, queued, monkeypatch):
    pod.partitions.create(PartitionRequest("full", 32))
    cancel_all, latecomers = pod.allocations.requests.cancel_all, []

    def then_a_request_arrives(allocation_id, reason):
        cancelled = cancel_all(allocation_id, reason)
        try:
            latecomers.append(queued.create(PartitionRequest("late", 4), wait_seconds=60))
        except Conflict as refusal:
            latecomers.append(refusal)
        return cancelled

    monkeypatch.setattr(pod.allocations.requests, "cancel_all", then_a_request_arrives)
    pod.allocations.remove("a1", force=True)
    assert [str(r) for r in latecomers] == ["allocation a1 is being removed: no request waits in it"]
    assert queued.list() == [] and pod.partitions.queue.get("late") is None


def test_a_request_whose_row_went_without_the_queue_knowing_is_cancelled_all_the_same(pod, queued):
    pod.partitions.create(PartitionRequest("full", 32))
    queue_up(queued, "r", 4)
    with pod.store.transaction() as tx:  # as its allocation's removal deletes it
        tx.end_request(pod.partitions.queue.get("r"), "cancel")
    queued.cancel("r")
    assert queued.list() == []
    with pytest.raises(Conflict, match="the request of partition r was cancelled"):
        queued.wait("r", 1)
    queue_up(queued, "r", 4)  # its id is free again


def test_capacity_says_which_free_ipus_are_on_machines_down_and_which_are_held_for_the_first_request(pod):
    pod.partitions.create(PartitionRequest("p", 4, explicit_ipus=tuple((0, 4 + i) for i in range(4)), cluster_id="cl0"))  # ag2
    pod.partitions.create(PartitionRequest("rest", 16, explicit_ipus=tuple((0, 16 + i) for i in range(16)), cluster_id="cl0"))
    pod.gateway.unreachable.add(pod.address("ag1"))
    pod.reconciler.check_all()  # ag1, free, is down
    requests = RequestService(pod.partitions)
    assert isinstance(requests.create(PartitionRequest("big", 16), wait_seconds=60), Waiting)  # held: ag3-ag6, ag1 being down
    room = pod.partitions.capacity()[0]
    assert (room.free_ipus, room.down_ipus, room.held_ipus, room.held_for) == (12, 4, 8, "big")
    requests.close()
