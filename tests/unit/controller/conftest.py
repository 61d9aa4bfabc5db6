"""Fixtures of the controller's unit tests."""

from __future__ import annotations

import pytest

from tests.unit.controller.test_services import Pod


@pytest.fixture
def pod(tmp_path):
    """test_services' pod of simulated machines, reached in memory, on SQLite."""
    pod = Pod(tmp_path)
    yield pod
    pod.close()


@pytest.fixture
def pod_on_store(tmp_path, store_url):
    """The in-memory pod of test_services, on SQLite and on PostgreSQL."""
    pod = Pod(tmp_path, store_url=store_url)
    yield pod
    pod.close()
