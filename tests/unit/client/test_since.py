"""`since` for the link ledger's calls as a person gives it: a time ago, a date and time, or
nothing; anything else refused in one line."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone

import pytest

from vipu.client import InvalidArgument
from vipu.client.admin import since_time

NOW = 1_795_000_000.0


@pytest.mark.parametrize(("given", "ago"), [("30s", 30), ("30m", 1800), ("12h", 43200), ("7d", 604800), ("1.5h", 5400)])
def test_a_time_ago_counts_back_from_now(given, ago):
    assert since_time(given, NOW) == NOW - ago


def test_a_date_and_time_is_utc_unless_it_names_its_zone():
    assert since_time("2026-11-01", NOW) == datetime(2026, 11, 1, tzinfo=UTC).timestamp()
    assert since_time("2026-11-01T08:00", NOW) == datetime(2026, 11, 1, 8, tzinfo=UTC).timestamp()
    assert since_time("2026-11-01T08:00+01:00", NOW) == datetime(2026, 11, 1, 8, tzinfo=timezone(timedelta(hours=1))).timestamp()


def test_nothing_given_is_no_limit():
    assert since_time("", NOW) == 0.0


@pytest.mark.parametrize("given", ["yesterday-ish", "7 d", "d", "-7d", "7w"])
def test_anything_else_is_refused_in_one_line(given):
    with pytest.raises(InvalidArgument) as refused:
        since_time(given, NOW)
    assert refused.value.message == f"{given!r} is neither a time ago (30m, 12h, 7d) nor a date and time (2026-11-01T08:00)"
