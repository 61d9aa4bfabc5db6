"""Rack descriptions: generated racks are cabled as the controller expects; bad files say where."""

from __future__ import annotations

import pytest

from vipu.backends.sim import faults
from vipu.backends.sim.rack import (
    PORT_COUNTS,
    Endpoint,
    IndexedRack,
    generate_rack,
    load_rack,
    parse_rack,
    rack_to_data,
    save_rack,
)
from vipu.model.entities import IldTopology
from vipu.model.errors import InvalidArgument
from vipu.model.topology import LinkKind


def test_a_generated_rack_round_trips_through_yaml(tmp_path):
    rack = generate_rack(8, topology=IldTopology.TORUS, num_ilds=2, agent_base_port=30001, with_exporters=True)
    save_rack(rack, tmp_path / "rack.yaml")
    loaded = load_rack(tmp_path / "rack.yaml")
    assert rack_to_data(loaded) == rack_to_data(rack)
    assert loaded.machines[3].port == 30004 and loaded.machines[3].exporter_port == 36004
    kinds = [c.kind for c in loaded.cables]
    assert (kinds.count(LinkKind.IPULINK), kinds.count(LinkKind.SYNC), kinds.count(LinkKind.GWLINK)) == (32, 12, 8)


def test_plugged_finds_the_far_end_of_a_cable():
    rack = generate_rack(2)
    cable, far = rack.plugged("m01", LinkKind.IPULINK, 6)
    assert far == Endpoint("m02", 2) and cable.serial.startswith("OSFP-I-")
    assert rack.plugged("m01", LinkKind.IPULINK, 1) is None


MACHINE = "machines:\n  - {name: m1, serial: S1, agent: {port: 9000}}\n  - {name: m2, serial: S2, agent: {port: 9001}}\n"


@pytest.mark.parametrize(
    "text, message",
    [
        ("machines: [", "line 1: not valid YAML"),
        ("name: r\n", "machines: a rack needs a non-empty list"),
        ("machines:\n  - {name: m1, agent: {port: 1}}\n", "machines[0]: 'serial' is missing"),
        ("machines:\n  - {name: m1, serial: S, agent: {port: 70000}}\n",
         "machines[0].agent: 'port' must be a whole number from 1 to 65535"),
        (MACHINE.replace("S2", "S1"), "machines[1]: serial S1 is also used by machines[0]"),
        (MACHINE.replace("9001", "9000"), "agent address ('127.0.0.1', 9000) is also used"),
        (MACHINE + "cables:\n  - {kind: IPU-Link, a: m1:9, b: m2:1}\n", "cables[0].a: IPU-Link ports are numbered 1 to 8"),
        (MACHINE + "cables:\n  - {kind: IPU-Link, a: m1:5, b: m3:1}\n", "cables[0].b: no machine named 'm3'"),
        (MACHINE + "cables:\n  - {kind: Laser, a: m1:5, b: m2:1}\n", "cables[0]: kind must be one of"),
        (MACHINE + "cables:\n  - {kind: Sync-Link, a: m1:6, b: m2:2}\n  - {kind: Sync-Link, a: m1:6, b: m2:3}\n",
         "cables[1]: Sync-Link port m1:6 already holds cables[0]"),
        (MACHINE.replace("agent: {port: 9000}", "agent: {port: 9000}, faults: {melt: true}"), "unknown fault 'melt'"),
    ],
)
def test_a_bad_rack_is_refused_with_the_place_of_the_mistake(text, message):
    with pytest.raises(InvalidArgument, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[").replace("]", r"\]")):
        parse_rack(text, "rack.yaml")


def test_a_missing_file_is_one_clear_error(tmp_path):
    with pytest.raises(InvalidArgument, match=r"cannot read rack description .*: no such file"):
        load_rack(tmp_path / "absent.yaml")


def test_faults_round_trip_and_bad_fault_fields_are_refused(tmp_path):
    from vipu.backends.sim import faults

    rack = generate_rack(2, time_scale=0.5)
    faults.set_errors(rack, "m01", "5", 327)
    faults.set_errors(rack, "m02", "ipu1:4C", 521)
    faults.break_link(rack, "m01", "6", LinkKind.SYNC)
    faults.break_link(rack, "m02", "ipu0:1A")
    faults.silence(rack, "m02")
    save_rack(rack, tmp_path / "rack.yaml")
    assert rack_to_data(load_rack(tmp_path / "rack.yaml")) == rack_to_data(rack)
    with pytest.raises(InvalidArgument, match=r"machines\[0\].link_errors: 'ipu9:1A' is not an internal link"):
        parse_rack(MACHINE.replace("agent: {port: 9000}", "agent: {port: 9000}, link_errors: {ipu9:1A: 3}"), "r")
    with pytest.raises(InvalidArgument, match=r"'silent' must be true or false"):
        parse_rack(MACHINE.replace("agent: {port: 9000}", "agent: {port: 9000}, faults: {silent: maybe}"), "r")
    with pytest.raises(InvalidArgument, match="time_scale: must be a number"):
        parse_rack(MACHINE + "time_scale: fast\n", "r")


def test_fault_functions_refuse_what_is_not_there():
    from vipu.backends.sim import faults

    rack = generate_rack(2)
    with pytest.raises(InvalidArgument, match="no IPU-Link cable is plugged into m02:5"):
        faults.unplug(rack, "m02", LinkKind.IPULINK, 5)
    with pytest.raises(InvalidArgument, match="there is already a cable in IPU-Link port m02:2"):
        faults.move(rack, "m02", LinkKind.IPULINK, 1, 2)
    with pytest.raises(InvalidArgument, match="has no component 'kernel'"):
        faults.set_version(rack, "m01", "kernel", "6")
    with pytest.raises(InvalidArgument, match="has no RNIC 'eth9'"):
        faults.set_pfc_classes(rack, "m01", "eth9", [])
    with pytest.raises(InvalidArgument, match="rack pod has no machine m09"):
        faults.silence(rack, "m09")
    with pytest.raises(InvalidArgument, match="unknown link kind 'laser'"):
        faults.kind_named("laser")


def test_an_indexed_rack_answers_as_the_rack_does():
    rack = generate_rack(8, topology=IldTopology.TORUS)
    faults.unplug(rack, "m03", LinkKind.IPULINK, 5)
    indexed = IndexedRack(rack)
    for machine in rack.machines:
        assert indexed.machine(machine.name) is rack.machine(machine.name)
        for kind, count in PORT_COUNTS.items():
            for port in range(1, count + 1):
                assert indexed.plugged(machine.name, kind, port) == rack.plugged(machine.name, kind, port)
    with pytest.raises(InvalidArgument, match=r"rack .* has no machine m99"):
        indexed.machine("m99")
