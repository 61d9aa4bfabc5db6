"""Free loopback ports for the processes the tests start."""

from __future__ import annotations

import socket

_handed_out: set[int] = set()


def free_port() -> int:
    """A loopback port nothing listens on now and that this session has not handed out before."""
    while True:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        if port not in _handed_out:
            _handed_out.add(port)
            return port
