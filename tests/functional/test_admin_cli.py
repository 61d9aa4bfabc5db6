"""vipu-admin against a real controller and real agents: agents, clusters, allocations."""

from __future__ import annotations

import json

import pytest

from tests.functional.harness import failed_line, pairs, rows, wait_until
from vipu.api.protos import admin_pb2


def create_agents(pod, count=4):
    for n, machine in enumerate(pod.rack.machines[:count], start=1):
        result = pod.admin("create", "agent", f"ag{n}", "--host", machine.host, "--port", str(machine.port))
        assert (result.code, result.out) == (0, f"create agent (ag{n}): success.\n"), result.err


def test_agents_are_registered_listed_shown_and_removed(pod):
    create_agents(pod)
    listing = pod.admin("list", "agents")
    assert listing.code == 0
    assert [row[0] for row in rows(listing.out)] == ["ag1", "ag2", "ag3", "ag4"]
    assert {row[3] for row in rows(listing.out)} == {"Up"}

    shown = pod.admin("get", "agent", "ag2")
    assert shown.code == 0
    fields = pairs(shown.out)
    machine = pod.rack.machines[1]
    assert (fields["Agent ID"], fields["Port"], fields["Status"]) == ("ag2", str(machine.port), "Up")
    assert (fields["Board Serial Number"], fields["Platform"]) == (machine.serial, "IPU-M2000")
    assert (fields["Discovery Mode"], fields["Num of IPUs"], fields["IPUoF Server Version"]) == ("Manual", "4", "2.5.1")
    assert [row[2] for row in rows(shown.out)] == ["-", "-", "-", "-"]

    as_json = json.loads(pod.admin("get", "agent", "ag2", "--json").out)
    assert as_json["inventory"]["machine_serial"] == machine.serial and len(as_json["ipus"]) == 4
    assert [a["id"] for a in json.loads(pod.admin("list", "agents", "--json").out)["agents"]] == ["ag1", "ag2", "ag3", "ag4"]

    assert pod.admin("remove", "agent", "ag4").out == "remove agent (ag4): success.\n"
    failed_line(pod.admin("get", "agent", "ag4"), "get agent", "ag4", "agent ag4 does not exist")


def test_bad_agents_are_refused_and_change_nothing(pod):
    create_agents(pod, 2)
    before = pod.snapshot()
    machine = pod.rack.machines[2]
    failed_line(pod.admin("create", "agent", "ag1", "--host", machine.host, "--port", str(machine.port)),
                "create agent", "ag1", "agent ag1 already exists")
    first = pod.rack.machines[0]
    failed_line(pod.admin("create", "agent", "other", "--host", first.host, "--port", str(first.port)),
                "create agent", "other", "agent ag1 already uses")
    failed_line(pod.admin("create", "agent", "ghost", "--host", "127.0.0.1", "--port", "1"),
                "create agent", "ghost", "cannot reach agent ghost at 127.0.0.1:1: unreachable (connection refused)")
    failed_line(pod.admin("create", "agent", "bad id!", "--host", "h", "--port", "5"), "create agent", "bad id!", "invalid agent id")
    failed_line(pod.admin("remove", "agent", "nope"), "remove agent", "nope", "agent nope does not exist")
    usage = pod.admin("create", "agent", "ag9", "--host", "h", "--port", "99999")
    assert usage.code == 2 and len(usage.err.splitlines()) == 1 and "99999" in usage.err and "Traceback" not in usage.err
    missing = pod.admin("create", "agent", "ag9", "--host", "h")
    assert missing.code == 2 and len(missing.err.splitlines()) == 1 and "--port" in missing.err
    assert pod.snapshot() == before


def test_clusters_keep_physical_order_and_their_topology(pod):
    create_agents(pod)
    result = pod.admin("create", "cluster", "cl0", "--agents", "ag1,ag2,ag3,ag4", "--topology", "torus")
    assert result.out == "create cluster (cl0): success.\n", result.err
    listing = pod.admin("list", "clusters")
    assert rows(listing.out) == [["cl0", "ag1 ag2 ag3 ag4", "torus", "1", "-", "-"]]
    shown = pod.admin("get", "cluster", "cl0")
    assert (pairs(shown.out)["Topology"], pairs(shown.out)["Num of IPUs"]) == ("torus", "16")
    assert json.loads(pod.admin("get", "cluster", "cl0", "--json").out)["agent_ids"] == ["ag1", "ag2", "ag3", "ag4"]
    assert pod.admin("remove", "cluster", "cl0").out == "remove cluster (cl0): success.\n"


