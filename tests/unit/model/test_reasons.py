"""The one-line reasons placement gives for a refusal: what is free, what would make room, or the rule."""

from __future__ import annotations

import pytest

from vipu.model.entities import IldTopology, IpuLinkRouting
from vipu.model.errors import Conflict, InvalidArgument
from vipu.model.placement import Occupancy, choose_held_shape, place_partition, shapes
from vipu.model.reasons import span
from vipu.model.topology import ClusterLayout


def pod(machines: int, topology=IldTopology.TORUS, ilds: int = 1) -> ClusterLayout:
    return ClusterLayout([f"ag{i}" for i in range(1, machines + 1)], topology, ilds)


def holding(partitions: dict[str, list[tuple[str, int]]]) -> tuple[dict[str, set[int]], Occupancy]:
    """The IPUs in use and who holds them, from partition id -> its IPUs."""
    used: dict[str, set[int]] = {}
    holders = {}
    for name, ipus in partitions.items():
        for agent, index in ipus:
            used.setdefault(agent, set()).add(index)
            holders[(agent, index)] = name
    return used, Occupancy(holders)


def machines(*numbers: int) -> list[tuple[str, int]]:
    return [(f"ag{n}", i) for n in numbers for i in range(4)]


def refusal(layout, used, size, occupancy=None, allowed=None, **options) -> str:
    with pytest.raises(Conflict) as refused:
        place_partition(layout, allowed or set(layout.agent_ids), used, size, where="allocation alloc-1",
                        occupancy=occupancy, **options)
    return refused.value.message


def test_the_issue_example_names_the_largest_free_run_and_either_partition_that_would_make_room():
    layout = pod(16)
    used, occupancy = holding({"p7": machines(1, 2, 3, 4), "p9": machines(9, 10, 11, 12)})
    assert refusal(layout, used, 32, occupancy) == (
        "no free 32-IPU run in allocation alloc-1: 32 of 64 IPUs are free, the largest free run is 16 IPUs (ag13-ag16); "
        "it fits when p7 or p9 is removed")


def test_when_two_partitions_must_go_it_names_both_and_one_other_choice():
    layout = pod(4, IldTopology.MESH)
    used, occupancy = holding({"a": machines(1), "b": machines(2), "c": machines(3), "d": [("ag4", 0)]})
    assert refusal(layout, used, 8, occupancy) == (
        "no free 8-IPU run in allocation alloc-1: 3 of 16 IPUs are free, the largest free group is 2 IPUs (ag4 IPUs 2-3); "
        "it fits when a and b are removed (or b and c)")


def test_many_partitions_in_the_way_are_counted_not_listed():
    layout = pod(2, IldTopology.MESH)
    used, occupancy = holding({f"q{n}": [(f"ag{1 + n // 4}", n % 4)] for n in range(8)})
    assert refusal(layout, used, 8, occupancy) == (
        "no free 8-IPU run in allocation alloc-1: all 8 of its IPUs are in use; it fits when 8 partitions are removed (q0, q1, q2, ...)")


def test_single_ipus_name_each_partition_that_would_free_one():
    layout = pod(1)
    used, occupancy = holding({"p1": [("ag1", 0)], "p2": [("ag1", 1)], "p3": [("ag1", 2), ("ag1", 3)]})
    assert refusal(layout, used, 1, occupancy) == (
        "no free IPU in allocation alloc-1: all 4 of its IPUs are in use; it fits when p1, p2 or p3 is removed")


def test_ipus_held_for_the_first_waiting_request_are_left_alone_and_said_so():
    layout = pod(2, IldTopology.MESH)
    used, occupancy = holding({"p1": [("ag1", 0)]})
    held = Occupancy(occupancy.holders, frozenset(machines(2)), "big")
    assert refusal(layout, used, 4, held) == (
        "no free 4-IPU run in allocation alloc-1: 7 of 8 IPUs are free, the largest free group is 2 IPUs (ag1 IPUs 2-3), "
        "4 free IPUs (ag2) are held for big, first in the queue; it fits when p1 is removed")
    only_held = Occupancy(occupancy.holders, frozenset(machines(1, 2)), "big")
    assert refusal(layout, used, 4, only_held).endswith("; the IPUs it could take are held for big, first in the queue")


