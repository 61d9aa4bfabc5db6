"""The cluster tests' counting and judgement, on observations from real simulated machines."""

from __future__ import annotations

from itertools import pairwise

import pytest

from vipu.backends.sim import faults
from vipu.backends.sim.machine import RackFile, SimMachine
from vipu.backends.sim.rack import generate_rack, save_rack
from vipu.model import clustertests as ct
from vipu.model.clustertests import Probe, Status
from vipu.model.entities import GwTopology, IldTopology
from vipu.model.topology import ClusterLayout, LinkKind


class Bench:
    """A rack of simulated machines in-process, as agents ag1..agN of one cluster."""

    def __init__(self, tmp_path, machines=8, topology=IldTopology.MESH, ilds=1):
        self.path = tmp_path / "rack.yaml"
        self.rack = generate_rack(machines, topology=topology, num_ilds=ilds, time_scale=0)
        save_rack(self.rack, self.path)
        rack_file = RackFile(self.path)
        self.machines = {f"ag{n}": SimMachine(rack_file, m.name) for n, m in enumerate(self.rack.machines, start=1)}
        ids = tuple(self.machines)
        self.layout = ClusterLayout(ids, topology, ilds, GwTopology.LOOPED if ilds > 1 else None)
        self.serials = {a: m.inventory().serial for a, m in self.machines.items()}
        self.chips = {a: {i.index: i.chip_id for i in m.inventory().ipus} for a, m in self.machines.items()}

    def fault(self, change) -> None:
        change(self.rack)
        save_rack(self.rack, self.path)

    def observe(self, probe, ipus=lambda agent: {}, seed=0, agents=None):
        return {a: (None if m.silent() else m.diagnose(probe, ipus(a), seed))
                for a, m in self.machines.items() if agents is None or a in agents}

    def sync(self):
        return ct.judge_sync(self.layout, self.observe(Probe.SYNC), self.serials)

    def cabling(self):
        return ct.judge_cabling(self.layout, self.observe(Probe.CABLING))

    def ipulink(self):
        return ct.judge_ipulink(self.layout, self.observe(Probe.IPULINK), self.serials)

    def traffic(self):
        windows = []
        for number, window in enumerate(ct.traffic_windows(self.layout), start=1):
            place = {a: p for p, a in enumerate(window)}
            observations = self.observe(Probe.TRAFFIC, lambda a, place=place: {i: place[a] * 4 + i for i in range(4)},
                                        number, set(window))
            windows.append(ct.judge_traffic_window(number, window, self.layout, observations, self.serials, self.chips, number))
        return ct.traffic_outcome(windows)

    def gwlink(self):
        return ct.judge_gwlink(self.layout, self.observe(Probe.GWLINK), self.serials)

    def versions(self):
        return ct.judge_versions(self.layout.agent_ids,
                                 {a: None if m.silent() else m.inventory().versions for a, m in self.machines.items()})

    def pfc(self):
        return ct.judge_pfc(self.layout.agent_ids, self.observe(Probe.PFC))


def counts(outcome):
    return outcome.status, f"{outcome.passed}/{outcome.total}"


@pytest.mark.parametrize(
    "machines, topology, ilds, expected",
    [
        # seed 002: an 8-machine single-ILD cluster
        (8, IldTopology.MESH, 1, {"sync": "14/14", "cabling": "28/28", "ipulink": "156/156", "traffic": "3/3", "gwlink": "0/0"}),
        # the seed's four overlapping traffic tests in an 8-machine torus
        (8, IldTopology.TORUS, 1, {"sync": "14/14", "cabling": "32/32", "ipulink": "160/160", "traffic": "4/4", "gwlink": "0/0"}),
        # two looped ILDs of two machines: 12 cables (SPEC-NOTES), sync over GW-Links too
        (4, IldTopology.MESH, 2, {"sync": "8/8", "cabling": "12/12", "ipulink": "72/72", "traffic": "2/2", "gwlink": "4/4"}),
    ],
)
def test_a_healthy_rack_passes_every_test_with_the_seeds_counts(tmp_path, machines, topology, ilds, expected):
    bench = Bench(tmp_path, machines, topology, ilds)
    for name, count in expected.items():
        assert counts(getattr(bench, name)()) == (Status.PASSED, count), name
    assert counts(bench.versions()) == (Status.PASSED, "6/6")
    assert counts(bench.pfc()) == (Status.PASSED, f"{machines}/{machines}")
    assert bench.gwlink().summary == (["GW Link test skipped"] if ilds == 1 else ["GW Link test passed"])