def test_a_multi_domain_cluster_is_looped(pod):
    create_agents(pod)
    result = pod.admin("create", "cluster", "c2", "--agents", "ag1,ag2,ag3,ag4", "--num-ipulinkdomains", "2",
                       "--cluster-topology", "looped")
    assert result.code == 0, result.err
    shown = pod.admin("get", "cluster", "c2")
    assert pairs(shown.out)["Cluster Topology"] == "looped"
    assert rows(shown.out) == [["0", "0", "ag1"], ["0", "1", "ag2"], ["1", "0", "ag3"], ["1", "1", "ag4"]]


def test_bad_clusters_are_refused_and_change_nothing(pod):
    create_agents(pod)
    assert pod.admin("create", "cluster", "cl0", "--agents", "ag1,ag2").code == 0
    before = pod.snapshot()
    failed_line(pod.admin("create", "cluster", "cl0", "--agents", "ag3"), "create cluster", "cl0", "cluster cl0 already exists")
    failed_line(pod.admin("create", "cluster", "cl1", "--agents", "ag2,ag3"), "create cluster", "cl1",
                "agent ag2 is already in cluster cl0")
    failed_line(pod.admin("create", "cluster", "cl1", "--agents", "ag3,ag9"), "create cluster", "cl1", "agent ag9 does not exist")
    failed_line(pod.admin("create", "cluster", "cl1", "--agents", "ag3,ag3"), "create cluster", "cl1", "listed more than once")
    failed_line(pod.admin("create", "cluster", "cl1", "--agents", "ag3,ag4,ag2", "--num-ipulinkdomains", "2"),
                "create cluster", "cl1", "3 agents cannot form 2 IPU-Link domains")
    usage = pod.admin("create", "cluster", "cl1", "--agents", "ag3", "--topology", "ring")
    assert usage.code == 2 and len(usage.err.splitlines()) == 1
    assert pod.snapshot() == before


def test_allocations_take_consecutive_free_machines(pod):
    create_agents(pod)
    assert pod.admin("create", "cluster", "cl0", "--agents", "ag1,ag2,ag3,ag4").code == 0
    assert pod.admin("create", "allocation", "a1", "--cluster", "cl0", "--agents", "ag2,ag3").out == "create allocation (a1): success.\n"
    assert pod.admin("create", "allocation", "a2", "--cluster", "cl0", "--size", "4").code == 0
    listing = pod.admin("list", "allocations")
    assert rows(listing.out) == [["a1", "cl0", "ag2 ag3", "-"], ["a2", "cl0", "ag1", "-"]]
    assert pairs(pod.admin("get", "allocation", "a1").out)["Num of IPUs"] == "8"
    before = pod.snapshot()
    failed_line(pod.admin("create", "allocation", "a3", "--cluster", "cl0", "--agents", "ag3,ag4"),
                "create allocation", "a3", "agent ag3 is already in allocation a1")
    failed_line(pod.admin("create", "allocation", "a3", "--cluster", "cl0", "--agents", "ag4,ag1"),
                "create allocation", "a3", "agent ag1 is already in allocation a2")
    failed_line(pod.admin("create", "allocation", "a3", "--cluster", "cl0", "--size", "8"),
                "create allocation", "a3", "no 2 consecutive free machines")
    failed_line(pod.admin("create", "allocation", "a3", "--cluster", "cl9", "--size", "4"),
                "create allocation", "a3", "cluster cl9 does not exist")
    failed_line(pod.admin("create", "allocation", "a1", "--cluster", "cl0", "--size", "4"),
                "create allocation", "a1", "allocation a1 already exists")
    both = pod.admin("create", "allocation", "a3", "--cluster", "cl0", "--size", "4", "--agents", "ag4")
    assert both.code == 2 and "either --agents or --size" in both.err
    assert pod.snapshot() == before


def test_non_consecutive_machines_are_refused(pod):
    create_agents(pod)
    assert pod.admin("create", "cluster", "cl0", "--agents", "ag1,ag2,ag3,ag4").code == 0
    before = pod.snapshot()
    failed_line(pod.admin("create", "allocation", "a1", "--cluster", "cl0", "--agents", "ag1,ag3"),
                "create allocation", "a1", "not physically consecutive in cluster cl0")
    assert pod.snapshot() == before


