"""A database and a role of its own on a PostgreSQL server for each tenant's controller that
vipu-vpod runs on Kubernetes, where a pod has no file of its own that outlives it.

The orchestrator is given a server URL whose user may create databases and roles (PostgreSQL 13
or later). Each tenant's store is a database named after its controller (`vpod-<id>`, an id of
vipu's grammar, quoted), owned by a role of the same name with a password of its own, which only
that role may connect to: a tenant's controller can reach no other tenant's store. The database
is marked as this site's, so that a database of that name another orchestrator made is never
dropped. It is made afresh before the tenant's controller is initialised, and kept when the vPOD
is released, as the archive of what the tenant did, its role no longer able to log in.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Connection, create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from vipu.model.entities import check_id
from vipu.model.errors import AlreadyExists, InvalidArgument, Unavailable
from vipu.store.engines import STATEMENT_DEADLINE_SECONDS, checked_url, first_line

CONNECT_DEADLINE_SECONDS = 10


def server_url(url: str) -> str:
    """A PostgreSQL server's URL, checked; InvalidArgument for anything else."""
    url, is_sqlite = checked_url(url)
    if is_sqlite:
        raise InvalidArgument("tenants' controllers on Kubernetes keep their stores on PostgreSQL: give a postgresql:// URL")
    return url


def _marker(site: str) -> str:
    return f"vipu-vpod site {site}"


@contextmanager
def _server(url: str, what: str) -> Iterator[Connection]:
    """A connection to the server's `postgres` database, each statement on its own, with deadlines."""
    engine = create_engine(make_url(url).set(database="postgres"), isolation_level="AUTOCOMMIT", connect_args={
        "connect_timeout": CONNECT_DEADLINE_SECONDS, "options": f"-c statement_timeout={STATEMENT_DEADLINE_SECONDS * 1000}"})
    try:
        with engine.connect() as connection:
            yield connection
    except DBAPIError as error:
        raise Unavailable(f"cannot {what} at {make_url(url).render_as_string(hide_password=True)}: {first_line(error)}") from None
    finally:
        engine.dispose()


def make_database(url: str, name: str, site: str) -> str:
    """Database `name` and its role, made afresh for site `site` (one of that name the site made
    before is dropped, another's refused); the URL the tenant's controller uses, with its password."""
    check_id("database", name)  # the grammar has no quote: the quoted name below is exactly this one
    password = secrets.token_urlsafe(24)
    with _server(url, f"make database {name}") as server:
        found = server.execute(text("SELECT shobj_description(oid, 'pg_database') FROM pg_database WHERE datname = :name"),
                               {"name": name}).first()
        if found is not None and found[0] != _marker(site):
            raise AlreadyExists(f"database {name} exists on that PostgreSQL server and is not this site's; "
                                "give this orchestrator a server (or a store) of its own")
        server.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        server.execute(text(f'DROP ROLE IF EXISTS "{name}"'))
        server.execute(text(f'CREATE ROLE "{name}" LOGIN PASSWORD \'{password}\''))  # token_urlsafe: no quote either
        server.execute(text(f'CREATE DATABASE "{name}" OWNER "{name}"'))
        server.execute(text(f'REVOKE CONNECT, TEMPORARY ON DATABASE "{name}" FROM PUBLIC'))
        server.execute(text(f'COMMENT ON DATABASE "{name}" IS \'{_marker(site)}\''))
    return make_url(url).set(username=name, password=password, database=name).render_as_string(hide_password=False)


def close_database(url: str, name: str) -> None:
    """Keep the database as an archive: its role may no longer log in."""
    check_id("database", name)
    with _server(url, f"close database {name}") as server:
        if server.execute(text("SELECT 1 FROM pg_roles WHERE rolname = :name"), {"name": name}).first() is not None:
            server.execute(text(f'ALTER ROLE "{name}" NOLOGIN'))
