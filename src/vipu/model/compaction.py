"""Planned compaction: which partitions to move, and where, so that a larger shape comes free.

When a request does not fit although enough IPUs are free, the partitions in the way of some shape
of it may be moved elsewhere in the allocation (relocation keeps a partition's id and attach key).
A plan is the fewest such moves found:

- every shape of the wanted size is weighed by the partitions in its way (its blockers); shapes
  with a blocker that may not move are out, the rest are tried fewest blockers first, then fewest
  IPUs moved, then in best-fit's order;
- for a shape, its blockers are placed one at a time, largest first, by vipu's own placement,
  outside the shape and outside every IPU in use, a blocker's old IPUs staying taken until it
  has moved (as relocation keeps them until its machines are cleared); the first shape whose
  blockers all find a place is the plan. Only the `SHAPES_TRIED` most promising shapes are
  tried, which bounds a plan's cost on a large allocation, and not one whose largest blocker has
  no room now (nothing has moved out of its way before it).

Plans are pure functions of the layout and the IPUs in use, as placement is, so the owner of the
allocation can make one inside its turn and carry it out one move at a time, checking each move
against what is free then. The cost is one placement per blocker of each shape tried: shapes with
unmovable blockers are dropped before any placement is made.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Set
from dataclasses import dataclass, field

from vipu.model.entities import IpuLinkRouting
from vipu.model.fragmentation import SizeMix
from vipu.model.linkhealth import NO_FAULTS, LinkFaults
from vipu.model.placement import Placement, Shape, largest_fitting, largest_size_free, shapes, shifted, try_place
from vipu.model.topology import ClusterLayout

Ipu = tuple[str, int]
HOUR = 3600.0  # the window of the budget's moves per hour, in seconds
SHAPES_TRIED = 48  # of a size, the most promising shapes whose blockers a plan tries to place: a bound on its cost


@dataclass(frozen=True)
class Movable:
    """A partition that compaction may move, with what its placement must keep."""

    partition_id: str
    ipus: Shape
    num_gcds: int = 1
    num_segments: int = 0
    ipulink_routing: IpuLinkRouting | None = None

    @property
    def size(self) -> int:
        return len(self.ipus)


@dataclass(frozen=True)
class Move:
    partition_id: str
    before: Shape
    after: Placement

    @property
    def to(self) -> Shape:
        return frozenset((ipu.agent_id, ipu.index) for ipu in self.after.ipus)


@dataclass(frozen=True)
class Plan:
    """Moves, in the order to make them, that free `shape` for a partition of `size` IPUs."""

    size: int
    shape: Shape
    moves: tuple[Move, ...]


def plan_for(layout: ClusterLayout, allowed: Set[str], used: Mapping[str, Set[int]], holders: Mapping[Ipu, str],
             size: int, movable: Mapping[str, Movable], *, max_moves: int, mix: SizeMix | None = None,
             num_segments: int = 0, ipulink_routing: IpuLinkRouting | None = None, faults: LinkFaults = NO_FAULTS) -> Plan | None:
    """The plan of at most `max_moves` moves of `movable` partitions that frees a shape for a
    partition of `size`, or None. `used` are the IPUs in use (and any held for another request,
    which moves keep off), `holders` which partition holds each IPU in use. With `faults`, no
    shape freed and no place moved to needs a failed link, as placement would refuse them."""
    if max_moves < 1:
        return None
    weighed: list[tuple[int, int, int, Shape, set[str]]] = []
    for order, shape in enumerate(shapes(layout, allowed, size, num_segments=num_segments, ipulink_routing=ipulink_routing)):
        in_use = [ipu for ipu in shape if ipu[1] in used.get(ipu[0], ())]
        blockers = {_mover(holders, movable, ipu) for ipu in in_use}
        if not in_use or len(blockers) > max_moves or not blockers <= movable.keys():
            continue  # already free (placement takes it), too many moves, or something in the way may not move
        if faults.failed and faults.met(layout, shape)[0]:
            continue  # placement would never take it
        moved_ipus = sum(movable[b].size for b in blockers)
        weighed.append((len(blockers), moved_ipus, order, shape, blockers))
    weighed.sort(key=lambda entry: entry[:3])
    fits_now: dict[Movable, bool] = {}  # the largest blocker moves first, into room free now or none
    tried = 0
    for _, _, _, shape, blockers in weighed:
        largest = max((movable[b] for b in blockers), key=lambda b: (b.size, b.partition_id))
        if largest not in fits_now:
            fits_now[largest] = try_place(layout, allowed, used, largest.size, num_gcds=largest.num_gcds, num_segments=largest.num_segments,
                                          ipulink_routing=largest.ipulink_routing, faults=faults) is not None
        if not fits_now[largest]:
            continue
        tried += 1
        if tried > SHAPES_TRIED:
            break
        moves = _moves_clearing(layout, allowed, used, shape, [movable[b] for b in blockers], mix, faults)
        if moves is not None:
            return Plan(size, shape, moves)
    return None


def _mover(holders: Mapping[Ipu, str], movable: Mapping[str, Movable], ipu: Ipu) -> str:
    """The movable partition whose move frees this IPU in use; "" when none does: its holder may
    not move, or the IPU is held back for a partition that has moved already (its old IPUs stay
    taken until its machines are seen cleared, wherever it goes next)."""
    holder = holders.get(ipu, "")
    found = movable.get(holder)
    return holder if found is not None and ipu in found.ipus else ""


def _moves_clearing(layout: ClusterLayout, allowed: Set[str], used: Mapping[str, Set[int]], shape: Shape, blockers: list[Movable],
                    mix: SizeMix | None, faults: LinkFaults) -> tuple[Move, ...] | None:
    """Each blocker placed outside `shape`, one after another, largest first; None if one finds no place."""
    taken = shifted(used, on=shape)
    moves = []
    for blocker in sorted(blockers, key=lambda b: (-b.size, b.partition_id)):
        placed = try_place(layout, allowed, taken, blocker.size, num_gcds=blocker.num_gcds,
                           num_segments=blocker.num_segments, ipulink_routing=blocker.ipulink_routing, mix=mix, faults=faults)
        if placed is None:
            return None
        moves.append(Move(blocker.partition_id, blocker.ipus, placed))
        for ipu in placed.ipus:
            taken.setdefault(ipu.agent_id, set()).add(ipu.index)
        for agent, index in blocker.ipus - shape:  # its old IPUs outside the shape are free once it has moved
            taken[agent].discard(index)
    return tuple(moves)


def frees_larger(layout: ClusterLayout, allowed: Set[str], used: Mapping[str, Set[int]], off: Iterable[Ipu], on: Iterable[Ipu],
                 faults: LinkFaults = NO_FAULTS) -> bool:
    """Whether a partition moved from the IPUs `off` to the IPUs `on` leaves room for a larger
    partition than fits now: the one test of a move, for compaction and for a reset that re-places.
    `used` counts every IPU no partition may take, those held for the first waiting request too."""
    return largest_fitting(layout, allowed, shifted(used, off=off, on=on), faults) > largest_fitting(layout, allowed, used, faults)


def plan_compaction(layout: ClusterLayout, allowed: Set[str], used: Mapping[str, Set[int]], holders: Mapping[Ipu, str],
                    movable: Mapping[str, Movable], *, max_moves: int, mix: SizeMix | None = None,
                    faults: LinkFaults = NO_FAULTS) -> Plan | None:
    """The plan that frees the largest shape that does not fit now although enough IPUs are free
    (with `faults`, that fits on no failed link), trying smaller sizes when no plan within
    `max_moves` frees a larger one; None if none does. `used` counts held IPUs as `frees_larger` does."""
    fitting = largest_fitting(layout, allowed, used, faults)
    size = largest_size_free(layout, allowed, used)
    while size > fitting:
        plan = plan_for(layout, allowed, used, holders, size, movable, max_moves=max_moves, mix=mix, faults=faults)
        if plan is not None:
            return plan
        size //= 2
    return None


@dataclass(frozen=True)
class Budget:
    """The bound on compaction's disruption in an allocation: at most `moves_per_hour` moves in
    any hour, and a partition moved at most once in `partition_interval` seconds."""

    moves_per_hour: int = 20
    partition_interval: float = 86_400.0


@dataclass
class BudgetSpent:
    """An allocation's compaction moves made lately, against its `Budget`."""

    budget: Budget
    moves: list[float] = field(default_factory=list)  # when each of the last hour's moves was made
    last_moved: dict[str, float] = field(default_factory=dict)  # partition id -> when it last moved

    @classmethod
    def recorded(cls, budget: Budget, last_moved: Mapping[str, float], now: float) -> BudgetSpent:
        """The budget spent as the allocation's partitions record it (when each last moved by
        compaction): what an owner starts from after a restart or a change of leader. Moves of
        partitions removed since are not counted, nor a partition's earlier moves within the hour."""
        return cls(budget, sorted(at for at in last_moved.values() if at > now - HOUR), dict(last_moved))

    def room(self, now: float) -> int:
        """How many moves the budget allows now."""
        self.moves = [at for at in self.moves if at > now - HOUR]
        return max(self.budget.moves_per_hour - len(self.moves), 0)

    def spent(self, now: float) -> str:
        """Why the budget allows no move now, in one line; empty if it allows one."""
        if self.room(now):
            return ""
        return (f"the budget of {self.budget.moves_per_hour} compaction moves per hour is spent; the next move is "
                f"allowed in {self.moves[0] + HOUR - now:.0f} s")

    def refusal(self, partition_id: str, now: float) -> str:
        """Why the budget refuses to move this partition now, in one line; empty if it allows it."""
        if spent := self.spent(now):
            return spent
        last = self.last_moved.get(partition_id)
        if last is not None and now - last < self.budget.partition_interval:
            return (f"partition {partition_id} was moved by compaction {now - last:.0f} s ago; it moves at most once in "
                    f"{self.budget.partition_interval:g} s")
        return ""

    def spend(self, partition_id: str, now: float) -> None:
        self.moves.append(now)
        self.last_moved[partition_id] = now


@dataclass(frozen=True)
class Report:
    """What a compaction of an allocation planned, and (unless a dry run) what it carried out:
    `moved` the partitions moved, in order; `stopped` why it stopped before the plan's end."""

    allocation_id: str
    layout: ClusterLayout
    plan: Plan | None
    why_none: str = ""  # why there is no plan
    dry_run: bool = True
    moved: tuple[str, ...] = ()
    stopped: str = ""


DEFAULT_BUDGET = Budget()
