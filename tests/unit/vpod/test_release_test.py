"""Which machines a failed release test holds back, and picking machines around them."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from vipu.backends.sim.rack import generate_rack
from vipu.model.entities import IldTopology
from vipu.model.errors import Conflict
from vipu.vpod.orchestrator import failing_machines
from vipu.vpod.site import pick_machines, site_machines
from vipu.vpod.store import SiteMachine

MACHINES = ["m1", "m2", "m3", "m10", "m1-b"]


def result(test: str, status: str, summary: list[str], passed: int = 0, total: int = 1):
    return SimpleNamespace(test=test, status=status, summary=summary, passed=passed, total=total)


def test_a_failing_test_holds_back_the_machines_its_lines_name_and_no_longer_names():
    results = [result("Sync-Link", "passed", ["Sync-Link test passed"], 3, 3),
               result("Cabling", "failed", ["Failed cables:", "m1:5 <--> 1:m2"], 11, 12),
               result("Traffic", "failed", ["Traffic test failed", "Errors encountered in traffic test 1",
                                            "m10:ipu1:4C <--> 4C:ipu2:m10: 521 link errors"], 0, 1),
               result("GW-Link", "failed", ["Failed GW-Links:", "m1-b:1 <--> 2:m3"], 1, 2),
               result("IPU-Link", "skipped", ["Test skipped", "an earlier dependency failed"])]
    assert failing_machines(results, MACHINES) == {
        "m1": "Cabling 11/12: m1:5 <--> 1:m2",
        "m2": "Cabling 11/12: m1:5 <--> 1:m2",
        "m10": "Traffic 0/1: m10:ipu1:4C <--> 4C:ipu2:m10: 521 link errors",
        "m1-b": "GW-Link 1/2: m1-b:1 <--> 2:m3",
        "m3": "GW-Link 1/2: m1-b:1 <--> 2:m3",
    }  # each with the lines naming it; neither "m10" nor "m1-b" names m1


def test_a_failing_test_that_names_no_machine_holds_back_every_machine_and_a_passing_run_none():
    results = [result("Version", "failed", ["Components with mismatched versions found:", "some component differs"])]
    assert failing_machines(results, MACHINES) == dict.fromkeys(MACHINES, "Version 0/1: some component differs")
    assert failing_machines([result("Cabling", "passed", ["Cabling test passed"], 12, 12)], MACHINES) == {}


def test_picking_passes_over_held_back_machines_and_says_so_when_nothing_fits():
    rack = generate_rack(6, topology=IldTopology.MESH)
    machines = site_machines(rack)
    machines[1] = SiteMachine(machines[1].name, 1, machines[1].host, machines[1].port, held_back="Cabling 11/12")
    assert pick_machines(rack, machines, 2, IldTopology.MESH, 1) == ["m03", "m04"]
    with pytest.raises(Conflict) as refused:
        pick_machines(rack, machines, 5, IldTopology.MESH, 1)
    assert refused.value.message == "no 5 free machines side by side: 5 of 6 are free (1 held back after a failed release test)"
