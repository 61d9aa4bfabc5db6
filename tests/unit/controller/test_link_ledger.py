"""The link ledger over a simulated pod and a real store (SQLite; PostgreSQL in the last test): readings become
history, a trend makes a link suspect and a down link failed, each change is an event with the
partitions on the machine, a swapped cable starts afresh and names the cable it replaced, cluster
tests fail and clear links, and compaction keeps the history's growth while it shrinks."""

from __future__ import annotations

import time

import pytest

from tests.unit.controller.test_services import Pod
from vipu.backends.sim import faults
from vipu.backends.sim.rack import load_rack, save_rack
from vipu.controller.usecases.links import LinkLedger
from vipu.controller.usecases.remediation import LinkRemediation
from vipu.model.clustertests import CableResult, CableVerdict
from vipu.model.clustertests import TestType as Step
from vipu.model.entities import PartitionRequest
from vipu.model.errors import NotFound
from vipu.model.linkhealth import HOUR, CableIdentity, LinkHealth, LinkName, LinkReading, RemediationPolicy, Retention, TrendPolicy
from vipu.model.topology import Cable, LinkKind, Port

T0 = 1_800_000_000.0
POLICY = TrendPolicy(window_seconds=60.0, windows=5, growing=3)


class Clock:
    def __init__(self, now: float = T0):
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def ledger(pod, clock):
    made = LinkLedger(pod.store, pod.gateway, POLICY, Retention(full_seconds=2 * HOUR, hourly_seconds=4 * HOUR, days=400), clock)
    yield made
    made.close()


def port(corrected: int, recoveries: int = 0, up: bool = True, serial: str = "C-1") -> LinkReading:
    return LinkReading("5", corrected, recoveries, up, CableIdentity(serial, "vipu-sim", "OSFP-DAC-1m"), "peer", 1)


def test_every_up_agent_is_sampled_and_each_of_its_links_enters_the_ledger(pod, ledger):
    pod.gateway.unreachable.add(pod.address("ag8"))
    assert ledger.sample_all() == 7  # ag8 does not answer this time
    links = ledger.links()
    assert {s.name.agent_id for s in links} == {f"ag{n}" for n in range(1, 8)}
    assert all(s.health is LinkHealth.HEALTHY and s.last is not None for s in links)
    five = ledger.detail(LinkName("ag1", "5"))
    assert five.state.cable is not None and five.state.cable.vendor == "vipu-sim" and len(five.history.samples) == 1
    assert [c.identity.serial for c in five.cables] == [five.state.cable.serial]
    with pytest.raises(NotFound, match="no link ag8:5 is in the ledger"):
        ledger.detail(LinkName("ag8", "5"))


def test_growth_in_k_of_n_windows_makes_a_link_suspect_with_an_event_naming_the_partitions_there(pod, ledger, clock):
    pod.partitions.create(PartitionRequest("p1", 8))  # on ag1 and ag2
    name = LinkName("ag1", "5")
    for minute, corrected in enumerate([0, 0, 4, 4, 9, 15]):  # growth in three of the last five minutes
        clock.now = T0 + 60 * minute + 1
        ledger.record("ag1", [port(corrected)], clock.now)
    state = ledger.detail(name).state
    assert state.health is LinkHealth.SUSPECT and state.reason == "its errors or recoveries grew in 3 of its last 5 windows of 1m"
    (event,) = ledger.detail(name).events
    assert (event.health, event.partitions, event.at) == (LinkHealth.SUSPECT, ("p1",), T0 + 301)
    assert [s.name for s in ledger.links(unhealthy=True)] == [name]
    assert ledger.links(agent_id="ag2") == [] and ledger.links(since=T0 + 302) == []

    clock.now = T0 + 900  # quiet for ten minutes: healthy again, another event
    ledger.record("ag1", [port(15)], clock.now)
    assert [e.health for e in ledger.detail(name).events] == [LinkHealth.SUSPECT, LinkHealth.HEALTHY]


def test_a_link_that_goes_down_fails_and_a_new_cable_starts_afresh_naming_the_one_it_replaced(ledger, clock):
    name = LinkName("ag1", "5")
    ledger.record("ag1", [port(0)], T0)
    ledger.record("ag1", [port(3, up=False)], T0 + 60)
    assert ledger.detail(name).state.health is LinkHealth.FAILED
    ledger.record("ag1", [port(0, serial="C-2")], T0 + 120)
    detail = ledger.detail(name)
    assert detail.state.health is LinkHealth.HEALTHY and detail.state.cable is not None and detail.state.cable.serial == "C-2"
    assert [(c.identity.serial, c.replaced) for c in detail.cables] == [("C-1", ""), ("C-2", "C-1")]
    assert [e.reason for e in detail.events] == ["it is down: it stopped training", "cable C-2 replaced cable C-1",
                                                 "its errors or recoveries grew in 0 of its last 5 windows of 1m"]


