"""Relocation with real agents: a relocatable partition moves off a killed agent and off a machine whose
apply fails, keeping its id, says where and why, and an IPUoF run on its moved devices succeeds."""

from __future__ import annotations

import json
import re

import pytest

from tests.functional.harness import pairs, wait_until
from tests.functional.test_ipuof import ipuof

pytestmark = pytest.mark.functional

MOVED = re.compile(r"^moved from (\S+) to (\S+) on \S+ \S+ UTC: (.*)$")


def reaching_the_controller(pod) -> dict[str, str]:
    """What vipu-ipuof needs to read a partition's configuration again from vipu-server."""
    return {"VIPU_CLI_API_HOST": "127.0.0.1", "VIPU_CLI_API_PORT": str(pod.user_port)}


def devices(pod, partition_id: str) -> list[tuple[str, int]]:
    """Where the partition's IPUoF file says its devices are: (IPUoF end-point, device id)."""
    document = json.loads((pod.ipuof_dir / f"{partition_id}_ipuof.conf").read_text())
    return [(f"{d['ip']}:{d['server_port']}", d["device_id"]) for d in document["devices"]]


def endpoint(pod, machine: str) -> str:
    found = pod.rack.machine(machine)
    return f"{found.ipuof_host}:{found.ipuof_port}"


def test_a_relocatable_partition_moves_off_a_killed_agent_and_its_ipuof_run_follows_it(pod):
    pod.register(machines=4)
    assert pod.user("create", "partition", "mover", "--size", "4", "--relocatable").code == 0
    assert pod.user("create", "partition", "stays", "--size", "4").code == 0  # not relocatable: m02
    assert devices(pod, "mover") == [(endpoint(pod, "m01"), i) for i in range(4)]
    assert ipuof(pod, "--partition", "mover").code == 0

    pod.stop_agent("m01")  # its machine is gone
    shown = wait_until(lambda: (fields := pairs(pod.user("get", "partition", "mover").out))["State"] == "ACTIVE"
                       and fields["Relocated"] != "-" and fields, timeout=30, what="mover to move")
    source, target, why = MOVED.match(shown["Relocated"]).groups()
    assert (source, target) == ("ag1", "ag3") and why.startswith("agent ag1 is down: ")
    assert (shown["Relocatable"], shown["Auto-reset Retries"]) == ("yes", "1/3")
    assert [m for m in ("m02", "m03", "m04") if "mover" in pod.held(m)] == ["m03"]  # m01's agent is gone

    ran = ipuof(pod, "--partition", "mover", env=reaching_the_controller(pod))
    assert (ran.code, ran.out) == (0, "run (mover): success. 4 IPUs in 1 GCD(s) ran the test program; its IPUoF files were "
                                      "out of date (it moved) and are rewritten.\n"), ran.err
    assert devices(pod, "mover") == [(endpoint(pod, "m03"), i) for i in range(4)]
    assert ipuof(pod, "--partition", "mover").out == "run (mover): success. 4 IPUs in 1 GCD(s) ran the test program.\n"

    pod.start_agent("m01")  # back: the old settings it kept are cleared, the partition stays where it went
    pod.wait_for_agent("m01")
    wait_until(lambda: pod.held("m01") == {}, what="m01 to be cleared")
    assert pod.held_anywhere("mover") == ["m03"]


def test_a_relocatable_partition_whose_machine_fails_to_apply_it_is_made_elsewhere(pod):
    pod.register(machines=4)
    pod.fault("m01", "IPU 2 failed")
    created = pod.user("create", "partition", "p1", "--size", "4", "--relocatable")
    assert (created.code, created.out) == (0, "create partition (p1): success.\n"), created.err
    source, target, why = MOVED.match(pairs(pod.user("get", "partition", "p1").out)["Relocated"]).groups()
    assert (source, target, why) == ("ag1", "ag2", "agent ag1: m01: IPU 2 failed")
    assert devices(pod, "p1") == [(endpoint(pod, "m02"), i) for i in range(4)]  # the files name where it is
    assert ipuof(pod, "--partition", "p1").code == 0
    plain = pod.user("create", "partition", "p2", "--size", "4", "--allocation", "alloc-1")  # not relocatable: ag1 fails it
    assert plain.code == 1 and "partition p2 could not be created and was not kept: agent ag1: m01: IPU 2 failed" in plain.err


def test_reset_relocate_moves_a_partition_on_demand_and_rewrites_its_files(pod):
    pod.register(machines=2)
    assert pod.user("create", "partition", "p1", "--size", "4").code == 0
    moved = pod.user("reset", "partition", "p1", "--relocate")
    assert moved.out == "reset partition (p1): success.\n", moved.err
    assert MOVED.match(pairs(pod.user("get", "partition", "p1").out)["Relocated"]).groups() == ("ag1", "ag2", "asked for")
    assert devices(pod, "p1") == [(endpoint(pod, "m02"), i) for i in range(4)]
    assert ipuof(pod, "--partition", "p1").code == 0
    assert pod.user("create", "partition", "p2", "--size", "4").code == 0  # ag1
    refused = pod.user("reset", "partition", "p1", "--relocate")
    assert refused.code == 1 and refused.err == (
        "reset partition (p1): failed: no free 4-IPU run in allocation alloc-1 without ag2: all 4 of its IPUs are in use; "
        "it fits when p2 is removed.\n")
    assert pod.held_anywhere("p1") == ["m02"]
