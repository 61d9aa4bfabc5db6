"""The site orchestrator's store (`vipu-vpod`): the site's IPU-Machines and the vPODs holding them.

A database of its own (SQLite by default, PostgreSQL), apart from every controller's. A machine
row names the one vPOD holding it, so no machine is ever in two vPODs, and why it is held back
from the pool when a release's cluster test failed on it; a vPOD row records which
step of its creation or release it has reached, each step moved on by a compare-and-set, so that
an orchestrator started again after a crash resumes where the last one stopped.
"""

from __future__ import annotations

import secrets
import time
import typing
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

from sqlalchemy import JSON, Boolean, CursorResult, Float, Integer, String, Update, create_engine, event, false, select, text, update
from sqlalchemy.engine import make_url
from sqlalchemy.exc import IntegrityError, OperationalError
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

from vipu.model.entities import shown
from vipu.model.errors import AlreadyExists, ConcurrentUpdate, Conflict, NotFound, Unavailable
from vipu.store.engines import STATEMENT_DEADLINE_SECONDS, checked_url, first_line, set_wal_mode

SCHEMA_VERSION = 2  # 2: site_machines.held_back, vpods.release_test
MIGRATIONS = {2: ["ALTER TABLE site_machines ADD COLUMN held_back VARCHAR(1000) NOT NULL DEFAULT ''",
                  "ALTER TABLE vpods ADD COLUMN release_test BOOLEAN NOT NULL DEFAULT FALSE"]}


class VpodBase(DeclarativeBase):
    pass


class SiteMachineRow(VpodBase):
    __tablename__ = "site_machines"
    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    position: Mapped[int] = mapped_column(Integer, unique=True)  # rack order, lowest first
    host: Mapped[str] = mapped_column(String(255))
    port: Mapped[int] = mapped_column(Integer)
    vpod_id: Mapped[str | None] = mapped_column(String(64), nullable=True, index=True)
    held_back: Mapped[str] = mapped_column(String(1000), default="", server_default="")  # why it stays out of the pool; "" if not


class VpodRow(VpodBase):
    __tablename__ = "vpods"
    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    tenant: Mapped[str] = mapped_column(String(64), index=True)
    state: Mapped[str] = mapped_column(String(16))
    step: Mapped[str] = mapped_column(String(32))
    machines: Mapped[list] = mapped_column(JSON)
    topology: Mapped[str] = mapped_column(String(16))
    ilds: Mapped[int] = mapped_column(Integer)
    user_id: Mapped[str] = mapped_column(String(64))
    ports: Mapped[list] = mapped_column(JSON)  # user, admin, metrics
    error: Mapped[str] = mapped_column(String(1000), default="")
    created_at: Mapped[float] = mapped_column(Float)
    released_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    release_test: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())  # its release runs the cluster test


class VpodMetaRow(VpodBase):
    __tablename__ = "vpod_meta"
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(String(1000))


@dataclass(frozen=True)
class SiteMachine:
    name: str
    position: int
    host: str
    port: int
    vpod_id: str = ""
    held_back: str = ""

    @property
    def free(self) -> bool:
        return not self.vpod_id and not self.held_back


@dataclass
class Vpod:
    id: str
    tenant: str
    state: str  # Creating | Active | Releasing | Released | Failed
    step: str  # the last step done
    machines: list[str]
    topology: str
    ilds: int
    user_id: str
    ports: list[int] = field(default_factory=list)
    error: str = ""
    created_at: float = 0.0
    released_at: float | None = None
    release_test: bool = False


def _changed(session: Session, statement: Update) -> int:
    """How many rows an UPDATE changed: the outcome of a compare-and-set."""
    return typing.cast(CursorResult, session.execute(statement)).rowcount


def _vpod(row: VpodRow) -> Vpod:
    return Vpod(row.id, row.tenant, row.state, row.step, list(row.machines), row.topology, row.ilds, row.user_id,
                list(row.ports), row.error or "", row.created_at, row.released_at, bool(row.release_test))


