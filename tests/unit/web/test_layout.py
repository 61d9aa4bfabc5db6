"""How the dashboard lays a pod out: racks, colours and cabling, from the API's messages."""

from __future__ import annotations

import re

from vipu.api.protos import admin_pb2, vipuuser_pb2
from vipu.web import cabling, racks
from vipu.web.app import _local, age


def partition(partition_id: str, allocation: str, *ipus: tuple[str, int], state=vipuuser_pb2.PS_ACTIVE) -> vipuuser_pb2.Partition:
    return vipuuser_pb2.Partition(id=partition_id, ready_state=state, spec=vipuuser_pb2.PartitionSpec(
        allocation_id=allocation, ipus=[vipuuser_pb2.PartitionIpu(agent_id=a, agent_ipu_index=i) for a, i in ipus]))


def agents(count: int, allocation: str = "alloc-1", down: tuple[str, ...] = ()) -> list[admin_pb2.Agent]:
    return [admin_pb2.Agent(id=f"ag{n}", status="Down" if f"ag{n}" in down else "Up", cluster_id="cl0", allocation_id=allocation)
            for n in range(1, count + 1)]


def test_up_to_16_partitions_shown_each_get_a_colour_of_their_own_which_they_keep():
    ids = [f"p{n}" for n in range(16)]
    tones = racks.partition_tones(ids)
    assert len(set(tones.values())) == 16 and racks.FREE_TONE not in tones.values()
    assert all(f".{tone}{{background-color:" in racks.PALETTE_CSS for tone in [*tones.values(), racks.FREE_TONE])
    assert racks.partition_tones(["train", "zz"])["train"] == racks.partition_tones(["train"])["train"]  # chosen first: kept


def test_a_cluster_is_drawn_by_domains_in_columns_of_8_lowest_machine_at_the_bottom():
    cluster = admin_pb2.Cluster(id="cl0", agent_ids=[f"ag{n}" for n in range(1, 41)], num_ipulinkdomains=2,
                                topology=admin_pb2.ILD_TOPOLOGY_TORUS)
    pod = agents(40, down=("ag7",))
    shown = racks.pod_racks(pod, [cluster], [partition("p8", "alloc-1", *[(f"ag{n}", i) for n in (1, 2) for i in range(4)]),
                                             partition("bad", "alloc-1", ("ag21", 0), state=vipuuser_pb2.PS_ERROR)])
    (group,) = shown.groups
    assert group.subtitle == "40 machines, torus, 2 IPU-Link domains"
    assert [d.label for d in group.domains] == ["IPU-Link domain 0", "IPU-Link domain 1"]
    first = group.domains[0]
    assert [len(column[0].machines) for column in first.columns] == [8, 8, 4]  # 20 machines: 8, 8 and 4, the lowest first
    bottom = first.columns[0][0].machines[-1]
    assert bottom.agent_id == "ag1" and [i.index for i in bottom.ladder] == [2, 3, 0, 1]
    assert {i.partition_id for i in bottom.ipus} == {"p8"} and bottom.ipus[0].tone == shown.tones["p8"]
    machines = {m.agent_id: m for d in group.domains for c in d.columns for run in c for m in run.machines}
    assert machines["ag21"].in_error and not machines["ag1"].in_error and machines["ag7"].status == "Down"
    assert (shown.machines, shown.down, shown.ipus, shown.used_ipus) == (40, 1, 160, 9)
    assert [e.partition_id for e in shown.legend] == ["bad", "p8"] and shown.partition_states == {"ACTIVE": 1, "ERROR": 1}


def test_machines_of_one_allocation_are_one_run_and_machines_of_no_cluster_a_group_of_their_own():
    pod = agents(4)
    pod[2].allocation_id = pod[3].allocation_id = "a2"
    pod.append(admin_pb2.Agent(id="spare", status="Up"))
    cluster = admin_pb2.Cluster(id="cl0", agent_ids=["ag1", "ag2", "ag3", "ag4"], num_ipulinkdomains=1)
    shown = racks.pod_racks(pod, [cluster], [])
    runs = shown.groups[0].domains[0].columns[0]
    assert [(run.allocation_id, [m.agent_id for m in run.machines]) for run in runs] == [
        ("a2", ["ag4", "ag3"]), ("alloc-1", ["ag2", "ag1"])]
    assert shown.groups[1].title == "Machines in no cluster" and shown.groups[1].domains[0].columns[0][0].machines[0].agent_id == "spare"


