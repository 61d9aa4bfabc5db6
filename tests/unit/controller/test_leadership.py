"""Leadership among replicas on one real store (SQLite and PostgreSQL): election, standby, handover, deposition."""

from __future__ import annotations

import threading
import time

import pytest

from vipu.controller.infrastructure.leadership import LEASE_NAME, Leadership
from vipu.model.errors import Standby, Unavailable
from vipu.store.schema import LeaseRow
from vipu.store.store import Store

LEASE = 0.6


class Replica:
    def __init__(self, store_url: str, name: str, lease: float = LEASE):
        self.store = Store(store_url)
        self.elected, self.deposed = threading.Event(), threading.Event()
        self.reasons: list[str] = []
        self.leadership = Leadership(self.store, name, lease, on_elected=self._elected, on_deposed=self._deposed)

    def _elected(self) -> None:
        self.leadership.serving()
        self.elected.set()

    def _deposed(self, reason: str) -> None:
        self.reasons.append(reason)
        self.deposed.set()

    def close(self) -> None:
        self.leadership.stop()
        self.store.close()


@pytest.fixture
def replicas(store_url):
    made: list[Replica] = []

    def make(name: str, lease: float = LEASE) -> Replica:
        made.append(Replica(store_url, name, lease))
        return made[-1]

    yield make
    for replica in made:
        replica.close()


def wait_for_refusal_naming_a_leader(replica: Replica, timeout: float = 5.0) -> Standby:
    """The standby's refusal, once it has read who leads."""
    deadline = time.monotonic() + timeout
    while True:
        with pytest.raises(Standby) as refused:
            replica.leadership.admit()
        if refused.value.leader or time.monotonic() > deadline:
            return refused.value
        time.sleep(0.02)


def test_the_first_replica_leads_and_the_second_stands_by_naming_it(replicas):
    first = replicas("first")
    first.leadership.start()
    assert first.elected.wait(5)
    first.leadership.admit()  # serves
    second = replicas("second")
    second.leadership.start()
    refused = wait_for_refusal_naming_a_leader(second)
    assert refused.leader == "first"
    assert refused.message == "this vipu-server is a standby replica; the leader is at first"
    assert not second.elected.is_set()


def test_a_leader_stopping_hands_over_without_waiting_for_its_lease(replicas):
    lease = 6.0  # the leader renews it every 2 s: unreleased, it would last 4 s or more past the stop
    first, second = replicas("first", lease), replicas("second", lease)
    first.leadership.start()
    assert first.elected.wait(5)
    second.leadership.start()
    first.leadership.stop()
    assert second.elected.wait(3.6)  # a released lease is taken at the standby's next claim, within a second
    assert first.store.read_lease(LEASE_NAME).term == 2


def test_a_leader_whose_lease_changed_hands_meanwhile_is_deposed(replicas):
    leader = replicas("leader")
    leader.leadership.start()
    assert leader.elected.wait(5)
    with leader.store.transaction() as tx:  # another replica led for a term, and the lease came back
        row = tx.session.get(LeaseRow, LEASE_NAME)
        row.term += 2
    assert leader.deposed.wait(5)
    assert leader.reasons == ["the lead changed hands while this replica could not renew it (term 1 to 3)"]
    with pytest.raises(Standby):
        leader.leadership.admit()


class LosingStore:
    """A store that, once told to, can no longer be reached (for the lease's claims)."""

    def __init__(self, store: Store):
        self.store = store
        self.lost = threading.Event()

    def claim_lease(self, *args):
        if self.lost.is_set():
            raise Unavailable("cannot reach the store: connection refused")
        return self.store.claim_lease(*args)

    def __getattr__(self, name):
        return getattr(self.store, name)


class StallingStore:
    """A store whose lease claims stall (a lock held, the server paused) from `stall()` for a while:
    a claim waits until the stall ends or its deadline passes, then fails as a statement timeout would."""

    def __init__(self, store: Store):
        self.store = store
        self.until = 0.0

    def stall(self, seconds: float) -> None:
        self.until = time.monotonic() + seconds

    def claim_lease(self, name, holder, address, seconds, deadline_seconds=0.0):
        remaining = self.until - time.monotonic()
        if remaining > 0:
            time.sleep(min(remaining, deadline_seconds or remaining))  # the statement waits on the stall, within its deadline
            if time.monotonic() < self.until:
                raise Unavailable("canceling statement due to statement timeout")
        return self.store.claim_lease(name, holder, address, seconds, deadline_seconds)

    def __getattr__(self, name):
        return getattr(self.store, name)


