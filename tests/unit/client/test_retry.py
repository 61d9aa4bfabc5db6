"""The one retry policy: what is tried again now, later or never, over gRPC and over the proxy's HTTP."""

from __future__ import annotations

import itertools

import pytest

from vipu.client.retry import RetryPolicy, Verdict, http_status, verdict, verdict_of_http
from vipu.model import errors


@pytest.mark.parametrize("error, expected", [
    (errors.Unavailable("agent ag1: unreachable"), Verdict.AGAIN),
    (errors.Standby("standby", "h2:8090"), Verdict.AGAIN),
    (errors.ConcurrentUpdate("p1 changed meanwhile"), Verdict.AGAIN),
    (errors.Conflict("no room"), Verdict.LATER),
    (errors.AlreadyExists("p1 exists"), Verdict.LATER),
    (errors.InvalidArgument("size 3"), Verdict.NEVER),
    (errors.NotFound("no p1"), Verdict.NEVER),
    (errors.PermissionDenied("not yours"), Verdict.NEVER),
    (errors.Unauthenticated("who?"), Verdict.LATER),  # an administrator mends the credentials
    (errors.HardwareFailure("IPU 2 failed"), Verdict.NEVER),
    (errors.VipuError("internal error; the server log has the details"), Verdict.AGAIN),  # nothing says the request was wrong
])
def test_each_family_has_one_verdict_and_http_carries_it_unchanged(error, expected):
    assert verdict(error) is expected
    assert verdict_of_http(http_status(error)) is expected


def test_proxies_and_gateways_on_the_way_are_judged_temporary():
    assert [verdict_of_http(s) for s in (500, 502, 503, 504, 408, 429)] == [Verdict.AGAIN] * 6


def test_delays_double_up_to_the_longest_and_end_after_the_attempts():
    assert list(RetryPolicy(attempts=5, first_delay=0.1, longest_delay=0.5).delays()) == [0.1, 0.2, 0.4, 0.5]
    assert list(RetryPolicy(attempts=1).delays()) == []
    endless = RetryPolicy(attempts=None, first_delay=1, longest_delay=30).delays()
    assert list(itertools.islice(endless, 7)) == [1, 2, 4, 8, 16, 30, 30]
