"""Cable counts and port numbering from seed 002's examples."""

from __future__ import annotations

import pytest

from vipu.model.entities import IldTopology
from vipu.model.errors import InvalidArgument
from vipu.model.topology import ClusterLayout, LinkKind, internal_peers


def agents(n):
    return [f"ag{i}" for i in range(1, n + 1)]


def test_an_eight_machine_mesh_domain_has_28_ipulink_and_14_sync_cables():
    layout = ClusterLayout(agents(8))
    assert len(layout.ipulink_cables()) == 28
    assert len(layout.sync_cables()) == 14
    assert layout.gwlink_cables() == []


def test_a_torus_adds_four_loop_back_cables_from_the_top_machine_to_the_bottom():
    layout = ClusterLayout(agents(8), IldTopology.TORUS)
    cables = layout.ipulink_cables()
    assert len(cables) == 32
    loops = [c for c in cables if c.lower.agent_id == "ag8"]
    assert [(c.lower.number, c.upper.agent_id, c.upper.number) for c in loops] == [
        (5, "ag1", 1), (6, "ag1", 2), (7, "ag1", 3), (8, "ag1", 4)
    ]


def test_adjacent_machines_meet_on_ports_5_to_8_below_and_1_to_4_above():
    cables = ClusterLayout(agents(2)).ipulink_cables()
    assert [(c.lower.agent_id, c.lower.number, c.upper.agent_id, c.upper.number) for c in cables] == [
        ("ag1", 5, "ag2", 1), ("ag1", 6, "ag2", 2), ("ag1", 7, "ag2", 3), ("ag1", 8, "ag2", 4)
    ]
    sync = ClusterLayout(agents(2)).sync_cables()
    assert [(c.lower.number, c.upper.number) for c in sync] == [(6, 2), (7, 3)]


def test_two_looped_domains_of_two_machines_have_12_ipulink_and_gwlink_cables():
    layout = ClusterLayout(agents(4), num_ilds=2)
    assert len(layout.ipulink_cables()) + len(layout.gwlink_cables()) == 12
    gw = [(c.lower.agent_id, c.lower.number, c.upper.agent_id, c.upper.number) for c in layout.gwlink_cables()]
    assert gw == [("ag1", 1, "ag3", 2), ("ag2", 1, "ag4", 2), ("ag3", 1, "ag1", 2), ("ag4", 1, "ag2", 2)]
    assert all(c.lower.kind is LinkKind.GWLINK for c in layout.gwlink_cables())


def test_a_single_domain_cluster_may_be_looped_but_has_no_gw_cables():
    from vipu.model.entities import GwTopology

    layout = ClusterLayout(agents(4), gw_topology=GwTopology.LOOPED)
    assert len(layout.ipulink_cables()) + len(layout.gwlink_cables()) == 12


def test_domains_are_equal_consecutive_groups_of_agents():
    layout = ClusterLayout(agents(6), num_ilds=2)
    assert layout.ilds == (("ag1", "ag2", "ag3"), ("ag4", "ag5", "ag6"))
    assert layout.locate("ag5") == (1, 1)
    assert layout.topology_id("ag5", 2) == 6


@pytest.mark.parametrize(
    "agent_ids, ilds, message",
    [([], 1, "at least one agent"), (["a", "b", "a"], 1, "more than once"), (agents(5), 2, "equal size")],
)
def test_impossible_layouts_are_refused(agent_ids, ilds, message):
    with pytest.raises(InvalidArgument, match=message):
        ClusterLayout(agent_ids, num_ilds=ilds)


def test_internal_links_join_rungs_and_columns():
    assert internal_peers(0, {0, 1, 2, 3}) == [1, 2]
    assert internal_peers(3, {0, 1, 2, 3}) == [1, 2]
    assert internal_peers(0, {0, 3}) == []


@pytest.mark.parametrize("topology", [IldTopology.MESH, IldTopology.TORUS])
@pytest.mark.parametrize("machines,ilds", [(1, 1), (2, 1), (3, 1), (8, 1), (8, 2), (12, 3)])
def test_cables_among_some_agents_are_the_cluster_cables_between_them(topology, machines, ilds):
    layout = ClusterLayout(agents(machines), topology, ilds)
    every = {"ipu": layout.ipulink_cables, "sync": layout.sync_cables, "gw": layout.gwlink_cables}
    for size in range(machines + 1):
        for start in range(machines):
            among = {layout.agent_ids[(start + k) % machines] for k in range(size)} | {layout.agent_ids[-1]}
            for kind, cables in every.items():
                expected = [c for c in cables() if c.lower.agent_id in among and c.upper.agent_id in among]
                assert sorted(map(repr, cables(among))) == sorted(map(repr, expected)), (kind, among)
