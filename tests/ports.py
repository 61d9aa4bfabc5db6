"""Free loopback ports for the processes the tests start.

They are taken below the kernel's ephemeral range, which it hands out as the local end of every
outgoing connection on the machine: a port from that range, free when probed, could be taken by
some connection before the server it was meant for binds it (a pod of 1,024 machines binds its
ports over many seconds, while other processes connect). Each session starts at a random place in
the range below, so that sessions running side by side rarely probe the same ports.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
SPAN = 12_000

_handed_out: set[int] = set()


def _below_ephemeral() -> range:
    try:
        low = int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    return range(max(1024, low - SPAN), low)


_PORTS = _below_ephemeral()
_next = random.randrange(len(_PORTS))


def free_port() -> int:
    """A loopback port nothing listens on now and that this session has not handed out before."""
    global _next
    for _ in range(len(_PORTS)):
        port = _PORTS[_next % len(_PORTS)]
        _next += 1
        if port in _handed_out:
            continue
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise RuntimeError(f"no free loopback port left in {_PORTS.start}-{_PORTS.stop - 1}")


def free_run(count: int) -> int:
    """A base port for `vipu-server --sim COUNT --sim-base-port`: `count` free ports from it and
    from 6000 above it (agents and their exporters)."""
    for _ in range(100):
        base = random.randrange(30000, 40000)
        try:
            for port in [*range(base, base + count), *range(base + 6000, base + 6000 + count)]:
                with socket.socket() as probe:
                    probe.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
    raise RuntimeError("no run of free ports")
