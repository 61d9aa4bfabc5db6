"""Which machines an allocation takes, and which IPUs a partition takes.

Pure functions over a `ClusterLayout` and the IPUs already in use, so they can be tested on a
thousand machines in milliseconds and replayed against traces by the benchmarks.

Partition shapes the hardware can link:

- 1 IPU: any free IPU. 2 IPUs: a rung of one machine (IPUs 0,1 or 2,3).
- 4 IPUs or more: whole machines, a run of consecutive machines of one IPU-Link domain; in a
  torus the run may wrap from the top machine to the bottom one over the loop-back cables.
- A partition too big for one domain, or finding no room in any single one, may take one
  segment in every domain of a looped cluster, at the same machine positions, joined by the
  GW-Links between those positions.

Among the shapes that fit, the choice is best-fit: a partition of one or two IPUs goes to the
machine with the fewest free IPUs left (the lowest in the cluster among equals); one of whole
machines into the smallest run of free machines that holds it, at an end of that run. Partitions
of `LARGE_PARTITION_IPUS` or more take the top end and fill the cluster downwards, smaller ones
fill it upwards from the bottom, so small partitions do not break the runs large ones need
(`bench/allocator.py` measures this against first-fit on a synthetic trace). Given the mix of
sizes the allocation is asked for (`mix`, as the controller gives it), the choice is the shape
that leaves those sizes the most room (`vipu.model.fragmentation`), best-fit's order breaking ties.

The link ledger's word on the machines' links (`LinkFaults`) comes first: a shape that needs a
failed link is never taken (the link is quarantined, its machine still takes shapes that do not
need it), and one that needs a suspect link only when no other shape fits; the placement then
says which links it stepped around, or which suspect ones it could not.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Set
from dataclasses import dataclass, replace
from functools import partial

from vipu.model import reasons
from vipu.model.entities import IPUS_PER_MACHINE, GwRouting, IpuLinkRouting, PlacedIpu
from vipu.model.errors import Conflict, InvalidArgument, NoRoom, VipuError
from vipu.model.fragmentation import Room, SizeMix
from vipu.model.linkhealth import NO_FAULTS, LinkFaults
from vipu.model.topology import ClusterLayout

# Partitions this large fill free runs from the top of the cluster, smaller ones from the bottom.
LARGE_PARTITION_IPUS = 16
SUB_MACHINE_GROUPS = {1: ((0,), (1,), (2,), (3,)), 2: ((0, 1), (2, 3))}


def is_power_of_two(value: int) -> bool:
    return value > 0 and value & (value - 1) == 0


@dataclass(frozen=True)
class Placement:
    ipus: tuple[PlacedIpu, ...]
    num_segments: int
    ipulink_routing: IpuLinkRouting
    gw_routing: GwRouting
    link_note: str = ""  # the unhealthy links it was placed away from, or the suspect ones it takes for want of another shape


Segments = tuple[tuple[int, tuple[tuple[str, int], ...]], ...]  # (ild, ((agent, index), ...)) per segment
Shape = frozenset[tuple[str, int]]  # the IPUs of a partition, as (agent, index) pairs
Used = Mapping[str, Set[int]]  # the IPU indices taken on each agent
Explicit = tuple[tuple[int, int], ...]  # IPUs asked for by name, as (machine, IPU) topology ids
Score = tuple[float, ...]  # compared element by element: the smallest wins


def shifted(used: Mapping[str, Set[int]], off: Iterable[tuple[str, int]] = (), on: Iterable[tuple[str, int]] = ()) -> dict[str, set[int]]:
    """The IPUs in use, by agent, as a copy with `off` freed and `on` taken: the room once a
    partition has moved, or with IPUs held back."""
    taken = {agent: set(indices) for agent, indices in used.items()}
    for agent, index in off:
        taken.get(agent, set()).discard(index)
    for agent, index in on:
        taken.setdefault(agent, set()).add(index)
    return taken


@dataclass(frozen=True)
class Occupancy:
    """Who holds the IPUs in use, by (agent, index), and the free IPUs `held` for the first request
    waiting in the allocation (`held_for`, its partition id): placement keeps off those, and says
    in a refusal which partitions stand in the way. `holders` may be a function giving them, called
    only for a refusal, so that a placement that succeeds never works them out."""

    holders: Mapping[tuple[str, int], str] | Callable[[], Mapping[tuple[str, int], str]]
    held: Shape = frozenset()
    held_for: str = ""

    def who_holds(self) -> Mapping[tuple[str, int], str]:
        return self.holders() if callable(self.holders) else self.holders

    def with_held(self, used: Mapping[str, Set[int]]) -> dict[str, set[int]]:
        """The IPUs in use, and those held, by agent."""
        return shifted(used, on=self.held)


@dataclass(frozen=True)
class _Candidate:
    """A shape that fits, scored; its IPUs are worked out only for the one chosen."""

    score: Score  # best-fit's preference
    position: tuple[int, ...]  # where the shape starts in the cluster's order, for first-fit
    shape: Callable[[], Segments]
    machines_per_segment: int
    link_note: str = ""

    @property
    def segments(self) -> Segments:
        return self.shape()


class _FreeRuns:
    """For each ILD position whose machine is wholly free (allowed, and no IPU of it used), the run
    of free machines holding it."""

    def __init__(self, layout: ClusterLayout, allowed: Set[str], used: Mapping[str, Set[int]]):
        self.layout = layout
        self.run_of: dict[tuple[int, int], tuple[int, int]] = {}  # (ild, pos) -> (start, length)
        self._distinct: set[tuple[int, int, int]] | None = None
        size = layout.machines_per_ild
        for d, ild in enumerate(layout.ilds):
            free = [agent in allowed and not used.get(agent) for agent in ild]
            if all(free):
                self.run_of.update({(d, p): (0, size) for p in range(size)})
                continue
            # In a torus, scan from just after a busy machine so that runs may wrap past the top.
            offset = free.index(False) + 1 if layout.is_torus else 0
            order = [(offset + i) % size for i in range(size)]
            i = 0
            while i < size:
                if not free[order[i]]:
                    i += 1
                    continue
                j = i
                while j < size and free[order[j]]:
                    j += 1
                self.run_of.update({(d, order[k]): (order[i], j - i) for k in range(i, j)})
                i = j

    def distinct(self) -> set[tuple[int, int, int]]:
        """Each free run once, as (domain, start, length); worked out once (placement asks twice)."""
        if self._distinct is None:
            self._distinct = {(d, start, length) for (d, _), (start, length) in self.run_of.items()}
        return self._distinct

    def pieces(self, ild: int, start: int, length: int) -> tuple[int, tuple[int, ...]]:
        """(the length of the free run holding a free window, the free runs it leaves once taken)."""
        size = self.layout.machines_per_ild
        run_start, run_length = self.run_of[(ild, start)]
        if run_length == size and self.layout.is_torus:
            return run_length, (size - length,)  # what is left of a free ring is one run, round the loop-back
        offset = (start - run_start) % size
        return run_length, (offset, run_length - offset - length)

    def fit(self, ild: int, start: int, length: int) -> tuple[int, int] | None:
        """(run length, 0 if the window touches an end of its run else 1), or None if not free."""
        size = self.layout.machines_per_ild
        run = self.run_of.get((ild, start))
        if run is None:
            return None
        run_start, run_length = run  # every position of a run is free, so the window is if it lies inside
        offset = (start - run_start) % size
        if offset + length > run_length:
            if run_length < size or not self.layout.is_torus:
                return None
            return run_length, 1  # a window across the top of a wholly free ring: free, though at no end of a run
        at_end = offset == 0 or offset + length == run_length
        return run_length, 0 if at_end else 1


def _machine_windows(layout: ClusterLayout, machines: int) -> list[int]:
    """Start positions of runs of `machines` consecutive machines in one ILD."""
    size = layout.machines_per_ild
    if machines > size:
        return []
    if machines == size:
        return [0]
    if layout.is_torus:
        return list(range(size))
    return list(range(size - machines + 1))


def _default_ipulink_routing(layout: ClusterLayout, machines_per_segment: int) -> IpuLinkRouting:
    if layout.is_torus and machines_per_segment == layout.machines_per_ild:
        return IpuLinkRouting.RINGSWNC
    if machines_per_segment >= 2:
        return IpuLinkRouting.SWNC
    return IpuLinkRouting.DNC


def _routing_allows(layout: ClusterLayout, routing: IpuLinkRouting, machines_per_segment: int) -> bool:
    if routing is IpuLinkRouting.RINGSWNC:
        return layout.is_torus and machines_per_segment == layout.machines_per_ild
    if routing in (IpuLinkRouting.SWNC, IpuLinkRouting.BTNC):
        return machines_per_segment >= 2
    return True


def _check_routing_can_fit(layout: ClusterLayout, size: int, num_segments: int, routing: IpuLinkRouting) -> None:
    """InvalidArgument naming the rule when no shape of this size could have the routing asked,
    however empty the cluster: that is no question of room."""
    machines = size // IPUS_PER_MACHINE
    shapes = [machines // count for count in _segment_counts(layout, size, num_segments) if machines % count == 0]
    if any(_routing_allows(layout, routing, per_segment) for per_segment in shapes if per_segment):
        return
    if routing is IpuLinkRouting.RINGSWNC:
        where = (f"whole IPU-Link domains of {layout.machines_per_ild} machines ({layout.ipus_per_ild} IPUs) each"
                 if layout.is_torus else "whole IPU-Link domains of a torus cluster, and this one is a mesh")
        raise InvalidArgument(f"RINGSWNC routing needs a partition that takes {where}, not {size} IPUs")
    raise InvalidArgument(f"{routing.value} routing needs two machines or more in each IPU-Link domain of the partition, "
                          f"not {size} IPUs")


def _segment_counts(layout: ClusterLayout, size: int, requested: int) -> list[int]:
    if requested:
        if not is_power_of_two(requested):
            raise InvalidArgument(f"the number of IPU-Link segments must be a power of two, not {requested}")
        if requested > 1 and requested != layout.num_ilds:
            raise InvalidArgument(
                f"a partition of {requested} IPU-Link segments needs a cluster of {requested} "
                f"IPU-Link domains; this one has {layout.num_ilds}"
            )
        if requested > 1 and size // requested < IPUS_PER_MACHINE:
            raise InvalidArgument(
                f"each of {requested} IPU-Link segments needs at least one whole machine "
                f"({IPUS_PER_MACHINE} IPUs), so the size must be at least {requested * IPUS_PER_MACHINE}"
            )
        return [requested]
    counts = [1]
    if layout.num_ilds > 1 and size >= layout.num_ilds * IPUS_PER_MACHINE:
        counts.append(layout.num_ilds)
    return counts


def _sub_machine_candidates(layout: ClusterLayout, allowed: Set[str], used: Used, size: int, every: bool,
                            future: _Future | None = None) -> list[_Candidate]:
    """Candidates within one machine: each machine's first free group, or every group if asked.

    Unless asked for every one, wholly free machines after the first are skipped: the lowest
    scores best among them, and any machine in use scores better still. Weighing the `future`,
    every group of a machine in use is a candidate, and of the free machines those at an end of
    their free run (breaking a run anywhere else never leaves more room).
    """
    candidates = []
    free_machine_seen = False
    machines = enumerate(layout.agent_ids) if future is None or every else _worth_weighing(layout, allowed, used, future.runs)
    for order, agent in machines:
        if agent not in allowed:
            continue
        busy = used.get(agent, frozenset())
        if len(busy) >= IPUS_PER_MACHINE:
            continue  # no group of a machine taken whole is free, as most busy ones of a large pod are
        if not busy:
            if free_machine_seen and not every and (future is None or not future.at_run_end(agent)):
                continue
            free_machine_seen = True
        d, _ = layout.locate(agent)
        for group_order, group in enumerate(SUB_MACHINE_GROUPS[size]):
            if busy.isdisjoint(group):
                score: Score = (IPUS_PER_MACHINE - len(busy), order, group_order)  # the fullest machine, the lowest
                if future is not None:
                    score = (-future.after_group(agent, busy, group), *score)
                candidates.append(_Candidate(score, (order, group_order), partial(_group_of_ipus, d, agent, group), 0))
                if not every and (future is None or not busy):
                    break  # the machine's later groups score no better
    return candidates


def _worth_weighing(layout: ClusterLayout, allowed: Set[str], used: Used, runs: _FreeRuns) -> list[tuple[int, str]]:
    """(order, agent) of the machines `_sub_machine_candidates` weighs against the future, found
    without walking the whole pod: those in use but not taken whole, the first free one, and the
    free ones at an end of their free run."""
    size = layout.machines_per_ild
    places = {layout.locate(agent) for agent, busy in used.items()
              if 0 < len(busy) < IPUS_PER_MACHINE and agent in allowed and layout.has(agent)}
    if runs.run_of:
        places.add(min(runs.run_of))
        for ild, start, length in runs.distinct():
            places.update(((ild, start), (ild, (start + length - 1) % size)))
    return sorted((ild * size + position, layout.agent_at(ild, position)) for ild, position in places)


def _segment_plans(layout: ClusterLayout, size: int, segment_counts: Iterable[int],
                   routing: IpuLinkRouting | None) -> Iterator[tuple[int, int, tuple[int, ...]]]:
    """(segments, machines per segment, the ILDs holding them) of each way a partition of `size`
    may take whole machines, with the routing asked."""
    machines = size // IPUS_PER_MACHINE
    for count in segment_counts:
        per_segment = machines // count
        if per_segment == 0 or per_segment * count != machines:
            continue
        if routing is not None and not _routing_allows(layout, routing, per_segment):
            continue
        for ilds in [(d,) for d in range(layout.num_ilds)] if count == 1 else [tuple(range(layout.num_ilds))]:
            yield count, per_segment, ilds


def _machine_candidates(layout: ClusterLayout, size: int, segment_counts: Iterable[int], routing: IpuLinkRouting | None,
                        runs: _FreeRuns, future: _Future | None = None, every: bool = False) -> list[_Candidate]:
    """Candidates of whole machines: every free window, or, weighing the `future` and unless asked
    for every one, only the windows of one segment at an end of their free run: a window inside
    a run leaves no more room for any size than one at its end (the two pieces it leaves hold no
    more partitions of any size than the one piece an end leaves), and loses the tie to it, so
    scoring it is wasted on a large pod."""
    upwards = 1 if size < LARGE_PARTITION_IPUS else -1
    candidates = []
    for count, per_segment, ilds in _segment_plans(layout, size, segment_counts, routing):
        for start in _machine_windows(layout, per_segment):
            found = [runs.fit(d, start, per_segment) for d in ilds]
            fits = [fit for fit in found if fit is not None]
            if len(fits) < len(found):
                continue
            if future is not None and not every and count == 1 and fits[0][1]:
                continue
            score: Score = (count, sum(f[0] for f in fits), sum(f[1] for f in fits), ilds[0], upwards * start)
            if future is not None:
                score = (count, -future.after_window(ilds, start, per_segment), *score[1:])
            candidates.append(_Candidate(score, (count, ilds[0], start),
                                         partial(_run_of_machines, layout, ilds, start, per_segment), per_segment))
    return candidates


class _Future:
    """What each candidate leaves of the free room, weighed against the allocation's mix of sizes
    (`vipu.model.fragmentation`): the larger the worth, the better the choice."""

    def __init__(self, layout: ClusterLayout, allowed: Set[str], used: Mapping[str, Set[int]], runs: _FreeRuns, mix: SizeMix):
        self.layout, self.runs = layout, runs
        machines = layout.count_among(allowed)
        shares = mix.shares(min(machines * IPUS_PER_MACHINE, layout.ipus_per_ild))
        busy = [indices for agent, indices in used.items() if indices and agent in allowed and layout.has(agent)]
        free_rungs = len(SUB_MACHINE_GROUPS[2]) * (machines - len(busy)) + sum(_free_rungs(indices) for indices in busy)
        self.room = Room(shares, (length for _, _, length in runs.distinct()), free_rungs)
        self._worth: dict[tuple[object, ...], float] = {}

    def after_window(self, ilds: tuple[int, ...], start: int, machines: int) -> float:
        changes = tuple(self.runs.pieces(d, start, machines) for d in ilds)
        if changes not in self._worth:
            self._worth[changes] = self.room.after_runs(changes)
        return self._worth[changes]

    def after_group(self, agent: str, busy: Set[int], group: tuple[int, ...]) -> float:
        rungs_lost = _free_rungs(busy) - _free_rungs(set(busy) | set(group))
        if busy:
            return self.room.after_runs((), rungs_lost)
        d, position = self.layout.locate(agent)
        return self.room.after_runs((self.runs.pieces(d, position, 1),), rungs_lost)

    def at_run_end(self, agent: str) -> bool:
        d, position = self.layout.locate(agent)
        start, length = self.runs.run_of[(d, position)]
        return position in (start, (start + length - 1) % self.layout.machines_per_ild)


def _free_rungs(busy: Set[int]) -> int:
    if len(busy) >= IPUS_PER_MACHINE:
        return 0  # a machine taken whole, as most busy ones of a large pod are
    return sum(busy.isdisjoint(rung) for rung in SUB_MACHINE_GROUPS[2])


def _group_of_ipus(ild: int, agent: str, group: tuple[int, ...]) -> Segments:
    return ((ild, tuple((agent, i) for i in group)),)


def _run_of_machines(layout: ClusterLayout, ilds: tuple[int, ...], start: int, machines: int) -> Segments:
    return tuple(
        (d, tuple((layout.agent_at(d, start + i), ipu) for i in range(machines) for ipu in range(IPUS_PER_MACHINE)))
        for d in ilds
    )


def free_ipu_count(layout: ClusterLayout, allowed: Set[str], used: Mapping[str, Set[int]]) -> int:
    """The free IPUs of the allowed machines: counted from those in use, as few machines are busy
    next to the whole of a large pod."""
    machines = layout.count_among(allowed)
    return IPUS_PER_MACHINE * machines - sum(len(indices) for agent, indices in used.items() if agent in allowed and layout.has(agent))


def place_partition(
    layout: ClusterLayout,
    allowed: Set[str],
    used: Mapping[str, Set[int]],
    size: int,
    *,
    num_gcds: int = 1,
    num_segments: int = 0,
    ipulink_routing: IpuLinkRouting | None = None,
    gw_routing: GwRouting | None = None,
    explicit: tuple[tuple[int, int], ...] = (),
    where: str = "the allocation",
    first_fit: bool = False,
    occupancy: Occupancy | None = None,
    faults: LinkFaults = NO_FAULTS,
    mix: SizeMix | None = None,
) -> Placement:
    """Choose the IPUs of a partition of `size` among the `allowed` machines of `layout`.

    `used` maps agents to the IPU indices already taken. `explicit` names the IPUs wanted as
    (ILD, topology id) pairs; they must form a shape the hardware can link and be free.
    `occupancy`, when given, says who holds the IPUs in use and which free IPUs are held for a
    waiting request (placement avoids those too). Raises InvalidArgument, naming the rule, for a
    request that could never fit these machines, however empty; Conflict, saying why in one line
    (`vipu.model.reasons`), when there is no room now. `first_fit` takes the first shape that
    fits in cluster order instead of the best fit: the baseline the allocator benchmark compares
    against. `faults` are the machines' unhealthy links (see the module's docstring). `mix`, the
    sizes the allocation is asked for, turns best-fit into the choice that leaves them the most
    room (`vipu.model.fragmentation`).
    """
    check_rules(layout, size, num_gcds=num_gcds, num_segments=num_segments, ipulink_routing=ipulink_routing,
                gw_routing=gw_routing, explicit=explicit)
    taken = used if occupancy is None or not occupancy.held else occupancy.with_held(used)
    best = _best(layout, allowed, taken, size, num_segments, ipulink_routing, explicit, first_fit, faults, mix)
    if best is None:
        if faults.failed and _best(layout, allowed, taken, size, num_segments, ipulink_routing, explicit, first_fit) is not None:
            raise _quarantined(layout, allowed, taken, size, where, num_segments, ipulink_routing, explicit, faults)
        raise _refusal(layout, allowed, used, size, where, occupancy, num_segments, ipulink_routing, explicit, faults)
    return _placement(layout, best, size, num_gcds, ipulink_routing, gw_routing)


def _quarantined(layout: ClusterLayout, allowed: Set[str], used: Used, size: int, where: str, num_segments: int,
                 ipulink_routing: IpuLinkRouting | None, explicit: Explicit, faults: LinkFaults) -> NoRoom:
    """The refusal of a request whose every free shape needs a failed link."""
    candidates = _candidates(layout, allowed, used, size, num_segments, ipulink_routing, explicit)
    failed = sorted({name for c in candidates for name in faults.met(layout, _ipus_of(c))[0]})
    which = "a quarantined link" if len(failed) == 1 else "quarantined links"
    return NoRoom(f"every free place for {size} IPUs in {where} needs {which}: {faults.described(failed)}")


def _refusal(layout: ClusterLayout, allowed: Set[str], used: Used, size: int, where: str, occupancy: Occupancy | None,
             num_segments: int, ipulink_routing: IpuLinkRouting | None, explicit: Explicit,
             faults: LinkFaults = NO_FAULTS) -> VipuError:
    """Why the request does not fit: the rule, if no shape of it lies within the machines however
    empty (InvalidArgument); else what is free, the largest partition that fits (on no failed
    link), and what would make room (Conflict)."""
    possible = shapes(layout, allowed, size, num_segments=num_segments, ipulink_routing=ipulink_routing, explicit=explicit)
    if not possible:
        return reasons.never_fits(layout, allowed, size, where, named=bool(explicit))
    if occupancy is None:
        return reasons.no_room(layout, allowed, used, size, where, possible, _ipus(largest_placement(layout, allowed, used, faults)))
    return reasons.no_room(layout, allowed, used, size, where, possible,
                           _ipus(largest_placement(layout, allowed, occupancy.with_held(used), faults)),
                           occupancy.who_holds(), occupancy.held, occupancy.held_for)


def _ipus(placement: Placement | None) -> tuple[PlacedIpu, ...] | None:
    return None if placement is None else tuple(placement.ipus)


def try_place(layout: ClusterLayout, allowed: Set[str], used: Mapping[str, Set[int]], size: int, *, num_gcds: int = 1,
              num_segments: int = 0, ipulink_routing: IpuLinkRouting | None = None, gw_routing: GwRouting | None = None,
              explicit: tuple[tuple[int, int], ...] = (), first_fit: bool = False, faults: LinkFaults = NO_FAULTS,
              mix: SizeMix | None = None) -> Placement | None:
    """`place_partition` for a request already found valid, without saying why: None when there is
    no room. What the queue and the allocator benchmark call many times over."""
    best = _best(layout, allowed, used, size, num_segments, ipulink_routing, explicit, first_fit, faults, mix)
    return None if best is None else _placement(layout, best, size, num_gcds, ipulink_routing, gw_routing)


def check_rules(layout: ClusterLayout, size: int, *, num_gcds: int = 1, num_segments: int = 0,
                ipulink_routing: IpuLinkRouting | None = None, gw_routing: GwRouting | None = None,
                explicit: tuple[tuple[int, int], ...] = ()) -> None:
    """InvalidArgument naming the rule a request breaks whatever the cluster holds: its size, GCDs,
    routing, IPU-Link segments or named IPUs."""
    if not is_power_of_two(size):
        raise InvalidArgument(f"partition size must be a power of two, not {size}")
    if not is_power_of_two(num_gcds) or num_gcds > size:
        raise InvalidArgument(f"the number of GCDs must be a power of two no larger than the size, not {num_gcds}")
    if gw_routing is GwRouting.SWRING:
        raise InvalidArgument("SWRING needs switched GW-Links; vipu clusters have looped GW-Links")
    if explicit and len(set(explicit)) != len(explicit):
        twice = sorted({ipu for ipu in explicit if explicit.count(ipu) > 1})
        raise InvalidArgument(f"IPU {twice[0][1]} of IPU-Link domain {twice[0][0]} is named more than once")
    if explicit and len(explicit) != size:
        raise InvalidArgument(f"{len(explicit)} IPUs were named for a partition of size {size}")
    capacity = layout.ipus_per_ild * layout.num_ilds
    if size > capacity:
        raise InvalidArgument(f"partition size {size} is larger than the cluster's {capacity} IPUs")
    if size >= IPUS_PER_MACHINE:
        if ipulink_routing is not None:
            _check_routing_can_fit(layout, size, num_segments, ipulink_routing)
        _segment_counts(layout, size, num_segments)
    else:
        if num_segments > 1:
            raise InvalidArgument("a partition smaller than one machine has a single IPU-Link segment")
        if ipulink_routing not in (None, IpuLinkRouting.DNC):
            raise InvalidArgument(f"{ipulink_routing.value} routing needs a partition of two machines or more")


def _best(layout: ClusterLayout, allowed: Set[str], used: Used, size: int, num_segments: int, ipulink_routing: IpuLinkRouting | None,
          explicit: Explicit, first_fit: bool, faults: LinkFaults = NO_FAULTS, mix: SizeMix | None = None) -> _Candidate | None:
    """The shape placement chooses among those free now, or None; with `faults`, never one that
    needs a failed link, and one that needs a suspect link only when no other is free (its
    `link_note` says which links were stepped around, or taken for want of another shape)."""
    if size > free_ipu_count(layout, allowed, used):
        return None
    candidates = _candidates(layout, allowed, used, size, num_segments, ipulink_routing, explicit, every=bool(faults),
                             mix=None if first_fit else mix)
    if not candidates:
        return None
    def order(candidate: _Candidate) -> tuple[float, ...]:
        return candidate.position if first_fit else candidate.score

    if not faults or faults.agents.isdisjoint(allowed):
        return min(candidates, key=order)
    met = {id(c): faults.met(layout, _ipus_of(c)) for c in candidates}
    usable = [c for c in candidates if not met[id(c)][0]]
    if not usable:
        return None
    chosen = min(usable, key=lambda c: (bool(met[id(c)][1]), order(c)))
    if met[id(chosen)][1]:
        return replace(chosen, link_note=f"on suspect links for want of another free place: {faults.described(met[id(chosen)][1])}")
    preferred = min(candidates, key=order)
    avoided = sorted(set(met[id(preferred)][0]) | set(met[id(preferred)][1]))
    if preferred is not chosen and avoided:
        return replace(chosen, link_note=f"placed away from {faults.described(avoided)}")
    return chosen


def _candidates(layout: ClusterLayout, allowed: Set[str], used: Used, size: int, num_segments: int,
                ipulink_routing: IpuLinkRouting | None, explicit: Explicit, every: bool = False,
                mix: SizeMix | None = None) -> list[_Candidate]:
    """Every shape free now that placement chooses among (with `every`, each machine's every free
    group of a sub-machine size, not only its first); with `mix`, scored by the room each leaves."""
    runs = _FreeRuns(layout, allowed, used) if size >= IPUS_PER_MACHINE or mix else None
    future = _Future(layout, allowed, used, runs, mix) if mix is not None and runs is not None and not explicit else None
    if size < IPUS_PER_MACHINE:
        candidates = _sub_machine_candidates(layout, allowed, used, size, every=every or bool(explicit), future=future)
    else:
        assert runs is not None  # made for every size of whole machines
        counts = _segment_counts(layout, size, num_segments)
        candidates = _machine_candidates(layout, size, counts, ipulink_routing, runs, future, every)
    if explicit:
        wanted = set(explicit)
        candidates = [c for c in candidates if _topology_ids(layout, _ipus_of(c)) == wanted]
    return candidates


def _ipus_of(candidate: _Candidate) -> Iterator[tuple[str, int]]:
    return (ipu for _, ipus in candidate.segments for ipu in ipus)


def _topology_ids(layout: ClusterLayout, ipus: Iterable[tuple[str, int]]) -> set[tuple[int, int]]:
    """The (ILD, topology id) of IPUs given as (agent, index)."""
    return {(layout.locate(agent)[0], layout.topology_id(agent, index)) for agent, index in ipus}


def shapes(layout: ClusterLayout, allowed: Set[str], size: int, *, num_segments: int = 0,
           ipulink_routing: IpuLinkRouting | None = None, explicit: tuple[tuple[int, int], ...] = ()) -> list[Shape]:
    """Every shape a partition of `size` could take among the `allowed` machines were they all free,
    best-fit's preferred first: what a waiting request may be held, and what a refusal weighs."""
    if size < IPUS_PER_MACHINE:
        found = [frozenset((agent, i) for i in group) for agent in layout.agent_ids if agent in allowed
                 for group in SUB_MACHINE_GROUPS[size]]
    else:
        found = []
        for _, per_segment, ilds in _segment_plans(layout, size, _segment_counts(layout, size, num_segments), ipulink_routing):
            for start in _every_window(layout, per_segment):
                segments = _run_of_machines(layout, ilds, start, per_segment)
                if all(agent in allowed for _, ipus in segments for agent, _ in ipus):
                    found.append(frozenset(ipu for _, ipus in segments for ipu in ipus))
    if explicit:
        found = [shape for shape in found if _topology_ids(layout, shape) == set(explicit)]
    return list(dict.fromkeys(found))


