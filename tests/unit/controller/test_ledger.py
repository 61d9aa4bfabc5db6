"""The ledger: the serving controller's copy of every partition and of the IPUs they take."""

from __future__ import annotations

from tests.unit.store.test_store import partition
from vipu.controller.services.ledger import Ledger
from vipu.model.entities import ReadyState


def test_it_starts_from_the_store_and_follows_what_is_recorded_and_forgotten():
    ledger = Ledger()
    ledger.load([partition("p1", "ag1", (0, 1)), partition("p2", "ag2")])
    assert [p.id for p in ledger.list()] == ["p1", "p2"]
    assert ledger.used_ipus("a1") == {"ag1": {0, 1}, "ag2": {0, 1, 2, 3}}
    ledger.record(partition("p3", "ag1", (2, 3)))
    ledger.forget("p2")
    assert ledger.used_ipus("a1") == {"ag1": {0, 1, 2, 3}, "ag2": set()}
    assert ledger.get("p2") is None and ledger.used_ipus("other") == {}
    ledger.load([])
    assert ledger.list() == [] and ledger.used_ipus("a1") == {}


def test_callers_get_copies_and_changes_count_only_once_recorded():
    ledger = Ledger()
    ledger.load([partition("p1", "ag1")])
    copy = ledger.get("p1")
    copy.ready_state = ReadyState.ACTIVE
    copy.errors.append("not recorded")
    assert ledger.get("p1").ready_state is ReadyState.PENDING and ledger.get("p1").errors == []
    ledger.record(copy)
    assert ledger.get("p1").ready_state is ReadyState.ACTIVE
    moved = partition("p1", "ag2")  # the same partition recorded again elsewhere frees its old IPUs
    ledger.record(moved)
    assert ledger.used_ipus("a1") == {"ag1": set(), "ag2": {0, 1, 2, 3}}


def test_each_allocation_is_placed_under_a_lock_of_its_own():
    ledger = Ledger()
    assert ledger.placing("a1") is ledger.placing("a1")
    assert ledger.placing("a1") is not ledger.placing("a2")
