"""A link's health from its counters' history: names, the k-of-N trend, and compaction that keeps
every bit of growth within what it keeps."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vipu.model.errors import InvalidArgument
from vipu.model.linkhealth import (
    DAY,
    HOUR,
    Attempt,
    History,
    LinkEvent,
    LinkFaults,
    LinkHealth,
    LinkName,
    LinkState,
    Reliability,
    RemediationPolicy,
    Retention,
    Sample,
    TrendPolicy,
    attempts_refusal,
    breaker_holds,
    compact,
    growth_windows,
    judge,
    reliability,
)
from vipu.model.topology import LinkKind

NOW = 1_800_000_000.0  # a whole day in epoch seconds is not needed: buckets are found, not assumed


@pytest.mark.parametrize("text, kind, port", [("ag3:5", LinkKind.IPULINK, 5), ("ag3:sync2", LinkKind.SYNC, 2),
                                              ("ag3:gw1", LinkKind.GWLINK, 1), ("ag3:ipu1:4C", None, None)])
def test_a_link_name_reads_back_as_written(text, kind, port):
    name = LinkName.parse(text)
    assert (str(name), name.kind, name.port) == (text, kind, port)


def test_a_port_names_its_link_by_kind():
    assert str(LinkName.of_port("ag2", LinkKind.SYNC, 7)) == "ag2:sync7"
    assert LinkName.parse(str(LinkName.of_port("ag2", LinkKind.GWLINK, 2))) == LinkName("ag2", "gw2")


@pytest.mark.parametrize("text, said", [("ag3", "names no link"), (":5", "names no link"), ("ag3:9", "numbered 1 to 8, not 9"),
                                        ("ag3:gw3", "numbered 1 to 2, not 3"), ("ag3:ipu3:1A", "not a link inside"),
                                        ("ag3:port5", "names no link")])
def test_a_name_that_is_no_link_is_refused_saying_why(text, said):
    with pytest.raises(InvalidArgument, match=said):
        LinkName.parse(text)


def readings(growth_by_window: list[int], policy: TrendPolicy) -> list[Sample]:
    """Two readings in each window (oldest window first), the counters growing by the given amount between them."""
    samples, corrected = [], 0
    for index, grows in enumerate(growth_by_window):
        start = NOW - (len(growth_by_window) - index) * policy.window_seconds
        samples.append(Sample(start + 1, corrected, 0, True))
        corrected += grows
        samples.append(Sample(start + policy.window_seconds / 2, corrected, 0, True))
    return samples


@given(st.lists(st.integers(0, 5), min_size=6, max_size=6), st.integers(1, 6))
def test_a_link_is_suspect_exactly_when_k_of_its_last_n_windows_grew(growth, k):
    policy = TrendPolicy(HOUR, 6, k)
    grew = sum(1 for g in growth if g)
    verdict = judge(readings(growth, policy), policy, NOW)
    assert verdict.health is (LinkHealth.SUSPECT if grew >= k else LinkHealth.HEALTHY)
    assert f"grew in {grew} of its last 6 windows of 1h" in verdict.reason


def test_one_burst_is_not_a_trend_but_growth_window_after_window_is():
    policy = TrendPolicy(HOUR, 6, 3)
    assert judge(readings([0, 0, 0, 0, 0, 5000], policy), policy, NOW).health is LinkHealth.HEALTHY
    assert judge(readings([1, 0, 2, 0, 3, 0], policy), policy, NOW).health is LinkHealth.SUSPECT


def test_growth_outside_the_last_n_windows_is_forgotten():
    policy = TrendPolicy(HOUR, 3, 2)
    assert growth_windows(readings([9, 9, 9, 0, 0, 0], policy), policy, NOW) == [False, False, False]


def test_a_reset_counter_counts_what_it_reads_as_new_growth():
    policy = TrendPolicy(HOUR, 2, 1)
    samples = [Sample(NOW - 5000, 900, 4, True), Sample(NOW - 100, 3, 0, True)]  # the machine was reset between them
    assert growth_windows(samples, policy, NOW) == [True, False]


def test_a_link_that_is_down_or_failed_by_a_test_is_failed_whatever_its_trend():
    policy = TrendPolicy()
    quiet = [Sample(NOW - 60, 0, 0, True)]
    assert judge(quiet, policy, NOW, test_failure="Traffic test: 412 corrected errors").reason == "Traffic test: 412 corrected errors"
    assert judge([*quiet, Sample(NOW, 0, 0, False)], policy, NOW).health is LinkHealth.FAILED


def test_a_policy_that_cannot_be_met_is_refused():
    with pytest.raises(InvalidArgument, match="1 <= k <= N"):
        TrendPolicy(HOUR, 3, 4)
    with pytest.raises(InvalidArgument, match="no longer than"):
        Retention(full_seconds=DAY * 30, hourly_seconds=DAY)


samples_over_time = st.lists(st.tuples(st.floats(0, 500 * DAY), st.integers(0, 50), st.integers(0, 3), st.booleans()),
                             min_size=1, max_size=60)


def history_of(raw) -> History:
    """Counters that grow, with now and then a reset to a small value."""
    samples, corrected, recoveries = [], 0, 0
    for age, grows, reset, up in sorted(raw, key=lambda r: -r[0]):
        corrected, recoveries = (grows, 0) if reset == 3 else (corrected + grows, recoveries + reset)
        samples.append(Sample(NOW - age, corrected, recoveries, up))
    return History((), tuple(samples))


def total_growth(history: History) -> tuple[int, int]:
    """Growth in the summaries, then from the last summary's end through the samples."""
    corrected = sum(s.corrected_growth for s in history.summaries)
    recoveries = sum(s.recovery_growth for s in history.summaries)
    last = (history.summaries[-1].last_corrected, history.summaries[-1].last_recoveries) if history.summaries else None
    for sample in history.samples:
        if last is not None:
            corrected += sample.corrected - last[0] if sample.corrected >= last[0] else sample.corrected
            recoveries += sample.recoveries - last[1] if sample.recoveries >= last[1] else sample.recoveries
        last = (sample.corrected, sample.recoveries)
    return corrected, recoveries


