"""The simulator's links as the link ledger reads them: counters that unfold in time (steady
growth, bursts, flapping) until the link fails or recovers, and cables with an identity that a
swap changes. Faults are put in with vipu-sim's functions and survive the rack file."""

from __future__ import annotations

import time

import pytest

from vipu.backends.sim import faults
from vipu.backends.sim.machine import SIM_CABLE_MODEL, SIM_CABLE_VENDOR, RackFile, SimMachine
from vipu.backends.sim.rack import Degradation, generate_rack, load_rack, save_rack
from vipu.model.errors import InvalidArgument
from vipu.model.topology import INTERNAL_LINKS, LinkKind

T0 = 1_800_000_000.0


@pytest.mark.parametrize("pattern, at, expected", [
    ("steady", 0, (0, 0, True)), ("steady", 30, (15, 0, True)), ("steady", 120, (60, 0, True)),
    ("bursts", 10, (15, 0, True)), ("bursts", 20, (30, 0, True)), ("bursts", 50, (30, 0, True)), ("bursts", 70, (45, 0, True)),
    ("flapping", 90, (450, 45, True)),
])
def test_a_degrading_link_counts_as_its_pattern_says(pattern, at, expected):
    assert Degradation(pattern, T0, 30).counters(T0 + at) == expected


def test_a_degrading_link_fails_on_time_and_a_recovered_one_stops_growing_and_comes_back():
    failing = Degradation("steady", T0, 60, fails_after=300)
    assert failing.counters(T0 + 299)[2] and not failing.counters(T0 + 300)[2]
    recovered = Degradation("steady", T0, 60, fails_after=300, recovered_at=T0 + 400)
    assert recovered.counters(T0 + 400) == recovered.counters(T0 + 9000) == (400, 0, True)


@pytest.fixture
def rack_path(tmp_path):
    path = tmp_path / "rack.yaml"
    save_rack(generate_rack(2), path)
    return path


def readings(rack_path, machine: str = "m01") -> dict:
    return {r.place: r for r in SimMachine(RackFile(rack_path), machine).link_counters()}


def test_every_link_is_read_with_its_cable_and_a_healthy_one_counts_nothing(rack_path):
    seen = readings(rack_path)
    rack = load_rack(rack_path)
    plugged = {f"{prefix}{port}" for kind, prefix in ((LinkKind.IPULINK, ""), (LinkKind.SYNC, "sync"), (LinkKind.GWLINK, "gw"))
               for port in range(1, 9) if rack.plugged("m01", kind, port) is not None}
    assert set(seen) == plugged | {link.key for link in INTERNAL_LINKS} and len(INTERNAL_LINKS) == 16
    port = seen["5"]
    assert (port.corrected, port.recoveries, port.up, port.peer_serial, port.peer_port) == (0, 0, True, "0024.0001.8200001", 1)
    assert port.cable is not None and (port.cable.vendor, port.cable.model) == (SIM_CABLE_VENDOR, SIM_CABLE_MODEL)
    assert seen["ipu1:4C"].cable is None


def test_a_degradation_put_in_the_rack_file_unfolds_for_the_agent(rack_path):
    rack = load_rack(rack_path)
    faults.degrade(rack, "m01", "5", "steady", 600, since=time.time() - 60)  # ten a second, for a minute already
    faults.degrade(rack, "m01", "ipu1:4C", "flapping", 60, since=time.time() - 30, fails_after=10)
    save_rack(rack, rack_path)
    first = readings(rack_path)
    assert 600 <= first["5"].corrected < 700 and first["5"].up
    assert (first["ipu1:4C"].recoveries, first["ipu1:4C"].up) == (30, False)
    assert readings(rack_path, "m02")["1"].corrected >= first["5"].corrected  # the same cable, read a moment later at its other end

    rack = load_rack(rack_path)
    faults.recover(rack, "m01", "ipu1:4C", time.time())
    save_rack(rack, rack_path)
    assert readings(rack_path)["ipu1:4C"].up


def test_a_swapped_cable_is_a_new_cable_with_a_healthy_link(rack_path):
    rack = load_rack(rack_path)
    old_serial = rack.plugged("m01", LinkKind.IPULINK, 5)[0].serial
    faults.degrade(rack, "m01", "5", "bursts", 100, since=time.time() - 600)
    faults.swap_cable(rack, "m01", LinkKind.IPULINK, 5, "NEW-0001", vendor="Acme", model="OSFP-AOC-3m")
    save_rack(rack, rack_path)
    port = readings(rack_path)["5"]
    assert port.cable is not None and (port.cable.serial, port.cable.vendor, port.cable.model) == ("NEW-0001", "Acme", "OSFP-AOC-3m")
    assert (port.corrected, port.up) == (0, True) and old_serial != "NEW-0001"


@pytest.mark.parametrize("change, said", [
    (lambda r: faults.degrade(r, "m01", "5", "wobbly", 5, T0), "not 'wobbly'"),
    (lambda r: faults.degrade(r, "m01", "5", "steady", 0, T0), "1 or more events a minute"),
    (lambda r: faults.degrade(r, "m09", "5", "steady", 5, T0), "has no machine m09"),
    (lambda r: faults.recover(r, "m01", "5", T0), "is not degrading"),
    (lambda r: faults.recover(r, "m01", "ipu1:4C", T0), "is not degrading"),
    (lambda r: faults.swap_cable(r, "m01", LinkKind.IPULINK, 5, ""), "has a serial number"),
])
def test_a_fault_that_cannot_be_is_refused_saying_why(rack_path, change, said):
    with pytest.raises(InvalidArgument, match=said):
        change(load_rack(rack_path))
