"""Free loopback ports for the processes the tests start.

They are taken below the kernel's ephemeral range, which it hands out as the local end of every
outgoing connection on the machine: a port from that range, free when probed, could be taken by
some connection before the server it was meant for binds it (a pod of 1,024 machines binds its
ports over many seconds, while other processes connect). Each session starts at a random place in
the range below, so that sessions running side by side rarely probe the same ports; the workers
of one run (pytest-xdist, as scripts/test runs the suite) each take a share of their own, so they
never do. The ports the README's walk-throughs use as written are never handed out, as those
walk-throughs may run meanwhile (test_readme.py).
"""

from __future__ import annotations

import os
import random
import socket
from pathlib import Path

EPHEMERAL_RANGE = Path("/proc/sys/net/ipv4/ip_local_port_range")
SPAN = 12_000
# vipu-server's and vipu-vpod's default ports, and the simulated pods' from their default base
# ports (18101, and 18301 for the vPOD walk-through): agents, IPUoF, RDMA and exporters.
WALKTHROUGH_PORTS = frozenset({*range(8090, 8096), *range(9100, 9103),
                               *(port for offset in (0, 2000, 4000, 6000) for port in range(18101 + offset, 18401 + offset))})

_handed_out: set[int] = set()


def _below_ephemeral() -> range:
    try:
        low = int(EPHEMERAL_RANGE.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    return range(max(1024, low - SPAN), low)


def _share(ports: range) -> range:
    """This pytest-xdist worker's share of the ports (all of them outside xdist)."""
    workers = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
    size = len(ports) // workers
    return range(ports.start + worker * size, ports.start + (worker + 1) * size)


_PORTS = _share(_below_ephemeral())
_next = random.randrange(len(_PORTS))


def free_port() -> int:
    """A loopback port nothing listens on now and that this session has not handed out before."""
    global _next
    for _ in range(len(_PORTS)):
        port = _PORTS[_next % len(_PORTS)]
        _next += 1
        if port in _handed_out or port in WALKTHROUGH_PORTS:
            continue
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
        _handed_out.add(port)
        return port
    raise RuntimeError(f"no free loopback port left in {_PORTS.start}-{_PORTS.stop - 1}")


SIM_OFFSETS = (0, 2000, 4000, 6000)  # a simulated pod's agents, IPUoF, RDMA and exporters, from its base port
RUN_BASES = range(10_000, 12_000)  # so its ports lie below free_port's (and the walk-throughs' 18101 and up)


def free_run(count: int) -> int:
    """A base port for `vipu-server --sim COUNT --sim-base-port`: `count` free ports from it and
    from each of SIM_OFFSETS above it. Every worker takes its bases from a share of RUN_BASES, so
    that no two workers' runs meet at any offset."""
    bases = _share(RUN_BASES)
    for _ in range(100):
        base = random.randrange(bases.start, bases.stop - count)
        ports = [port + offset for offset in SIM_OFFSETS for port in range(base, base + count)]
        if _handed_out.intersection(ports):
            continue
        try:
            for port in ports:
                with socket.socket() as probe:
                    probe.bind(("127.0.0.1", port))
        except OSError:
            continue
        _handed_out.update(ports)
        return base
    raise RuntimeError(f"no run of {count} free ports from {bases.start}-{bases.stop - 1}")
