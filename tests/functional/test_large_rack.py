"""A 64-machine rack of two looped torus domains, served by one agent process, tested in full."""

from __future__ import annotations

import time

import pytest

from tests.functional.harness import Pod
from tests.functional.test_cluster_tests import results
from vipu.api.protos import admin_pb2
from vipu.model.entities import IldTopology

MACHINES = 64


@pytest.fixture(scope="module")
def module_pod(tmp_path_factory):
    pod = Pod(tmp_path_factory.mktemp("pod64"), machines=MACHINES, topology=IldTopology.TORUS, ilds=2,
              time_scale=0.01, agent_processes=1).start()
    yield pod
    pod.stop()


def test_the_full_suite_on_64_machines_in_two_domains(pod, capsys):
    pod.register(topology=admin_pb2.ILD_TOPOLOGY_TORUS, ilds=2)
    started = time.monotonic()
    result = pod.admin("test", "cluster", "cl0")
    elapsed = time.monotonic() - started
    assert result.code == 0, result.out + result.err
    table = results(result.out)
    # 2 domains of 32: 32 x 4 IPU-Link cables each (torus) and 64 GW-Link cables
    assert table["Sync-Link"][0] == f"{2 * 31 * 2 + 64}/{2 * 31 * 2 + 64}"
    assert table["Cabling"][0] == f"{2 * 32 * 4 + 64}/{2 * 32 * 4 + 64}"
    assert table["IPU-Link"][0] == f"{2 * 32 * 4 + 64 * 16}/{2 * 32 * 4 + 64 * 16}"
    assert table["Traffic"][0] == "32/32"
    assert table["GW-Link"] == ("64/64", ["GW Link test passed"])
    assert "PFC-settings" not in table  # run by name only
    with capsys.disabled():
        print(f"\n  full cluster test of {MACHINES} machines at time scale 0.01: {elapsed:.1f}s")

    assert pod.user("create", "partition", "big", "--size", "256").code == 0
    assert pod.settings("m01", "big").gwlinks  # spans both domains over their GW-Links
    assert pod.user("remove", "partition", "big").code == 0
