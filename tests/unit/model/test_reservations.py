"""How a refusal names the IPUs reservations keep from a request (`vipu.model.reservations`)."""

from __future__ import annotations

from vipu.model.entities import IldTopology
from vipu.model.reservations import Reservation, kept_refusal
from vipu.model.topology import ClusterLayout

LAYOUT = ClusterLayout([f"ag{n}" for n in range(1, 5)], IldTopology.MESH)
NOW = 1_800_000_000.0


def test_whole_machines_are_named_as_their_ipus_and_part_of_one_by_its_ipus():
    window = Reservation("mw1", "a1", frozenset(("ag2", i) for i in range(4)), NOW + 3600, NOW + 7200, "fans", maintenance=True)
    team = Reservation("team", "a1", frozenset({("ag3", 0), ("ag3", 1)}), NOW - 60, NOW + 3600, "a run", users=("alice",))
    single = Reservation("one", "a1", frozenset({("ag4", 2)}), NOW - 60, NOW + 3600, "a probe", users=("bob",))
    kept = {ipu: r for r in (window, team, single) for ipu in r.ipus}
    refusal = kept_refusal(8, "allocation a1", kept, {}, 0, NOW, LAYOUT)
    assert refusal.startswith("no room for 8 IPUs in allocation a1 but on reserved ones: the IPUs of ag2 are kept for maintenance "
                              "window mw1 (fans) from "), refusal
    assert "ag4 IPU 2 is kept for reservation one (a probe) from " in refusal
    assert "; ag3 IPUs 0-1 are kept for reservation team (a run) from " in refusal