def test_a_machine_being_drained_is_marked_draining_until_no_partition_is_left_on_it():
    pod = agents(3)
    pod[0].drain.CopyFrom(admin_pb2.AgentDrain(reason="cable repair", by="admin", since=1.0, partition_ids=["p1"]))
    pod[1].drain.CopyFrom(admin_pb2.AgentDrain(reason="fan", by="admin", since=1.0))
    cluster = admin_pb2.Cluster(id="cl0", agent_ids=["ag1", "ag2", "ag3"], num_ipulinkdomains=1)
    shown = racks.pod_racks(pod, [cluster], [partition("p1", "alloc-1", ("ag1", 0))])
    machines = {m.agent_id: m for run in shown.groups[0].domains[0].columns[0] for m in run.machines}
    assert [(machines[a].drain, machines[a].drain_reason) for a in ("ag1", "ag2", "ag3")] == [
        ("DRAINING", "cable repair"), ("DRAINED", "fan"), ("", "")]
    assert machines["ag1"].hardware == "draining for cable repair"


def test_a_user_sees_the_machines_of_their_allocations_and_no_agent_status():
    allocation = vipuuser_pb2.Allocation(id="a1", spec=vipuuser_pb2.AllocationSpec(cluster_id="cl0", agent_ids=["ag1", "ag2"]))
    shown = racks.allocation_racks([allocation], [partition("pa", "a1", ("ag2", 3))])
    (group,) = shown.groups
    assert group.title == "Allocation a1" and group.domains[0].label == ""
    machines = group.domains[0].columns[0][0].machines
    assert [m.agent_id for m in machines] == ["ag2", "ag1"] and {m.status for m in machines} == {""}
    assert machines[0].ipus[3].partition_id == "pa" and (shown.machines, shown.ipus, shown.used_ipus) == (2, 8, 1)


def test_every_cable_of_a_looped_torus_is_drawn_between_its_machines():
    cluster = admin_pb2.Cluster(id="cl0", agent_ids=["ag1", "ag2", "ag3", "ag4"], num_ipulinkdomains=2,
                                topology=admin_pb2.ILD_TOPOLOGY_TORUS)
    cables = [admin_pb2.Cable(kind="IPU-Link", lower_agent_id="ag1", lower_port=5, upper_agent_id="ag2", upper_port=1, verdict="passed"),
              admin_pb2.Cable(kind="IPU-Link", lower_agent_id="ag2", lower_port=8, upper_agent_id="ag1", upper_port=4, verdict="failed",
                              failures=["Cabling: ag2:8 [IPU-Link] <--> ag1:4 [IPU-Link] (failed)"]),
              admin_pb2.Cable(kind="Sync-Link", lower_agent_id="ag3", lower_port=7, upper_agent_id="ag4", upper_port=3, verdict="untested"),
              admin_pb2.Cable(kind="GW-Link", lower_agent_id="ag1", lower_port=1, upper_agent_id="ag3", upper_port=2, verdict="passed"),
              admin_pb2.Cable(kind="GW-Link", lower_agent_id="ag3", lower_port=1, upper_agent_id="ag1", upper_port=2, verdict="passed"),
              admin_pb2.Cable(kind="IPU-Link", lower_agent_id="gone", lower_port=5, upper_agent_id="ag1", upper_port=1, verdict="passed")]
    drawing = cabling.draw(cluster, admin_pb2.Cabling(cluster_id="cl0", cables=cables))
    boxes = {b.agent_id: (b.x, b.y) for b in drawing.boxes}
    assert boxes["ag1"][0] == boxes["ag2"][0] < boxes["ag3"][0] and boxes["ag2"][1] < boxes["ag1"][1]  # ag2 above ag1
    assert len(drawing.wires) == 5  # the cable of a machine no longer in the cluster is left out
    straight, loop_back, sync, gw, gw_back = (w.path for w in drawing.wires)
    assert re.fullmatch(r"M[\d.]+,[\d.]+ V[\d.]+", straight) and loop_back.count("V") == 3  # round the left of the column
    assert drawing.wires[1].title.splitlines() == [
        "IPU-Link ag2:8 <--> ag1:4: failed", "Cabling: ag2:8 [IPU-Link] <--> ag1:4 [IPU-Link] (failed)"]
    assert sync != straight and "H" in gw and gw_back.count("M") == 2  # back to the first domain: two stubs, each end named
    assert [text for _, _, text in drawing.wires[4].labels] == ["to ag1", "from ag3"]
    assert all(0 <= float(n) <= max(drawing.width, drawing.height) for w in drawing.wires for n in re.findall(r"[\d.]+", w.path))


