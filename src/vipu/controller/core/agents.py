"""The core's view of the agents, and how an owner's calls to them run outside it.

The core depends on the `AgentGateway` interface only; `vipu.controller.infrastructure.agentclient`
implements it over gRPC, and unit tests in memory. Every method raises the `vipu.model.errors`
families: `Unavailable` when the agent cannot be reached, `HardwareFailure` or `Conflict` when it
refuses.

An owner never waits for an agent in its turn: an operation's calls are made by the thread waiting
for its answer (`AgentCalls.run`), or by a bounded pool of threads when nobody waits (`start`), and
their outcomes come back to the owner as the operation's next step. Failpoints `agent.apply` and
`agent.clear` stall or fail a call there, never in a turn.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
import typing
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Protocol

from vipu import failpoints
from vipu.controller.core.lending import Cancellation
from vipu.model.clustertests import Observation, Probe
from vipu.model.configuration import AgentSettings
from vipu.model.entities import MachineInventory
from vipu.model.errors import Conflict, Unavailable, VipuError
from vipu.model.hardware import MachineCondition, PowerAction, PowerState
from vipu.model.linkhealth import LinkReading
from vipu.model.telemetry import WatchReport

log = logging.getLogger("vipu.controller.core")

POWER_SECONDS = 300.0  # how long a power action may take before it counts as failed (a real machine boots in minutes)
Outcomes = list[VipuError | None]  # each call's error, or None where it succeeded, in order


@dataclass(frozen=True)
class AgentCall:
    """One call an owner makes: apply `settings`, or clear partition `partition_id`, at an agent;
    or, with `fence_seconds`, fence that partition there for a move if no IPUoF client is attached
    (the call then fails, saying so, if one is); or, `checking`, only fail so if one is."""

    agent_id: str
    host: str
    port: int
    settings: AgentSettings | None = None  # None: a clear, a fence or a power action
    partition_id: str = ""
    fence_seconds: float = 0.0
    checking: bool = False  # whether IPUoF clients of `partition_id` are attached, fencing nothing
    power: PowerAction | None = None  # a power action on the agent's machine, waited for POWER_SECONDS at most

    @property
    def action(self) -> str:
        if self.power is not None:
            return "power"
        if self.fence_seconds:
            return "fence"
        if self.checking:
            return "attachments"
        return "clear" if self.settings is None else "apply"

    @property
    def about(self) -> str:
        """The partition whose settings at the agent it may change ("" for a power action)."""
        return self.settings.partition_id if self.settings is not None else self.partition_id


class AgentGateway(Protocol):
    def inventory(self, host: str, port: int) -> MachineInventory: ...

    def apply(self, host: str, port: int, settings: AgentSettings) -> None: ...

    def clear(self, host: str, port: int, partition_id: str) -> None: ...

    def apply_all(self, targets: Sequence[tuple[str, int, AgentSettings]]) -> Outcomes:
        """`apply` on several agents at once, (host, port, settings) each; each one's error, or
        None where it succeeded, in order."""
        ...

    def clear_all(self, targets: Sequence[tuple[str, int]], partition_id: str) -> Outcomes:
        """`clear` of one partition on several agents at once, (host, port) each; as `apply_all`."""
        ...

    def partitions(self, host: str, port: int) -> list[AgentSettings]: ...

    def diagnose(self, host: str, port: int, probe: Probe, ipus: dict[int, int], seed: int,
                 cancellation: Cancellation | None = None) -> Observation:
        """One cluster-test step at an agent; `cancellation` (an idle-time test's) may cancel the
        call, which then raises `Unavailable` at once."""
        ...

    def link_counters(self, host: str, port: int) -> tuple[list[LinkReading], float]:
        """Every link's counters and state, and when the agent read them (seconds since the epoch)."""
        ...

    def reset_link(self, host: str, port: int, place: str) -> None:
        """Retrain one link of the agent's machine."""
        ...

    def attachments(self, host: str, port: int, partition_ids: Sequence[str], fence_seconds: float = 0.0) -> dict[str, int]:
        """How many IPUoF clients are attached to each partition on the agent's machine (none named:
        every partition it holds). With `fence_seconds`, each named partition it holds with none
        attached is fenced in the same step: new attaches are refused until the fence lapses or the
        partition is cleared or applied there again (what a move of an idle partition needs).
        `InvalidArgument` for a fence over 3600 s or none named; `Unavailable` from an agent too old
        to tell."""
        ...

    def condition(self, host: str, port: int, after_event: int = 0) -> MachineCondition:
        """The machine's power and health now, and its health events after `after_event`."""
        ...

    def watch(self, host: str, port: int, after_line: int, most_lines: int, incarnation: str = "", timeout: float = 0.0) -> WatchReport:
        """The machine's telemetry as its agent last read it, and its log lines after `after_line`
        as that run of the agent (`incarnation`) numbered them; within `timeout` seconds (0: the
        agent timeout)."""
        ...

    def power(self, host: str, port: int, action: PowerAction, timeout: float) -> PowerState:
        """Power the machine on, off, reset or cycle it, and wait at most `timeout` seconds until it
        gets there; its power state then. `Unavailable` if it did not get there."""
        ...

    def claim(self, host: str, port: int, takeover_grant: str = "") -> str:
        """Hold the agent's machine, so that it obeys this controller only (on a TLS link); with a
        grant from the site's agent-link authority, take it from another controller. `PermissionDenied`
        when another holds it; the controller it was taken from, or ""."""
        ...

    def release(self, host: str, port: int) -> None:
        """Let go of the machine, for another controller to claim."""
        ...

    def forget(self, host: str, port: int) -> None:
        """Release whatever the gateway keeps for an agent that was removed."""


def _one(gateway: AgentGateway, call: AgentCall) -> VipuError | None:
    try:
        failpoints.hit(f"agent.{call.action}")
        if call.power is not None:
            gateway.power(call.host, call.port, call.power, POWER_SECONDS)
        elif call.fence_seconds or call.checking:
            attached = gateway.attachments(call.host, call.port, [call.partition_id], call.fence_seconds).get(call.partition_id, 0)
            if attached:
                return Conflict(f"partition {call.partition_id} has {attached} IPUoF client(s) attached at agent {call.agent_id}")
        elif call.settings is None:
            gateway.clear(call.host, call.port, call.partition_id)
        else:
            gateway.apply(call.host, call.port, call.settings)
    except VipuError as error:
        return error
    except Exception as error:  # a fault of ours, not the agent's: the operation must still hear an outcome
        log.exception("a call to agent %s failed", call.agent_id)
        return Unavailable(f"the call to agent {call.agent_id} failed: {type(error).__name__}")
    return None


class _Gathered:
    """The outcomes of calls that end in any order; `done` is called by the last to end."""

    def __init__(self, count: int, done: Callable[[Outcomes], None]):
        self._outcomes: Outcomes = [None] * count
        self._left = count
        self._lock = threading.Lock()
        self._done = done

    def add(self, position: int, outcome: VipuError | None) -> None:
        with self._lock:
            self._outcomes[position] = outcome
            self._left -= 1
            last = self._left == 0
        if last:
            self._done(self._outcomes)


class CallEnds:
    """When the owner learnt that its latest call about each partition at each agent ended, and
    that each agent last answered one: what a health pass read at an agent before then may predate
    that call (a partition applied meanwhile would look lost, one cleared and made again would look
    stray), so it is not judged by it; the next pass reads again. A read from before the owner was
    made (a rebuilt owner knows nothing of its predecessor's calls) or older than `horizon` is not
    judged at all."""

    def __init__(self, horizon: float):
        self.horizon = horizon  # seconds a call's end is remembered
        self._since = time.monotonic()  # calls that ended before are not known
        self._ends: dict[tuple[str, str], float] = {}  # (agent, partition id) -> monotonic; oldest first
        self._answered: dict[str, float] = {}  # agent -> monotonic

    def record(self, calls: Sequence[AgentCall], outcomes: Outcomes, now: float) -> None:
        for call, error in zip(calls, outcomes, strict=True):
            key = (call.agent_id, call.about)
            self._ends.pop(key, None)  # moved to the end: the map stays ordered by time
            self._ends[key] = now
            if error is None:
                self._answered[call.agent_id] = now
        cutoff = now - self.horizon
        while self._ends and next(iter(self._ends.values())) < cutoff:
            del self._ends[next(iter(self._ends))]

    def forgotten(self, moment: float) -> bool:
        """Whether calls that ended since `moment` may be unknown here: forgotten already, or made
        before this owner was."""
        return moment < self._since or time.monotonic() - moment > self.horizon

    def after(self, agent_id: str, partition_id: str, moment: float) -> bool:
        """Whether a call about that partition at that agent ended at or after `moment`."""
        return self._ends.get((agent_id, partition_id), -math.inf) >= moment

    def answered_after(self, agent_id: str, moment: float) -> bool:
        return self._answered.get(agent_id, -math.inf) >= moment


class AgentCalls:
    """Runs owners' agent calls outside them; `done(outcomes)` is called once every call has ended."""

    def __init__(self, gateway: AgentGateway, workers: int = 32):
        self.gateway = gateway
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="agent-calls")
        self._closed = False

    def start(self, calls: Sequence[AgentCall], done: Callable[[Outcomes], None], before: Callable[[], None] | None = None) -> None:
        """`before`: run first, on one of the pool's threads (a bounded wait for a test step to stop)."""
        if before is not None:
            try:
                self._pool.submit(self._after, before, calls, done)
            except RuntimeError:  # the pool was shut down meanwhile
                done([Unavailable("this vipu-server is stopping") for _ in calls])
            return
        if not calls:
            done([])
            return
        if self._closed:
            done([Unavailable("this vipu-server is stopping") for _ in calls])
            return
        gathered = _Gathered(len(calls), done)
        for position, call in enumerate(calls):
            try:
                self._pool.submit(self._call, gathered, position, call)
            except RuntimeError:  # the pool was shut down meanwhile
                gathered.add(position, Unavailable("this vipu-server is stopping"))

    def run(self, calls: Sequence[AgentCall], before: Callable[[], None] | None = None) -> Outcomes:
        """Make the calls on this thread, after `before` if given: those of one partition to its
        agents all at once (the gateway runs them together), each alone when a failpoint may stall
        or fail it."""
        if before is not None:
            before()
        if not calls:
            return []
        if self._closed:
            return [Unavailable("this vipu-server is stopping") for _ in calls]
        if not failpoints.armed("agent."):
            first = calls[0]
            try:
                if all(c.action == "clear" and c.partition_id == first.partition_id for c in calls):
                    return self.gateway.clear_all([(c.host, c.port) for c in calls], first.partition_id)
                if all(c.settings is not None for c in calls):
                    return self.gateway.apply_all([(c.host, c.port, typing.cast(AgentSettings, c.settings)) for c in calls])
            except Exception as error:  # a fault of ours, not the agents' (which come back as outcomes)
                log.exception("calls to agents %s failed", ", ".join(c.agent_id for c in calls))
                return [Unavailable(f"the call to agent {c.agent_id} failed: {type(error).__name__}") for c in calls]
        return [_one(self.gateway, call) for call in calls]

    def hand_off(self, work: Callable[[], None]) -> None:
        """Run an owner's `work` (turns left by a thread that has its own answer) on the pool; not
        once it is stopping."""
        with contextlib.suppress(RuntimeError):  # the pool was shut down meanwhile: owners are stopping too
            self._pool.submit(work)

    def _after(self, before: Callable[[], None], calls: Sequence[AgentCall], done: Callable[[Outcomes], None]) -> None:
        before()
        self.start(calls, done)

    def _call(self, gathered: _Gathered, position: int, call: AgentCall) -> None:
        gathered.add(position, _one(self.gateway, call))

    def close(self) -> None:
        self._closed = True
        self._pool.shutdown(wait=False, cancel_futures=True)
