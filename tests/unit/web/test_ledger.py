"""A link's history as the dashboard charts it: running totals of growth, across counter resets,
placed in the chart's box, and an empty history said to be empty."""

from __future__ import annotations

from vipu.api.protos import admin_pb2
from vipu.web import ledger

AT = 1_795_000_000.0


def sample(seconds: float, corrected: int, recoveries: int = 0, up: bool = True) -> admin_pb2.LinkSample:
    return admin_pb2.LinkSample(at=AT + seconds, corrected_errors=corrected, recovery_events=recoveries, up=up)


def test_readings_are_running_totals_of_their_growth_across_a_reset_of_the_machine():
    link = admin_pb2.Link(samples=[sample(0, 100, 3), sample(60, 140, 3), sample(120, 5, 0, up=False), sample(180, 25, 1)])
    points = ledger.grown(link)
    # 100 and 3 grew before the first reading kept: nothing to count them from; 5 after the reset all grew since it
    assert [(p.corrected, p.recoveries, p.down) for p in points] == [(0, 0, False), (40, 0, False), (45, 0, True), (65, 1, False)]


def test_summaries_come_first_each_at_its_end_then_the_readings_counting_on_from_their_total():
    link = admin_pb2.Link(summaries=[admin_pb2.LinkSummary(start=AT - 7200, end=AT - 3601, corrected_growth=12, recovery_growth=1, down=2),
                                     admin_pb2.LinkSummary(start=AT - 3600, end=AT - 1, corrected_growth=3)],
                          samples=[sample(0, 500), sample(60, 530)])
    points = ledger.grown(link)
    assert [(p.at - AT, p.corrected, p.recoveries, p.down) for p in points] == [
        (-3601, 12, 1, True), (-1, 15, 1, False), (0, 15, 1, False), (60, 45, 1, False)]


def test_the_points_scale_into_the_box_oldest_at_the_left_newest_at_the_right_the_total_under_a_round_top():
    link = admin_pb2.Link(samples=[sample(0, 0), sample(10, 30), sample(15, 30, up=False), sample(40, 87)])
    corrected, recoveries = ledger.charts(ledger.grown(link))
    assert (corrected.title, recoveries.title) == ("Corrected errors grown", "Recoveries grown")
    assert corrected.total == 87 and corrected.top == 100
    xs, ys = [x for x, _ in corrected.points], [y for _, y in corrected.points]
    assert xs == sorted(xs) and xs[0] == corrected.left and xs[-1] == corrected.right
    assert xs[1] == corrected.left + (corrected.right - corrected.left) / 4  # 10 s of 40: time is to scale
    assert ys[0] == corrected.bottom and all(corrected.plot_top <= y <= corrected.bottom for y in ys)
    assert ys[-1] == round(corrected.bottom - (corrected.bottom - corrected.plot_top) * 87 / 100, 1)
    assert corrected.down == (xs[2],)  # the reading that found it down, marked where it is
    assert corrected.polyline == " ".join(f"{x:g},{y:g}" for x, y in corrected.points) and len(corrected.polyline.split()) == 4
    assert recoveries.total == 0 and recoveries.top == 1 and {y for _, y in recoveries.points} == {recoveries.bottom}  # flat at 0
    assert corrected.start == "2026-11-18 11:06:40 UTC" and corrected.end == "2026-11-18 11:07:20 UTC"
    assert corrected.caption == "87 in all from 2026-11-18 11:06:40 UTC to 2026-11-18 11:07:20 UTC, over 4 points"


def test_a_single_reading_sits_at_the_left_on_the_zero_line():
    (corrected, _) = ledger.charts(ledger.grown(admin_pb2.Link(samples=[sample(0, 7)])))
    assert corrected.points == ((corrected.left, corrected.bottom),) and corrected.total == 0


def test_an_empty_history_draws_nothing_and_says_so():
    for chart in ledger.charts(ledger.grown(admin_pb2.Link())):
        assert chart.points == () and chart.polyline == ""
        assert chart.caption == "The ledger kept no readings of this link in this span: nothing to draw."


def test_a_cable_ends_line_says_its_health_trend_and_last_reading_or_that_it_was_never_read():
    link = admin_pb2.Link(name="ag1:5", health="suspect", reason="its errors or recoveries grew in 3 of its last 6 windows of 1h",
                          changed_at=AT, last=sample(5, 420, 2))
    assert ledger.described("ag1:5", link) == (
        "link ledger: ag1:5 suspect: its errors or recoveries grew in 3 of its last 6 windows of 1h, since 2026-11-18 11:06:40 UTC; "
        "last reading 420 corrected errors, 2 recoveries, up, at 2026-11-18 11:06:45 UTC")
    failed_by_a_test = admin_pb2.Link(name="ag1:5", health="failed", reason="failed the Cabling test: ...", changed_at=AT)
    assert ledger.described("ag1:5", failed_by_a_test) == \
        "link ledger: ag1:5 failed: failed the Cabling test: ..., since 2026-11-18 11:06:40 UTC"  # no reading: none to tell
    assert ledger.described("ag1:6", None) == "link ledger: ag1:6 not read yet"


def test_the_cable_replaced_is_the_one_named_by_the_record_of_the_cable_in_the_port_now():
    cables = [admin_pb2.LinkCable(serial="A"), admin_pb2.LinkCable(serial="B", replaced="A")]
    assert ledger.replaced(admin_pb2.Link(cable=admin_pb2.LinkCable(serial="B"), cables=cables)) == "A"
    assert ledger.replaced(admin_pb2.Link(cable=admin_pb2.LinkCable(serial="A"), cables=cables[:1])) == ""  # the first one seen there
    assert ledger.replaced(admin_pb2.Link()) == ""  # inside a machine: no cable