def test_nothing_in_use_is_removed_without_force_and_force_says_what_it_tears_down(pod):
    create_agents(pod)
    assert pod.admin("create", "cluster", "cl0", "--agents", "ag1,ag2,ag3,ag4").code == 0
    assert pod.admin("create", "allocation", "a1", "--cluster", "cl0", "--size", "16").code == 0
    assert pod.user("create", "partition", "p1", "--size", "8").code == 0
    before = pod.snapshot()
    failed_line(pod.admin("remove", "allocation", "a1"), "remove allocation", "a1", "holds 1 partition(s) (p1)")
    failed_line(pod.admin("remove", "cluster", "cl0"), "remove cluster", "cl0", "has 1 allocation(s) (a1)")
    failed_line(pod.admin("remove", "agent", "ag1"), "remove agent", "ag1", "is in cluster cl0")
    assert pod.snapshot() == before

    removed = pod.admin("remove", "agent", "ag1", "--force")
    assert removed.lines == ["remove agent (ag1): success.", "removed with it: partition p1, allocation a1, cluster cl0"]
    assert pod.held_anywhere("p1") == []
    assert json.loads(pod.user("list", "partitions", "--json").out)["partitions"] == []
    assert [a["id"] for a in json.loads(pod.admin("list", "agents", "--json").out)["agents"]] == ["ag2", "ag3", "ag4"]


@pytest.mark.parametrize("command", [["list", "agent"], ["list", "agents"], ["get", "agents", "x"]])
def test_singular_and_plural_names_both_work(pod, command):
    result = pod.admin(*command)
    assert "No such command" not in result.err


def test_the_server_version_and_an_unreachable_server(pod):
    version = pod.admin("--server-version")
    assert version.lines == ["version: 0.1.0", f"host: 127.0.0.1:{pod.admin_port}"]
    result = pod._run("vipu-admin", 1, ["list", "agents"])
    failed_line(result, "list agents", None, "vipu-server at 127.0.0.1:1: unreachable (connection refused)")


def agents_of(pod, partition_id: str) -> set[str]:
    """The agents `vipu get partition` shows the partition's IPUs on."""
    shown = pod.user("get", "partition", partition_id)
    assert shown.code == 0, shown.err
    return {row[2] for row in rows(shown.out)}


