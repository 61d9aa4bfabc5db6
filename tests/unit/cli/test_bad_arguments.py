"""Bad input at the command line (hypothesis): any arguments to `vipu` and `vipu-admin` end in their
output, a one-line failure (status 1) or a one-line usage error (status 2), never a traceback.
The end-point is a closed port, so commands that parse fail fast as `unreachable`."""

from __future__ import annotations

import io
import sys
import time
from contextlib import redirect_stderr, redirect_stdout

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from vipu.cli import admin, user
from vipu.cli.common import exit_status

WORDS = st.one_of(
    st.sampled_from(["create", "remove", "get", "list", "reset", "partition", "partitions", "agent", "agents", "cluster",
                     "allocation", "user", "--size", "--num-gcds", "--cluster", "--agents", "--json", "--force", "-H",
                     "--api-port", "--sync-type", "--topology", "torus", "4", "0", "-1", "3", "p1", "x" * 70, "--", "-"]),
    st.text(max_size=12))  # surrogates too: the bytes of an argument that is not UTF-8


def invoke(group, prog: str, arguments: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    argv = sys.argv
    sys.argv = [prog, "--api-host", "127.0.0.1", "--api-port", "1", "--api-timeout", "2", *arguments]
    try:
        with redirect_stdout(out), redirect_stderr(err):
            code = exit_status(group, prog)
    finally:
        sys.argv = argv
    return code, out.getvalue(), err.getvalue()


@pytest.mark.parametrize("group, prog", [(user.cli, "vipu"), (admin.cli, "vipu-admin")])
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(arguments=st.lists(WORDS, max_size=7))
def test_any_arguments_end_in_one_line_or_output(group, prog, arguments):
    code, out, err = invoke(group, prog, arguments)
    assert "Traceback" not in err and "Traceback" not in out
    if code in (1, 2):
        assert len(err.strip().splitlines()) == 1, err
    else:
        assert code == 0, (code, err)


NOT_UTF8 = b"p\xff".decode("utf-8", "surrogateescape")  # how Python hands over an argument that is not UTF-8


@pytest.mark.parametrize("group, prog, arguments", [
    (user.cli, "vipu", ["create", "partition", NOT_UTF8, "--size", "1"]),
    (user.cli, "vipu", ["reset", "partition", NOT_UTF8]),
    (user.cli, "vipu", ["remove", "partition", NOT_UTF8]),
    (admin.cli, "vipu-admin", ["get", "agent", NOT_UTF8]),
    (user.cli, "vipu", ["get", "partition", "p1", "--ipu-configs", "--gcd", str(2**32)]),
    (user.cli, "vipu", ["--config", "/dev/zero", "list", "partitions"]),
    (admin.cli, "vipu-admin", ["--config", "/dev", "list", "agents"]),
])
def test_odd_arguments_end_in_one_line_within_a_second(group, prog, arguments):
    began = time.monotonic()
    code, out, err = invoke(group, prog, arguments)
    assert time.monotonic() - began < 1.0
    assert code in (1, 2), (code, out, err)
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err, err
