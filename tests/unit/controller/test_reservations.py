"""Maintenance windows and reservations for people, on the real services (the agents' gateway is
the test double of `test_services`): before its start only what ends in time is placed on a
reservation's IPUs, a window drains its machines while it lasts and resumes them at its end, a
reservation holds its shape for its users, and all of it is stored."""

from __future__ import annotations

import time

import pytest

from vipu.model.entities import Access, PartitionRequest, ReadyState
from vipu.model.errors import AlreadyExists, Conflict, InvalidArgument, NoRoom, NotFound, PermissionDenied

HOUR = 3600.0
ALICE = Access("alice", frozenset({"a1"}))
BOB = Access("bob", frozenset({"a1"}))


def until(condition, what: str, seconds: float = 30.0) -> None:
    """Poll `condition` until it holds, failing with `what` after `seconds`."""
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def machines(n: int) -> tuple[str, ...]:
    return tuple(f"ag{i}" for i in range(1, n + 1))


def test_before_a_maintenance_window_only_what_ends_before_its_start_is_placed_on_its_machines(pod):
    now = time.time()
    view = pod.partitions.reservations.create("mw1", now + HOUR, now + 2 * HOUR, "firmware update", "admin", agent_ids=machines(7),
                                              maintenance=True)
    assert (view.reservation.size, view.reservation.allocation_id, view.ipus_in_use) == (28, "a1", 0)
    assert pod.partitions.create(PartitionRequest("anytime", 4)).agent_ids == ["ag8"]  # the one machine outside it
    with pytest.raises(NoRoom, match=r"no room for 4 IPUs in allocation a1 but on reserved ones: the IPUs of ag1-ag7 are kept for "
                                     r"maintenance window mw1 \(firmware update\) from .* UTC to .* UTC, and with no expected duration "
                                     r"it may not start there before"):
        pod.partitions.create(PartitionRequest("unknown", 4))
    with pytest.raises(NoRoom, match=r"it is expected to run 2h, past the start"):
        pod.partitions.create(PartitionRequest("long", 4, expected_seconds=7200))
    short = pod.partitions.create(PartitionRequest("short", 4, expected_seconds=600))
    assert short.agent_ids[0] in machines(7)
    [listed] = pod.partitions.reservations.list()
    assert listed.ipus_in_use == 4


def test_a_maintenance_window_drains_its_machines_from_its_start_and_resumes_them_at_its_end(pod):
    kept = pod.partitions.create(PartitionRequest("kept", 2))
    moving = pod.partitions.create(PartitionRequest("moving", 2, relocatable=True))
    assert kept.agent_ids == moving.agent_ids == ["ag1"]
    start = time.time() + 2.0
    pod.partitions.reservations.create("mw1", start, start + 8.0, "fan swap", "admin", agent_ids=("ag1",), maintenance=True)
    if time.time() < start - 0.5:  # (a machine too loaded to get here in time skips this look)
        assert pod.agents.get("ag1").agent.drain is None  # to come: nothing is drained yet
    until(lambda: pod.agents.get("ag1").agent.drain is not None, "the window's start did not drain its machine")  # by the owner's timer
    with pytest.raises(Conflict, match="it resumes at the window's end"):
        pod.agents.resume(["ag1"])
    drained = pod.agents.get("ag1")
    assert drained.agent.drain.reason.startswith("maintenance window mw1 until ") and drained.agent.drain.reason.endswith(": fan swap")
    until(lambda: pod.partitions.get("moving").agent_ids != ["ag1"], "the relocatable partition did not move off at the window's start")
    assert pod.partitions.get("moving").ready_state is ReadyState.ACTIVE
    assert drained.draining_partitions in (("kept",), ("kept", "moving"))
    [notice] = pod.partitions.get("kept").drain_notices
    assert notice.startswith("agent ag1 is draining for maintenance window mw1") and notice.endswith("it is left to finish there")
    until(lambda: pod.agents.get("ag1").agent.drain is None, "the window's end did not resume its machine")
    assert pod.partitions.get("kept").drain_notices == ()
    [listed] = pod.partitions.reservations.list()
    assert listed.reservation.phase(time.time()) == "OVER"


