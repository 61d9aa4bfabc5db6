"""Fixtures shared by every layer of the tests."""

from __future__ import annotations

import pytest

from tests.postgres import PostgresServer


@pytest.fixture(scope="session", autouse=True)
def ipuof_files_of_the_tests(tmp_path_factory):
    """The IPUoF files the tests' commands write go to a directory of the run's, not to the
    machine's (root's default is /etc/ipuof.conf.d, which every controller of a host shares); a
    test that means another directory names it."""
    directory = tmp_path_factory.mktemp("ipuof.conf.d")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("VIPU_IPUOF_DIR", str(directory))
        yield directory


@pytest.fixture(scope="session")
def postgres():
    server = PostgresServer()
    yield server
    server.stop()


@pytest.fixture
def postgres_of_its_own():
    """A PostgreSQL server for one test: what a vPOD orchestrator is given, since it keeps each
    tenant's database there and refuses one another site left (the session's server is shared)."""
    server = PostgresServer()
    yield server
    server.stop()


@pytest.fixture
def postgres_url(postgres):
    name = postgres.create_database()
    yield postgres.url(name)
    postgres.drop_database(name)


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def store_url(request, tmp_path):
    """A fresh, empty store URL, once for SQLite and once for a real PostgreSQL."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'vipu.db'}"
    return request.getfixturevalue("postgres_url")