def test_a_cable_that_gives_no_serial_is_one_cable_whose_trend_is_judged_like_any_other(ledger, clock):
    name = LinkName("ag1", "5")
    for minute, corrected in enumerate([0, 2, 4, 6, 8]):  # growth in four of the last five minutes
        clock.now = T0 + 60 * minute + 1
        ledger.record("ag1", [port(corrected, serial="")], clock.now)
    detail = ledger.detail(name)
    assert detail.state.health is LinkHealth.SUSPECT and detail.cables == [] and len(detail.history.samples) == 5
    assert [e.health for e in detail.events] == [LinkHealth.SUSPECT]  # no cable "replaced" at each reading


def judged(verdict: CableVerdict, *lines: str) -> CableResult:
    """A cluster test's verdict on the IPU-Link cable from ag3:5 to ag4:1."""
    return CableResult(Cable(Port("ag3", LinkKind.IPULINK, 5), Port("ag4", LinkKind.IPULINK, 1)), verdict, lines)


def test_a_cluster_test_fails_both_ends_of_a_cable_and_a_later_pass_clears_them(ledger, clock):
    ledger.record("ag3", [port(0)], T0)
    failed = ledger.record_test("cluster", [judged(CableVerdict.FAILED, "ag3:5 - ag4:1: 412 corrected errors"),
                                            CableResult(Cable(Port("ag3", LinkKind.SYNC, 6), Port("ag4", LinkKind.SYNC, 2)),
                                                        CableVerdict.UNTESTED, ())])
    assert {(str(e.name), e.health) for e in failed} == {("ag3:5", LinkHealth.FAILED), ("ag4:1", LinkHealth.FAILED)}
    state = ledger.detail(LinkName("ag3", "5")).state
    assert state.reason == "failed the cluster test: ag3:5 - ag4:1: 412 corrected errors"
    clock.now = T0 + 30
    ledger.record("ag3", [port(0)], clock.now)
    assert ledger.detail(LinkName("ag3", "5")).state.health is LinkHealth.FAILED  # a quiet reading does not clear a test's failure
    ledger.record("ag4", [LinkReading("1", 0, 0, True, CableIdentity("C-1"))], clock.now)
    assert ledger.detail(LinkName("ag4", "1")).state.health is LinkHealth.FAILED  # nor does the first reading of the other end
    assert ledger.record_test("cluster", [judged(CableVerdict.FAILED, "ag3:5 - ag4:1: 412 corrected errors")]) == []
    cleared = ledger.record_test("cluster", [judged(CableVerdict.PASSED)])
    assert {e.health for e in cleared} == {LinkHealth.HEALTHY}


def test_a_cluster_test_run_tells_the_ledger_what_it_found(pod):
    rack = load_rack(pod.rack_path)
    faults.break_link(rack, "m03", "5")
    save_rack(rack, pod.rack_path)
    pod.clustertests.start("cl0", {Step.CABLING, Step.IPULINK}, wait=True)
    failed = pod.services.links.links(unhealthy=True)
    assert {str(s.name) for s in failed} >= {"ag3:5", "ag4:1"}, failed


