"""Fault injection for the crash tests: the orchestrator SIGKILLs itself at a named point.

With VIPU_VPOD_CRASH_AT=<point> in its environment, `vipu-vpod serve` kills itself with SIGKILL
(nothing flushed, nothing cleaned up, as `kill -9` does) the first time it reaches that point, so
a test can stop it at each step of a creation or release, not at a moment a timer guesses. Unset,
as in every deployment, the points cost one look at the environment. The points (CRASH_POINTS):

- `create:<step>` and `release:<step>`: right after the store recorded that step
  (`vipu.vpod.orchestrator.CREATE_STEPS`, `RELEASE_STEPS`; `release:begun` once the vPOD is
  marked Releasing, `release:released` once its machines are free);
- `create:handing` and `release:taking-back`: in the middle of a step, once its first machine
  is handed to the tenant's controller, or taken back from it;
- `release:testing`: once the release's cluster test has started in the tenant's controller;
- `controller:launched`: once a tenant's controller process is started, before its process id is
  written down (on OpenStack: once its server is asked for, before it is ACTIVE);
- `openstack:network-made`: on OpenStack, once a vPOD's network, subnet, security group and port
  are made, before its controller's address is written down.
"""

from __future__ import annotations

import logging
import os
import signal

from vipu.model.errors import InvalidArgument

CRASH_AT_VARIABLE = "VIPU_VPOD_CRASH_AT"
CREATE_POINTS = ("create:reserved", "create:prepared", "controller:launched", "create:started", "create:handing", "create:handed",
                 "create:configured", "create:active")  # in the order a creation reaches them
RELEASE_POINTS = ("release:begun", "release:emptied", "release:testing", "release:tested", "release:taking-back",
                  "release:taken-back", "release:stopped", "release:archived", "release:released")
OPENSTACK_POINTS = ("openstack:network-made",)  # reached only with --provider openstack
CRASH_POINTS = CREATE_POINTS + RELEASE_POINTS + OPENSTACK_POINTS

log = logging.getLogger(__name__)


def crash_point(point: str) -> None:
    """Die here, at once, if the environment names this point."""
    if os.environ.get(CRASH_AT_VARIABLE) == point:
        log.warning("crash point %s reached: SIGKILL", point)
        os.kill(os.getpid(), signal.SIGKILL)


def check_setting() -> None:
    """Refuse, in one line, an environment naming a point that does not exist: a test asking
    for it would otherwise run without ever crashing."""
    point = os.environ.get(CRASH_AT_VARIABLE)
    if point is not None and point not in CRASH_POINTS:
        raise InvalidArgument(f"{CRASH_AT_VARIABLE}={point} names no crash point; the points are: {', '.join(CRASH_POINTS)}")