@settings(max_examples=200)
@given(samples_over_time)
def test_compaction_keeps_all_growth_every_reading_and_is_done_once(raw):
    history = history_of(raw)
    retention = Retention(days=10_000)  # nothing dropped: everything must be accounted for
    compacted = compact(history, NOW, retention)
    assert total_growth(compacted) == total_growth(history)
    assert sum(s.samples for s in compacted.summaries) + len(compacted.samples) == len(history.samples)
    assert sum(s.down for s in compacted.summaries) + sum(not s.up for s in compacted.samples) == sum(not s.up for s in history.samples)
    assert compact(compacted, NOW, retention) == compacted
    assert all(NOW - s.at < retention.full_seconds + HOUR for s in compacted.samples)  # older ones summarised
    starts = [s.start for s in compacted.summaries]
    assert starts == sorted(starts) and len(set(starts)) == len(starts)


@given(samples_over_time)
def test_compaction_drops_what_is_older_than_the_history_and_keeps_the_rest(raw):
    history = history_of(raw)
    compacted = compact(history, NOW, Retention(days=400))
    assert all(NOW - s.end <= 400 * DAY for s in compacted.summaries)
    kept = sum(s.samples for s in compacted.summaries) + len(compacted.samples)
    assert kept >= sum(1 for s in history.samples if NOW - s.at < 399 * DAY)


