"""The link ledger on real agent processes and vipu-server (issue 32): a link made to degrade in the
rack is sampled, its trend makes it suspect at both ends of its cable, with the partition running
over it named and told; its history is there as a table and as JSON; a swapped cable is a new
cable naming the one it replaced; an idle relocatable partition moves off a link going bad; a
suspect link steers a new partition elsewhere and a failed one refuses only the shapes that need
it; a name that is no link is refused in one line."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import time
from datetime import UTC, datetime

import pytest

from tests.functional.harness import BIN, Pod, failed_line, pairs, rows, wait_until
from vipu.model.topology import INTERNAL_LINKS, PORT_COUNTS, LinkKind

pytestmark = pytest.mark.functional


@pytest.fixture(scope="module")
def pod(tmp_path_factory):
    # readings twice a second; suspect when two of the last three one-second windows grew; failed
    # links quarantined as they fail (remediation and its breaker are test_link_remediation's)
    started = Pod(tmp_path_factory.mktemp("links"), machines=4,
                  server_options=("--link-sample-interval", "0.5", "--link-trend", "2,3,1", "--link-remediation-attempts", "0",
                                  "--link-breaker-percent", "100")).start()
    started.register()
    yield started
    started.stop()


def sim(pod: Pod, *args: str) -> None:
    done = subprocess.run([str(BIN / "vipu-sim"), "fault", str(pod.rack_path), *args], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr


def links(pod: Pod, *args: str) -> dict[str, list[str]]:
    listed = pod.admin("list", "links", *args)
    assert listed.code == 0, listed.err
    return {row[0]: row for row in rows(listed.out)}


def test_every_link_is_sampled_and_healthy_with_its_cable(pod):
    plugged = sum(1 for machine in pod.rack.machines for kind in LinkKind for port in range(1, PORT_COUNTS[kind] + 1)
                  if pod.rack.plugged(machine.name, kind, port) is not None)
    expected = plugged + 4 * len(INTERNAL_LINKS)
    seen = wait_until(lambda: links(pod) if len(links(pod)) == expected else None, timeout=30, what=f"all {expected} links sampled")
    assert all(row[2] == "healthy" for row in seen.values())
    five = pairs(pod.admin("get", "link", "ag1:5").out)
    assert (five["Kind"], five["Health"], five["Up"]) == ("IPU-Link", "healthy", "yes") and "vipu-sim OSFP-DAC-1m" in five["Cable"]
    assert links(pod, "--suspect") == {}


def test_a_degrading_link_turns_suspect_at_both_ends_then_a_new_cable_starts_afresh(pod):
    assert pod.user("create", "partition", "p1", "--size", "8").code == 0  # on ag1 and ag2, over the cable from ag1:5 to ag2:1
    sim(pod, "--degrade", "m01:IPU-Link:5=steady:600")  # ten corrected errors a second
    suspect = wait_until(lambda: links(pod, "--suspect") if set(links(pod, "--suspect")) >= {"ag1:5", "ag2:1"} else None,
                         timeout=30, what="ag1:5 and its cable's other end to turn suspect")
    assert suspect["ag1:5"][2] == "suspect" and "of its last 3 windows of 1s" in suspect["ag1:5"][-1]
    assert set(links(pod, "--suspect", "--machine", "ag2")) == {"ag2:1"}
    over = links(pod, "--partition", "p1")  # ag1 and ag2 whole: their internal links, and the cables between them
    assert {"ag1:5", "ag2:1", "ag1:sync6", "ag2:sync2"} <= set(over) and not any(name.startswith(("ag3", "ag4")) for name in over)
    assert "ag2:5" not in over and set(links(pod, "--partition", "p1", "--suspect")) == {"ag1:5", "ag2:1"}
    failed_line(pod.admin("list", "links", "--partition", "p9"), "list links", None, "partition p9 does not exist")
    metrics = pod.metrics()
    assert metrics['vipu_link_unhealthy{health="suspect",link="ag1:5"}'] == 1 and metrics['vipu_links{health="suspect"}'] >= 2
    assert metrics['vipu_link_events{health="suspect"}'] >= 2

    detail = json.loads(pod.admin("get", "link", "ag1:5", "--history", "--json").out)
    assert detail["health"] == "suspect" and len(detail["samples"]) >= 3
    assert detail["events"][-1]["health"] == "suspect" and detail["events"][-1]["partitions"] == ["p1"]
    assert int(detail["samples"][-1]["corrected_errors"]) > int(detail["samples"][0]["corrected_errors"])
    shown = pod.admin("get", "link", "ag1:5", "--history")
    assert shown.code == 0 and "Errors Grew" in shown.out and " p1" in shown.out
    told = wait_until(lambda: (p := pairs(pod.user("get", "partition", "p1").out))["Links"] != "-" and p, timeout=10,
                      what="partition p1 to be told of the suspect link it runs over")
    assert told["Links"].startswith("link ag1:5 it runs over is suspect: its errors or recoveries grew in")

    old_serial = detail["cable"]["serial"]
    sim(pod, "--swap-cable", "m01:IPU-Link:5=SPARE-0042")
    wait_until(lambda: pairs(pod.admin("get", "link", "ag1:5").out)["Health"] == "healthy", timeout=30,
               what="the new cable's link to be healthy")
    cables = json.loads(pod.admin("get", "link", "ag1:5", "--history", "--json").out)["cables"]
    assert [(c["serial"], c["replaced"]) for c in cables] == [(old_serial, ""), ("SPARE-0042", old_serial)]
    wait_until(lambda: pairs(pod.user("get", "partition", "p1").out)["Links"] == "-", timeout=10,
               what="partition p1 to be told its links are healthy again")
    assert pod.user("remove", "partition", "p1").code == 0



def test_an_idle_relocatable_partition_moves_off_a_link_going_bad(pod):
    assert pod.user("create", "partition", "mover", "--size", "8", "--relocatable").code == 0
    assert {row[2] for row in rows(pod.user("get", "partition", "mover").out)} == {"ag1", "ag2"}
    sim(pod, "--degrade", "m01:IPU-Link:6=steady:600")  # the cable from ag1:6 to ag2:2, which it runs over
    moved = wait_until(lambda: (p := pairs(pod.user("get", "partition", "mover").out))["Relocated"] != "-" and p["State"] != "PENDING"
                       and p, timeout=30, what="mover to move off ag1:6 once it is suspect, and be configured there")
    assert moved["Relocated"].startswith("moved from ag1-ag2 to ag3-ag4") and "away from an unhealthy link (link ag1:6 it runs over" \
        in moved["Relocated"], moved["Relocated"]
    assert moved["State"] == "ACTIVE" and moved["Links"] == "-"
    assert {row[2] for row in rows(pod.user("get", "partition", "mover").out)} == {"ag3", "ag4"}
    assert pod.user("remove", "partition", "mover").code == 0
    sim(pod, "--recover", "m01:IPU-Link:6")
    wait_until(lambda: "ag1:6" not in links(pod, "--suspect"), timeout=30, what="ag1:6 to be healthy again")

def test_a_name_that_is_no_link_or_a_link_never_read_is_refused_in_one_line(pod):
    failed_line(pod.admin("get", "link", "ag1:port5"), "get link", "ag1:port5", "names no link")
    failed_line(pod.admin("get", "link", "ag9:5"), "get link", "ag9:5", "no link ag9:5 is in the ledger")
    refused = pod.admin("list", "links", "--since", "yesterday-ish")
    assert refused.code == 2 and "neither a time ago" in refused.err


def test_a_suspect_link_steers_a_new_partition_and_a_failed_one_refuses_only_the_shapes_that_need_it(pod):
    sim(pod, "--degrade", "m01:IPU-Link:5=steady:600", "--break", "m03:IPU-Link:5")
    unhealthy = wait_until(lambda: (found := links(pod, "--suspect")).keys() >= {"ag1:5", "ag3:5"} and found, timeout=30,
                           what="ag1:5 to turn suspect and ag3:5 to fail")
    assert unhealthy["ag3:5"][2] == "failed"

    def whole_pod_refused():
        """Refused once the owner has the ledger's word (which follows the ledger's commit)."""
        created = pod.user("create", "partition", "whole", "--size", "16")
        if created.code == 0:
            assert pod.user("remove", "partition", "whole").code == 0
        return created if "quarantined links" in created.err else None

    refused = wait_until(whole_pod_refused, timeout=30, what="the partition of all four machines to be refused for the failed ag3:5")
    failed_line(refused, "create partition", "whole", "every free place for 16 IPUs in allocation alloc-1 needs quarantined links: "
                "ag3:5 (failed: it is down: it stopped training); ag4:1 (failed: it is down: it stopped training)")

    # Best fit would take ag1 and ag2, over the suspect ag1:5; ag3 and ag4 need the failed ag3:5.
    assert pod.user("create", "partition", "steered", "--size", "8").code == 0
    steered = pairs(pod.user("get", "partition", "steered").out)
    assert [row[2] for row in rows(pod.user("get", "partition", "steered").out)][::4] == ["ag2", "ag3"]
    assert steered["Placement"].startswith("placed away from ag1:5 (suspect: its errors or recoveries grew in ")
    assert "ag2:1 (suspect: " in steered["Placement"] and steered["Links"] == "-"
    assert pod.user("remove", "partition", "steered").code == 0

    # Every machine, the two ends of the failed link's cable too, still takes a shape that does not need it.
    for name in ("m1", "m2", "m3", "m4"):
        assert pod.user("create", "partition", name, "--size", "4").code == 0
    on = {name: rows(pod.user("get", "partition", name).out)[0][2] for name in ("m1", "m2", "m3", "m4")}
    assert sorted(on.values()) == ["ag1", "ag2", "ag3", "ag4"]
    assert all(pairs(pod.user("get", "partition", name).out)["Placement"] == "-" for name in on)
    for name in on:
        assert pod.user("remove", "partition", name).code == 0


def test_a_week_of_readings_every_second_is_read_a_bounded_page_at_a_time(pod):
    """604,800 readings made one reply of 12 MB, past what a client takes: it failed for ever. Now
    a page holds the newest 10,000 and says how many older ones were left out, and --before pages back."""
    week, now = 7 * 86_400, int(time.time())  # whole seconds: --since and --before name them exactly
    wait_until(lambda: "ag4:5" in links(pod), timeout=30, what="ag4:5 in the ledger")
    began, ended = now - 3 * week, now - 2 * week  # a week long past: the readings the ledger takes now are not among them
    with sqlite3.connect(pod.db_url.removeprefix("sqlite:///")) as db:  # a week of readings of ag4:5, as the ledger keeps them
        db.executemany("INSERT INTO link_samples (agent_id, place, at, corrected, recoveries, up) VALUES ('ag4', '5', ?, ?, 0, 1)",
                       ((began + n, n) for n in range(week)))
    window = ("--since", datetime.fromtimestamp(began, UTC).isoformat(), "--before", datetime.fromtimestamp(ended, UTC).isoformat())
    answer = pod.admin("get", "link", "ag4:5", "--history", *window, "--json")
    assert answer.code == 0, answer.err
    page = json.loads(answer.out)
    assert (len(page["samples"]), page["samples_left_out"]) == (10_000, week - 10_000)
    assert page["samples"][-1]["at"] == began + week - 1  # the newest
    shown = pod.admin("get", "link", "ag4:5", "--history", *window, "--limit", "100")
    assert shown.code == 0, shown.err
    hint = shown.out.splitlines()[-1]
    assert hint.startswith(f"{week - 100} older readings not shown: --before ")
    before = hint.split("--before ")[1].split()[0]
    older = json.loads(pod.admin("get", "link", "ag4:5", "--history", "--since", window[1], "--before", before, "--limit", "100",
                                 "--json").out)
    assert (len(older["samples"]), older["samples_left_out"]) == (100, week - 200)
    assert older["samples"][-1]["at"] == began + week - 101  # the page just before the first one shown
