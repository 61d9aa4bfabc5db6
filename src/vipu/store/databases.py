"""A database of its own on a PostgreSQL server for each tenant's controller that vipu-vpod runs
on Kubernetes, where a pod has no file of its own that outlives it.

The orchestrator is given a server URL whose user may create databases; each tenant's store is a
database named after its controller (`vpod-<id>`, an id of vipu's grammar, quoted). It is made
afresh before the tenant's controller is initialised and kept when the vPOD is released, as the
archive of what the tenant did.
"""

from __future__ import annotations

from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError, ProgrammingError

from vipu.model.entities import check_id
from vipu.model.errors import InvalidArgument, Unavailable
from vipu.store.store import _first_line, checked_url


def database_url(server_url: str, name: str) -> str:
    """The URL of database `name` on the server `server_url` names, its password kept."""
    return make_url(server_url).set(database=name).render_as_string(hide_password=False)


def server_url(url: str) -> str:
    """A PostgreSQL server's URL, checked; InvalidArgument for anything else."""
    url, is_sqlite = checked_url(url)
    if is_sqlite:
        raise InvalidArgument("tenants' controllers on Kubernetes keep their stores on PostgreSQL: give a postgresql:// URL")
    return url


def make_database(url: str, name: str) -> str:
    """Create database `name` on the server, dropping one of that name first; its URL."""
    check_id("database", name)  # the grammar has no quote: the quoted name below is exactly this one
    engine = create_engine(database_url(url, "postgres"), isolation_level="AUTOCOMMIT")
    try:
        with engine.connect() as connection:
            connection.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
            connection.execute(text(f'CREATE DATABASE "{name}"'))
    except (OperationalError, ProgrammingError) as error:
        raise Unavailable(f"cannot make database {name} at {make_url(url).render_as_string(hide_password=True)}: "
                          f"{_first_line(error)}") from None
    finally:
        engine.dispose()
    return database_url(url, name)
