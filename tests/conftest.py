"""Fixtures shared by every layer of the tests."""

from __future__ import annotations

import pytest

from tests.postgres import PostgresServer


@pytest.fixture(scope="session")
def postgres():
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
