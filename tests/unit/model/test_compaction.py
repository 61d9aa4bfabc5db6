"""Compaction plans and the placement that weighs the allocation's mix of sizes."""

from __future__ import annotations

from vipu.model.compaction import Budget, BudgetSpent, Movable, frees_larger, plan_compaction, plan_for
from vipu.model.entities import IldTopology
from vipu.model.fragmentation import SizeMix
from vipu.model.linkhealth import LinkFaults, LinkName
from vipu.model.placement import try_place
from vipu.model.topology import ClusterLayout

LAYOUT = ClusterLayout([f"ag{n}" for n in range(1, 5)], IldTopology.MESH)
ALLOWED = set(LAYOUT.agent_ids)
WHOLE = {0, 1, 2, 3}


def machines(*agents: str) -> frozenset[tuple[str, int]]:
    return frozenset((agent, i) for agent in agents for i in WHOLE)


def test_the_plan_moves_the_one_movable_partition_in_the_way_and_never_an_unmovable_one():
    used = {"ag1": set(WHOLE), "ag3": set(WHOLE)}  # 8 IPUs free on ag2 and ag4, no two free neighbours
    holders = {ipu: "pa" for ipu in machines("ag1")} | {ipu: "pc" for ipu in machines("ag3")}
    plan = plan_for(LAYOUT, ALLOWED, used, holders, 8, {"pc": Movable("pc", machines("ag3"))}, max_moves=4)
    assert plan is not None and [m.partition_id for m in plan.moves] == ["pc"]
    (move,) = plan.moves
    assert move.to == machines("ag2") or move.to == machines("ag4")
    assert not move.to & plan.shape and "ag1" not in {agent for agent, _ in plan.shape}
    assert plan_for(LAYOUT, ALLOWED, used, holders, 8, {}, max_moves=4) is None  # nothing may move
    assert plan_for(LAYOUT, ALLOWED, used, holders, 8, {"pc": Movable("pc", machines("ag3"))}, max_moves=0) is None
    assert plan_compaction(LAYOUT, ALLOWED, used, holders, {"pc": Movable("pc", machines("ag3"))}, max_moves=1).size == 8


def test_a_move_frees_a_larger_shape_only_with_ipus_no_one_holds():
    """ag1 and ag3 in use, ag2 and ag4 free: moving ag3's partition to ag4 frees ag2-ag3, 8 IPUs
    together. Held for the first waiting request (counted in `used`), ag2 frees nothing."""
    used = {"ag1": set(WHOLE), "ag3": set(WHOLE)}
    assert frees_larger(LAYOUT, ALLOWED, used, off=machines("ag3"), on=machines("ag4"))
    assert not frees_larger(LAYOUT, ALLOWED, used, off=machines("ag3"), on=machines("ag3"))  # staying frees nothing
    assert not frees_larger(LAYOUT, ALLOWED, used | {"ag2": set(WHOLE)}, off=machines("ag3"), on=machines("ag4"))


def test_the_budget_counts_moves_in_the_last_hour_and_each_partition_once_in_its_interval():
    spent = BudgetSpent(Budget(moves_per_hour=2, partition_interval=600))
    spent.spend("p1", 1000.0)
    assert spent.room(1000.0) == 1 and "moves at most once in 600 s" in spent.refusal("p1", 1100.0)
    assert spent.refusal("p2", 1100.0) == "" and spent.refusal("p1", 1700.0) == ""
    spent.spend("p2", 1100.0)
    assert "budget of 2 compaction moves per hour is spent" in spent.refusal("p3", 1200.0)
    assert spent.room(4700.0) == 2


def test_the_mix_keeps_a_run_whole_for_the_size_asked_most_where_best_fit_would_break_it():
    layout = ClusterLayout([f"m{n}" for n in range(11)], IldTopology.MESH)
    used = {"m5": set(WHOLE), "m10": set(WHOLE)}  # free runs: m0-m4 (5 machines) and m6-m9 (4)
    mix = SizeMix()
    for _ in range(50):
        mix = mix.saw(16)  # partitions of 4 machines
    best_fit = try_place(layout, set(layout.agent_ids), used, 4)
    weighed = try_place(layout, set(layout.agent_ids), used, 4, mix=mix)
    assert best_fit is not None and {ipu.agent_id for ipu in best_fit.ipus} == {"m6"}  # the smaller run: none of 4 left
    assert weighed is not None and {ipu.agent_id for ipu in weighed.ipus} in ({"m0"}, {"m4"})  # two runs of 4 left
    shares = mix.shares(16)
    assert max(shares, key=shares.get) == 16 and abs(sum(shares.values()) - 1) < 1e-9