def test_a_drain_moves_what_may_move_keeps_new_partitions_off_survives_a_restart_and_resumes(registered_pod):
    pod = registered_pod
    for name, relocatable in (("stays", ()), ("moves", ("--relocatable",))):
        created = pod.user("create", "partition", name, "--size", "2", *relocatable)
        assert created.code == 0, created.err
    assert agents_of(pod, "stays") == agents_of(pod, "moves") == {"ag1"}

    drained = pod.admin("drain", "agent", "ag1", "--reason", "cable repair")
    assert drained.code == 0, drained.err
    assert drained.out.startswith("agent ag1: DRAINING (stays left): cable repair, by an administrator since "), drained.out
    assert "ag1" not in agents_of(pod, "moves")  # moved while idle, before the answer
    assert set(pod.held("m01")) == {"stays"}  # the other is left to finish, and runs on
    stays = pairs(pod.user("get", "partition", "stays").out)
    assert stays["State"] == "ACTIVE" and stays["Drain"].startswith("agent ag1 is draining for cable repair"), stays
    samples = pod.metrics()
    assert (samples['vipu_agents_drained{state="draining"}'], samples['vipu_agents_drained{state="drained"}']) == (1, 0)
    assert pod.user("create", "partition", "new", "--size", "4").code == 0
    assert "ag1" not in agents_of(pod, "new")
    failed_line(pod.admin("drain", "agent", "ag1", "--reason", "another"), "drain agent", "ag1", "resume it first")
    failed_line(pod.admin("resume", "agent", "ag2"), "resume agent", "ag2", "agent ag2 is not drained")
    failed_line(pod.admin("drain", "agent", "ag1", "--reason", " "), "drain agent", "ag1", "a drain needs a reason")

    assert pod.user("remove", "partition", "stays").code == 0
    pod.stop_server()
    pod.start_server()
    listing = {row[0]: row[6] for row in rows(pod.admin("list", "agents").out)}
    assert listing["ag1"].startswith("DRAINED: cable repair, by an administrator since "), listing
    assert listing["ag2"] == "-"
    assert pairs(pod.admin("get", "agent", "ag1").out)["Drain"] == listing["ag1"]
    assert pod.metrics()['vipu_agents_drained{state="drained"}'] == 1
    refused = pod.user("create", "partition", "big", "--size", "32")  # all eight machines: not while one drains
    failed_line(refused, "create partition", "big", "agent ag1 is draining for cable repair")

    resumed = pod.admin("resume", "agent", "ag1")
    assert (resumed.code, resumed.out) == (0, "agent ag1 resumed\n"), resumed.err
    assert {row[0]: row[6] for row in rows(pod.admin("list", "agents").out)}["ag1"] == "-"

    cable = pod.admin_api.GetCabling(admin_pb2.GetRequest(id="cl0")).cables[0]
    ends = [cable.lower_agent_id, cable.upper_agent_id]
    by_cable = pod.admin("drain", "link", f"{cable.lower_agent_id}:{cable.lower_port}", "--reason", "new cable")
    assert [line.split(":")[0] for line in by_cable.out.splitlines()] == [f"agent {end}" for end in ends], by_cable.out
    assert pod.admin("resume", "link", f"{cable.upper_agent_id}:{cable.upper_port}").out == "".join(f"agent {e} resumed\n" for e in ends)
    failed_line(pod.admin("drain", "domain", "cl0:1", "--reason", "x"), "drain domain", "cl0:1", "cluster cl0 has 1 IPU-Link domain(s)")

    bad = pod.admin("drain", "agent", "ag1", "--reason", "repair", "--by", "soon")
    assert bad.code == 2 and len(bad.err.splitlines()) == 1 and "neither a time from now" in bad.err, bad.err
    [machine] = [name for name, held in ((m.name, pod.held(m.name)) for m in pod.rack.machines) if "new" in held]
    holder = f"ag{int(machine[1:])}"
    late = pod.admin("drain", "agent", holder, "--reason", "rack move", "--by", "3s")
    assert late.code == 0 and "what is left is removed at " in late.out, late.out
    assert "it is removed at " in pairs(pod.user("get", "partition", "new").out)["Drain"]
    wait_until(lambda: pod.held(machine) == {} and "new" not in pod.user("list", "partitions").out, timeout=30,
               what="the partition left past the drain's deadline to be removed")
    assert {row[0]: row[6] for row in rows(pod.admin("list", "agents").out)}[holder].startswith("DRAINED: rack move")


def test_a_maintenance_window_and_a_reservation_through_both_clis(registered_pod):
    pod = registered_pod
    made = pod.admin("create", "reservation", "mw1", "--agents", "ag1,ag2", "--start", "1h", "--end", "3h", "--maintenance",
                     "--reason", "firmware update")
    assert made.code == 0 and made.out.startswith("create reservation (mw1): success: maintenance window mw1 (firmware update) from "), \
        made.err
    for cli in (pod.admin, pod.user):
        [listed] = rows(cli("list", "reservations").out)
        assert listed[:5] == ["mw1", "maintenance window", "alloc-1", "8 (ag1 ag2)", "0"] and listed[7] == "TO COME", listed
    samples = pod.metrics()
    assert (samples['vipu_reserved_ipus{kind="maintenance_window",phase="to_come"}'],
            samples['vipu_reserved_ipus{kind="reservation",phase="under_way"}']) == (8, 0)
    for n in range(6):
        assert pod.user("create", "partition", f"full{n}", "--size", "4").code == 0  # ag3 to ag8
    failed_line(pod.user("create", "partition", "long", "--size", "4", "--expected-duration", "2h"), "create partition", "long",
                "kept for maintenance window mw1 (firmware update) from")
    short = pod.user("create", "partition", "short", "--size", "4", "--expected-duration", "10m")
    assert short.code == 0, short.err
    assert agents_of(pod, "short") <= {"ag1", "ag2"}

    failed_line(pod.admin("create", "reservation", "mw2", "--agents", "ag2", "--start", "2h", "--end", "4h", "--maintenance",
                          "--reason", "x"), "create reservation", "mw2", "reservation mw2 would hold ag2 while maintenance window mw1")
    failed_line(pod.admin("create", "reservation", "big", "--size", "64", "--users", "alice", "--end", "1h", "--reason", "x"),
                "create reservation", "big", "is larger than allocation alloc-1 (32 IPUs)")
    failed_line(pod.admin("create", "reservation", "old", "--agents", "ag3", "--end", "2020-01-01T00:00", "--maintenance",
                          "--reason", "x"), "create reservation", "old", "would end in the past")
    bad = pod.admin("create", "reservation", "x", "--agents", "ag3", "--start", "soon", "--end", "1h", "--maintenance", "--reason", "x")
    assert bad.code == 2 and len(bad.err.splitlines()) == 1 and "neither a time from now" in bad.err, bad.err
    failed_line(pod.admin("remove", "reservation", "nope"), "remove reservation", "nope", "reservation nope does not exist")

    assert pod.user("remove", "partition", "full0").code == 0
    train = pod.admin("create", "reservation", "train", "--size", "4", "--users", "alice", "--end", "1h", "--reason", "a demo")
    assert train.code == 0, train.err
    failed_line(pod.user("create", "partition", "other", "--size", "4"), "create partition", "other", "kept for reservation train")
    inside = pod.user("create", "partition", "demo", "--size", "4", "--reservation", "train")  # open mode: anyone may name it
    assert inside.code == 0, inside.err

    pod.stop_server()
    pod.start_server()
    listing = {row[0]: row for row in rows(pod.admin("list", "reservations").out)}
    assert set(listing) == {"mw1", "train"} and listing["train"][4] == "4" and listing["train"][7] == "UNDER WAY", listing
    assert pod.metrics()['vipu_reserved_ipus{kind="reservation",phase="under_way"}'] == 4
    for name in ("train", "mw1"):
        removed = pod.admin("remove", "reservation", name)
        assert removed.code == 0, removed.err
    assert rows(pod.admin("list", "reservations").out) == []


