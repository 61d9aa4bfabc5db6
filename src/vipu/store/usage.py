"""Usage records (`vipu.model.usage`) in the store: one per partition removed, folded by day once old.

A partition's record is written by the removal's own statement group (`PartitionRepository`), so
no partition ends without one; folding replaces old records by their days in one transaction.
"""

from __future__ import annotations

import typing

from sqlalchemy import Row, Table, delete, func, insert, select

from vipu.model.usage import UsageRecord, fold
from vipu.store.partitions import PartitionRepository
from vipu.store.schema import UsageRecordRow

USAGE = typing.cast(Table, UsageRecordRow.__table__)


def _record(row: Row[typing.Any]) -> UsageRecord:
    return UsageRecord(row.partition_id, row.allocation_id, row.account, row.user_id, row.size, float(row.started), float(row.ended),
                       float(row.ipu_seconds))


class UsageRepository(PartitionRepository):
    def usage_records(self, since: float, until: float, allocation_id: str | None = None) -> list[UsageRecord]:
        """The records that used IPUs between `since` and `until` (of one allocation)."""
        statement = select(USAGE).where(USAGE.c.ended >= since, USAGE.c.started < until).order_by(USAGE.c.id)
        if allocation_id is not None:
            statement = statement.where(USAGE.c.allocation_id == allocation_id)
        return [_record(row) for row in self.session.execute(statement)]

    def usage_totals(self) -> dict[str, float]:
        """IPU-seconds of the partitions that ended, by account, over all the records kept."""
        rows = self.session.execute(select(USAGE.c.account, func.sum(USAGE.c.ipu_seconds)).group_by(USAGE.c.account))
        return {account: float(total or 0.0) for account, total in rows}

    def fold_usage(self, before: float, limit: int) -> int:
        """Fold at most `limit` of the partitions' records that ended before `before` into one per
        day (a day a later fold reaches gets a row of its own); how many were folded."""
        rows = self.session.execute(select(USAGE).where(USAGE.c.ended < before, USAGE.c.partition_id != "")
                                    .order_by(USAGE.c.id).limit(limit)).all()
        if not rows:
            return 0
        records = [_record(row) for row in rows]
        self.session.execute(delete(USAGE).where(USAGE.c.id.in_([row.id for row in rows])))
        self.session.execute(insert(USAGE), [{"partition_id": "", "allocation_id": f.allocation_id, "account": f.account,
                                              "user_id": f.user, "size": 0, "started": f.started, "ended": f.ended,
                                              "ipu_seconds": f.ipu_seconds} for f in fold(records)])
        return len(rows)
