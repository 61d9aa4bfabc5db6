"""The orchestrator's store, on SQLite and on a real PostgreSQL: no machine in two vPODs, machines
held back after a failed release test stay out of the pool until repaired, older stores migrate."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from vipu.model.errors import ConcurrentUpdate, Conflict, NotFound
from vipu.vpod.store import SCHEMA_VERSION, SiteMachine, Vpod, VpodStore


@pytest.fixture
def store(store_url):
    store = VpodStore(store_url)
    store.add_machines([SiteMachine(f"m{n}", n, "127.0.0.1", 18000 + n) for n in range(1, 5)])
    yield store
    store.close()


def vpod(vpod_id: str, machines: list[str], ports: list[int]) -> Vpod:
    return Vpod(vpod_id, "acme", "Creating", "reserved", machines, "mesh", 1, "acme", ports)


def release(store: VpodStore, vpod_id: str) -> None:
    store.start_release(vpod_id)
    store.advance(vpod_id, "reserved", "archived", expected_state="Releasing")
    store.finish_release(vpod_id, "archived")


def test_a_machine_held_back_stays_out_of_the_pool_until_repaired(store):
    store.add_vpod(vpod("acme-1", ["m1", "m2"], [1, 2, 3]))
    store.hold_back("acme-1", {"m2": "Cabling 3/4: m2:5 <--> 1:m3"})
    release(store, "acme-1")
    machines = {m.name: m for m in store.machines()}
    assert machines["m1"].free and not machines["m2"].free
    assert machines["m2"].held_back == "Cabling 3/4: m2:5 <--> 1:m3" and machines["m2"].vpod_id == ""
    with pytest.raises(ConcurrentUpdate):  # a vPOD cannot take it
        store.add_vpod(vpod("acme-2", ["m2"], [4, 5, 6]))
    store.repaired(["m2"])
    assert all(m.free for m in store.machines())
    store.add_vpod(vpod("acme-2", ["m2"], [4, 5, 6]))
    assert {m.name: m.vpod_id for m in store.machines()}["m2"] == "acme-2"


def test_repairing_is_refused_whole_for_a_machine_not_held_back_unknown_or_in_a_vpod(store):
    store.add_vpod(vpod("acme-1", ["m1", "m2"], [1, 2, 3]))
    store.hold_back("acme-1", {"m1": "Sync-Link 0/1", "m2": "Sync-Link 0/1"})
    release(store, "acme-1")
    store.add_vpod(vpod("acme-2", ["m3"], [4, 5, 6]))
    for names, refusal, reason in ((["m1", "m4"], Conflict, "machine m4 is not held back; it is in the pool already"),
                                   (["m1", "m9"], NotFound, "machine m9 is not one of the site's"),
                                   (["m3"], Conflict, "machine m3 is in vPOD acme-2; it is tested when that vPOD is released")):
        with pytest.raises(refusal) as refused:
            store.repaired(names)
        assert refused.value.message == reason
    assert {m.name for m in store.machines() if m.held_back} == {"m1", "m2"}  # nothing changed by the refusals


def test_a_store_of_schema_1_is_migrated_and_keeps_its_machines(store, store_url):
    store.add_vpod(vpod("acme-1", ["m1"], [1, 2, 3]))
    with store.session() as session:
        session.execute(text("ALTER TABLE site_machines DROP COLUMN held_back"))
        session.execute(text("ALTER TABLE vpods DROP COLUMN release_test"))
        session.execute(text("UPDATE vpod_meta SET value = '1' WHERE key = 'schema_version'"))
    store.close()
    reopened = VpodStore(store_url)
    try:
        assert [(m.name, m.vpod_id, m.held_back) for m in reopened.machines()] == [
            ("m1", "acme-1", ""), ("m2", "", ""), ("m3", "", ""), ("m4", "", "")]
        assert reopened.get("acme-1").release_test is False
        reopened.hold_back("acme-1", {"m1": "Sync-Link 0/1"})  # the new columns work
        assert reopened.start_release("acme-1", test=True).release_test is True
        assert reopened.setting("schema_version") == str(SCHEMA_VERSION)
    finally:
        reopened.close()


def test_a_store_newer_than_this_orchestrator_is_refused(store, store_url):
    store.set_setting("schema_version", str(SCHEMA_VERSION + 1))
    store.close()
    with pytest.raises(Conflict, match=f"has schema version {SCHEMA_VERSION + 1}, newer than this vipu-vpod's"):
        VpodStore(store_url)


def test_a_release_begun_with_the_cluster_test_keeps_it_when_resumed_without(store):
    store.add_vpod(vpod("acme-1", ["m1"], [1, 2, 3]))
    assert store.start_release("acme-1").release_test is False
    assert store.start_release("acme-1", test=True).release_test is True
    assert store.start_release("acme-1").release_test is True  # an orchestrator started again without the option
