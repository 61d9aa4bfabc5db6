"""The link ledger in the store: each link's state, its samples and their compacted summaries, its
events, and the cables met in its ports (`vipu.model.linkhealth`)."""

from __future__ import annotations

from collections.abc import Sequence

from sqlalchemy import delete, func, select

from vipu.model.linkhealth import (
    REFUSED,
    Attempt,
    CableIdentity,
    CableRecord,
    History,
    LinkEvent,
    LinkHealth,
    LinkName,
    LinkState,
    Sample,
    Summary,
)
from vipu.store.schema import CableRow, LinkEventRow, LinkRemediationRow, LinkRow, LinkSampleRow, LinkSummaryRow
from vipu.store.transactions import TransactionBase

SERIAL = 64  # the longest serial kept: an agent's longer one is cut, not refused (its machine's readings would all fail)


def _state(row: LinkRow, cables: dict[tuple[str, str, str], CableRow]) -> LinkState:
    cable = cables.get((row.cable_serial, row.agent_id, row.place))
    identity = CableIdentity(cable.serial, cable.vendor, cable.model) if cable else None
    last = Sample(row.last_at, row.last_corrected, row.last_recoveries, row.last_up) if row.last_at is not None else None
    return LinkState(LinkName(row.agent_id, row.place), LinkHealth(row.health), row.reason, row.changed_at, identity, row.cable_since,
                     last, row.test_failure, row.breaker or "", row.first_seen or row.changed_at)