def test_accounts_quotas_borrowing_and_usage_through_both_clis(registered_pod):
    pod = registered_pod
    made = pod.admin("create", "account", "ml-a", "--users", "alice", "--quota", "8", "--cohort", "research")
    assert (made.code, made.out) == (0, "create account (ml-a): success.\n"), made.err
    assert pod.admin("create", "account", "ml-b", "--quota", "24", "--cohort", "research").code == 0
    failed_line(pod.user("create", "partition", "p1", "--size", "4"), "create partition", "p1",
                "allocation alloc-1 is shared by quotas and no account is named: name one (--account")
    assert pod.user("create", "partition", "p1", "--size", "8", "--account", "ml-a").code == 0
    borrowed = pod.user("create", "partition", "p2", "--size", "16", "--account", "ml-a", "--preemptible")
    assert borrowed.code == 0, borrowed.err  # ml-b's idle quota
    assert pairs(pod.user("get", "partition", "p2").out)["Account"] == "ml-a (preemptible)"
    listing = {row[0]: row for row in rows(pod.admin("list", "accounts").out)}
    assert listing["ml-a"][1:8] == ["research", "alice", "alloc-1", "8", "24", "16", "0"], listing
    assert pod.admin("set", "quota", "ml-a", "4", "--limit", "8+:partitions=1").code == 0  # below its use: nothing is evicted
    failed_line(pod.user("create", "partition", "p3", "--size", "8", "--account", "ml-a"), "create partition", "p3",
                "account ml-a is at its limit of at most 1 partition of 8 IPUs or more in allocation alloc-1")
    assert pod.metrics()['vipu_account_quota_ipus{account="ml-a",allocation="alloc-1"}'] == 4
    assert pod.metrics()['vipu_account_ipus{account="ml-a",allocation="alloc-1"}'] == 24

    before = pod.snapshot()
    failed_line(pod.admin("set", "quota", "nope", "4"), "set quota", "nope", "account nope does not exist")
    failed_line(pod.admin("set", "quota", "ml-a", "4", "--limit", "8:partitions=1"), "set quota", "ml-a", "a shape limit is SIZE+")
    failed_line(pod.admin("create", "account", "bad id!"), "create account", "bad id!", "invalid account id")
    failed_line(pod.admin("create", "account", "ml-a"), "create account", "ml-a", "account ml-a already exists")
    failed_line(pod.admin("remove", "account", "ml-a"), "remove account", "ml-a", "account ml-a holds 2 partitions (p1, p2)")
    for bad in (("set", "quota", "ml-a", "lots"), ("report", "usage", "--by", "team"), ("report", "usage", "--since", "soon")):
        usage = pod.admin(*bad)
        assert usage.code == 2 and len(usage.err.splitlines()) == 1 and "Traceback" not in usage.err, (bad, usage.err)
    assert pod.snapshot() == before

    assert pod.user("remove", "partition", "p1").code == 0
    report = pod.admin("report", "usage", "--since", "1h")  # earlier tests' partitions are on no account ("-")
    assert report.code == 0 and {row[0]: row[2] for row in rows(report.out)}["ml-a"] == "2", report.out
    assert pod.admin("report", "usage", "--since", "1h", "--csv").out.splitlines()[0] == "account,ipu_hours,partitions"
    as_json = json.loads(pod.admin("report", "usage", "--since", "1h", "--json").out)
    [ours] = [row for row in as_json["rows"] if row["account"] == "ml-a"]
    assert ours["partitions"] == 2 and ours["ipu_hours"] >= 0 and as_json["by"] == "account"
    by_user = json.loads(pod.admin("report", "usage", "--by", "user", "--since", "1h", "--json").out)
    assert by_user["by"] == "user" and [row["user"] for row in by_user["rows"]] == ["-"]  # open mode: one nameless user
    assert pod.metrics()['vipu_account_ipu_seconds_total{account="ml-a"}'] > 0
    assert pod.user("remove", "partition", "p2").code == 0
    for name in ("ml-a", "ml-b"):
        assert pod.admin("remove", "account", name).code == 0
    assert rows(pod.admin("list", "accounts").out) == []


