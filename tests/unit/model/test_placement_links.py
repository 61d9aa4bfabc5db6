"""Placement around the link ledger's unhealthy links: a failed link is quarantined (only the
shapes that need it are refused), a suspect one is stepped around while another shape fits."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vipu.model.entities import IldTopology
from vipu.model.errors import NoRoom
from vipu.model.linkhealth import LinkFaults, LinkName, links_used
from vipu.model.placement import choose_held_shape, place_partition, shapes, try_place
from vipu.model.topology import INTERNAL_LINKS, ClusterLayout

SUSPECT = "its errors or recoveries grew in 3 of its last 6 windows of 1h"
FAILED = "failed the cabling test: no link"


def pod(machines: int, topology=IldTopology.MESH, ilds: int = 1) -> ClusterLayout:
    return ClusterLayout([f"ag{i}" for i in range(1, machines + 1)], topology, ilds)


def machines_of(placement) -> list[str]:
    return list(dict.fromkeys(ipu.agent_id for ipu in placement.ipus))


def test_a_partition_of_two_machines_needs_the_cables_between_them_and_each_machines_internal_links():
    layout = pod(4)
    used = links_used(layout, [("ag2", i) for i in range(4)] + [("ag3", i) for i in range(4)])
    assert {str(n) for n in used if not n.place.startswith("ipu")} == {
        "ag2:5", "ag2:6", "ag2:7", "ag2:8", "ag3:1", "ag3:2", "ag3:3", "ag3:4", "ag2:sync6", "ag2:sync7", "ag3:sync2", "ag3:sync3"}
    assert sum(n.place.startswith("ipu") for n in used) == 2 * len(INTERNAL_LINKS)
    assert LinkName("ag1", "5") not in used and LinkName("ag2", "1") not in used


def test_a_single_ipu_needs_no_link_and_a_pair_only_its_rung():
    layout = pod(2)
    assert links_used(layout, [("ag1", 2)]) == frozenset()
    assert {n.place for n in links_used(layout, [("ag1", 0), ("ag1", 1)])} == {"ipu0:1A", "ipu0:1B", "ipu0:1C", "ipu0:1D"}


def test_a_torus_wrap_needs_the_loop_back_cables_and_two_domains_need_the_gw_links():
    torus = pod(4, IldTopology.TORUS)
    wrap = links_used(torus, [("ag4", i) for i in range(4)] + [("ag1", i) for i in range(4)])
    assert {LinkName("ag4", "5"), LinkName("ag1", "1")} <= wrap and LinkName("ag1", "5") not in wrap
    looped = pod(4, ilds=2)
    across = links_used(looped, [("ag1", i) for i in range(4)] + [("ag3", i) for i in range(4)])
    assert {LinkName("ag1", "gw1"), LinkName("ag3", "gw2"), LinkName("ag3", "gw1"), LinkName("ag1", "gw2")} <= across


def test_a_suspect_link_steers_a_partition_to_another_place_and_says_why():
    layout = pod(4)
    plain = place_partition(layout, set(layout.agent_ids), {}, 8)
    assert machines_of(plain) == ["ag1", "ag2"] and plain.link_note == ""
    faults = LinkFaults(suspect={LinkName("ag1", "5"): SUSPECT})
    steered = place_partition(layout, set(layout.agent_ids), {}, 8, faults=faults)
    assert "ag1" not in machines_of(steered) or "ag2" not in machines_of(steered)
    assert steered.link_note == f"placed away from ag1:5 (suspect: {SUSPECT})"


def test_a_suspect_link_is_taken_when_no_other_place_fits_and_the_placement_says_so():
    layout = pod(2)
    faults = LinkFaults(suspect={LinkName("ag1", "5"): SUSPECT})
    placed = place_partition(layout, set(layout.agent_ids), {}, 8, faults=faults)
    assert machines_of(placed) == ["ag1", "ag2"]
    assert placed.link_note.startswith("on suspect links for want of another free place: ag1:5")


def test_a_failed_link_refuses_only_the_shapes_that_need_it():
    layout = pod(2)
    faults = LinkFaults(failed={LinkName("ag2", "1"): FAILED})
    with pytest.raises(NoRoom, match=r"^every free place for 8 IPUs in the allocation needs a quarantined link: ag2:1 \(failed: "):
        place_partition(layout, set(layout.agent_ids), {}, 8, faults=faults)
    one_machine = place_partition(layout, set(layout.agent_ids), {}, 4, faults=faults)
    assert one_machine.link_note == ""  # a machine takes shapes that do not need its failed port
    assert try_place(layout, set(layout.agent_ids), {}, 8, faults=faults) is None
    assert choose_held_shape(layout, set(layout.agent_ids), {}, 8, faults=faults) == frozenset()


def test_a_failed_internal_link_moves_a_pair_to_the_other_rung_of_the_machine():
    layout = pod(1)
    faults = LinkFaults(failed={LinkName("ag1", "ipu0:1C"): FAILED})
    placed = place_partition(layout, {"ag1"}, {}, 2, faults=faults)
    assert sorted(ipu.index for ipu in placed.ipus) == [2, 3]


@settings(max_examples=150, deadline=None)
@given(st.data())
def test_placement_never_takes_a_failed_link_and_takes_a_suspect_one_only_when_nothing_else_is_free(data):
    machines = data.draw(st.sampled_from([2, 4, 8]))
    topology = data.draw(st.sampled_from([IldTopology.MESH, IldTopology.TORUS]))
    ilds = data.draw(st.sampled_from([1, 2])) if machines >= 4 else 1
    layout = pod(machines, topology, ilds)
    size = data.draw(st.sampled_from([s for s in (1, 2, 4, 8, 16) if s <= 4 * machines]))
    busy = data.draw(st.sets(st.tuples(st.sampled_from(layout.agent_ids), st.integers(0, 3)), max_size=4 * machines // 2))
    used: dict[str, set[int]] = {}
    for agent, index in busy:
        used.setdefault(agent, set()).add(index)
    every_link = sorted({name for shape in shapes(layout, set(layout.agent_ids), size) for name in links_used(layout, shape)})
    if not every_link:
        return
    picked = data.draw(st.lists(st.tuples(st.sampled_from(every_link), st.booleans()), max_size=6))
    faults = LinkFaults(failed={n: FAILED for n, failed in picked if failed}, suspect={n: SUSPECT for n, failed in picked if not failed})
    free_shapes = [s for s in shapes(layout, set(layout.agent_ids), size) if not any(i in used.get(a, ()) for a, i in s)]
    clean = [s for s in free_shapes if links_used(layout, s).isdisjoint({*faults.failed, *faults.suspect})]
    usable = [s for s in free_shapes if links_used(layout, s).isdisjoint(faults.failed.keys())]
    try:
        placed = place_partition(layout, set(layout.agent_ids), used, size, faults=faults)
    except NoRoom:
        assert not usable
        return
    needed = links_used(layout, [(i.agent_id, i.index) for i in placed.ipus])
    assert needed.isdisjoint(faults.failed.keys())
    if not needed.isdisjoint(faults.suspect.keys()):
        assert not clean and placed.link_note.startswith("on suspect links")