def _every_window(layout: ClusterLayout, machines: int) -> list[int]:
    """Start positions of every run of `machines` consecutive machines of one ILD, wrapping ones too in a torus."""
    if machines >= layout.machines_per_ild:
        return [0] if machines == layout.machines_per_ild else []
    return list(range(layout.machines_per_ild if layout.is_torus else layout.machines_per_ild - machines + 1))


def choose_held_shape(layout: ClusterLayout, allowed: Set[str], used: Mapping[str, Set[int]], size: int, *,
                       holders: Mapping[tuple[str, int], str] | None = None, num_segments: int = 0,
                       ipulink_routing: IpuLinkRouting | None = None, explicit: tuple[tuple[int, int], ...] = (),
                       faults: LinkFaults = NO_FAULTS, avoid: Set[tuple[str, int]] = frozenset()) -> Shape:
    """The IPUs to hold for the first waiting request while partitions end: the shape that the
    fewest partitions block (`holders` names them; without it, the fewest IPUs in use), then the
    fewest IPUs in use, then best-fit's order; never one that needs a quarantined link (`faults`),
    nor one with an IPU it may not have (`avoid`: kept for a reservation). Empty when no shape exists."""
    def blocked(shape: Shape) -> tuple[int, int]:
        busy = [ipu for ipu in shape if ipu[1] in used.get(ipu[0], ())]
        blocking = len({holders[ipu] for ipu in busy if ipu in holders}) if holders is not None else len(busy)
        return blocking, len(busy)

    options = shapes(layout, allowed, size, num_segments=num_segments, ipulink_routing=ipulink_routing, explicit=explicit)
    if faults.failed:
        options = [shape for shape in options if not faults.met(layout, shape)[0]]
    if avoid:
        options = [shape for shape in options if shape.isdisjoint(avoid)]
    return min(options, key=blocked, default=frozenset())


