"""Failpoints: named points of the controller's core and store where a test stalls or fails a step.

Off unless armed, and then a look at one dictionary per point reached. A test arms them in the
environment of the `vipu-server` it starts (read when it starts, as `VIPU_VPOD_CRASH_AT` is read
by the site orchestrator), or in its own process with `arm`:

    VIPU_FAILPOINTS='store.commit=delay(2.5);agent.apply=2*fail(agent gone)'

Each point takes one action, optionally limited to its first N hits (`N*action`):

- `delay(S)`: wait S seconds, then go on: a slow disk, a group commit held back, a slow agent;
- `fail(TEXT)`: raise `Unavailable(TEXT)` there: a refused commit, an agent that does not answer;
- `pause`: wait until the test `release`s the point (in-process only; at most PAUSE_SECONDS).

The points:

- `store.commit`: a write transaction about to commit (a turn's writes, a configuration change);
- `store.commit.answer`: a grouped write just committed, whose answer a `fail` loses on the way
  back, as a connection gone during COMMIT does (its writers are told the outcome is unknown);
- `store.partition.<transition>`: the store applying one life-cycle transition of a partition
  (`create`, `configured`, `fail`, `abandon`, `lost`, `reset`, `relocate`, `remove`, `removed`);
- `store.request.<transition>`: the same for a waiting request (`enqueue`, `grant`, `cancel`, `expire`);
- `agent.apply`, `agent.clear`, `agent.attachments`, `agent.fence`, `agent.power`: an owner's call
  to one agent, before it is sent;
- `owner.turn`: an allocation's owner starting a turn;
- `owner.read`: an allocation's owner being made, its read of the store done (a slow read, which
  another owner of the allocation may overtake);
- `clustertest.step`: a cluster test (an idle-time one too) about to start its next test;
- `server.exit`: a deposed `vipu-server` about to exit, its agent calls already on the way still
  going out meanwhile (as they may in the instant before any exit): what its agents must refuse.

`POINTS` lists them all: arming another name is refused, so a misspelt point cannot pass for one
that never fires, and a test checks that each is reached and armed by some test.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from dataclasses import dataclass, field

from vipu.model import lifecycle, queue
from vipu.model.errors import InvalidArgument, Unavailable

log = logging.getLogger(__name__)

VARIABLE = "VIPU_FAILPOINTS"
PAUSE_SECONDS = 60.0  # a paused point goes on by itself after this: no wait without a deadline
AGENT_CALLS = ("apply", "clear", "attachments", "fence", "power")  # what `agents.AgentCall.action` may be
POINTS: frozenset[str] = frozenset({
    "store.commit", "store.commit.answer", "owner.turn", "owner.read", "clustertest.step", "server.exit", "machine.telemetry",
    *(f"store.partition.{transition}" for transition in lifecycle.TRANSITIONS),
    *(f"store.request.{transition}" for transition in queue.TRANSITIONS),
    *(f"agent.{action}" for action in AGENT_CALLS),
})
_ACTION = re.compile(r"^(?:(\d+)\*)?(delay\(([0-9.]+)\)|fail\((.*)\)|pause)$")


@dataclass
class Failpoint:
    """One armed point: what it does, how often it may still do it, and who reached it."""

    name: str
    kind: str  # "delay", "fail" or "pause"
    seconds: float = 0.0
    text: str = ""
    remaining: int | None = None  # None: every time
    hits: int = 0
    reached: threading.Event = field(default_factory=threading.Event)
    released: threading.Event = field(default_factory=threading.Event)

    def act(self) -> None:
        self.hits += 1
        self.reached.set()
        if self.kind == "delay":
            time.sleep(self.seconds)
        elif self.kind == "pause":
            self.released.wait(PAUSE_SECONDS)
        else:
            raise Unavailable(self.text or f"failpoint {self.name}")


_armed: dict[str, Failpoint] = {}
_lock = threading.Lock()


def parse(spec: str) -> dict[str, Failpoint]:
    """The points a `VIPU_FAILPOINTS` value arms; InvalidArgument naming a part it cannot read."""
    points = {}
    for part in filter(None, (p.strip() for p in spec.split(";"))):
        name, _, action = part.partition("=")
        found = _ACTION.match(action.strip())
        if not name.strip() or found is None:
            raise InvalidArgument(f"{VARIABLE}: cannot read {part!r}: write NAME=delay(SECONDS), NAME=fail(TEXT) or NAME=pause, "
                                  "optionally N* before the action")
        if name.strip() not in POINTS:
            raise InvalidArgument(f"{VARIABLE}: there is no failpoint {name.strip()!r}; the points are {', '.join(sorted(POINTS))}")
        count, _, seconds, text = found.groups()
        kind = "delay" if seconds is not None else "fail" if text is not None else "pause"
        points[name.strip()] = Failpoint(name.strip(), kind, float(seconds or 0), text or "", int(count) if count else None)
    return points


def arm(name: str, action: str) -> Failpoint:
    """Arm one point in this process (`action` as in VIPU_FAILPOINTS); the point, to watch or release."""
    point = parse(f"{name}={action}")[name]
    with _lock:
        _armed[name] = point
    return point


def disarm(name: str | None = None) -> None:
    """Disarm one point, or every point; a paused one goes on."""
    with _lock:
        gone = [_armed.pop(name)] if name in _armed else [] if name else list(_armed.values())
        if name is None:
            _armed.clear()
    for point in gone:
        point.released.set()


def armed(prefix: str) -> bool:
    """Whether a point whose name starts with `prefix` is armed (such calls then take a thread of their own)."""
    return bool(_armed) and any(name.startswith(prefix) for name in _armed)


def hit(name: str) -> None:
    """A point is reached: act if it is armed."""
    if not _armed:
        return
    point = _armed.get(name)
    if point is None:
        return
    with _lock:
        if point.remaining is not None:
            if point.remaining <= 0:
                return
            point.remaining -= 1
    point.act()


def arm_from_environment() -> None:
    """Arm what VIPU_FAILPOINTS names (nothing when it is unset, as in every deployment)."""
    points = parse(os.environ.get(VARIABLE, ""))
    if points:
        log.warning("failpoints armed by %s, for tests only: %s", VARIABLE, ", ".join(sorted(points)))
    with _lock:
        _armed.update(points)