def test_a_login_sends_the_browser_back_only_to_a_page_of_the_dashboard():
    assert _local("/partitions/p1") == "/partitions/p1"
    for elsewhere in ("https://evil.example/", "//evil.example/x", "javascript:alert(1)", "partitions"):
        assert _local(elsewhere) == "/"


def test_ages_read_as_people_say_them():
    from google.protobuf.timestamp_pb2 import Timestamp

    assert age(Timestamp()) == "-"
    now = Timestamp()
    now.GetCurrentTime()
    assert age(now) in ("0s", "1s")
    now.seconds -= 3 * 3600 + 5
    assert age(now) == "3h"


def test_a_cable_is_marked_by_the_worse_of_its_ends_in_the_link_ledger():
    cluster = admin_pb2.Cluster(id="cl0", agent_ids=["ag1", "ag2"], topology=admin_pb2.ILD_TOPOLOGY_MESH, num_ipulinkdomains=1)
    cables = [admin_pb2.Cable(kind="IPU-Link", lower_agent_id="ag1", lower_port=5, upper_agent_id="ag2", upper_port=1, verdict="passed"),
              admin_pb2.Cable(kind="Sync-Link", lower_agent_id="ag1", lower_port=6, upper_agent_id="ag2", upper_port=2, verdict="passed"),
              admin_pb2.Cable(kind="IPU-Link", lower_agent_id="ag1", lower_port=6, upper_agent_id="ag2", upper_port=2, verdict="passed")]
    at = 1_795_000_000  # 2026-11-18 11:06:40 UTC
    unhealthy = {"ag1:5": admin_pb2.Link(name="ag1:5", health="suspect", reason="its errors grew in 3 of its last 6 windows of 1h",
                                         changed_at=at,
                                         last=admin_pb2.LinkSample(at=at + 5, corrected_errors=420, recovery_events=2, up=True)),
                 "ag2:1": admin_pb2.Link(name="ag2:1", health="failed", reason="it is down: it stopped training", changed_at=at,
                                         last=admin_pb2.LinkSample(at=at, corrected_errors=7, up=False)),
                 "ag2:sync2": admin_pb2.Link(name="ag2:sync2", health="suspect", reason="its recoveries grew", changed_at=at)}
    assert cabling.partners(cables, unhealthy) == {"ag1:sync6"}  # the other end of the one cable with a single unhealthy end
    drawing = cabling.draw(cluster, admin_pb2.Cabling(cluster_id="cl0", cables=cables), unhealthy)
    marked = {wire.name: (wire.health, wire.title.splitlines()[1:]) for wire in drawing.wires}
    assert marked["IPU-Link ag1:5 <--> ag2:1"] == ("failed", [
        "link ledger: ag1:5 suspect: its errors grew in 3 of its last 6 windows of 1h, since 2026-11-18 11:06:40 UTC; "
        "last reading 420 corrected errors, 2 recoveries, up, at 2026-11-18 11:06:45 UTC",
        "link ledger: ag2:1 failed: it is down: it stopped training, since 2026-11-18 11:06:40 UTC; "
        "last reading 7 corrected errors, 0 recoveries, down, at 2026-11-18 11:06:40 UTC"])
    assert marked["Sync-Link ag1:6 <--> ag2:2"] == ("suspect", [  # each end, the healthy one too once looked up
        "link ledger: ag1:sync6 not read yet", "link ledger: ag2:sync2 suspect: its recoveries grew, since 2026-11-18 11:06:40 UTC"])
    partner = admin_pb2.Link(name="ag1:sync6", health="healthy", reason="its errors or recoveries grew in 1 of its last 6 windows of 1h")
    drawn_again = cabling.draw(cluster, admin_pb2.Cabling(cluster_id="cl0", cables=cables), {**unhealthy, "ag1:sync6": partner})
    assert drawn_again.wires[1].health == "suspect" and "link ledger: ag1:sync6 healthy: its errors or recoveries grew in 1 of" \
        in drawn_again.wires[1].title
    assert marked["IPU-Link ag1:6 <--> ag2:2"] == ("", [])  # both ends healthy: the test's colour alone