def test_a_partition_template_is_made_whole_or_refused_whole(registered_pod):
    """vipu-admin apply template on real agents: a dry run places and makes nothing; a template is
    made, every partition ACTIVE where it says; one that does not fit, or whose machine refuses one
    partition, leaves nothing of it, in the controller or on any machine."""
    pod = registered_pod

    def made() -> dict[str, list[str]]:
        listing = pod.user("list", "partitions").out
        return {name: row for name, *row in rows(listing)} if listing.strip() else {}

    def held() -> set[str]:
        return {partition_id for machine in pod.rack.machines for partition_id in pod.held(machine.name)}

    dry = pod.admin("apply", "template", "2x8+4x4", "--allocation", "alloc-1", "--dry-run")
    assert dry.code == 0 and dry.out.splitlines()[-1] == \
        "apply template (2x8+4x4): dry run: 6 partitions would be made in allocation alloc-1; nothing was.", dry.err
    planned = {name: where for name, _, where in rows(dry.out)}
    assert list(planned) == ["2x8-4x4-1", "2x8-4x4-2", "2x8-4x4-3", "2x8-4x4-4", "2x8-4x4-5", "2x8-4x4-6"]
    assert made() == {} and held() == set()

    applied = pod.admin("apply", "template", "2x8+4x4", "--allocation", "alloc-1")
    assert applied.code == 0 and applied.out.splitlines()[-1] == \
        "apply template (2x8+4x4): success: 6 partitions made in allocation alloc-1.", applied.err
    assert {name: where for name, _, where in rows(applied.out)} == planned
    assert {name: row[-1] for name, row in made().items()} == dict.fromkeys(planned, "ACTIVE")
    assert held() == set(planned)
    failed_line(pod.admin("apply", "template", "1x4", "--allocation", "alloc-1", "--prefix", "2x8-4x4-"), "apply template", "1x4",
                "template 1x4: partition 2x8-4x4-1 already exists; nothing was made")
    for name in planned:
        assert pod.user("remove", "partition", name).code == 0

    failed_line(pod.admin("apply", "template", "2x16+1x4", "--allocation", "alloc-1"), "apply template", "2x16+1x4",
                "template 2x16+1x4: partition 2x16-1x4-3 (4 IPUs) does not fit beside the template's 2 before it: ")
    assert made() == {} and held() == set()

    pod.fault(pod.rack.machines[-1].name, "IPU-Link training failed")  # the last machine refuses what it is given
    try:
        refused = pod.admin("apply", "template", "4x8", "--allocation", "alloc-1")
        failed_line(refused, "apply template", "4x8", "could not be made: ")
        assert "IPU-Link training failed" in refused.err and refused.err.rstrip().endswith("; nothing was made."), refused.err
        assert made() == {} and held() == set()
    finally:
        pod.wipe_rack_only()
    failed_line(pod.admin("apply", "template", "2x3", "--allocation", "alloc-1"), "apply template", "2x3",
                "a partition's size must be a power of two, not 3")
