"""IPUoF attachments last on the simulated machine, and a fence keeps an idle partition idle.

An attachment lasts until its client detaches, its hold lapses (a run renews it) or its
partition's settings are cleared or replaced; the controller reads them, and fences a partition
nobody is attached to before it moves it. The machine's clock here is the test's own, so holds
and fences lapse when the test says, not after a sleep.
"""

from __future__ import annotations

import dataclasses
import re
import threading

import pytest

from tests.unit.backends.test_sim_machine import settings
from vipu.backends.base import DEFAULT_HOLD_SECONDS, PartitionAttachments
from vipu.backends.sim.machine import MAX_SESSIONS_PER_IPU, RackFile, SimMachine
from vipu.backends.sim.rack import generate_rack, save_rack
from vipu.model.errors import Conflict, InvalidArgument, NotFound, PermissionDenied, Unavailable

KEY = "key-of-p1"


class Clock:
    """A monotonic clock that moves only when told."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def machine(tmp_path, clock):
    path = tmp_path / "rack.yaml"
    save_rack(generate_rack(2, time_scale=0.001), path)
    machine = SimMachine(RackFile(path), "m01", clock=clock)
    machine.apply(keyed("p1", (0, 1)))
    machine.apply(keyed("p2", (2, 3), key="key-of-p2"))
    return machine


def keyed(partition_id, indices, key=KEY):
    return dataclasses.replace(settings(partition_id, indices), attach_key=key)


def attach(machine, session, device=0, hold=0.0, partition_id="p1", key=KEY):
    machine.ipuof_attach(partition_id, device, "", key, session, hold)


def clients(machine, partition_id="p1") -> int:
    return report(machine, partition_id).attached_clients


def report(machine, partition_id="p1", fence=0.0) -> PartitionAttachments:
    (only,) = machine.attachments([partition_id], fence)
    return only


def test_an_attachment_lasts_until_its_client_detaches(machine):
    assert clients(machine) == 0
    attach(machine, "s1", 0)
    attach(machine, "s1", 1)  # one client on both IPUs
    attach(machine, "s2", 1)
    assert clients(machine) == 2
    assert report(machine).oldest_attached_at > 0
    assert clients(machine, "p2") == 0
    machine.ipuof_detach("p1", 0, "s1")
    assert clients(machine) == 2  # s1 still holds IPU 1
    machine.ipuof_detach("p1", 1, "s1")
    machine.ipuof_detach("p1", 1, "s2")
    assert report(machine) == PartitionAttachments("p1", 0, 0.0, 0.0)
    machine.ipuof_detach("p1", 1, "s2")  # already detached: no error
    machine.ipuof_detach("p2", 0, "s9")  # never attached: no error


def test_every_held_partition_is_reported_when_none_is_named(machine):
    attach(machine, "s1")
    assert [(r.partition_id, r.attached_clients) for r in machine.attachments([])] == [("p1", 1), ("p2", 0)]
    assert [r.partition_id for r in machine.attachments(["p9", "p1", "p9"])] == ["p9", "p1"]


def test_an_attachment_lapses_at_the_end_of_its_hold(machine, clock):
    attach(machine, "s1", hold=10)
    clock.advance(9.9)
    assert clients(machine) == 1
    clock.advance(0.1)
    assert clients(machine) == 0


def test_an_attachment_without_a_hold_lasts_the_default_and_one_without_a_session_counts_too(machine, clock):
    attach(machine, "")  # a client from before sessions: it never detaches, so it lapses
    clock.advance(DEFAULT_HOLD_SECONDS - 1)
    assert clients(machine) == 1
    clock.advance(1)
    assert clients(machine) == 0


def test_a_run_renews_the_attachment_of_its_ipu_by_its_hold(machine, clock):
    attach(machine, "s1", hold=10)
    clock.advance(8)
    assert machine.ipuof_run("p1", 0, "", 0, 7, KEY, "s1")
    clock.advance(8)
    assert clients(machine) == 1  # 16 s after the attach, 8 after the run
    clock.advance(2)
    assert clients(machine) == 0


def test_a_run_attaches_a_session_not_attached(machine, clock):
    machine.ipuof_run("p1", 0, "", 0, 7, KEY, "s1")
    assert clients(machine) == 1
    clock.advance(DEFAULT_HOLD_SECONDS)
    assert clients(machine) == 0


def test_attachments_end_when_the_partition_is_cleared_or_its_settings_replaced(machine):
    attach(machine, "s1")
    machine.apply(keyed("p1", (0, 1)))  # the same settings again: nothing changes for its clients
    assert clients(machine) == 1
    machine.apply(keyed("p1", (0, 1), key="a-new-key"))
    assert clients(machine) == 0
    attach(machine, "s1", key="a-new-key")
    machine.clear("p1")
    assert clients(machine) == 0
    machine.apply(keyed("p1", (0, 1)))
    assert clients(machine) == 0  # not back with the partition's settings


def test_a_fence_refuses_new_attaches_and_runs_of_an_idle_partition(machine, clock):
    fenced = report(machine, fence=30)
    assert fenced.attached_clients == 0 and fenced.fenced_until > 0
    with pytest.raises(Unavailable, match=r"^partition p1 is being moved; attach again once it is ACTIVE$"):
        attach(machine, "s1")
    with pytest.raises(Unavailable, match="partition p1 is being moved"):
        machine.ipuof_run("p1", 0, "", 0, 7, KEY, "s1")
    attach(machine, "s1", device=2, partition_id="p2", key="key-of-p2")  # another partition is not fenced
    assert report(machine).fenced_until == pytest.approx(fenced.fenced_until, abs=1)  # a report alone leaves the fence as it is
    assert clients(machine) == 0


def test_a_fence_refuses_only_a_client_with_the_key(machine):
    report(machine, fence=30)
    with pytest.raises(PermissionDenied, match="the attach key is not partition p1's"):
        attach(machine, "s1", key="a-guess")


def test_a_partition_with_a_client_attached_gets_no_fence(machine):
    attach(machine, "s1")
    assert report(machine, fence=30) == PartitionAttachments("p1", 1, report(machine).oldest_attached_at, 0.0)
    attach(machine, "s2")  # still open to others
    assert clients(machine) == 2


def test_a_partition_the_machine_does_not_hold_gets_no_fence(machine):
    assert report(machine, "p9", fence=30) == PartitionAttachments("p9", 0, 0.0, 0.0)
    machine.clear("p1")
    machine.apply(keyed("p9", (0, 1)))
    attach(machine, "s1", partition_id="p9")


def test_a_fence_lapses(machine, clock):
    report(machine, fence=30)
    clock.advance(29.9)
    with pytest.raises(Unavailable):
        attach(machine, "s1")
    clock.advance(0.1)
    assert report(machine).fenced_until == 0
    attach(machine, "s1")


def test_a_fence_ends_when_the_partition_is_applied_again_or_cleared(machine):
    report(machine, fence=30)
    machine.apply(keyed("p1", (0, 1)))
    attach(machine, "s1")
    machine.ipuof_detach("p1", 0, "s1")
    report(machine, fence=30)
    machine.clear("p1")
    machine.apply(keyed("p1", (0, 1)))
    attach(machine, "s1")


def race(machine: SimMachine, session: str, controller_delay: int) -> tuple[bool, PartitionAttachments]:
    """A client attaching and the controller fencing at once; whether the attach succeeded, and
    the controller's report. The controller starts `controller_delay` rack reads (what an attach
    does before it takes the lock) later."""
    start = threading.Barrier(2)
    attached: list[bool] = []
    fenced: list[PartitionAttachments] = []

    def client() -> None:
        start.wait()
        try:
            attach(machine, session)
            attached.append(True)
        except Unavailable:
            attached.append(False)

    def controller() -> None:
        start.wait()
        for _ in range(controller_delay):
            machine.machine()
        fenced.append(report(machine, fence=30))

    threads = [threading.Thread(target=client), threading.Thread(target=controller)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return attached[0], fenced[0]


def test_an_attach_and_a_fence_racing_never_both_succeed(machine):
    """Finding a partition idle and fencing it are one step: either the client attached first and
    no fence is set, or the fence came first and the attach is refused; never both. The controller
    starts a little later each round, so that the two meet at different points, either order
    happening."""
    for round_number in range(200):
        machine.apply(keyed("p1", (0, 1)))
        attached, fenced = race(machine, f"s{round_number}", round_number % 12)
        assert attached != (fenced.fenced_until > 0), f"round {round_number}: attached {attached}, {fenced}"
        assert fenced.attached_clients == (1 if attached else 0)
        machine.clear("p1")


def test_an_ipu_takes_a_bounded_number_of_clients(machine):
    for n in range(MAX_SESSIONS_PER_IPU):
        attach(machine, f"s{n}")
    attach(machine, "s0")  # renewing one attached is no new client
    with pytest.raises(Conflict, match=f"IPU 0 of m01 has {MAX_SESSIONS_PER_IPU} clients attached, the most it takes"):
        attach(machine, "one-more")
    attach(machine, "one-more", device=1)


@pytest.mark.parametrize(("call", "error", "message"), [
    (lambda m: attach(m, "s1", hold=-1), InvalidArgument, "hold_seconds must be between 0 and 86400, not -1"),
    (lambda m: attach(m, "s1", hold=float("nan")), InvalidArgument, "hold_seconds must be between 0 and 86400, not nan"),
    (lambda m: attach(m, "s1", hold=1e9), InvalidArgument, "hold_seconds must be between 0 and 86400, not 1e+09"),
    (lambda m: attach(m, "x" * 129), InvalidArgument, "an IPUoF client session is at most 128 printable characters"),
    (lambda m: attach(m, "bad\nsession"), InvalidArgument, "an IPUoF client session is at most 128 printable characters"),
    (lambda m: attach(m, "s1", device=7), NotFound, "m01 has no IPU 7"),
    (lambda m: m.ipuof_detach("p1", 0, ""), InvalidArgument, "a detach names the client session that attached"),
    (lambda m: m.ipuof_detach("p1", 9, "s1"), NotFound, "m01 has no IPU 9"),
    (lambda m: m.attachments(["p1"], -1), InvalidArgument, "fence_seconds must be between 0 and 3600, not -1"),
    (lambda m: m.attachments(["p1"], float("inf")), InvalidArgument, "fence_seconds must be between 0 and 3600, not inf"),
    (lambda m: m.attachments(["p1"], 3601), InvalidArgument, "fence_seconds must be between 0 and 3600, not 3601"),
    (lambda m: m.attachments([], 30), InvalidArgument, "a fence names the partitions it is for"),
    (lambda m: m.attachments(["p1", ""]), InvalidArgument, "a partition id is empty"),
])
def test_bad_requests_are_refused_in_one_line(machine, call, error, message):
    with pytest.raises(error, match=re.escape(message)) as refused:
        call(machine)
    assert "\n" not in refused.value.message
    assert clients(machine) == 0 and report(machine).fenced_until == 0