def test_a_plan_frees_no_shape_and_moves_to_no_place_that_needs_a_failed_link():
    used = {"ag1": set(WHOLE), "ag3": set(WHOLE)}
    holders = {ipu: "pa" for ipu in machines("ag1")} | {ipu: "pc" for ipu in machines("ag3")}
    movable = {"pc": Movable("pc", machines("ag3"))}
    cable = LinkFaults(failed={LinkName("ag3", "5"): "failed the cabling test: no link"})  # the cable from ag3 up to ag4
    plan = plan_for(LAYOUT, ALLOWED, used, holders, 8, movable, max_moves=1, faults=cable)
    assert plan is not None and plan.shape == machines("ag2", "ag3") and plan.moves[0].to == machines("ag4")
    # ag4 takes no partition of whole machines: pc has nowhere to go but ag2, which frees only
    # ag3 and ag4 together, a shape that needs ag4 too.
    inside = LinkFaults(failed={LinkName("ag4", "ipu0:1C"): "failed the cabling test: no link"})
    assert plan_for(LAYOUT, ALLOWED, used, holders, 8, movable, max_moves=1, faults=inside) is None
    assert plan_compaction(LAYOUT, ALLOWED, used, holders, movable, max_moves=1, faults=cable).shape == machines("ag2", "ag3")


def test_ipus_held_back_for_a_partition_that_moved_are_not_freed_by_moving_it_again():
    layout = ClusterLayout([f"ag{n}" for n in range(1, 7)], IldTopology.MESH)
    # pc moved from ag3 to ag5; its old IPUs on ag3 stay taken until ag3 is seen cleared.
    used = {"ag1": set(WHOLE), "ag3": set(WHOLE), "ag5": set(WHOLE)}
    holders = {ipu: "pa" for ipu in machines("ag1")} | {ipu: "pc" for ipu in machines("ag3", "ag5")}
    plan = plan_for(layout, set(layout.agent_ids), used, holders, 8, {"pc": Movable("pc", machines("ag5"))}, max_moves=2)
    assert plan is not None and [m.partition_id for m in plan.moves] == ["pc"]
    assert not plan.shape & machines("ag3"), "the shape counts on ag3, which moving pc does not free"


def test_the_budget_spent_is_counted_again_from_when_each_partition_last_moved():
    spent = BudgetSpent.recorded(Budget(moves_per_hour=2, partition_interval=600), {"p1": 1000.0, "p2": -5000.0}, 1100.0)
    assert spent.room(1100.0) == 1  # p2's move is more than an hour old
    assert "moves at most once in 600 s" in spent.refusal("p1", 1100.0) and spent.refusal("p2", 1100.0) == ""


def test_a_starting_owner_weighs_the_sizes_its_partitions_and_waiting_requests_hold():
    shares = SizeMix.of([16, 16, 16, 1]).shares(16)
    assert max(shares, key=shares.get) == 16 and shares[1] > shares[2]


def test_a_free_run_that_needs_a_failed_link_does_not_count_as_fitting_and_compaction_frees_another():
    layout = ClusterLayout([f"ag{n}" for n in range(1, 7)], IldTopology.MESH)
    used = {"ag1": set(WHOLE), "ag4": set(WHOLE), "ag6": set(WHOLE)}  # ag2-ag3 free, but the cable between them failed
    holders = {ipu: "pa" for ipu in machines("ag1")} | {ipu: "pc" for ipu in machines("ag4")} | {ipu: "pd" for ipu in machines("ag6")}
    cable = LinkFaults(failed={LinkName("ag2", "5"): "failed the cabling test: no link"})
    plan = plan_compaction(layout, set(layout.agent_ids), used, holders, {"pc": Movable("pc", machines("ag4"))}, max_moves=1,
                           faults=cable)
    assert plan is not None and plan.size == 8 and [m.partition_id for m in plan.moves] == ["pc"]
    assert cable.met(layout, plan.shape) == ([], []) and machines("ag4") <= plan.shape and not plan.moves[0].to & plan.shape
    assert plan_compaction(layout, set(layout.agent_ids), used, holders, {"pc": Movable("pc", machines("ag4"))}, max_moves=1) is None