def test_a_failing_sync_link_is_named_by_its_ports(tmp_path):
    bench = Bench(tmp_path, 8)
    bench.fault(lambda r: (faults.break_link(r, "m01", "6", LinkKind.SYNC), faults.break_link(r, "m01", "7", LinkKind.SYNC)))
    outcome = bench.sync()
    assert counts(outcome) == (Status.FAILED, "12/14")
    assert outcome.summary == ["Failed Sync Links:", "ag1:6 <--> 2:ag2", "ag1:7 <--> 3:ag2"]


def test_missing_wrong_port_and_gw_cables_are_reported_as_the_seed_shows(tmp_path):
    bench = Bench(tmp_path, 4)
    bench.fault(lambda r: [faults.unplug(r, "m01", LinkKind.IPULINK, p) for p in (5, 6, 7, 8)])
    assert bench.cabling().summary == [f"ag1:{p} [IPU-Link] <--> ag2:{p - 4} [IPU-Link] (failed)" for p in (5, 6, 7, 8)]
    assert counts(bench.cabling()) == (Status.FAILED, "8/12")

    (tmp_path / "moved").mkdir()
    moved = Bench(tmp_path / "moved", 4)
    moved.fault(lambda r: faults.move(r, "m04", LinkKind.IPULINK, 3, 7))
    assert moved.cabling().summary == [
        "Cables not connected as expected:",
        "ag3 (IPU-Cluster Port 7) <--> ag4 (IPU-Cluster Port 3) (connected to wrong port)",
    ]

    (tmp_path / "gw").mkdir()
    looped = Bench(tmp_path / "gw", 4, ilds=2)
    looped.fault(lambda r: faults.unplug(r, "m01", LinkKind.GWLINK, 1))
    assert counts(looped.cabling()) == (Status.FAILED, "11/12")
    assert looped.cabling().summary == ["ag1:1 [GW-Link] <--> ag3:2 [GW-Link] (failed)"]
    assert looped.gwlink().summary == ["Failed GW-Links:", "ag1:1 <--> 2:ag3"]


def test_crossed_cables_fail_cabling_and_training(tmp_path):
    bench = Bench(tmp_path, 3)
    bench.fault(lambda r: faults.cross(r, "m02", LinkKind.IPULINK, 1, "m02", 2))
    assert bench.cabling().summary == [
        "Cables not connected as expected:",
        "ag1 (IPU-Cluster Port 5) <--> ag2 (IPU-Cluster Port 1) (connected to wrong port)",
        "ag1 (IPU-Cluster Port 6) <--> ag2 (IPU-Cluster Port 2) (connected to wrong port)",
    ]
    assert bench.ipulink().summary == ["Links that did not train:", "ag1:5 <--> 1:ag2", "ag1:6 <--> 2:ag2"]


def test_links_over_the_error_threshold_fail_their_traffic_windows(tmp_path):
    bench = Bench(tmp_path, 8)
    # Windows: ag1-ag4, ag3-ag6, ag5-ag8. 300 errors is at the threshold, not over it.
    bench.fault(lambda r: (faults.set_errors(r, "m02", "5", 327), faults.set_errors(r, "m02", "ipu1:4C", 521),
                           faults.set_errors(r, "m04", "6", 400), faults.set_errors(r, "m06", "5", 300)))
    outcome = bench.traffic()
    assert counts(outcome) == (Status.FAILED, "1/3")
    assert outcome.summary == [
        "Traffic test failed",
        "Errors encountered in traffic test 1", "ag3:1 <--> ag2:5: 327 link errors", "ag2:ipu1:4C <--> 4C:ipu3:ag2: 521 link errors",
        "Errors encountered in traffic test 2", "ag5:2 <--> ag4:6: 400 link errors",
    ]


def test_an_internal_link_that_does_not_come_up_fails_training(tmp_path):
    bench = Bench(tmp_path, 2)
    bench.fault(lambda r: faults.break_link(r, "m02", "ipu0:1A"))
    assert bench.ipulink().summary == ["Links that did not train:", "ag2:ipu0:1A <--> 1A:ipu1:ag2"]
    assert counts(bench.ipulink()) == (Status.FAILED, "35/36")


def test_a_version_mismatch_lists_the_component_on_every_agent(tmp_path):
    bench = Bench(tmp_path, 8)
    bench.fault(lambda r: faults.set_version(r, "m08", "agent", "1.5.1"))
    outcome = bench.versions()
    assert counts(outcome) == (Status.FAILED, "5/6")
    assert outcome.summary == ["Components with mismatched versions found:"] + [
        f"ag{n}-Agent: {'1.5.1' if n == 8 else bench.rack.machines[0].versions['agent']}" for n in range(1, 9)
    ]