class VpodStore:
    def __init__(self, url: str):
        self.url, is_sqlite = checked_url(url)
        if is_sqlite:
            self.engine = create_engine(self.url, connect_args={"check_same_thread": False, "timeout": STATEMENT_DEADLINE_SECONDS})

            @event.listens_for(self.engine, "connect")
            def _configure(dbapi_connection, _record):
                dbapi_connection.isolation_level = None
                cursor = dbapi_connection.cursor()
                set_wal_mode(cursor)
                cursor.close()

            @event.listens_for(self.engine, "begin")
            def _begin(connection):
                connection.exec_driver_sql("BEGIN IMMEDIATE")  # one writer at a time, each seeing the last
        else:
            self.engine = create_engine(self.url, pool_pre_ping=True, isolation_level="SERIALIZABLE",
                                        connect_args={"options": f"-c statement_timeout={STATEMENT_DEADLINE_SECONDS * 1000}"})
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)
        with self.session() as session:
            VpodBase.metadata.create_all(session.connection())
            self._settle_schema(session)

    def _settle_schema(self, session: Session) -> None:
        row = session.get(VpodMetaRow, "schema_version")
        if row is None:
            session.add(VpodMetaRow(key="schema_version", value=str(SCHEMA_VERSION)))
        elif int(row.value) > SCHEMA_VERSION:
            raise Conflict(f"the orchestrator's store at {self.describe()} has schema version {row.value}, newer than this "
                           f"vipu-vpod's {SCHEMA_VERSION}; upgrade vipu-vpod")
        elif int(row.value) < SCHEMA_VERSION:
            for version in range(int(row.value) + 1, SCHEMA_VERSION + 1):
                for statement in MIGRATIONS[version]:
                    session.execute(text(statement))
            row.value = str(SCHEMA_VERSION)

    @contextmanager
    def session(self) -> Iterator[Session]:
        """One transaction; a database that does not answer is Unavailable, a lost race ConcurrentUpdate."""
        try:
            with self._sessions.begin() as session:
                yield session
        except OperationalError as error:
            if "could not serialize" in str(error.orig):
                raise ConcurrentUpdate("another orchestrator changed the same vPOD or machines; try again") from None
            raise Unavailable(f"the orchestrator's store at {self.describe()}: {first_line(error)}") from None

    def describe(self) -> str:
        return make_url(self.url).render_as_string(hide_password=True)

    def close(self) -> None:
        self.engine.dispose()

    # Settings of the orchestrator itself

    def setting(self, key: str) -> str | None:
        with self.session() as session:
            row = session.get(VpodMetaRow, key)
            return row.value if row is not None else None

    def set_setting(self, key: str, value: str) -> None:
        with self.session() as session:
            session.merge(VpodMetaRow(key=key, value=value))

    def site_id(self) -> str:
        """This orchestrator's own id, made once: it marks what it makes in places others share."""
        with self.session() as session:
            row = session.get(VpodMetaRow, "site_id")
            if row is None:
                row = VpodMetaRow(key="site_id", value=secrets.token_hex(8))
                session.add(row)
            return row.value

    # Machines

    def add_machines(self, machines: list[SiteMachine]) -> list[str]:
        """Record machines of the site not yet known (by name); the names added."""
        with self.session() as session:
            known = {row.name: row for row in session.scalars(select(SiteMachineRow))}
            added = []
            for machine in machines:
                row = known.get(machine.name)
                if row is None:
                    session.add(SiteMachineRow(name=machine.name, position=machine.position, host=machine.host, port=machine.port))
                    added.append(machine.name)
                elif (row.host, row.port, row.position) != (machine.host, machine.port, machine.position):
                    raise AlreadyExists(f"machine {machine.name} is known at {row.host}:{row.port}, position {row.position}, "
                                        f"not {machine.host}:{machine.port}, position {machine.position}")
        return added

    def machines(self) -> list[SiteMachine]:
        with self.session() as session:
            rows = session.scalars(select(SiteMachineRow).order_by(SiteMachineRow.position))
            return [SiteMachine(r.name, r.position, r.host, r.port, r.vpod_id or "", r.held_back or "") for r in rows]

    def hold_back(self, vpod_id: str, reasons: dict[str, str]) -> None:
        """Keep machines of a vPOD out of the pool once it is released, each with its reason
        (a release's cluster test failed on it); the vPOD's other machines go back clean."""
        with self.session() as session:
            for row in session.scalars(select(SiteMachineRow).where(SiteMachineRow.vpod_id == vpod_id)):
                row.held_back = reasons.get(row.name, "")[:1000]

    def repaired(self, names: list[str]) -> None:
        """Return machines held back to the pool, all or none: each must be known, held back, and in no vPOD."""
        with self.session() as session:
            rows = {row.name: row for row in session.scalars(select(SiteMachineRow).where(SiteMachineRow.name.in_(names)))}
            for name in names:
                row = rows.get(name)
                if row is None:
                    raise NotFound(f"machine {name} is not one of the site's")
                if row.vpod_id:
                    raise Conflict(f"machine {name} is in vPOD {row.vpod_id}; it is tested when that vPOD is released")
                if not row.held_back:
                    raise Conflict(f"machine {name} is not held back; it is in the pool already")
            for row in rows.values():
                row.held_back = ""

    # vPODs

    def add_vpod(self, vpod: Vpod) -> None:
        """Record a new vPOD holding its machines, in one transaction: refused (ConcurrentUpdate)
        if any of them was taken meanwhile, so no machine is ever in two vPODs."""
        try:
            with self.session() as session:
                if session.get(VpodRow, vpod.id) is not None:
                    raise AlreadyExists(f"vPOD {vpod.id} exists already")
                others = session.scalars(select(VpodRow).where(VpodRow.state != "Released"))
                if any(set(other.ports) & set(vpod.ports) for other in others):
                    raise ConcurrentUpdate("another vPOD took the same ports meanwhile; try again")
                taken = _changed(session, update(SiteMachineRow).where(
                    SiteMachineRow.name.in_(vpod.machines), SiteMachineRow.vpod_id.is_(None), SiteMachineRow.held_back == ""
                ).values(vpod_id=vpod.id))
                if taken != len(vpod.machines):
                    raise ConcurrentUpdate("some of the machines picked were taken by another vPOD meanwhile; try again")
                session.add(VpodRow(id=vpod.id, tenant=vpod.tenant, state=vpod.state, step=vpod.step, machines=vpod.machines,
                                    topology=vpod.topology, ilds=vpod.ilds, user_id=vpod.user_id, ports=vpod.ports,
                                    error=vpod.error, created_at=vpod.created_at or time.time()))
        except IntegrityError:
            raise AlreadyExists(f"vPOD {vpod.id} exists already") from None

    def get(self, vpod_id: str) -> Vpod:
        with self.session() as session:
            row = session.get(VpodRow, vpod_id)
            if row is None:
                raise NotFound(f"vPOD {shown(vpod_id)} does not exist")
            return _vpod(row)

    def list(self, tenant: str | None = None, with_released: bool = False) -> list[Vpod]:
        with self.session() as session:
            query = select(VpodRow).order_by(VpodRow.created_at)
            if tenant is not None:
                query = query.where(VpodRow.tenant == tenant)
            if not with_released:
                query = query.where(VpodRow.state != "Released")
            return [_vpod(row) for row in session.scalars(query)]

    def advance(self, vpod_id: str, from_step: str, to_step: str, expected_state: str, state: str | None = None,
                error: str | None = None) -> None:
        """Move a vPOD from one step to the next, only if it is still at `from_step` in `expected_state`
        (a release begun meanwhile stops a creation); ConcurrentUpdate otherwise."""
        values: dict = {"step": to_step}
        if state is not None:
            values["state"] = state
        if error is not None:
            values["error"] = error[:1000]
        with self.session() as session:
            moved = _changed(session, update(VpodRow).where(VpodRow.id == vpod_id, VpodRow.step == from_step,
                                                            VpodRow.state == expected_state).values(**values))
            if moved != 1:
                raise ConcurrentUpdate(f"vPOD {vpod_id} is no longer {expected_state} at step {from_step}")

    def start_release(self, vpod_id: str, test: bool = False) -> Vpod:
        """Mark a vPOD Releasing (from any state but Released), keeping its step; the vPOD. `test`:
        the release runs the cluster test, as does one begun so before and resumed without it."""
        with self.session() as session:
            row = session.get(VpodRow, vpod_id)
            if row is None or row.state == "Released":
                raise NotFound(f"vPOD {shown(vpod_id)} does not exist")
            row.state = "Releasing"
            row.release_test = bool(row.release_test) or test
            return _vpod(row)

    def finish_release(self, vpod_id: str, from_step: str) -> None:
        """The last step of a release, in one transaction: the machines are free again and the vPOD Released."""
        with self.session() as session:
            moved = _changed(session, update(VpodRow).where(VpodRow.id == vpod_id, VpodRow.step == from_step)
                             .values(state="Released", step="released", released_at=time.time()))
            if moved != 1:
                raise ConcurrentUpdate(f"vPOD {vpod_id} is no longer at step {from_step}")
            session.execute(update(SiteMachineRow).where(SiteMachineRow.vpod_id == vpod_id).values(vpod_id=None))
