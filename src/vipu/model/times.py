"""Times and durations as vipu writes them for people and reads them back: one rule each, for the
controller's reasons and notes, the CLI and the dashboard.

- A moment is UTC to the second, `2026-12-06 05:30:00 UTC` (`utc_text`); tables whose column
  says "(UTC)" leave the word out.
- A duration is written as `parse_duration` reads it: `1h30m`, `90s` as `1m30s`, `2d`, a
  fraction of a second as `0.5s` (`duration_text`); an age, roughly, in its largest unit: `3h`
  (`age_text`).
- A partition is expected to end its expected duration after its start (`expected_end`).
- A stamp a machine writes (ISO 8601, `2026-12-07T10:00:00Z`; one naming no zone is UTC) is read
  as seconds since the epoch (`stamp_seconds`).
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

from vipu.model.waiting import MAX_EXPECTED_SECONDS

UNITS = {"d": 86_400, "h": 3_600, "m": 60, "s": 1}
_DURATION = re.compile(r"(?:[0-9]+[dhms])+")


def utc_text(moment: datetime | float | None, *, labelled: bool = True) -> str:
    """`moment` (a datetime, naive ones being UTC, or seconds since the epoch) as
    `2026-12-06 05:30:00 UTC`; "-" when there is none (None or 0)."""
    if moment is None or moment == 0:
        return "-"
    if not isinstance(moment, datetime):
        moment = datetime.fromtimestamp(moment, UTC)
    elif moment.tzinfo is not None:
        moment = moment.astimezone(UTC)
    return f"{moment:%Y-%m-%d %H:%M:%S}{' UTC' if labelled else ''}"


def stamp_seconds(text: str) -> float | None:
    """An ISO 8601 stamp (`Z` or an offset; none: UTC) in seconds since the epoch; None if it is none."""
    try:
        moment = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        return None
    return (moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)).timestamp()


def duration_text(seconds: float) -> str:
    """`seconds` as `parse_duration` reads it: 5,400 s as `1h30m`, 90 s as `1m30s`; under a minute,
    a fraction as it is (`0.5s`)."""
    if seconds < 60 and seconds != int(seconds):
        return f"{seconds:g}s"
    left, parts = round(seconds), list[str]()
    for unit, size in UNITS.items():
        if left >= size or (unit == "s" and not parts):
            parts.append(f"{left // size}{unit}")
            left %= size
    return "".join(parts)


def age_text(seconds: float) -> str:
    """How long ago, roughly, as a person says it: its largest whole unit (`3h` for 3 h 40 min)."""
    whole = max(0, int(seconds))
    unit, size = next(((unit, size) for unit, size in UNITS.items() if whole >= size), ("s", 1))
    return f"{whole // size}{unit}"


def parse_duration(text: str) -> int:
    """Seconds in a duration written as a person writes it: 90s, 30m, 2h, 1d, or parts of them
    together (1h30m); ValueError saying what is wrong otherwise."""
    written = text.strip().lower()
    if len(written) > 40 or not _DURATION.fullmatch(written):
        raise ValueError(f"{text!r} is not a duration: write it as 90s, 30m, 2h or 1d (or 1h30m)")
    seconds = sum(int(number) * UNITS[unit] for number, unit in re.findall(r"([0-9]+)([dhms])", written))
    if not 0 < seconds <= MAX_EXPECTED_SECONDS:
        raise ValueError(f"{text!r} is {'no time' if not seconds else 'too long'}: a duration is 1 s to {MAX_EXPECTED_SECONDS} s")
    return seconds


def expected_end(started: datetime | None, expected_seconds: int) -> datetime | None:
    """When work started at `started` and expected to run `expected_seconds` should end; None when
    either is unknown (no start, or 0 s)."""
    if started is None or not expected_seconds:
        return None
    return started + timedelta(seconds=expected_seconds)
