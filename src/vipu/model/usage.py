"""Usage accounts: the IPU-seconds each partition used, on its account and for its user.

A partition's record is written when it is removed (its IPUs from its start to its end); one still
running counts up to now. A report sums, over a time window, the part of each record inside it,
by account or by user, as Slurm's `sreport` does. Records older than `FOLD_AFTER_SECONDS` are
folded into one per account, user, allocation and UTC day (`fold`), so the ledger grows with days
and teams, not with partitions; a report over whole days past that reads the same.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from vipu.model.entities import Partition
from vipu.model.errors import InvalidArgument

DAY = 86_400.0
FOLD_AFTER_SECONDS = 35 * DAY  # records of partitions that ended this long ago are folded by day
BY = ("account", "user")


@dataclass(frozen=True)
class UsageRecord:
    partition_id: str  # "" for a fold of a day's records
    allocation_id: str
    account: str
    user: str
    size: int  # IPUs (0 for a fold)
    started: float  # seconds since the epoch
    ended: float
    ipu_seconds: float  # spread evenly from its start to its end

    @classmethod
    def of(cls, partition: Partition, ended: float) -> UsageRecord:
        """What a partition used from its start (its creation; `ended` if unknown) to `ended`: its
        record when it is removed, or what it used so far while it runs."""
        started = min(partition.created.timestamp(), ended) if partition.created is not None else ended
        return cls(partition.id, partition.allocation_id, partition.account, partition.owner, partition.size, started, ended,
                   partition.size * (ended - started))

    def within(self, since: float, until: float) -> float:
        """Its IPU-seconds between `since` and `until`."""
        if self.ended <= self.started:
            return self.ipu_seconds if since <= self.started < until else 0.0
        overlap = min(self.ended, until) - max(self.started, since)
        return self.ipu_seconds * overlap / (self.ended - self.started) if overlap > 0 else 0.0


@dataclass(frozen=True)
class UsageRow:
    key: str  # the account or the user
    ipu_seconds: float
    partitions: int  # partitions that used IPUs in the window (folds count none)


def report(records: Iterable[UsageRecord], by: str, since: float, until: float) -> list[UsageRow]:
    """IPU-seconds used between `since` and `until`, by account or by user (most first)."""
    if by not in BY:
        raise InvalidArgument(f"usage is reported by {' or '.join(BY)}, not by {by!r}")
    if until <= since:
        raise InvalidArgument("a usage report's --until is after its --since")
    sums: dict[str, list[float]] = {}
    for record in records:
        used = record.within(since, until)
        if used <= 0:
            continue
        key = record.account if by == "account" else record.user
        row = sums.setdefault(key, [0.0, 0])
        row[0] += used
        row[1] += 1 if record.partition_id else 0
    return sorted((UsageRow(key, seconds, int(count)) for key, (seconds, count) in sums.items()), key=lambda r: (-r.ipu_seconds, r.key))


def fold(records: Iterable[UsageRecord]) -> list[UsageRecord]:
    """The records as one per account, user, allocation and UTC day, each day's part of a record
    counted in its day: what a report over whole days reads the same from."""
    days: dict[tuple[str, str, str, float], float] = {}
    for record in records:
        day = (record.started // DAY) * DAY
        while day < max(record.ended, record.started + 1e-9):
            used = record.within(day, day + DAY)
            if used > 0:
                key = (record.allocation_id, record.account, record.user, day)
                days[key] = days.get(key, 0.0) + used
            day += DAY
    return [UsageRecord("", allocation, account, user, 0, day, day + DAY, seconds)
            for (allocation, account, user, day), seconds in sorted(days.items())]