def test_a_stall_of_the_store_shorter_than_the_lease_pauses_the_leader_and_changes_no_leader(store_url):
    """Past ACTING_SHARE of the lease unrenewed, the leader admits nothing; renewed in its term once
    the stall ends, it serves again. Not deposed: no standby can have taken over."""
    store = Store(store_url)
    stalling = StallingStore(store)
    deposed: list[str] = []
    lease = 2.0
    leadership = Leadership(stalling, "leader", lease, on_elected=lambda: leadership.serving(), on_deposed=deposed.append)
    try:
        leadership.start()
        wait_until(lambda: leadership.ready, 5)
        stalling.stall(0.65 * lease)  # past the acting share, within the lease whenever it starts after a renewal
        with pytest.raises(Standby, match=r"this vipu-server leads but has not renewed its lease for .* s \(the store is slow\)"):
            wait_until(lambda: not leadership.ready, lease)
            leadership.admit()
        wait_until(lambda: leadership.ready, 2 * lease)  # renewed in the same term
        leadership.admit()
        assert deposed == []
        with store.reading() as tx:
            assert tx.session.get(LeaseRow, LEASE_NAME).term == 1
    finally:
        leadership.stop()
        store.close()


class HangingStore:
    """A store whose lease claims, once `hang` is set, keep no deadline (a driver hung on its socket, a
    paused server, a cut network) until `released`."""

    def __init__(self, store: Store):
        self.store = store
        self.hang, self.released = threading.Event(), threading.Event()

    def claim_lease(self, *args):
        if self.hang.is_set():
            self.released.wait(30)
        return self.store.claim_lease(*args)

    def __getattr__(self, name):
        return getattr(self.store, name)


def test_a_claim_held_past_its_deadline_changes_no_leader_within_the_lease_and_deposes_it_once_it_may_lapse(store_url):
    """The claim waits on the store on a thread of its own: held for most of the lease, then answered,
    it renews the lease in the same term; held past the lease, the leader is deposed when the lease
    may have run out, not before (a held claim once held the loop, and the watchdog deposed it at half)."""
    store = Store(store_url)
    hanging = HangingStore(store)
    deposed: list[str] = []
    lease = 2.0
    leadership = Leadership(hanging, "leader", lease, on_elected=lambda: leadership.serving(), on_deposed=deposed.append)
    try:
        leadership.start()
        wait_until(lambda: leadership.ready, 5)
        hanging.hang.set()
        time.sleep(0.7 * lease)  # what is tested is that nothing happens for this long
        assert deposed == []
        hanging.hang.clear()
        hanging.released.set()
        wait_until(lambda: leadership.ready, lease)
        assert deposed == []
        with store.reading() as tx:
            assert tx.session.get(LeaseRow, LEASE_NAME).term == 1
        hanging.released.clear()
        hanging.hang.set()
        held = time.monotonic()
        wait_until(lambda: bool(deposed), 2 * lease)
        assert deposed == [f"the lease could not be renewed within {lease:g} s"]
        assert time.monotonic() - held > lease - lease / 5 - 0.05  # the last renewal began at most a fifth of a lease before
    finally:
        hanging.released.set()
        leadership.stop()
        store.close()


def test_a_leader_whose_lease_loop_is_held_is_deposed_by_its_watchdog(store_url):
    """Past half a lease with its loop itself held (here where it reports a claim's time: a log that
    cannot be written, a starved process), the leader is deposed, before the lease can run out."""
    store = Store(store_url)
    deposed: list[str] = []
    held, released = threading.Event(), threading.Event()
    leadership = Leadership(store, "leader", 1.0, on_elected=lambda: leadership.serving(), on_deposed=deposed.append)

    def reported(_seconds: float) -> None:
        if held.is_set():
            released.wait(30)

    leadership.on_claim = reported
    try:
        leadership.start()
        wait_until(lambda: leadership.ready, 5)
        held.set()
        wait_until(lambda: bool(deposed), 2.0)
        assert deposed[0].startswith("its lease loop was held for ") and deposed[0].endswith(", past half its lease of 1 s")
        assert not leadership.ready
    finally:
        released.set()
        leadership.stop()
        store.close()


def wait_until(condition, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def test_a_leader_that_loses_the_store_stops_serving_when_its_lease_runs_out(store_url):
    store = Store(store_url)
    losing = LosingStore(store)
    deposed: list[str] = []
    leadership = Leadership(losing, "leader", LEASE, on_elected=lambda: leadership.serving(), on_deposed=deposed.append)
    try:
        leadership.start()
        deadline = time.monotonic() + 5
        while not leadership.leading:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        losing.lost.set()
        while not deposed:
            assert time.monotonic() < deadline + LEASE * 3
            time.sleep(0.02)
        assert deposed == [f"the lease could not be renewed within {LEASE:g} s"]
        with pytest.raises(Standby):
            leadership.admit()
    finally:
        leadership.stop()
        store.close()
