"""Fixtures starting real controller and agent processes for the functional tests.

Starting processes is the slow part, so a module's tests share one pod of 8 machines, each with
its own agent process, and one vipu-server; every test starts from an empty controller over
empty, healthy agents and an intact rack file.
"""

from __future__ import annotations

import pytest

from tests.functional.harness import Pod


def pytest_collection_modifyitems(items):
    for item in items:
        if "tests/functional/" in str(item.fspath):
            item.add_marker(pytest.mark.functional)


@pytest.fixture(scope="module")
def module_pod(tmp_path_factory):
    pod = Pod(tmp_path_factory.mktemp("pod"), machines=8).start()
    yield pod
    pod.stop()


@pytest.fixture
def pod(module_pod):
    """The module's pod with nothing registered."""
    module_pod.wipe()
    yield module_pod


@pytest.fixture
def registered_pod(pod):
    """The module's pod as agents ag1..ag8, cluster cl0 and allocation alloc-1 of all of them."""
    return pod.register()
