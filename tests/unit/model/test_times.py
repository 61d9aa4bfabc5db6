"""Times and durations as vipu writes them for people (`vipu.model.times`): one rule each, which
the controller's reasons, the CLI and the dashboard all use."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from vipu.model.times import age_text, duration_text, expected_end, parse_duration, stamp_seconds, utc_text


@pytest.mark.parametrize("text, seconds", [
    ("90s", 90), ("30m", 1800), ("2h", 7200), ("1d", 86400), ("1h30m", 5400), ("2H", 7200), (" 45m ", 2700),
    ("1d2h3m4s", 93784), ("4294967295s", 2**32 - 1),
])
def test_a_duration_is_read_in_seconds_and_written_back_alike(text, seconds):
    assert parse_duration(text) == seconds
    assert parse_duration(duration_text(seconds)) == seconds


def test_a_duration_is_written_in_its_largest_units():
    assert [duration_text(s) for s in (1, 90, 3600, 5400, 86400 + 1)] == ["1s", "1m30s", "1h", "1h30m", "1d1s"]


@pytest.mark.parametrize("text, why", [
    ("2", "is not a duration: write it as 90s, 30m, 2h or 1d"), ("1.5h", "is not a duration"), ("-1h", "is not a duration"),
    ("h", "is not a duration"), ("", "is not a duration"), ("2 h", "is not a duration"), ("1w", "is not a duration"),
    ("1" * 50 + "s", "is not a duration"), ("0s", "is no time"), ("0h0m", "is no time"),
    ("4294967296s", "is too long: a duration is 1 s to 4294967295 s"),
])
def test_a_bad_duration_says_why_in_a_line(text, why):
    with pytest.raises(ValueError, match=why):
        parse_duration(text)


def test_a_fraction_of_a_second_is_written_as_it_is_and_a_duration_of_floats_as_whole_seconds():
    assert [duration_text(s) for s in (0.5, 1.0, 2.25, 3600.0, 5400.4)] == ["0.5s", "1s", "2.25s", "1h", "1h30m"]


def test_an_age_is_its_largest_whole_unit():
    assert [age_text(s) for s in (-3, 0, 59, 61, 3 * 3600 + 40 * 60, 2 * 86400 + 5)] == ["0s", "0s", "59s", "1m", "3h", "2d"]


def test_a_moment_is_utc_to_the_second_whatever_it_is_given_as():
    moment = datetime(2026, 12, 6, 5, 30, 7, 900_000, tzinfo=UTC)
    assert utc_text(moment) == utc_text(moment.timestamp()) == utc_text(moment.replace(tzinfo=None)) == "2026-12-06 05:30:07 UTC"
    assert utc_text(moment.astimezone(timezone(timedelta(hours=2)))) == "2026-12-06 05:30:07 UTC"
    assert utc_text(moment, labelled=False) == "2026-12-06 05:30:07"
    assert utc_text(None) == utc_text(0) == "-"


def test_work_is_expected_to_end_its_expected_duration_after_its_start():
    started = datetime(2026, 12, 6, 5, 0, tzinfo=UTC)
    assert expected_end(started, 5400) == datetime(2026, 12, 6, 6, 30, tzinfo=UTC)
    assert expected_end(started, 0) is None and expected_end(None, 5400) is None


def test_a_machines_stamp_is_read_in_utc_unless_it_names_its_zone():
    assert stamp_seconds("2026-12-07T10:00:00Z") == stamp_seconds("2026-12-07T10:00:00") == 1796637600.0
    assert stamp_seconds("2026-12-07T11:00:00+01:00") == 1796637600.0
    assert stamp_seconds("flooding") is None