def test_bad_pfc_classes_are_shown_got_against_expected(tmp_path):
    bench = Bench(tmp_path, 8)
    bench.fault(lambda r: (faults.set_pfc_classes(r, "m05", "eth1", [0, 2]), faults.set_pfc_classes(r, "m07", "eth1", [])))
    outcome = bench.pfc()
    assert counts(outcome) == (Status.FAILED, "6/8")
    assert outcome.summary == [
        "PFC settings not as expected:",
        "ag5: {eth1: pfc classes: got [0, 2], expected [0 1 2 3 4 5 6 7]}",
        "ag7: {eth1: pfc classes: got [], expected [0 1 2 3 4 5 6 7]}",
    ]


def test_a_machine_that_does_not_answer_fails_every_element_it_takes_part_in(tmp_path):
    bench = Bench(tmp_path, 4)
    bench.fault(lambda r: faults.silence(r, "m02"))
    sync = bench.sync()
    assert counts(sync) == (Status.FAILED, "2/6")
    assert sync.summary[:2] == ["Failed Sync Links:", "ag2: does not answer"]
    assert bench.versions().summary == ["Components with mismatched versions found:", "ag2: does not answer"]
    assert bench.pfc().summary == ["PFC settings not as expected:", "ag2: does not answer"]


def verdicts(bench, *outcomes) -> dict[str, tuple[str, tuple[str, ...]]]:
    return {r.cable.key: (r.verdict.value, r.lines) for r in ct.cable_results(bench.layout, list(outcomes))}


def test_each_cable_takes_the_verdict_of_the_tests_that_judged_it_with_their_lines(tmp_path):
    bench = Bench(tmp_path, 4, ilds=2)
    bench.fault(lambda r: (faults.unplug(r, "m01", LinkKind.IPULINK, 5), faults.break_link(r, "m03", "6", LinkKind.SYNC)))
    sync, cabling = bench.sync(), bench.cabling()
    ipulink = ct.skipped(ct.TestType.IPULINK, ct.TestType.CABLING)
    results = verdicts(bench, sync, cabling, ipulink)
    assert len(results) == len(bench.layout.cables()) == 4 * 2 + 2 * 2 + 4  # IPU-Link, Sync-Link and GW-Link cables
    assert results["IPU-Link ag1:5 ag2:1"] == ("failed", ("Cabling: ag1:5 [IPU-Link] <--> ag2:1 [IPU-Link] (failed)",))
    assert results["Sync-Link ag3:6 ag4:2"] == ("failed", ("Sync-Link: ag3:6 <--> 2:ag4",))
    assert results["IPU-Link ag1:6 ag2:2"] == ("passed", ())  # judged by Cabling; IPU-Link training was skipped
    assert results["GW-Link ag1:1 ag3:2"] == ("passed", ())
    assert sorted(verdict for verdict, _ in results.values()).count("failed") == 2

    unjudged = verdicts(bench, bench.versions(), ipulink)
    assert {verdict for verdict, _ in unjudged.values()} == {"untested"}
    assert {verdict for verdict, _ in verdicts(bench).values()} == {"untested"}


def test_a_cluster_keeps_each_cables_verdict_until_a_later_test_of_it_judges_that_cable(tmp_path):
    bench = Bench(tmp_path, 4)
    bench.fault(lambda r: faults.unplug(r, "m01", LinkKind.IPULINK, 5))

    def results(kept) -> dict[str, tuple[str, tuple[str, ...]]]:
        return {r.cable.key: (r.verdict.value, r.lines) for r in ct.kept_results(bench.layout, kept)}

    assert {verdict for verdict, _ in results(None).values()} == {"untested"}
    first = ct.kept_verdicts(None, bench.layout, ct.TestRun("cl0", ct.RunState.FINISHED, [], [bench.sync(), bench.cabling()]))
    judged = results(first)
    assert judged == verdicts(bench, bench.sync(), bench.cabling())  # of one run: that run's verdicts
    assert judged["IPU-Link ag1:5 ag2:1"][0] == "failed" and {verdict for verdict, _ in judged.values()} == {"failed", "passed"}

    running = ct.kept_verdicts(first, bench.layout, ct.TestRun("cl0", ct.RunState.RUNNING, [], [bench.versions()]))
    assert running.run_state is ct.RunState.RUNNING and results(running) == judged  # a test that judges no cable
    bench.fault(lambda r: faults.break_link(r, "m03", "6", LinkKind.SYNC))
    later = results(ct.kept_verdicts(running, bench.layout, ct.TestRun("cl0", ct.RunState.STOPPED, [], [bench.sync()])))
    assert later.pop("Sync-Link ag3:6 ag4:2") == ("failed", ("Sync-Link: ag3:6 <--> 2:ag4",))
    assert later == {key: verdict for key, verdict in judged.items() if key != "Sync-Link ag3:6 ag4:2"}  # the rest as they were


