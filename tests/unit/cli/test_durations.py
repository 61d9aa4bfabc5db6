"""`vipu`'s durations (--expected-duration) and `vipu update partition`'s choice, read before any
call: a bad one is a one-line usage error (status 2) that reaches no controller."""

from __future__ import annotations

import pytest

from tests.unit.cli.test_bad_arguments import invoke
from vipu.cli import user
from vipu.cli.user import duration_text, parse_duration


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


@pytest.mark.parametrize("arguments, why", [
    (["create", "partition", "p1", "--size", "4", "--expected-duration", "2"], "'2' is not a duration"),
    (["create", "partition", "p1", "--size", "4", "--expected-duration", "0m"], "'0m' is no time"),
    (["create", "partition", "p1", "--size", "4", "--expected-duration", "soon"], "'soon' is not a duration"),
    (["update", "partition", "p1"], "nothing to change: give --may-move or --no-may-move"),
    (["update", "partition"], "Missing argument"),
])
def test_bad_input_is_a_one_line_usage_error_before_any_call(arguments, why):
    code, out, err = invoke(user.cli, "vipu", arguments)
    assert (code, out) == (2, "")
    assert len(err.strip().splitlines()) == 1 and why in err and "Traceback" not in err, err


@pytest.mark.parametrize("arguments", [
    ["create", "partition", "p1", "--size", "4", "--may-move", "--expected-duration", "1h"],
    ["update", "partition", "p1", "--may-move"],
    ["update", "partition", "p1", "--no-may-move"],
])
def test_good_input_goes_on_to_the_controller(arguments):
    code, out, err = invoke(user.cli, "vipu", arguments)  # a closed port: it fails reaching it, having parsed
    assert (code, out) == (1, "") and len(err.strip().splitlines()) == 1 and "unreachable" in err, err
