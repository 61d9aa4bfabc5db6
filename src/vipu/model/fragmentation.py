"""How much of an allocation's free room stays useful: the measure placement chooses by.

In the spirit of fragmentation-gradient placement (Weng et al., "Beware of Fragmentation",
USENIX ATC 2023): among the shapes that fit, take the one after which the sizes the allocation
is asked for most still fit most often. What "fit" means is vipu's own shapes:

- a partition of whole machines needs a run of free machines in one IPU-Link domain (a ring in a
  torus): a free run of L machines holds floor(L / m) partitions of m machines side by side;
- a partition of 2 IPUs needs a free rung of one machine, one of 1 IPU any free IPU.

The room for a size is the count of such partitions that fit side by side now; the worth of the
free room is the sum over sizes of the size's share of requests times its room: how many of the
next request's shapes fit, expected over the mix. (Weighing the first shape of a size more than
the next ones, or counting only windows aligned to their size, did worse on `bench.allocator`'s
traces.) Shapes spanning several domains are left out of the measure: every choice takes the
same machines of each domain, so they weigh little in the choice. 1-IPU partitions are left out
too: every choice takes the same number of free IPUs.

The mix of sizes is what the allocation has been asked for (`SizeMix`), counted with a decay so
that a change in its workload shows within about `HALF_LIFE` requests, on top of an even prior
over every size the allocation can hold, so a new allocation does not favour one size. A request
is counted in each allocation it is tried in once it is found valid there, and a refused one
asked again by the same id is not counted twice. The counts live in the owner's memory; an owner that starts (a restart, a new leader)
begins from the sizes of the partitions and waiting requests the allocation holds.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from vipu.model.entities import IPUS_PER_MACHINE

HALF_LIFE = 500  # requests after which one request's weight in the mix has halved
PRIOR_REQUESTS = 8.0  # the even prior weighs as much as this many requests


@dataclass(frozen=True)
class SizeMix:
    """The share of requests of each size (in IPUs) an allocation has seen, decayed, with a prior."""

    seen: tuple[tuple[int, float], ...] = ()  # (size, decayed count), sizes in increasing order

    @classmethod
    def of(cls, sizes: Iterable[int]) -> SizeMix:
        """A mix counting each of these sizes once, undecayed: what an allocation's partitions and
        waiting requests say of its workload when its owner starts (the decayed counts are not stored)."""
        counts: dict[int, float] = {}
        for size in sizes:
            counts[size] = counts.get(size, 0.0) + 1.0
        return cls(tuple(sorted(counts.items())))

    def saw(self, size: int) -> SizeMix:
        """The mix after one more request of `size` IPUs."""
        keep = 0.5 ** (1 / HALF_LIFE)
        counts = {s: c * keep for s, c in self.seen}
        counts[size] = counts.get(size, 0.0) + 1.0
        return SizeMix(tuple(sorted(counts.items())))

    def shares(self, largest: int) -> dict[int, float]:
        """Each power-of-two size up to `largest` IPUs with its share of requests, summing to one."""
        sizes = [1 << k for k in range(largest.bit_length()) if 1 << k <= largest]
        counted = dict(self.seen)
        prior = PRIOR_REQUESTS / len(sizes)
        weights = {s: prior + counted.get(s, 0.0) for s in sizes}
        total = sum(weights.values())
        return {s: w / total for s, w in weights.items()}


class Room:
    """The free room of an allocation for each size in the mix, and what a choice would leave.

    Built once per placement from the lengths of the free runs of machines and the count of free
    rungs; `after_runs` weighs one candidate in time proportional to the number of sizes."""

    def __init__(self, shares: Mapping[int, float], runs: Iterable[int], free_rungs: int):
        self.machine_sizes = {s // IPUS_PER_MACHINE: w for s, w in shares.items() if s >= IPUS_PER_MACHINE}
        self.rung_share = shares.get(2, 0.0)
        self.runs_room = {m: 0 for m in self.machine_sizes}
        for length in runs:
            for m in self.machine_sizes:
                self.runs_room[m] += length // m
        self.free_rungs = free_rungs

    def after_runs(self, changes: Iterable[tuple[int, tuple[int, ...]]], rungs_lost: int = 0) -> float:
        """The worth of the room left when runs of the given lengths become the pieces given."""
        room = dict(self.runs_room)
        for length, pieces in changes:
            for m in room:
                room[m] += sum(p // m for p in pieces) - length // m
        return sum(w * room[m] for m, w in self.machine_sizes.items()) + self.rung_share * (self.free_rungs - rungs_lost)
