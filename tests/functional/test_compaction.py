"""Planned compaction on a real controller and real agents: a dry run changes nothing, a plan moves
exactly the partitions it names and keeps their ids and attach keys, never moves one with an IPUoF
client attached without its user's consent, and the budget refuses the move beyond it (after a
restart too); and a
request waiting for room it cannot have although enough IPUs are free is started by the compaction
the queue makes for it; a relocatable partition being reset goes where it leaves a larger shape free.

Its own pod of four machines (16 IPUs), one partition of one machine on each, then the second and
fourth removed: 8 IPUs are free but no two free machines are neighbours, so a partition of 8 IPUs
fits only once the third (relocatable) moves. The first is not relocatable, so the plan can only
move the third. The server allows one compaction move an hour."""

from __future__ import annotations

import json
import os
import subprocess

import pytest

from tests.functional.harness import BIN, Pod, wait_until
from tests.functional.test_ipuof_attach import clients
from tests.functional.test_queue import reaching_the_controller
from tests.processes import dying_with_parent
from vipu.ipuof.files import attach_key_of


@pytest.fixture(scope="module")
def module_pod(tmp_path_factory):
    pod = Pod(tmp_path_factory.mktemp("pod"), machines=4, server_options=("--compaction-moves-per-hour", "1")).start()
    yield pod
    pod.stop()


@pytest.fixture(scope="module")
def broken_up(module_pod):
    return break_up(module_pod.register())


def break_up(pod: Pod) -> Pod:
    for name, relocatable in (("pa", ()), ("pb", ()), ("pc", ("--relocatable",)), ("pd", ())):
        created = pod.user("create", "partition", name, "--size", "4", *relocatable)
        assert created.code == 0, created.err
    for name in ("pb", "pd"):
        assert pod.user("remove", "partition", name).code == 0
    refused = pod.user("create", "partition", "big", "--size", "8")
    assert refused.code == 1 and "no free 8-IPU run" in refused.err
    return pod


def status(pod: Pod, partition_id: str) -> dict:
    shown = pod.user("get", "partition", partition_id, "--json")
    assert shown.code == 0, shown.err
    return json.loads(shown.out)["status"]


def attach_key(pod: Pod, partition_id: str) -> str | None:
    return attach_key_of(pod.ipuof_dir / f"{partition_id}_ipuof.conf")


def test_a_dry_run_shows_the_plan_and_changes_nothing(broken_up):
    pod = broken_up
    before = status(pod, "pc")
    planned = pod.admin("compact", "alloc-1", "--dry-run")
    assert planned.code == 0, planned.err
    rows = [line.split("|") for line in planned.out.splitlines() if "|" in line][1:]
    assert [[cell.strip() for cell in row] for row in rows] == [["pc", "ag3", "ag4", "planned"]]
    assert "dry run: 1 move would free 8 IPUs at" in planned.out
    assert status(pod, "pc") == before
    assert pod.user("create", "partition", "big", "--size", "8").code == 1


def test_an_attached_partition_is_not_moved_then_an_idle_one_is_keeping_its_id_and_key_and_the_budget_holds(broken_up):
    pod = broken_up
    key = attach_key(pod, "pc")
    holding = subprocess.Popen(dying_with_parent([str(BIN / "vipu-ipuof"), "attach", "pc", "--hold", "600"]),
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env={**os.environ, "VIPU_IPUOF_DIR": str(pod.ipuof_dir)})
    try:
        wait_until(lambda: clients(pod, "pc") == [0, 0, 1, 0], what="pc's client to show at its agent")
        refused = pod.admin("compact", "alloc-1")
        assert refused.code == 1
        assert refused.err.strip() == ("compact (alloc-1): failed: stopped after 0 of 1 move: partition pc did not move: "
                                        "partition pc has 1 IPUoF client(s) attached at agent ag3.")
        assert status(pod, "pc")["relocation"] == ""
    finally:
        holding.terminate()
        holding.communicate(timeout=30)
    wait_until(lambda: clients(pod, "pc") == [0, 0, 0, 0], what="pc's client to detach")

    done = pod.admin("compact", "alloc-1")
    assert done.code == 0, done.err
    assert "success. 1 move freed 8 IPUs at" in done.out
    moved = status(pod, "pc")
    assert moved["relocation"].startswith("moved from ag3 to ") and "compaction asked by an administrator" in moved["relocation"]
    ran = subprocess.run([str(BIN / "vipu-ipuof"), "run", "--partition", "pc"], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "VIPU_IPUOF_DIR": str(pod.ipuof_dir), **reaching_the_controller(pod)})
    assert ran.returncode == 0 and "out of date (it moved)" in ran.stdout, ran.stderr  # its files are read again
    assert attach_key(pod, "pc") == key
    assert pod.user("create", "partition", "big", "--size", "8").code == 0
    assert status(pod, "pa")["relocation"] == ""

    assert pod.user("remove", "partition", "big").code == 0
    again = pod.admin("compact", "alloc-1", "--dry-run")
    assert again.code == 1
    assert "no plan: the budget of 1 compaction moves per hour is spent; the next move is allowed in" in again.err

    pod.stop_server()  # the budget spent is recorded on the partition moved, and counted again by the next controller
    pod.start_server()
    after_restart = pod.admin("compact", "alloc-1", "--dry-run")
    assert after_restart.code == 1
    assert "no plan: the budget of 1 compaction moves per hour is spent; the next move is allowed in" in after_restart.err


def test_a_waiting_request_is_started_by_the_compaction_made_for_it(module_pod):
    pod = module_pod
    pod.wipe()
    break_up(pod.register())  # an allocation made anew, with a budget of its own
    waited = pod.user("create", "partition", "big", "--size", "8", "--wait")
    assert waited.code == 0, waited.err
    moved = status(pod, "pc")
    assert moved["relocation"].startswith("moved from ag3 to ") and "compaction asked by the queue for big" in moved["relocation"]
    assert status(pod, "big")["ready_state"] == "PS_ACTIVE"
    assert status(pod, "pa")["relocation"] == ""  # not relocatable: never moved
    pod.logged("allocation alloc-1: 1 move(s) to free 8 IPUs for waiting request big")


def test_a_relocatable_partition_reset_is_placed_where_it_leaves_a_larger_shape_free(module_pod):
    pod = module_pod
    pod.wipe()
    break_up(pod.register())  # pc alone between two free machines: 8 IPUs free, 4 the largest that fits
    reset = pod.user("reset", "partition", "pc")
    assert reset.code == 0, reset.err
    moved = status(pod, "pc")
    assert moved["relocation"].startswith("moved from ag3 to ") and "reset where it leaves a larger shape free" in moved["relocation"]
    assert status(pod, "pc")["ready_state"] == "PS_ACTIVE"
    assert pod.user("reset", "partition", "pc").code == 0  # a second reset: anywhere else would break the free run up again
    assert status(pod, "pc")["relocation"] == moved["relocation"]
    assert pod.user("create", "partition", "big", "--size", "8").code == 0
    assert pod.user("reset", "partition", "pa").code == 0  # not relocatable: reset in place
    assert status(pod, "pa")["relocation"] == ""