@pytest.mark.parametrize("layout,size,options,rule", [
    (pod(4, IldTopology.MESH), 16, {"ipulink_routing": IpuLinkRouting.RINGSWNC},
     "RINGSWNC routing needs a partition that takes whole IPU-Link domains of a torus cluster, and this one is a mesh, not 16 IPUs"),
    (pod(8), 16, {"ipulink_routing": IpuLinkRouting.RINGSWNC},
     r"RINGSWNC routing needs a partition that takes whole IPU-Link domains of 8 machines \(32 IPUs\) each, not 16 IPUs"),
    (pod(16), 4, {"ipulink_routing": IpuLinkRouting.RINGSWNC},  # the probe's case, on scripts/pod's 16 machines
     r"RINGSWNC routing needs a partition that takes whole IPU-Link domains of 16 machines \(64 IPUs\) each, not 4 IPUs"),
    (pod(4), 2, {"ipulink_routing": IpuLinkRouting.SWNC}, "SWNC routing needs a partition of two machines or more"),
    (pod(4), 16, {"num_segments": 2}, "a partition of 2 IPU-Link segments needs a cluster of 2 IPU-Link domains; this one has 1"),
    (pod(8, ilds=2), 4, {"num_segments": 2},
     r"each of 2 IPU-Link segments needs at least one whole machine \(4 IPUs\), so the size must be at least 8"),
    (pod(4), 4, {"num_gcds": 8}, "the number of GCDs must be a power of two no larger than the size, not 8"),
    (pod(4), 64, {}, "partition size 64 is larger than the cluster's 16 IPUs"),
])
def test_a_request_no_room_could_satisfy_is_refused_with_its_rule_even_when_the_pod_is_full(layout, size, options, rule):
    full = {agent: {0, 1, 2, 3} for agent in layout.agent_ids}
    with pytest.raises(InvalidArgument, match=f"^{rule}$"):
        place_partition(layout, set(layout.agent_ids), full, size, **options)


def test_a_request_larger_than_its_allocation_never_fits_it():
    layout = pod(8)
    with pytest.raises(InvalidArgument, match=r"^allocation alloc-1 has 8 IPUs \(2 machines\): a partition of 16 IPUs never fits in it$"):
        place_partition(layout, {"ag3", "ag4"}, {}, 16, where="allocation alloc-1")


def test_machines_split_across_domains_hold_no_run_of_the_size():
    layout = pod(8, IldTopology.MESH, ilds=2)  # domains ag1-ag4 and ag5-ag8
    with pytest.raises(InvalidArgument, match=r"^a partition of 16 IPUs needs 4 consecutive machines of one IPU-Link domain, .*"
                                              r"the machines of allocation alloc-1 \(ag3-ag6\) hold none$"):
        place_partition(layout, {"ag3", "ag4", "ag5", "ag6"}, {}, 16, where="allocation alloc-1")


def test_spans_read_as_runs_of_machines_then_parts_of_machines():
    layout = pod(8)
    assert span(layout, machines(5, 6, 7, 8)) == "ag5-ag8"
    assert span(layout, machines(1, 2, 7)) == "ag1-ag2, ag7"
    assert span(layout, [("ag3", 2), ("ag3", 3), ("ag4", 1)]) == "ag3 IPUs 2-3, ag4 IPU 1"
    assert span(layout, [("ag1", 0), ("ag2", 0), ("ag3", 0), ("ag4", 0), ("ag5", 0)]) == "ag1 IPU 0, ag2 IPU 0, ag3 IPU 0 and 2 more"


def test_the_first_waiting_request_is_held_the_shape_the_fewest_partitions_block():
    layout = pod(4, IldTopology.MESH)
    used, occupancy = holding({"small": [("ag1", 0)], "big": machines(3, 4)})
    # ag1-ag2 and ag2-ag3 each wait for one partition; of those, ag1-ag2 has the fewest IPUs in use.
    assert choose_held_shape(layout, set(layout.agent_ids), used, 8, holders=occupancy.holders) == frozenset(machines(1, 2))
    used, occupancy = holding({"a": [("ag1", 0)], "b": [("ag2", 3)], "c": machines(3, 4)})
    assert choose_held_shape(layout, set(layout.agent_ids), used, 16, holders=occupancy.holders) == frozenset(machines(1, 2, 3, 4))
    used, occupancy = holding({"a": [("ag1", 0)], "b": [("ag2", 3)], "c": [("ag3", 0)]})
    assert choose_held_shape(layout, set(layout.agent_ids), used, 8, holders=occupancy.holders) == frozenset(machines(3, 4))


def test_shapes_include_every_window_a_torus_can_wrap_and_only_allowed_machines():
    torus = pod(4)
    windows = shapes(torus, set(torus.agent_ids), 8)
    assert frozenset(machines(4, 1)) in windows and len(windows) == 4
    assert shapes(pod(4, IldTopology.MESH), {"ag1", "ag2", "ag4"}, 8) == [frozenset(machines(1, 2))]
    assert len(shapes(torus, {"ag2"}, 1)) == 4 and len(shapes(torus, {"ag2"}, 2)) == 2