def _placement(layout: ClusterLayout, best: _Candidate, size: int, num_gcds: int, ipulink_routing: IpuLinkRouting | None,
               gw_routing: GwRouting | None) -> Placement:
    per_gcd = size // num_gcds
    placed = []
    routing_id = 0
    for segment, (d, ipus) in enumerate(best.segments):
        for agent, index in ipus:
            placed.append(
                PlacedIpu(
                    agent_id=agent,
                    index=index,
                    ild=d,
                    topology_id=layout.topology_id(agent, index),
                    segment=segment,
                    routing_id=routing_id,
                    gcd=routing_id // per_gcd,
                )
            )
            routing_id += 1
    segments = len(best.segments)
    routing = ipulink_routing or _default_ipulink_routing(layout, best.machines_per_segment)
    gw = GwRouting.DEFAULT if segments == 1 else GwRouting.RING
    if gw_routing not in (None, GwRouting.DEFAULT, gw):
        raise InvalidArgument(f"GW routing {gw_routing.value} does not apply to a partition of {segments} segment(s)")
    return Placement(tuple(placed), segments, routing, gw, best.link_note)


def choose_allocation_machines(cluster_agents: tuple[str, ...], taken: Set[str], ipus: int) -> tuple[str, ...]:
    """Consecutive free machines for an allocation of `ipus` IPUs: best-fit among free runs."""
    if ipus <= 0 or ipus % IPUS_PER_MACHINE:
        raise InvalidArgument(f"an allocation takes whole machines: its size must be a positive multiple of {IPUS_PER_MACHINE}, not {ipus}")
    count = ipus // IPUS_PER_MACHINE
    if count > len(cluster_agents):
        raise InvalidArgument(f"the cluster has {len(cluster_agents)} machines; {count} were asked for")
    runs: list[tuple[int, int]] = []  # (length, start)
    start = None
    for position, agent in enumerate((*cluster_agents, None)):
        free = agent is not None and agent not in taken
        if free and start is None:
            start = position
        elif not free and start is not None:
            runs.append((position - start, start))
            start = None
    fitting = [run for run in runs if run[0] >= count]
    if not fitting:
        free_count = len(cluster_agents) - len(set(cluster_agents) & set(taken))
        raise Conflict(f"no {count} consecutive free machines in the cluster ({free_count} machines are free)")
    _, first = min(fitting)
    return tuple(cluster_agents[first : first + count])