def test_a_reservation_holds_its_shape_for_its_users_and_refuses_others_naming_it(pod):
    now = time.time()
    view = pod.partitions.reservations.create("train", now, now + HOUR, "alice's training run", "admin", size=8, users=("alice",))
    reserved = view.reservation.ipus
    assert len(reserved) == 8 and len(view.reservation.agent_ids) == 2  # a whole shape: two machines
    for n in range(6):
        pod.partitions.create(PartitionRequest(f"bob{n}", 4), BOB)
    with pytest.raises(NoRoom, match=r"are kept for reservation train \(alice's training run\) from .* \(its users name it: "
                                     r"--reservation\)"):
        pod.partitions.create(PartitionRequest("bob6", 4), BOB)
    with pytest.raises(PermissionDenied, match=r"reservation train .* is for alice, not for user bob"):
        pod.partitions.create(PartitionRequest("sneaky", 4, reservation="train"), BOB)
    made = pod.partitions.create(PartitionRequest("run", 8, reservation="train"), ALICE)
    assert {(ipu.agent_id, ipu.index) for ipu in made.ipus} == reserved
    assert (made.reservation, pod.partitions.get("bob0", BOB).reservation) == ("train", "")  # where each was made, stored
    with pytest.raises(NoRoom, match=r"no room in reservation train"):
        pod.partitions.create(PartitionRequest("more", 1, reservation="train"), ALICE)
    with pytest.raises(NotFound, match="reservation nope does not exist"):
        pod.partitions.create(PartitionRequest("lost", 1, reservation="nope"), ALICE)
    [listed] = pod.partitions.reservations.list(access=ALICE)
    assert listed.ipus_in_use == 8
    assert pod.restarted().partitions.get("run", ALICE).reservation == "train"


def test_a_request_in_a_reservation_to_come_waits_and_starts_at_its_start(pod):
    now = time.time()
    pod.partitions.reservations.create("soon", now + 1.0, now + HOUR, "demo", "admin", size=4, users=("alice",))
    waiting = pod.requests.create(PartitionRequest("demo", 4, reservation="soon"), ALICE, wait_seconds=600)
    assert "has not started" in waiting.reason
    until(lambda: pod.owners.owner("a1").snapshot.partitions.get("demo") is not None, "the request did not start at the start")
    until(lambda: pod.partitions.get("demo", ALICE).ready_state is ReadyState.ACTIVE, "the partition did not become ACTIVE")
    [reservation] = [v.reservation for v in pod.partitions.reservations.list()]
    assert {(ipu.agent_id, ipu.index) for ipu in pod.partitions.get("demo", ALICE).ipus} == reservation.ipus
    assert pod.partitions.get("demo", ALICE).reservation == "soon"  # a grant from the queue records it too


def test_reservations_are_stored_and_a_restarted_controller_keeps_them(pod):
    now = time.time()
    pod.partitions.reservations.create("mw1", now, now + HOUR, "rack move", "admin", agent_ids=("ag1", "ag2"), maintenance=True)
    services = pod.restarted()
    [kept] = services.partitions.reservations.list()
    assert (kept.reservation.name, kept.reservation.agent_ids, kept.reservation.by) == ("mw1", ("ag1", "ag2"), "admin")
    assert services.agents.get("ag2").agent.drain.reason.startswith("maintenance window mw1")
    assert services.partitions.create(PartitionRequest("p1", 4)).agent_ids == ["ag3"]
    services.partitions.reservations.remove("mw1")  # removed while under way: its machines resume at once
    assert services.agents.get("ag1").agent.drain is None
    assert services.partitions.reservations.list() == []


def test_bad_reservations_are_refused_in_one_line_and_change_nothing(pod):
    now = time.time()
    create = pod.partitions.reservations.create
    create("mw1", now + HOUR, now + 2 * HOUR, "firmware", "admin", agent_ids=("ag1", "ag2"), maintenance=True)
    refusals = [
        (Conflict, r"reservation mw2 would hold ag2 while maintenance window mw1 \(firmware\) from",
         dict(name="mw2", start=now + 1.5 * HOUR, end=now + 3 * HOUR, agent_ids=("ag2", "ag3"), maintenance=True)),
        (InvalidArgument, "would end in the past", dict(name="old", start=now - 2 * HOUR, end=now - HOUR, agent_ids=("ag3",),
                                                        maintenance=True)),
        (InvalidArgument, "ends .* before it starts", dict(name="back", start=now + 2 * HOUR, end=now + HOUR, agent_ids=("ag3",),
                                                           maintenance=True)),
        (InvalidArgument, "a reservation of 64 IPUs is larger than allocation a1 \\(32 IPUs\\)",
         dict(name="huge", start=now, end=now + HOUR, size=64, users=("alice",))),
        (AlreadyExists, "reservation mw1 already exists", dict(name="mw1", start=now, end=now + HOUR, agent_ids=("ag5",),
                                                               maintenance=True)),
        (NotFound, "agent nope does not exist", dict(name="x", start=now, end=now + HOUR, agent_ids=("ag5", "nope"),
                                                     maintenance=True)),
        (InvalidArgument, "reserve machines .* or a number of IPUs", dict(name="x", start=now, end=now + HOUR, agent_ids=("ag5",),
                                                                          size=4, maintenance=True)),
        (InvalidArgument, "give --maintenance or --users/--accounts, not both", dict(name="x", start=now, end=now + HOUR, size=4,
                                                                          maintenance=True, users=("alice",))),
        (InvalidArgument, "is for its users .* or accounts .*, or is a maintenance window",
         dict(name="x", start=now, end=now + HOUR, size=4)),
        (InvalidArgument, "start and end are times", dict(name="x", start=float("nan"), end=now + HOUR, size=4, users=("a",))),
        (InvalidArgument, "a reservation's size is a power of two, as a partition's is, not 3",
         dict(name="x", start=now, end=now + HOUR, size=3, users=("a",))),
        (InvalidArgument, "a maintenance window takes whole machines", dict(name="x", start=now, end=now + HOUR, size=2,
                                                                            maintenance=True)),
    ]
    for family, message, fields in refusals:
        reason = fields.pop("reason", "why")
        with pytest.raises(family, match=message):
            create(fields.pop("name"), fields.pop("start"), fields.pop("end"), reason, "admin", **fields)
    with pytest.raises(InvalidArgument, match="a reservation needs a reason"):
        create("x", now, now + HOUR, "  ", "admin", size=4, users=("alice",))
    assert [v.reservation.name for v in pod.partitions.reservations.list()] == ["mw1"]
    assert pod.partitions.create(PartitionRequest("after", 4)).agent_ids == ["ag3"]  # the owner took every refusal in its stride
    with pytest.raises(NotFound, match="reservation nope does not exist"):
        pod.partitions.reservations.remove("nope")
    with pytest.raises(PermissionDenied, match="is a maintenance window: no partition is made in it"):
        pod.partitions.create(PartitionRequest("in-window", 4, reservation="mw1"), ALICE)