def test_compaction_shrinks_old_history_keeping_its_growth(ledger, clock):
    name = LinkName("ag1", "5")
    for minute in range(0, 6 * 60, 5):  # six hours of readings every five minutes, one error each
        ledger.record("ag1", [port(minute // 5)], T0 + minute * 60)
    clock.now = T0 + 6 * HOUR
    before = ledger.detail(name).history
    assert ledger.compact() == 1
    after = ledger.detail(name).history
    assert len(after.samples) < len(before.samples) and after.summaries
    assert after.samples[-1] == before.samples[-1]
    grown = sum(s.corrected_growth for s in after.summaries) + after.samples[-1].corrected - after.summaries[-1].last_corrected
    assert grown == before.samples[-1].corrected - before.samples[0].corrected
    assert ledger.compact() == 1 and ledger.detail(name).history == after  # done once


def test_a_swapped_cable_in_the_simulator_reaches_the_ledger_through_sampling(pod, ledger):
    ledger.sample_all()
    rack = load_rack(pod.rack_path)
    old = rack.plugged("m02", LinkKind.IPULINK, 5)[0].serial
    faults.swap_cable(rack, "m02", LinkKind.IPULINK, 5, "SPARE-9")
    save_rack(rack, pod.rack_path)
    ledger.sample_all()
    detail = ledger.detail(LinkName("ag2", "5"))
    assert [(c.identity.serial, c.replaced) for c in detail.cables] == [(old, ""), ("SPARE-9", old)]
    other_end = ledger.detail(LinkName("ag3", "1"))  # the same cable, seen from its other end
    assert [(c.identity.serial, c.replaced) for c in other_end.cables] == [(old, ""), ("SPARE-9", old)]


@pytest.mark.postgres
def test_the_ledger_keeps_and_compacts_its_history_on_postgresql(tmp_path, postgres_url):
    pod = Pod(tmp_path, store_url=postgres_url)
    clock = Clock()
    ledger = LinkLedger(pod.store, pod.gateway, POLICY, Retention(full_seconds=HOUR, hourly_seconds=2 * HOUR, days=400), clock)
    try:
        name = LinkName("ag1", "5")
        for minute, corrected in enumerate([0, 2, 2, 5, 9] + [9] * 200):
            ledger.record("ag1", [port(corrected, serial="PG-1")], T0 + 60 * minute)
        assert [e.health for e in ledger.detail(name).events] == [LinkHealth.SUSPECT, LinkHealth.HEALTHY]
        clock.now = T0 + 205 * 60
        ledger.compact()
        history = ledger.detail(name).history
        assert history.summaries and sum(s.corrected_growth for s in history.summaries) == 9
        assert ledger.detail(name).cables[0].identity.serial == "PG-1"
    finally:
        ledger.close()
        pod.close()


# Automatic remediation and the breaker

@pytest.fixture
def remediation(pod):
    ledger = LinkLedger(pod.store, pod.gateway, POLICY, tell=pod.owners.links_changed)
    made = LinkRemediation(pod.store, pod.gateway, ledger, RemediationPolicy(attempts=3, settle_seconds=0.0))
    yield made
    made.close()
    ledger.close()


def test_a_link_failed_in_the_simulator_is_reset_and_re_tested_and_the_fourth_attempt_in_a_week_is_refused(pod, remediation):
    rack = load_rack(pod.rack_path)
    faults.degrade(rack, "m01", "5", "steady", 60, since=time.time() - 60, fails_after=30)  # down since 30 s
    save_rack(rack, pod.rack_path)
    name = LinkName("ag1", "5")
    remediation.ledger.sample_all()
    assert remediation.ledger.detail(name).state.quarantined  # the first machine with a quarantined link: the breaker lets it be
    outcomes = [remediation.remediate(name) for _ in range(3)]
    assert outcomes == ["reset and re-tested: up again, healthy"] * 3  # retrained: up for 30 s more
    assert remediation.ledger.detail(name).state.health is LinkHealth.HEALTHY
    refused = remediation.remediate(name)
    assert refused == "automatic remediation refused: link ag1:5 had 3 attempts in the last 7d (at most 3)"
    assert remediation.remediate(LinkName("ag1", "6")).startswith("automatic remediation refused: machine ag1 had 3 attempts")
    events = [e.reason for e in remediation.ledger.detail(name).events]
    assert events[-1] == f"{refused}; it stays failed for a person to see to"
    assert events.count("automatic remediation: reset and re-tested: up again, healthy") == 3
    with pod.store.reading() as tx:
        assert tx.attempt_counts() == {"attempted": 3, "refused": 2}


def test_a_broken_link_stays_down_after_its_reset_and_stays_quarantined(pod, remediation):
    rack = load_rack(pod.rack_path)
    faults.break_link(rack, "m02", "5")
    save_rack(rack, pod.rack_path)
    remediation.ledger.sample_all()
    assert remediation.remediate(LinkName("ag2", "5")) == "reset and re-tested: still down, quarantined"


def test_the_breaker_keeps_a_second_machines_failed_link_out_of_quarantine_and_lets_go_when_the_first_recovers(pod, remediation):
    ledger = remediation.ledger
    ledger.record("ag1", [port(0, up=False)], time.time())
    assert ledger.detail(LinkName("ag1", "5")).state.quarantined
    ledger.record("ag3", [port(0, up=False)], time.time())  # 2 of the 8 machines of a1: over 20 %
    held = ledger.detail(LinkName("ag3", "5"))
    assert not held.state.quarantined and held.state.breaker.startswith("the breaker holds: quarantining ag3:5 would leave 2 of the 8")
    assert held.events[-1].reason == f"not quarantined: {held.state.breaker}"
    # The owner steps around the held link as a suspect one, and still places on it when nothing else fits.
    owner = pod.owners.owner("a1")
    assert owner is not None and set(owner.snapshot.links.failed) == {LinkName("ag1", "5")}
    assert LinkName("ag3", "5") in owner.snapshot.links.suspect

    ledger.record("ag1", [port(0)], time.time())  # the first comes back: the second is quarantined at its next reading
    ledger.record("ag3", [port(0, up=False)], time.time())
    assert ledger.detail(LinkName("ag3", "5")).state.quarantined
    assert set(owner.snapshot.links.failed) == {LinkName("ag3", "5")}
