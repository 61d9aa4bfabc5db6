"""What a machine says of its IPUs while they run, and what it logs: plain values and bounded keeps.

A reading is what a telemetry driver (`vipu.backends.capabilities.Telemetry`) gave at one time:
per IPU, whatever it can measure, each field None where the machine has no such sensor (the
exporter then leaves the series out rather than say 0, as dcgm-exporter does for a field a GPU
lacks). Machine logs are lines with a sequence, kept in bounded tails at the agent and the
controller: a machine that floods its log costs a count of dropped lines, never memory or disk.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass, field

MAX_LOG_LINE = 512  # characters of one machine log line kept; the rest is cut, marked with "…"
AGENT_LOG_LINES = 2000  # lines an agent keeps for the controller to collect


@dataclass(frozen=True)
class IpuReading:
    index: int
    utilisation: float | None = None  # percent of the last seconds it ran a program, 0 to 100
    temperature: float | None = None  # degrees Celsius
    power: float | None = None  # watts
    clock_mhz: float | None = None
    memory_used: int | None = None  # bytes of its in-processor memory a loaded program takes
    memory_total: int | None = None
    ecc_errors: int | None = None  # corrected memory errors since the machine started (a counter)
    parity_errors: int | None = None  # parity errors since the machine started (a counter)
    link_errors: int | None = None  # corrected errors on its IPU-Links inside the machine (a counter)


@dataclass(frozen=True)
class SensorReading:
    """A machine sensor that is not one IPU's: an intake temperature, the chassis' power draw."""

    name: str
    kind: str  # "temperature" (degrees Celsius) or "power" (watts)
    value: float


@dataclass(frozen=True)
class TelemetryReading:
    read_at: float  # seconds since the epoch
    ipus: tuple[IpuReading, ...] = ()
    sensors: tuple[SensorReading, ...] = ()

    def ipu(self, index: int) -> IpuReading | None:
        return next((ipu for ipu in self.ipus if ipu.index == index), None)


def with_environment(fabric: TelemetryReading, environment: TelemetryReading) -> TelemetryReading:
    """The fabric's reading (what the gateway counts: utilisation, clocks, memory, errors) with the
    temperatures and power of another driver (a BMC's): where the BMC has no sensor for an IPU, that
    IPU has no temperature or power, never the fabric's guess."""
    ipus = []
    for ipu in fabric.ipus:
        sensed = environment.ipu(ipu.index)
        ipus.append(IpuReading(ipu.index, ipu.utilisation, sensed.temperature if sensed else None, sensed.power if sensed else None,
                               ipu.clock_mhz, ipu.memory_used, ipu.memory_total, ipu.ecc_errors, ipu.parity_errors, ipu.link_errors))
    return TelemetryReading(min(fabric.read_at, environment.read_at), tuple(ipus), environment.sensors)


@dataclass(frozen=True)
class LogLine:
    sequence: int  # from 1, in the order the keeper got it
    at: float  # seconds since the epoch, as the machine stamped it (else when it was read)
    source: str  # "gateway" (the machine's own log) or "bmc" (its BMC's log services and SEL)
    text: str


def clipped(text: str) -> str:
    """One line as kept: printable, at most MAX_LOG_LINE characters."""
    text = "".join(c if c.isprintable() else " " for c in text.rstrip("\r\n"))
    return text if len(text) <= MAX_LOG_LINE else text[:MAX_LOG_LINE - 1] + "…"


@dataclass
class LogTail:
    """The last `keep` lines of a log, numbered as they come; thread-safe.

    `dropped` counts the lines that left the tail before anyone read past them: a reader that
    comes back after a flood learns how many it missed (`after`).
    """

    keep: int = AGENT_LOG_LINES
    lines: deque[LogLine] = field(default_factory=deque)
    last: int = 0
    dropped: int = 0
    read_up_to: int = 0  # the highest sequence a reader has been given
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, at: float, source: str, text: str) -> LogLine:
        with self._lock:
            self.last += 1
            line = LogLine(self.last, at, source, clipped(text))
            self.lines.append(line)
            while len(self.lines) > self.keep:
                gone = self.lines.popleft()
                if gone.sequence > self.read_up_to:
                    self.dropped += 1
            return line

    def after(self, sequence: int, limit: int = 0) -> tuple[list[LogLine], int]:
        """The lines after `sequence`, oldest first (at most `limit`, 0: all kept), and how many
        after it are no longer kept. A `sequence` beyond the last (the keeper restarted and counts
        from 1 again) reads from the start."""
        with self._lock:
            if sequence > self.last:
                sequence = 0
            first = self.lines[0].sequence if self.lines else self.last + 1
            missed = max(0, first - sequence - 1)
            found = [line for line in self.lines if line.sequence > sequence]
            if limit:
                found = found[:limit]
            if found:
                self.read_up_to = max(self.read_up_to, found[-1].sequence)
            return found, missed


@dataclass(frozen=True)
class WatchReport:
    """What an agent answered the controller's look: its last telemetry and its age, new log lines."""

    reading: TelemetryReading | None
    age: float  # seconds since the agent read it
    lines: tuple[LogLine, ...] = ()
    missed: int = 0  # lines after those the controller had that the agent no longer keeps
    incarnation: str = ""  # the agent's run that numbered the lines


@dataclass
class UtilisationHistory:
    """A partition's IPUs' utilisation over its whole life in at most `keep` samples: when full,
    every other sample goes and the spacing between kept ones doubles, so a long life is seen at
    a coarser step and a short one in detail."""

    keep: int = 240
    step: float = 0.0  # the least seconds between kept samples; grows as samples are thinned
    samples: list[tuple[float, tuple[float | None, ...]]] = field(default_factory=list)

    def add(self, at: float, utilisations: tuple[float | None, ...]) -> None:
        """A sample; it replaces the latest one while that is within `step` of the one before, so
        the history always ends with the newest."""
        if len(self.samples) >= 2 and at - self.samples[-2][0] < self.step:
            self.samples[-1] = (at, utilisations)
            return
        self.samples.append((at, utilisations))
        if len(self.samples) > self.keep:
            self.samples = self.samples[::2]
            first, last = self.samples[0][0], self.samples[-1][0]
            self.step = max(self.step * 2, (last - first) / max(1, len(self.samples) - 1))
