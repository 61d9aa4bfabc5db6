"""`vipu`'s durations (--expected-duration, read as `vipu.model.times` reads them) and `vipu update
partition`'s choice, read before any call: a bad one is a one-line usage error (status 2) that
reaches no controller."""

from __future__ import annotations

import pytest

from tests.unit.cli.test_bad_arguments import invoke
from vipu.cli import user


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
