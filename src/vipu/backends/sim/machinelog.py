"""A simulated machine's own log: a file per machine beside its rack description, as a gateway's syslog.

The simulated machine writes what it does (partitions configured and cleared, power, health,
errors it counts), and `vipu-sim fault` writes each fault it injects into the machine it names,
so a test sees a fault's line arrive at the controller. Several processes append to one file (the
agent's machine, the fault injector), each line in one write under a lock; the file is rotated at
ROTATE_BYTES, one older file kept, so a flood never fills a disk. The agent's driver follows the
file as `tail -F` does, across rotations.
"""

from __future__ import annotations

import fcntl
import os
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO

from vipu.model.telemetry import clipped
from vipu.model.times import stamp_seconds

ROTATE_BYTES = 256 * 1024  # a machine log's file is rotated when it reaches this size: at most twice this on disk
READ_BYTES = 256 * 1024  # the most a follower reads at one look


def machine_log_path(rack_path: Path, machine: str) -> Path:
    return Path(rack_path).resolve().parent / "machine-logs" / f"{machine}.log"


def write_lines(path: Path, lines: list[str], at: float | None = None) -> None:
    """Append `lines` to a machine log, each stamped with `at` (now by default); rotated first if full."""
    stamp = _stamp(time.time() if at is None else at)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_suffix(".lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        for text in lines:
            try:
                if path.stat().st_size >= ROTATE_BYTES:
                    os.replace(path, path.with_suffix(".log.1"))
            except FileNotFoundError:
                pass
            with open(path, "a", encoding="utf-8") as log:
                log.write(f"{stamp} {clipped(text)}\n")


def _stamp(at: float) -> str:
    return datetime.fromtimestamp(at, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def parse_line(line: str) -> tuple[float, str]:
    """(when, text) of a written line; a line without a stamp is stamped now."""
    stamp, _, text = line.partition(" ")
    at = stamp_seconds(stamp)
    return (at, text) if at is not None else (time.time(), line)


LOST_LINES = "the log rotated more than once between two reads: lines may have been lost"


class LogFollower:
    """Reads the lines added to a log file since the last read, following it across rotations as
    `tail -F` does: it keeps the file open, so after a rotation it finishes the old file (renamed
    or gone) before it opens the new one. The first read starts at the file's end less READ_BYTES;
    each read takes at most READ_BYTES of a file. A flood that rotates the file twice between two
    reads loses the files in between, as any follower of a rotated log would: a line saying so
    (LOST_LINES) stands for them."""

    def __init__(self, path: Path):
        self.path = path
        self._file: BinaryIO | None = None
        self._partial = b""

    def read(self) -> list[tuple[float, str]]:
        lines: list[bytes] = []
        if self._file is None:
            try:
                self._file = open(self.path, "rb")  # noqa: SIM115 - kept open between reads, closed on rotation
            except FileNotFoundError:
                return []
            start = max(0, os.fstat(self._file.fileno()).st_size - READ_BYTES)
            self._file.seek(start)
            if start:
                self._file.readline()  # the rest of a line begun before: not a line
        ended = self._drain(lines)
        try:
            current = self.path.stat().st_ino
        except FileNotFoundError:
            current = None
        ours = os.fstat(self._file.fileno()).st_ino
        if ended and current is not None and current != ours:  # rotated, and the old file read to its end
            self._file.close()
            self._file, self._partial = None, b""
            try:
                rotated = self.path.with_suffix(".log.1")
                if rotated.stat().st_ino != ours:  # another file (or more) came between: one or more may have gone unread
                    after = lines[-1].split(b" ", 1)[0].decode("utf-8", "replace") if lines else _stamp(time.time())
                    lines.append(f"{after} {LOST_LINES}".encode())  # stamped as the line before, to keep its place
                    with open(rotated, "rb") as between:
                        whole = between.read(2 * ROTATE_BYTES)  # a rotated file is at most ROTATE_BYTES and a line
                    lines += [line for line in whole.rpartition(b"\n")[0].split(b"\n") if line]
            except FileNotFoundError:
                pass
            try:
                self._file = open(self.path, "rb")  # noqa: SIM115 - as above
            except FileNotFoundError:
                return [parse_line(line.decode("utf-8", "replace")) for line in lines]
            self._drain(lines)
        return [parse_line(line.decode("utf-8", "replace")) for line in lines]

    def _drain(self, lines: list[bytes]) -> bool:
        """Add the complete lines of up to READ_BYTES more of the open file; whether it was read to its end."""
        assert self._file is not None
        if os.fstat(self._file.fileno()).st_size < self._file.tell():  # truncated
            self._file.seek(0)
            self._partial = b""
        data = self._file.read(READ_BYTES)
        complete, _, self._partial = (self._partial + data).rpartition(b"\n")
        lines += [line for line in complete.split(b"\n") if line]
        return len(data) < READ_BYTES

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
