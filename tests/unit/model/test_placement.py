"""Placement over pods of 1 to 64 machines: shapes the hardware can link, and no IPU twice."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from vipu.model.entities import GwRouting, IldTopology, IpuLinkRouting
from vipu.model.errors import Conflict, InvalidArgument
from vipu.model.fragmentation import SizeMix
from vipu.model.placement import (
    _candidates,
    check_allocation_machines,
    choose_allocation_machines,
    count_fitting,
    is_power_of_two,
    largest_fitting,
    place_partition,
)
from vipu.model.topology import ClusterLayout


def pod(machines: int, topology=IldTopology.MESH, ilds: int = 1) -> ClusterLayout:
    return ClusterLayout([f"ag{i}" for i in range(1, machines + 1)], topology, ilds)


def take(used: dict, placement) -> None:
    for ipu in placement.ipus:
        assert ipu.index not in used.setdefault(ipu.agent_id, set()), "IPU handed out twice"
        used[ipu.agent_id].add(ipu.index)


def assert_linkable(layout: ClusterLayout, placement, size: int, num_gcds: int = 1) -> None:
    """The placement's IPUs form a shape the hardware can link, with routing ids 0..size-1."""
    ipus = placement.ipus
    assert len(ipus) == size == len({(i.agent_id, i.index) for i in ipus})
    assert sorted(i.routing_id for i in ipus) == list(range(size))
    assert all(i.gcd == i.routing_id // (size // num_gcds) for i in ipus)
    if size < 4:
        assert len({i.agent_id for i in ipus}) == 1
        if size == 2:
            assert sorted(i.index for i in ipus) in ([0, 1], [2, 3])
        return
    segments = {}
    for ipu in ipus:
        segments.setdefault(ipu.segment, []).append(ipu)
    assert len(segments) == placement.num_segments
    position_sets = []
    for members in segments.values():
        assert len({i.ild for i in members}) == 1
        machines = {}
        for ipu in members:
            machines.setdefault(ipu.agent_id, set()).add(ipu.index)
        assert all(indices == {0, 1, 2, 3} for indices in machines.values()), "whole machines only"
        positions = sorted(layout.locate(agent)[1] for agent in machines)
        n, size_ild = len(positions), layout.machines_per_ild
        starts = [p for p in positions if all((p + k) % size_ild in positions for k in range(n))]
        assert starts, f"machines {positions} are not consecutive"
        if not layout.is_torus:
            assert positions == list(range(positions[0], positions[0] + n)), "a mesh run cannot wrap"
        position_sets.append(set(positions))
    assert all(s == position_sets[0] for s in position_sets), "segments sit at the same positions in each ILD"


@pytest.mark.parametrize("machines", [1, 2, 3, 4, 5, 8, 16, 32, 64])
@pytest.mark.parametrize("topology", list(IldTopology))
def test_a_pod_fills_completely_with_single_machine_partitions(machines, topology):
    layout = pod(machines, topology)
    used: dict = {}
    for _ in range(machines):
        placement = place_partition(layout, set(layout.agent_ids), used, 4)
        assert_linkable(layout, placement, 4)
        take(used, placement)
    with pytest.raises(Conflict, match=f"no free 4-IPU run in the allocation: all {machines * 4} of its IPUs are in use$"):
        place_partition(layout, set(layout.agent_ids), used, 4)


@pytest.mark.parametrize("machines", [1, 2, 4, 8, 16, 64])
def test_a_pod_fills_completely_with_single_ipus(machines):
    layout = pod(machines)
    used: dict = {}
    for _ in range(machines * 4):
        take(used, place_partition(layout, set(layout.agent_ids), used, 1))
    assert sum(len(v) for v in used.values()) == machines * 4


@pytest.mark.parametrize("size", [0, 3, 5, 6, 12, 24, 100])
def test_sizes_that_are_not_powers_of_two_are_refused(size):
    with pytest.raises(InvalidArgument, match="power of two"):
        place_partition(pod(16), set(pod(16).agent_ids), {}, size)


def test_a_size_beyond_the_cluster_is_invalid_and_beyond_the_free_ipus_a_conflict():
    layout = pod(4)
    with pytest.raises(InvalidArgument, match="larger than the cluster's 16 IPUs"):
        place_partition(layout, set(layout.agent_ids), {}, 32)
    with pytest.raises(Conflict, match=r"no free 16-IPU run in the allocation: 12 of 16 IPUs are free, "
                                       r"the largest free run is 8 IPUs \(ag2-ag3\)$"):
        place_partition(layout, set(layout.agent_ids), {"ag1": {0, 1, 2, 3}}, 16)


def test_small_partitions_share_a_machine_before_opening_another():
    layout = pod(4)
    used: dict = {}
    first = place_partition(layout, set(layout.agent_ids), used, 1)
    take(used, first)
    second = place_partition(layout, set(layout.agent_ids), used, 2)
    take(used, second)
    third = place_partition(layout, set(layout.agent_ids), used, 1)
    assert {i.agent_id for i in (*first.ipus, *second.ipus, *third.ipus)} == {first.ipus[0].agent_id}


def test_free_ipus_that_are_not_a_linkable_block_are_refused():
    layout = pod(4)
    # One IPU taken on every machine: 12 IPUs free, but no whole machine.
    used = {agent: {0} for agent in layout.agent_ids}
    with pytest.raises(Conflict, match=r"no free 4-IPU run in the allocation: 12 of 16 IPUs are free, "
                                       r"the largest free group is 2 IPUs \(ag1 IPUs 2-3\)$"):
        place_partition(layout, set(layout.agent_ids), used, 4)
    # Rung pairs 0-1 are broken everywhere but 2-3 are free.
    assert sorted(i.index for i in place_partition(layout, set(layout.agent_ids), used, 2).ipus) == [2, 3]


def test_a_torus_run_wraps_over_the_loop_back_cables_and_a_mesh_run_does_not():
    used = {"ag2": {0, 1, 2, 3}, "ag3": {0, 1, 2, 3}}
    torus = pod(4, IldTopology.TORUS)
    placement = place_partition(torus, set(torus.agent_ids), used, 8)
    assert [i.agent_id for i in placement.ipus][::4] == ["ag4", "ag1"]
    mesh = pod(4)
    with pytest.raises(Conflict):
        place_partition(mesh, set(mesh.agent_ids), used, 8)


def test_routing_follows_the_shape_unless_asked():
    torus = pod(4, IldTopology.TORUS)
    allowed = set(torus.agent_ids)
    assert place_partition(torus, allowed, {}, 16).ipulink_routing is IpuLinkRouting.RINGSWNC
    assert place_partition(torus, allowed, {}, 8).ipulink_routing is IpuLinkRouting.SWNC
    assert place_partition(torus, allowed, {}, 4).ipulink_routing is IpuLinkRouting.DNC
    assert place_partition(pod(4), set(pod(4).agent_ids), {}, 16).ipulink_routing is IpuLinkRouting.SWNC
    assert place_partition(torus, allowed, {}, 8, ipulink_routing=IpuLinkRouting.BTNC).ipulink_routing is IpuLinkRouting.BTNC
    with pytest.raises(InvalidArgument, match=r"RINGSWNC routing needs a partition that takes whole IPU-Link domains "
                                              r"of 4 machines \(16 IPUs\) each, not 8 IPUs"):  # a rule, not a question of room
        place_partition(torus, allowed, {"ag1": {0}}, 8, ipulink_routing=IpuLinkRouting.RINGSWNC)
    with pytest.raises(InvalidArgument, match="torus cluster, and this one is a mesh"):
        place_partition(pod(4), set(pod(4).agent_ids), {}, 16, ipulink_routing=IpuLinkRouting.RINGSWNC)
    with pytest.raises(InvalidArgument, match="two machines or more"):
        place_partition(torus, allowed, {}, 2, ipulink_routing=IpuLinkRouting.SWNC)


def test_best_fit_keeps_the_largest_run_of_free_machines_whole():
    layout = pod(8)
    # Free runs: ag1 (1 machine) and ag3..ag8 (6 machines).
    used = {"ag2": {0, 1, 2, 3}}
    placement = place_partition(layout, set(layout.agent_ids), used, 4)
    assert {i.agent_id for i in placement.ipus} == {"ag1"}
    take(used, placement)
    # A large partition takes the top end of the remaining run ag3..ag8.
    assert {i.agent_id for i in place_partition(layout, set(layout.agent_ids), used, 16).ipus} == {"ag5", "ag6", "ag7", "ag8"}


def test_small_partitions_fill_the_cluster_from_the_bottom_and_large_ones_from_the_top():
    layout = pod(16, IldTopology.TORUS)
    allowed, used = set(layout.agent_ids), {}
    placed = {}
    for size in (1, 8, 32, 4, 2):
        placed[size] = place_partition(layout, allowed, used, size)
        take(used, placed[size])
    machines = {size: sorted({i.agent_id for i in p.ipus}, key=layout.agent_ids.index) for size, p in placed.items()}
    assert machines[1] == machines[2] == ["ag1"]  # packed into the fullest machine
    assert machines[8] == ["ag2", "ag3"] and machines[4] == ["ag4"]
    assert machines[32] == [f"ag{n}" for n in range(9, 17)]


def test_first_fit_takes_the_first_shape_in_cluster_order():
    layout = pod(8)
    used = {"ag2": {0, 1, 2, 3}}
    placement = place_partition(layout, set(layout.agent_ids), used, 8, first_fit=True)
    assert [i.agent_id for i in placement.ipus][::4] == ["ag3", "ag4"]


def test_a_partition_spans_domains_only_over_gw_links_at_the_same_positions():
    layout = pod(8, ilds=2)
    allowed = set(layout.agent_ids)
    whole = place_partition(layout, allowed, {}, 32)
    assert whole.num_segments == 2 and whole.gw_routing is GwRouting.RING
    assert_linkable(layout, whole, 32)
    # 16 IPUs fit in one domain, so one segment is used.
    assert place_partition(layout, allowed, {}, 16).num_segments == 1
    # Asked for two segments, 16 IPUs take two machines at the same positions in each domain.
    split = place_partition(layout, allowed, {}, 16, num_segments=2)
    assert_linkable(layout, split, 16)
    assert split.num_segments == 2
    # With no single domain free enough, it spans: ILD 0 has ag1 busy, ILD 1 has ag8 busy.
    used = {"ag1": {0}, "ag8": {0}}
    spanning = place_partition(layout, allowed, used, 16)
    assert spanning.num_segments == 2
    assert {i.agent_id for i in spanning.ipus} == {"ag2", "ag3", "ag6", "ag7"}
    with pytest.raises(InvalidArgument, match="needs a cluster of 4 IPU-Link domains"):
        place_partition(layout, allowed, {}, 32, num_segments=4)


def test_gcds_split_the_partition_evenly_in_routing_order():
    layout = pod(4)
    placement = place_partition(layout, set(layout.agent_ids), {}, 16, num_gcds=4)
    assert_linkable(layout, placement, 16, num_gcds=4)
    with pytest.raises(InvalidArgument, match="GCDs"):
        place_partition(layout, set(layout.agent_ids), {}, 4, num_gcds=3)
    with pytest.raises(InvalidArgument, match="GCDs"):
        place_partition(layout, set(layout.agent_ids), {}, 4, num_gcds=8)


def test_explicit_ipus_are_honoured_when_they_form_a_free_block():
    layout = pod(4)
    wanted = tuple((0, t) for t in range(8, 16))  # machines ag3 and ag4
    placement = place_partition(layout, set(layout.agent_ids), {}, 8, explicit=wanted)
    assert {i.agent_id for i in placement.ipus} == {"ag3", "ag4"}
    with pytest.raises(InvalidArgument, match=r"^the named IPUs are not a linkable set of 8 IPUs in the allocation$"):
        place_partition(layout, set(layout.agent_ids), {}, 8, explicit=tuple((0, t) for t in (0, 1, 2, 3, 8, 9, 10, 11)))
    with pytest.raises(Conflict, match=r"^no free 8-IPU run in the allocation: 15 of 16 IPUs are free, "
                                       r"the largest free run is 8 IPUs \(ag1-ag2\)$"):
        place_partition(layout, set(layout.agent_ids), {"ag4": {0}}, 8, explicit=wanted)
    with pytest.raises(InvalidArgument, match="IPU 1 of IPU-Link domain 0 is named more than once"):
        place_partition(layout, set(layout.agent_ids), {}, 2, explicit=((0, 0), (0, 1), (0, 1)))


def test_only_machines_of_the_allocation_are_used():
    layout = pod(8)
    allowed = {"ag5", "ag6"}
    placement = place_partition(layout, allowed, {}, 8)
    assert {i.agent_id for i in placement.ipus} == allowed
    with pytest.raises(InvalidArgument, match=r"^the allocation has 8 IPUs \(2 machines\): a partition of 16 IPUs never fits in it$"):
        place_partition(layout, allowed, {}, 16)


def test_allocations_take_the_smallest_consecutive_run_that_fits():
    agents = tuple(f"ag{i}" for i in range(1, 9))
    assert choose_allocation_machines(agents, {"ag3"}, 8) == ("ag1", "ag2")
    assert choose_allocation_machines(agents, {"ag3"}, 12) == ("ag4", "ag5", "ag6")
    with pytest.raises(Conflict, match="no 4 consecutive free machines"):
        choose_allocation_machines(agents, {"ag3", "ag6"}, 16)
    with pytest.raises(InvalidArgument, match="multiple of 4"):
        choose_allocation_machines(agents, set(), 6)


def test_explicit_allocation_machines_must_be_consecutive_free_and_in_order():
    agents = tuple(f"ag{i}" for i in range(1, 9))
    check_allocation_machines("cl0", agents, {}, ("ag2", "ag3"))
    with pytest.raises(InvalidArgument, match="not physically consecutive"):
        check_allocation_machines("cl0", agents, {}, ("ag2", "ag4"))
    with pytest.raises(InvalidArgument, match="not physically consecutive"):
        check_allocation_machines("cl0", agents, {}, ("ag3", "ag2"))
    with pytest.raises(Conflict, match="already in allocation a1"):
        check_allocation_machines("cl0", agents, {"ag3": "a1"}, ("ag2", "ag3"))
    with pytest.raises(InvalidArgument, match="not in cluster cl0"):
        check_allocation_machines("cl0", agents, {}, ("ag9",))


@st.composite
def pods_and_requests(draw):
    ilds = draw(st.sampled_from([1, 1, 2, 4]))
    per_ild = draw(st.integers(1, 64 // ilds))
    topology = draw(st.sampled_from(list(IldTopology)))
    steps = draw(st.lists(st.tuples(st.sampled_from([1, 2, 4, 8, 16, 32, 64]), st.booleans()), max_size=40))
    return pod(per_ild * ilds, topology, ilds), steps


@settings(max_examples=150, deadline=None)
@given(pods_and_requests())
def test_any_sequence_of_creates_and_removes_keeps_every_placement_linkable_and_disjoint(case):
    layout, steps = case
    allowed = set(layout.agent_ids)
    used: dict = {}
    live = []
    for size, remove_first in steps:
        if remove_first and live:
            for ipu in live.pop(0).ipus:
                used[ipu.agent_id].discard(ipu.index)
        try:
            placement = place_partition(layout, allowed, used, size)
        except (Conflict, InvalidArgument):
            continue
        assert_linkable(layout, placement, size)
        take(used, placement)
        live.append(placement)


def test_is_power_of_two():
    assert [n for n in range(0, 70) if is_power_of_two(n)] == [1, 2, 4, 8, 16, 32, 64]


@settings(max_examples=300, deadline=None)
@given(machines=st.sampled_from([1, 2, 4, 6, 8, 16]), topology=st.sampled_from([IldTopology.MESH, IldTopology.TORUS]),
       ilds=st.sampled_from([1, 2, 4]), taken=st.lists(st.tuples(st.integers(0, 31), st.integers(0, 3)), max_size=20),
       size=st.sampled_from([1, 2, 4, 8, 16, 32, 64]))
def test_the_capacity_reported_is_what_placing_one_partition_after_another_achieves(machines, topology, ilds, taken, size):
    """count_fitting, computed from the free runs (and, for shapes that may span domains, the runs filled as placement
    fills them), agrees with placing partitions of the size until one is refused;
    largest_fitting is a size that places, and twice it does not."""
    if machines % ilds:
        return
    layout = pod(machines, topology, ilds)
    allowed = set(layout.agent_ids)
    used: dict[str, set[int]] = {}
    for machine, ipu in taken:
        if machine < machines:
            used.setdefault(layout.agent_ids[machine], set()).add(ipu)
    counted = count_fitting(layout, allowed, used, size)
    placed, trial = 0, {agent: set(ipus) for agent, ipus in used.items()}
    while True:
        try:
            take(trial, place_partition(layout, allowed, trial, size))
        except (Conflict, InvalidArgument):
            break
        placed += 1
    assert counted == placed
    largest = largest_fitting(layout, allowed, used)
    if largest:
        place_partition(layout, allowed, used, largest)
    with pytest.raises((Conflict, InvalidArgument)):
        place_partition(layout, allowed, used, largest * 2 or 1)


@settings(max_examples=300, deadline=None)
@given(pods_and_requests(), st.lists(st.sampled_from([1, 2, 4, 8, 16, 32, 64]), min_size=1, max_size=30))
def test_weighing_the_mix_only_the_windows_at_the_ends_of_free_runs_yields_the_choice_among_every_window(case, asked):
    """Placement weighing the mix skips windows inside a free run (`_machine_candidates`): the
    shape it takes is the one the best of every window would be."""
    layout, steps = case
    allowed, used, live = set(layout.agent_ids), {}, []
    mix = SizeMix()
    for size in asked:
        mix = mix.saw(size)
    for size, remove_first in steps:
        if remove_first and live:  # partitions ending leave free runs between busy machines
            for ipu in live.pop(0).ipus:
                used[ipu.agent_id].discard(ipu.index)
        try:
            placement = place_partition(layout, allowed, used, size, mix=mix)
        except (Conflict, InvalidArgument):
            continue
        if size >= 4:
            best = min(_candidates(layout, allowed, used, size, 0, None, (), every=True, mix=mix), key=lambda c: c.score)
            assert {(i.agent_id, i.index) for i in placement.ipus} == {ipu for _, ipus in best.segments for ipu in ipus}
        take(used, placement)
        live.append(placement)
