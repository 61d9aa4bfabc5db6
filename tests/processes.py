"""Children of the tests that do not outlive them."""

from __future__ import annotations

import ctypes
import signal

PR_SET_PDEATHSIG = 1  # prctl(2)


def die_with_parent() -> None:
    """As a child's preexec_fn: be terminated when the test process dies, even if it is killed."""
    ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