def test_a_cable_failing_in_traffic_and_training_keeps_every_test_line(tmp_path):
    bench = Bench(tmp_path, 4)
    bench.fault(lambda r: faults.set_errors(r, "m02", "5", 327))
    assert verdicts(bench, bench.ipulink(), bench.traffic())["IPU-Link ag2:5 ag3:1"] == (
        "failed", ("Traffic: traffic test 1: ag3:1 <--> ag2:5: 327 link errors",))
    bench.fault(lambda r: faults.unplug(r, "m02", LinkKind.IPULINK, 5))
    lines = verdicts(bench, bench.ipulink(), bench.traffic())["IPU-Link ag2:5 ag3:1"]
    assert lines == ("failed", ("IPU-Link: ag2:5 <--> 1:ag3", "Traffic: traffic test 1: ag3:1 <--> ag2:5: link down"))


def test_dependencies_skip_with_the_first_failed_dependency_named():
    failed = ct.Outcome(ct.TestType.CABLING, Status.FAILED, 11, 12, [])
    outcomes = {ct.TestType.SYNC: ct.Outcome(ct.TestType.SYNC, Status.PASSED, 6, 6, []), ct.TestType.CABLING: failed}
    outcomes[ct.TestType.IPULINK] = ct.skipped(ct.TestType.IPULINK, ct.failed_dependency(ct.TestType.IPULINK, outcomes))
    assert ct.failed_dependency(ct.TestType.TRAFFIC, outcomes) is ct.TestType.CABLING
    assert ct.failed_dependency(ct.TestType.GWLINK, outcomes) is ct.TestType.CABLING
    assert ct.failed_dependency(ct.TestType.VERSION, outcomes) is None
    assert ct.skipped(ct.TestType.TRAFFIC, ct.TestType.CABLING).summary == [
        "Test skipped", "Test did not run because of an earlier dependency test failure (Cabling)"
    ]
    assert ct.plan(set()) == [ct.TestType.SYNC, ct.TestType.CABLING, ct.TestType.IPULINK, ct.TestType.TRAFFIC, ct.TestType.GWLINK,
                              ct.TestType.VERSION]  # seed 002's six; PFC-settings only when asked for
    assert ct.plan({ct.TestType.PFC}) == [ct.TestType.PFC]
    assert ct.plan({ct.TestType.GWLINK, ct.TestType.CABLING}) == [ct.TestType.CABLING, ct.TestType.GWLINK]


@pytest.mark.parametrize("machines, topology, windows", [
    (1, IldTopology.MESH, 1), (4, IldTopology.MESH, 1), (5, IldTopology.MESH, 2), (8, IldTopology.MESH, 3),
    (8, IldTopology.TORUS, 4), (16, IldTopology.TORUS, 8), (64, IldTopology.MESH, 31),
])
def test_traffic_windows_hold_at_most_16_ipus_and_cover_every_link(machines, topology, windows):
    layout = ClusterLayout([f"ag{i}" for i in range(machines)], topology)
    found = ct.traffic_windows(layout)
    assert len(found) == windows
    assert all(len(w) <= 4 for w in found)
    covered = {(a, b) for w in found for a, b in pairwise(w)}
    assert all((lower, upper) in covered for lower, upper, _ in layout.vertical_pairs()) or machines <= 4


@pytest.mark.parametrize("machines, topology, ilds", [(8, IldTopology.MESH, 1), (64, IldTopology.TORUS, 2), (7, IldTopology.MESH, 1)])
def test_traffic_phases_never_run_overlapping_windows_together(machines, topology, ilds):
    layout = ClusterLayout([f"ag{i}" for i in range(machines)], topology, ilds)
    windows = ct.traffic_windows(layout)
    phases = ct.traffic_phases(windows)
    assert sorted(n for phase in phases for n in phase) == list(range(1, len(windows) + 1))
    for phase in phases:
        used = [a for n in phase for a in windows[n - 1]]
        assert len(used) == len(set(used))
    assert len(phases) <= 3