def test_nothing_waits_moves_or_counts_as_room_on_a_reservations_ipus(pod):
    now = time.time()
    reserved = pod.partitions.reservations.create("train", now, now + HOUR, "a run", "admin", agent_ids=("ag7", "ag8"),
                                                  users=("alice",)).reservation.ipus
    for n in range(1, 6):
        pod.partitions.create(PartitionRequest(f"p{n}", 4), BOB)
    mover = pod.partitions.create(PartitionRequest("mover", 4, relocatable=True), BOB)
    assert mover.agent_ids == ["ag6"]
    with pytest.raises(NoRoom):  # the only free IPUs are the reservation's: a move may not take them
        pod.partitions.relocate("mover", BOB)
    assert pod.partitions.get("mover", BOB).agent_ids == ["ag6"]
    [room] = pod.partitions.capacity(size=4, access=BOB)
    assert (room.free_ipus, room.reserved_ipus, room.fitting, room.largest) == (8, 8, 0, 0)
    waiting = pod.requests.create(PartitionRequest("waits", 4), BOB, wait_seconds=600)
    assert "kept for reservation train" in waiting.reason
    held = pod.owners.owner("a1").snapshot.queue.held
    assert held and held.isdisjoint(reserved)  # the shape held for it is one it may have


def test_a_request_waiting_for_a_reservation_ends_when_the_reservation_is_removed(pod):
    now = time.time()
    pod.partitions.reservations.create("later", now + HOUR, now + 2 * HOUR, "demo", "admin", size=4, users=("alice",))
    waiting = pod.requests.create(PartitionRequest("demo", 4, reservation="later"), ALICE, wait_seconds=600)
    assert "has not started" in waiting.reason
    pod.partitions.reservations.remove("later")
    until(lambda: pod.owners.owner("a1").snapshot.queue.get("demo") is None, "the request outlived its reservation")
    assert "demo" not in {p.id for p in pod.partitions.list()}
    with pytest.raises(Conflict, match="the request of partition demo ends: reservation later was removed"):
        pod.requests.wait("demo", 0, ALICE)  # what its waiter is told


def test_a_waiting_requests_reason_names_a_reservation_only_when_it_alone_keeps_the_request_off(pod):
    now = time.time()
    pod.partitions.reservations.create("mw1", now + HOUR, now + 2 * HOUR, "firmware", "admin", agent_ids=("ag8",), maintenance=True)
    for n in range(1, 8):
        pod.partitions.create(PartitionRequest(f"p{n}", 4))
    kept_off = pod.requests.create(PartitionRequest("kept-off", 4), wait_seconds=600)  # ag8 is free, but the window is to come
    assert "but on reserved ones: the IPUs of ag8 are kept for maintenance window mw1" in kept_off.reason
    pod.requests.cancel("kept-off")
    pod.partitions.create(PartitionRequest("short", 4, expected_seconds=600))  # ends before the window: on ag8
    full = pod.requests.create(PartitionRequest("full", 4), wait_seconds=600)
    assert "all 32 of its IPUs are in use" in full.reason and "kept for" not in full.reason  # the window keeps nothing off now


def test_a_refusal_that_partitions_and_a_reservation_both_cause_says_what_must_go_including_the_reservation(pod):
    now = time.time()
    pod.partitions.reservations.create("team", now, now + HOUR, "a run", "admin", agent_ids=("ag3", "ag4"), users=("alice",))
    pod.partitions.create(PartitionRequest("inres", 8, reservation="team"), ALICE)
    pod.partitions.create(PartitionRequest("p1", 4), BOB)
    with pytest.raises(NoRoom, match=r"it fits when inres and reservation team and p1 are removed$"):  # not "inres and p1"
        pod.partitions.create(PartitionRequest("big", 32), BOB)
