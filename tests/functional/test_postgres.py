"""The controller on a real PostgreSQL: partitions and restarts as on SQLite."""

from __future__ import annotations

import pytest

from tests.functional.harness import Pod, rows

pytestmark = pytest.mark.postgres


@pytest.fixture(scope="module")
def module_pod(tmp_path_factory, postgres):
    database = postgres.create_database()
    pod = Pod(tmp_path_factory.mktemp("pgpod"), machines=4, db_url=postgres.url(database)).start()
    yield pod
    pod.stop()
    postgres.drop_database(database)


def test_partitions_on_postgresql_survive_a_restart(pod):
    pod.register()
    assert pod.user("create", "partition", "p1", "--size", "8").code == 0
    assert pod.user("create", "partition", "p2", "--size", "2").code == 0
    before = pod.snapshot()
    pod.stop_server()
    pod.start_server()
    assert pod.snapshot() == before
    assert [r[0] for r in rows(pod.user("list", "partitions").out)] == ["p1", "p2"]
    assert pod.user("remove", "partition", "p1").code == 0
    assert pod.held_anywhere("p1") == []
