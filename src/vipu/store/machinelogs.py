"""Machines' log lines in the store, as their agents shipped them: the latest KEPT_MACHINE_LOG_LINES of each.

A line's id is its place in the controller's record of that machine, so a follower asks for the
lines after the last id it printed, whichever replica answers.
"""

from __future__ import annotations

import typing
from collections.abc import Sequence

from sqlalchemy import Table, delete, func, select

from vipu.model.telemetry import LogLine
from vipu.store.schema import MachineLogRow
from vipu.store.transactions import TransactionBase

KEPT_MACHINE_LOG_LINES = 10_000
LOG = typing.cast(Table, MachineLogRow.__table__)


class MachineLogRepository(TransactionBase):
    def add_log_lines(self, agent_id: str, incarnation: str, lines: Sequence[LogLine]) -> None:
        """Record lines of an agent's machine (numbered by that run of the agent), dropping its
        oldest beyond the kept number."""
        if not lines:
            return
        kept = list(lines)[-KEPT_MACHINE_LOG_LINES:]
        self.session.execute(LOG.insert(), [{"agent_id": agent_id, "agent_incarnation": incarnation, "agent_sequence": line.sequence,
                                             "at": line.at, "source": line.source, "text": line.text} for line in kept])
        oldest_kept = self.session.execute(select(LOG.c.id).where(LOG.c.agent_id == agent_id).order_by(LOG.c.id.desc())
                                           .offset(KEPT_MACHINE_LOG_LINES - 1).limit(1)).scalar()
        if oldest_kept is not None:
            self.session.execute(delete(LOG).where(LOG.c.agent_id == agent_id, LOG.c.id < oldest_kept))

    def log_lines(self, agent_id: str, after: int = 0, since: float = 0.0, limit: int = 1000) -> list[LogLine]:
        """An agent's machine's lines after line `after` and stamped at or after `since`, oldest first,
        at most `limit` (the latest `limit` when only `since` bounds them)."""
        statement = select(LOG).where(LOG.c.agent_id == agent_id, LOG.c.id > after, LOG.c.at >= since)
        if after:
            rows = self.session.execute(statement.order_by(LOG.c.id).limit(limit)).all()
        else:
            rows = list(reversed(self.session.execute(statement.order_by(LOG.c.id.desc()).limit(limit)).all()))
        return [LogLine(row.id, row.at, row.source, row.text) for row in rows]

    def last_agent_lines(self) -> dict[str, tuple[str, int]]:
        """Each agent's last line recorded, by the run of the agent that numbered it and its number:
        where collecting goes on from after the controller restarts."""
        last = select(LOG.c.agent_id, func.max(LOG.c.id).label("id")).group_by(LOG.c.agent_id).subquery()
        rows = self.session.execute(select(LOG.c.agent_id, LOG.c.agent_incarnation, LOG.c.agent_sequence).join(last, LOG.c.id == last.c.id))
        return {agent_id: (incarnation, int(sequence)) for agent_id, incarnation, sequence in rows}

    def last_log_line(self, agent_id: str) -> int:
        """The id of an agent's latest line kept; 0 when none is."""
        return int(self.session.execute(select(func.max(LOG.c.id)).where(LOG.c.agent_id == agent_id)).scalar() or 0)

    def log_lines_from(self, agent_id: str, at: float) -> set[tuple[float, str, str]]:
        """(at, source, text) of an agent's lines kept stamped at or after `at`: what a restarted
        agent sends again is told apart by them."""
        rows = self.session.execute(select(LOG.c.at, LOG.c.source, LOG.c.text).where(LOG.c.agent_id == agent_id, LOG.c.at >= at))
        return {(float(row.at), row.source, row.text) for row in rows}

    def forget_log_lines(self, agent_id: str) -> None:
        self.session.execute(delete(LOG).where(LOG.c.agent_id == agent_id))