def test_400_days_of_samples_every_5_minutes_compact_to_a_week_of_them_and_some_thousand_summaries():
    samples = tuple(Sample(NOW - age, int(400 * DAY - age) // 600, 0, True) for age in range(int(400 * DAY) - 300, -1, -300))
    compacted = compact(History((), samples), NOW)
    assert len(compacted.samples) <= (7 * DAY + HOUR) / 300
    assert len(compacted.summaries) <= 90 * 24 + 24 + 310 + 2
    assert total_growth(compacted)[0] == samples[-1].corrected - samples[0].corrected


# Remediation's caps, the breaker, and reliability

def attempt(name: str, at: float, outcome: str = "reset and re-tested: up again, healthy") -> Attempt:
    return Attempt(LinkName.parse(name), at, outcome)


def test_a_fourth_attempt_within_the_window_is_refused_for_the_link_and_for_its_machine():
    policy = RemediationPolicy(attempts=3)
    three = [attempt("ag1:5", NOW + n) for n in range(3)]
    assert attempts_refusal(LinkName.parse("ag1:5"), three, policy, NOW + 10) == \
        "automatic remediation refused: link ag1:5 had 3 attempts in the last 7d (at most 3)"
    assert attempts_refusal(LinkName.parse("ag1:6"), three, policy, NOW + 10) == \
        "automatic remediation refused: machine ag1 had 3 attempts in the last 7d (at most 3)"
    assert attempts_refusal(LinkName.parse("ag2:1"), three, policy, NOW + 10) == ""
    assert attempts_refusal(LinkName.parse("ag1:5"), three, policy, NOW + 7 * DAY + 1) == ""  # the window moved past them
    refused = [*three[:2], attempt("ag1:5", NOW + 3, "automatic remediation refused: ...")]
    assert attempts_refusal(LinkName.parse("ag1:5"), refused, policy, NOW + 10) == ""  # a refusal is no attempt


def test_the_breaker_holds_past_its_share_of_an_allocations_machines_but_always_lets_one_machine_be_quarantined():
    machines = [f"ag{n}" for n in range(1, 11)]
    policy = RemediationPolicy(breaker_share=0.2)
    assert breaker_holds(LinkName.parse("ag1:5"), "a1", machines[:4], set(), policy) == ""  # one of four: always allowed
    assert breaker_holds(LinkName.parse("ag2:5"), "a1", machines, {"ag1"}, policy) == ""  # 2 of 10: at the share
    held = breaker_holds(LinkName.parse("ag3:5"), "a1", machines, {"ag1", "ag2"}, policy)
    assert held == "the breaker holds: quarantining ag3:5 would leave 3 of the 10 machines of allocation a1 (30%) with a quarantined " \
                   "link, over 20%"
    assert breaker_holds(LinkName.parse("ag1:6"), "a1", machines, {"ag1", "ag2"}, policy) == ""  # its machine is counted already
    assert breaker_holds(LinkName.parse("ag3:5"), "a1", machines, {"ag1", "ag2", "ag11"}, policy) == held  # another allocation's


def test_a_failed_link_the_breaker_holds_is_stepped_around_not_quarantined():
    held = LinkState(LinkName.parse("ag3:5"), LinkHealth.FAILED, "it is down: it stopped training", NOW, breaker="the breaker holds: x")
    quarantined = LinkState(LinkName.parse("ag1:5"), LinkHealth.FAILED, "it is down: it stopped training", NOW)
    faults = LinkFaults.of([held, quarantined])
    assert list(faults.failed) == [quarantined.name] and quarantined.quarantined and not held.quarantined
    assert faults.suspect[held.name] == "failed (it is down: it stopped training), not quarantined: the breaker holds: x"


def event(name: str, at: float, health: LinkHealth) -> LinkEvent:
    return LinkEvent(LinkName.parse(name), at, health, "")


def test_mtbf_and_mttr_of_a_link_and_of_a_machine_whose_links_fail_together():
    failed, healthy = LinkHealth.FAILED, LinkHealth.HEALTHY
    link = [event("ag1:5", NOW + 100, failed), event("ag1:5", NOW + 110, healthy), event("ag1:5", NOW + 300, failed),
            event("ag1:5", NOW + 330, healthy)]
    found = reliability(link, NOW, NOW + 400)
    assert (found.failures, found.mttr_seconds, found.mtbf_seconds) == (2, 20.0, (400 - 40) / 2)
    overlapping = [*link, event("ag1:6", NOW + 105, failed), event("ag1:6", NOW + 120, healthy)]  # one span down: 100 to 120
    machine = reliability(overlapping, NOW, NOW + 400)
    assert (machine.failures, machine.mttr_seconds) == (2, (20.0 + 30.0) / 2)
    still_down = reliability([event("ag1:5", NOW + 100, failed)], NOW, NOW + 400)
    assert (still_down.failures, still_down.mttr_seconds, still_down.mtbf_seconds) == (1, 0.0, 100.0)
    assert reliability([], NOW, NOW + 400) == Reliability(0, 0.0, 0.0)
