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
        assert deposed == ["the lease could not be renewed"]
        with pytest.raises(Standby):
            leadership.admit()
    finally:
        leadership.stop()
        store.close()