def check_allocation_machines(cluster_id: str, cluster_agents: tuple[str, ...], taken: Mapping[str, str], agents: tuple[str, ...]) -> None:
    """Refuse a list of machines that is not a consecutive, free run of the cluster, in order."""
    if not agents:
        raise InvalidArgument("an allocation needs at least one agent")
    for agent in agents:
        if agent not in cluster_agents:
            raise InvalidArgument(f"agent {agent} is not in cluster {cluster_id}")
        if agent in taken:
            raise Conflict(f"agent {agent} is already in allocation {taken[agent]}")
    if len(set(agents)) != len(agents):
        raise InvalidArgument("an agent is listed more than once")
    first = cluster_agents.index(agents[0])
    if tuple(cluster_agents[first : first + len(agents)]) != tuple(agents):
        raise InvalidArgument(
            f"agents {','.join(agents)} are not physically consecutive in cluster {cluster_id} "
            f"(its order is {','.join(cluster_agents)})"
        )


def count_fitting(layout: ClusterLayout, allowed: Set[str], used: Mapping[str, Set[int]], size: int) -> int:
    """How many partitions of `size` IPUs, with the default options, fit side by side in the free
    IPUs of the `allowed` machines now: what a scheduler asks before it sends work here."""
    if not is_power_of_two(size) or size > layout.ipus_per_ild * layout.num_ilds:
        return 0
    if size < IPUS_PER_MACHINE:  # a machine's groups of this size do not overlap
        return sum(not any(i in used.get(agent, ()) for i in group)
                   for agent in layout.agent_ids if agent in allowed for group in SUB_MACHINE_GROUPS[size])
    machines = size // IPUS_PER_MACHINE
    runs = _FreeRuns(layout, allowed, used)
    distinct = {(d, start, length) for (d, _), (start, length) in runs.run_of.items()} if machines <= layout.machines_per_ild else set()
    count = sum(length // machines for _, _, length in distinct)
    if layout.num_ilds == 1 or size < layout.num_ilds * IPUS_PER_MACHINE:
        return count
    # The shape may also span domains, which placement takes only once no single domain has room:
    # fill each run as placement would, then place what spans domains one by one (few fit).
    taken = {agent: set(ipus) for agent, ipus in used.items()}
    for d, start, length in distinct:
        for position in _filled_positions(layout, start, length, machines, upwards=size < LARGE_PARTITION_IPUS):
            taken.setdefault(layout.agent_at(d, position), set()).update(range(IPUS_PER_MACHINE))
    while True:
        placed = try_place(layout, allowed, taken, size)
        if placed is None:
            return count
        count += 1
        for ipu in placed.ipus:
            taken.setdefault(ipu.agent_id, set()).add(ipu.index)


def _filled_positions(layout: ClusterLayout, start: int, length: int, machines: int, upwards: bool) -> list[int]:
    """The positions of one free run that partitions of `machines` machines take, placed one after
    another as place_partition does: always at an end of what is left of the run, the end with the
    lower start for small partitions and the higher for large ones."""
    size, first, left, taken = layout.machines_per_ild, start, length, []
    while left >= machines:
        bottom, top = first % size, (first + left - machines) % size
        if (bottom <= top) == upwards or bottom == top:
            window, first = first, first + machines
        else:
            window = first + left - machines
        taken += [(window + i) % size for i in range(machines)]
        left -= machines
    return taken


def largest_fitting(layout: ClusterLayout, allowed: Set[str], used: Mapping[str, Set[int]], faults: LinkFaults = NO_FAULTS) -> int:
    """The largest partition, with the default options, that fits in the free IPUs now (with
    `faults`, on no failed link); 0 if none."""
    largest = largest_placement(layout, allowed, used, faults)
    return 0 if largest is None else len(largest.ipus)


def largest_size_free(layout: ClusterLayout, allowed: Set[str], used: Mapping[str, Set[int]]) -> int:
    """The largest partition size (a power of two) that as many IPUs are free for, whatever their shape."""
    size = 1
    while size * 2 <= min(free_ipu_count(layout, allowed, used), layout.ipus_per_ild * layout.num_ilds):
        size *= 2
    return size


def largest_placement(layout: ClusterLayout, allowed: Set[str], used: Mapping[str, Set[int]],
                      faults: LinkFaults = NO_FAULTS) -> Placement | None:
    """Where the largest partition with the default options would go now (with `faults`, on no
    failed link); None if nothing fits."""
    size = largest_size_free(layout, allowed, used)
    while size >= 1:
        placed = try_place(layout, allowed, used, size, faults=faults)
        if placed is not None:
            return placed
        size //= 2
    return None