def test_each_end_of_a_cable_links_to_its_links_page_where_the_cable_meets_its_machine():
    cluster = admin_pb2.Cluster(id="cl0", agent_ids=["ag1", "ag2", "ag3", "ag4"], num_ipulinkdomains=2,
                                topology=admin_pb2.ILD_TOPOLOGY_TORUS)
    cables = [admin_pb2.Cable(kind="IPU-Link", lower_agent_id="ag1", lower_port=5, upper_agent_id="ag2", upper_port=1, verdict="passed"),
              admin_pb2.Cable(kind="IPU-Link", lower_agent_id="ag2", lower_port=8, upper_agent_id="ag1", upper_port=4, verdict="passed"),
              admin_pb2.Cable(kind="Sync-Link", lower_agent_id="ag1", lower_port=6, upper_agent_id="ag2", upper_port=2, verdict="passed"),
              admin_pb2.Cable(kind="GW-Link", lower_agent_id="ag3", lower_port=1, upper_agent_id="ag1", upper_port=2, verdict="passed")]
    drawing = cabling.draw(cluster, admin_pb2.Cabling(cluster_id="cl0", cables=cables))
    boxes = {b.agent_id: b for b in drawing.boxes}

    def on_edge(agent: str, x: float, y: float) -> bool:
        box = boxes[agent]
        return (box.x <= x <= box.x + box.width and y in (box.y, box.y + box.height)) or \
            (box.y <= y <= box.y + box.height and x in (box.x, box.x + box.width))

    ends = [wire.linked_ends() for wire in drawing.wires]
    assert [[name for name, _, _ in wire] for wire in ends] == [["ag1:5", "ag2:1"], ["ag2:8", "ag1:4"], ["ag1:sync6", "ag2:sync2"],
                                                                ["ag3:gw1", "ag1:gw2"]]
    assert all(on_edge(name.split(":")[0], x, y) for wire in ends for name, x, y in wire)


def test_reservations_not_over_are_bars_on_a_weeks_timeline_soonest_first():
    day, now = 86_400.0, 1_000_000.0

    def reservation(name, start, end, maintenance=False):
        return vipuuser_pb2.Reservation(name=name, start=start, end=end, maintenance=maintenance, reason="a test",
                                        ipus=[vipuuser_pb2.ReservedIpu(agent_id="ag1", index=i) for i in range(4)],
                                        users=[] if maintenance else ["alice"], ipus_in_use=2)

    shown = racks.timeline([reservation("late", now + 10 * day, now + 11 * day), reservation("over", now - day, now - 1),
                            reservation("mw", now + day, now + 1.5 * day, maintenance=True),
                            reservation("now", now - day, now + 7 * day)], now)
    assert [(b.name, b.phase, b.left, b.width) for b in shown] == [
        ("now", "UNDER WAY", 0.0, 100.0), ("mw", "TO COME", 14.29, 7.14), ("late", "TO COME", 100.0, 0.0)]
    assert shown[1].kind == "maintenance window" and shown[0].title == (
        "reservation now (a test) from 1970-01-11 13:46:40 UTC to 1970-01-19 13:46:40 UTC for alice; 4 IPUs, 2 in use")
