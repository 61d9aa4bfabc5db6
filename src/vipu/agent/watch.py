"""What an agent reads of its machine on its own schedule: telemetry, and the machine's log lines.

A scrape or a controller's call is answered from what was last read, with its age, and never
waits on the machine: a BMC that takes seconds to answer makes the reading older, not the scrape
slower. Log lines go into a bounded tail (`vipu.model.telemetry.LogTail`) that the controller
collects from; a flood costs dropped lines, counted, not memory.
"""

from __future__ import annotations

import logging
import secrets
import threading
import time

from vipu import failpoints
from vipu.backends.composed import ComposedMachine
from vipu.model.errors import VipuError
from vipu.model.hardware import Capability
from vipu.model.telemetry import AGENT_LOG_LINES, LogTail, TelemetryReading

log = logging.getLogger(__name__)

TELEMETRY_SECONDS = 1.0  # how often the machine's telemetry is read
LOG_SECONDS = 0.25  # how often its log is looked at for new lines


class MachineWatch:
    def __init__(self, backend: ComposedMachine, telemetry_seconds: float = TELEMETRY_SECONDS, log_seconds: float = LOG_SECONDS,
                 log_lines: int = AGENT_LOG_LINES):
        self.backend = backend
        self.telemetry_seconds, self.log_seconds = telemetry_seconds, log_seconds
        self.log = LogTail(log_lines)
        # Which run of the agent numbered the log's lines: a controller that knew another starts over.
        self.incarnation = secrets.token_hex(8)
        self._started = time.monotonic()
        self._latest: tuple[TelemetryReading, float] | None = None  # the last reading and when (monotonic): one value, read whole
        self.telemetry_failures = 0
        self.problem = ""  # why the last reading failed; "" when it did not
        self._log_problem = ""
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    def start(self) -> MachineWatch:
        capabilities = self.backend.capabilities()
        for capability, loop in ((Capability.TELEMETRY, self._read_telemetry), (Capability.LOGS, self._read_log)):
            if capability.value in capabilities:
                thread = threading.Thread(target=loop, name=f"watch {capability.value} {self.backend.machine_name}", daemon=True)
                thread.start()
                self._threads.append(thread)
        return self

    def stop(self) -> None:
        self._stop.set()
        for thread in self._threads:
            thread.join(timeout=10)

    def latest(self) -> tuple[TelemetryReading | None, float]:
        """The reading served now (None before the first) and its age in seconds: without a
        reading, the time since the watch started, so that telemetry never read grows stale too."""
        latest = self._latest
        if latest is None:
            return None, time.monotonic() - self._started
        return latest[0], time.monotonic() - latest[1]

    def read_telemetry_once(self) -> None:
        try:
            failpoints.hit("machine.telemetry")  # a BMC that answers slowly, or not at all
            reading = self.backend.telemetry()
        except Exception as error:  # noqa: BLE001  (a failed reading, or a bug in one: the last reading stays, ageing)
            self.telemetry_failures += 1
            message = error.message if isinstance(error, VipuError) else f"{type(error).__name__}: {error}"
            if message != self.problem:
                log.warning("%s: telemetry not read: %s", self.backend.machine_name, message)
            self.problem = message
            return
        if self.problem:
            log.info("%s: telemetry read again", self.backend.machine_name)
        self._latest, self.problem = (reading, time.monotonic()), ""

    def read_log_once(self) -> int:
        lines = self.backend.log_lines()
        for at, source, text in lines:
            self.log.add(at, source, text)
        return len(lines)

    def _read_telemetry(self) -> None:
        while not self._stop.is_set():
            self.read_telemetry_once()
            self._stop.wait(self.telemetry_seconds)

    def _read_log(self) -> None:
        while not self._stop.is_set():
            try:
                self.read_log_once()
            except Exception:
                log.exception("%s: reading its log failed", self.backend.machine_name)
            self._stop.wait(self.log_seconds)