class LinkRepository(TransactionBase):
    """The ledger's rows, through the ORM, in the transaction's session."""

    def links(self, agent_id: str | None = None, for_update: bool = False) -> list[LinkState]:
        """`for_update`: their rows locked until the transaction ends (PostgreSQL; SQLite's writers
        take turns), so that the sampler and a cluster test's verdicts do not overwrite each other."""
        query = select(LinkRow).order_by(LinkRow.agent_id, LinkRow.place)
        if agent_id is not None:
            query = query.where(LinkRow.agent_id == agent_id)
        if for_update:
            query = query.with_for_update()
        return self._states(self.session.scalars(query).all())

    def _states(self, rows: Sequence[LinkRow]) -> list[LinkState]:
        """The links' states, each with the cable in its port."""
        serials = {row.cable_serial for row in rows if row.cable_serial}
        found = self.session.scalars(select(CableRow).where(CableRow.serial.in_(serials))) if serials else ()
        cables = {(c.serial, c.agent_id, c.place): c for c in found}
        return [_state(row, cables) for row in rows]

    def link(self, name: LinkName, for_update: bool = False) -> LinkState | None:
        row = self.session.get(LinkRow, (name.agent_id, name.place), with_for_update=for_update)
        if row is None:
            return None
        cable = self.session.get(CableRow, (row.cable_serial, row.agent_id, row.place)) if row.cable_serial else None
        return _state(row, {(cable.serial, cable.agent_id, cable.place): cable} if cable else {})

    def save_link(self, state: LinkState) -> None:
        row = self.session.get(LinkRow, (state.name.agent_id, state.name.place))
        if row is None:
            row = LinkRow(agent_id=state.name.agent_id, place=state.name.place)
            self.session.add(row)
        row.health, row.reason, row.changed_at = state.health.value, state.reason[:1024], state.changed_at
        row.breaker, row.first_seen = state.breaker[:512], state.first_seen
        row.cable_serial, row.cable_since, row.test_failure = (state.cable.serial[:SERIAL] if state.cable else "", state.cable_since,
                                                               state.test_failure[:1024])
        if state.last is not None:
            row.last_at, row.last_corrected, row.last_recoveries, row.last_up = (state.last.at, state.last.corrected,
                                                                                 state.last.recoveries, state.last.up)

    def forget_links(self, agent_id: str) -> None:
        """An agent removed: its links' present state goes (a machine added later under its id
        starts afresh, no quarantine carried over); their history stays, under their names."""
        self.session.execute(delete(LinkRow).where(LinkRow.agent_id == agent_id))

    def add_sample(self, name: LinkName, sample: Sample) -> None:
        self.session.add(LinkSampleRow(agent_id=name.agent_id, place=name.place, at=sample.at, corrected=sample.corrected,
                                       recoveries=sample.recoveries, up=sample.up))

    def samples(self, name: LinkName, since: float = 0.0) -> list[Sample]:
        """Read as plain rows, not ORM objects: a week of a flapping link's readings is ten thousand."""
        query = select(LinkSampleRow.at, LinkSampleRow.corrected, LinkSampleRow.recoveries, LinkSampleRow.up).where(
            LinkSampleRow.agent_id == name.agent_id, LinkSampleRow.place == name.place, LinkSampleRow.at >= since)
        rows = self.session.execute(query.order_by(LinkSampleRow.at))
        return [Sample(at, corrected, recoveries, up) for at, corrected, recoveries, up in rows]

    def trend_samples(self, name: LinkName, since: float) -> list[Sample]:
        """The samples from `since` on, after the last one before it (the counters they grew from:
        only readings that changed something are kept)."""
        query = select(LinkSampleRow).where(LinkSampleRow.agent_id == name.agent_id, LinkSampleRow.place == name.place,
                                            LinkSampleRow.at < since)
        before = self.session.scalars(query.order_by(LinkSampleRow.at.desc()).limit(1)).first()
        baseline = [Sample(before.at, before.corrected, before.recoveries, before.up)] if before is not None else []
        return baseline + self.samples(name, since)

    def summaries(self, name: LinkName, since: float = 0.0) -> list[Summary]:
        columns = (LinkSummaryRow.start, LinkSummaryRow.end, LinkSummaryRow.samples, LinkSummaryRow.down, LinkSummaryRow.corrected_growth,
                   LinkSummaryRow.recovery_growth, LinkSummaryRow.last_corrected, LinkSummaryRow.last_recoveries)
        query = select(*columns).where(LinkSummaryRow.agent_id == name.agent_id, LinkSummaryRow.place == name.place,
                                       LinkSummaryRow.end >= since).order_by(LinkSummaryRow.start)
        return [Summary(*row) for row in self.session.execute(query)]

    def history(self, name: LinkName, since: float = 0.0) -> History:
        return History(tuple(self.summaries(name, since)), tuple(self.samples(name, since)))

    def sample_page(self, name: LinkName, since: float, before: float, limit: int) -> tuple[list[Sample], int]:
        """The newest `limit` readings from `since` on and before `before` (0: now), oldest first,
        and how many older ones within those times were left out: a page a reply can carry."""
        where = (LinkSampleRow.agent_id == name.agent_id, LinkSampleRow.place == name.place, LinkSampleRow.at >= since,
                 *((LinkSampleRow.at < before,) if before else ()))
        rows = self.session.execute(select(LinkSampleRow.at, LinkSampleRow.corrected, LinkSampleRow.recoveries, LinkSampleRow.up)
                                    .where(*where).order_by(LinkSampleRow.at.desc()).limit(limit)).all()
        total = self.session.execute(select(func.count()).select_from(LinkSampleRow).where(*where)).scalar_one()
        return [Sample(at, corrected, recoveries, up) for at, corrected, recoveries, up in reversed(rows)], total - len(rows)

    def event_page(self, name: LinkName, since: float, before: float, limit: int) -> tuple[list[LinkEvent], int]:
        """The newest `limit` events of the link within those times, oldest first, and how many older ones were left out."""
        where = (LinkEventRow.agent_id == name.agent_id, LinkEventRow.place == name.place, LinkEventRow.at >= since,
                 *((LinkEventRow.at < before,) if before else ()))
        rows = list(self.session.scalars(select(LinkEventRow).where(*where).order_by(LinkEventRow.at.desc(), LinkEventRow.id.desc())
                                         .limit(limit)))
        total = self.session.execute(select(func.count()).select_from(LinkEventRow).where(*where)).scalar_one()
        events = [LinkEvent(LinkName(r.agent_id, r.place), r.at, LinkHealth(r.health), r.reason, tuple(r.partitions))
                  for r in reversed(rows)]
        return events, total - len(rows)

    def replace_history(self, name: LinkName, history: History, before: float) -> None:
        """The link's samples from before `before`, and all its summaries, replaced by `history`'s
        (compaction: `history` is what compacting them gave, with the samples it kept)."""
        where = (LinkSampleRow.agent_id == name.agent_id, LinkSampleRow.place == name.place, LinkSampleRow.at < before)
        self.session.execute(delete(LinkSampleRow).where(*where))
        self.session.execute(delete(LinkSummaryRow).where(LinkSummaryRow.agent_id == name.agent_id, LinkSummaryRow.place == name.place))
        self.session.add_all(LinkSummaryRow(agent_id=name.agent_id, place=name.place, start=s.start, end=s.end, samples=s.samples,
                                            down=s.down, corrected_growth=s.corrected_growth, recovery_growth=s.recovery_growth,
                                            last_corrected=s.last_corrected, last_recoveries=s.last_recoveries)
                             for s in history.summaries)


    def add_link_event(self, event: LinkEvent) -> None:
        self.session.add(LinkEventRow(agent_id=event.name.agent_id, place=event.name.place, at=event.at, health=event.health.value,
                                      reason=event.reason[:1024], partitions=list(event.partitions)))

    def link_events(self, name: LinkName | None = None, since: float = 0.0) -> list[LinkEvent]:
        query = select(LinkEventRow).where(LinkEventRow.at >= since)
        if name is not None:
            query = query.where(LinkEventRow.agent_id == name.agent_id, LinkEventRow.place == name.place)
        return self._events(query)

    def _events(self, query) -> list[LinkEvent]:
        return [LinkEvent(LinkName(r.agent_id, r.place), r.at, LinkHealth(r.health), r.reason, tuple(r.partitions))
                for r in self.session.scalars(query.order_by(LinkEventRow.at, LinkEventRow.id))]

    def drop_link_events(self, before: float) -> None:
        """Events, and records of automatic remediations, older than the history kept."""
        self.session.execute(delete(LinkEventRow).where(LinkEventRow.at < before))
        self.session.execute(delete(LinkRemediationRow).where(LinkRemediationRow.at < before))

    def cable_at(self, serial: str, name: LinkName) -> CableRecord | None:
        """The cable of that serial as first met in this link's port (each end of a cable has a row)."""
        row = self.session.get(CableRow, (serial[:SERIAL], name.agent_id, name.place))
        if row is None:
            return None
        return CableRecord(CableIdentity(row.serial, row.vendor, row.model), name, row.first_seen, row.replaced)

    def add_cable(self, record: CableRecord) -> None:
        self.session.add(CableRow(serial=record.identity.serial[:SERIAL], vendor=record.identity.vendor[:64],
                                  model=record.identity.model[:64], agent_id=record.name.agent_id, place=record.name.place,
                                  first_seen=record.first_seen, replaced=record.replaced[:SERIAL]))

    def cables_of(self, name: LinkName) -> list[CableRecord]:
        """The cables first met in this link's port, oldest first."""
        rows = self.session.scalars(select(CableRow).where(CableRow.agent_id == name.agent_id, CableRow.place == name.place)
                                    .order_by(CableRow.first_seen))
        return [CableRecord(CableIdentity(r.serial, r.vendor, r.model), name, r.first_seen, r.replaced) for r in rows]

    def unhealthy_links(self) -> list[LinkState]:
        """The links suspect or failed now: what placement steps around."""
        return self._states(self.session.scalars(select(LinkRow).where(LinkRow.health != LinkHealth.HEALTHY.value)
                                                 .order_by(LinkRow.agent_id, LinkRow.place)).all())

    def add_attempt(self, attempt: Attempt) -> int:
        """An automatic remediation begun; its id, to record its outcome by."""
        row = LinkRemediationRow(agent_id=attempt.name.agent_id, place=attempt.name.place, at=attempt.at, outcome=attempt.outcome[:1024])
        self.session.add(row)
        self.session.flush()
        return row.id

    def end_attempt(self, attempt_id: int, outcome: str) -> None:
        row = self.session.get(LinkRemediationRow, attempt_id)
        if row is not None:
            row.outcome = outcome[:1024]

    def attempts_on(self, agent_id: str, since: float) -> list[Attempt]:
        """The automatic remediations of a machine's links since a time, oldest first."""
        rows = self.session.scalars(select(LinkRemediationRow).where(LinkRemediationRow.agent_id == agent_id,
                                                                     LinkRemediationRow.at >= since).order_by(LinkRemediationRow.at))
        return [Attempt(LinkName(r.agent_id, r.place), r.at, r.outcome) for r in rows]

    def failure_events(self) -> list[LinkEvent]:
        """The kept events of every link that failed within them: what its MTBF and MTTR are from."""
        failed = set(self.session.execute(select(LinkEventRow.agent_id, LinkEventRow.place)
                                          .where(LinkEventRow.health == LinkHealth.FAILED.value).distinct()).all())
        if not failed:
            return []
        agents = {agent for agent, _ in failed}
        return [e for e in self._events(select(LinkEventRow).where(LinkEventRow.agent_id.in_(agents)))
                if (e.name.agent_id, e.name.place) in failed]

    def attempt_counts(self) -> dict[str, int]:
        """The kept automatic remediations: how many were attempted and how many refused by the caps."""
        outcomes = self.session.scalars(select(LinkRemediationRow.outcome)).all()
        refused = sum(outcome.startswith(REFUSED) for outcome in outcomes)
        return {"attempted": len(outcomes) - refused, "refused": refused}

    def link_event_counts(self) -> dict[str, int]:
        """How many of the kept events changed a link's health to each health."""
        query = select(LinkEventRow.health, func.count()).group_by(LinkEventRow.health)
        return {health: count for health, count in self.session.execute(query).all()}
