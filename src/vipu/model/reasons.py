"""Why a partition does not fit, in one line: what is free, what would make room, or the rule.

Placement calls these when it finds no room, with the shapes the request could take were its
machines empty, so every refusal and every waiting request's reason is worked out from the same
shapes placement chooses among:

- a request no shape of which lies within the machines, however empty, breaks a rule, named
  (InvalidArgument): `allocation a1 has 16 IPUs (4 machines): a partition of 32 IPUs never fits in it`;
- otherwise it waits for room (NoRoom, a Conflict): what is free, the largest partition that fits now and
  which partitions stand in the way of the shape needing the fewest to go:
  `no free 32-IPU run in allocation alloc-1: 16 of 64 IPUs are free, the largest free run is 16
  IPUs (ag5-ag8); it fits when p7 or p9 is removed`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence, Set

from vipu.model.entities import IPUS_PER_MACHINE, PlacedIpu, natural_key
from vipu.model.errors import InvalidArgument, NoRoom
from vipu.model.times import duration_text, utc_text
from vipu.model.topology import ClusterLayout
from vipu.model.waiting import ends_in_time

Ipu = tuple[str, int]  # (agent, index)
# Names listed before the rest are counted: a reason stays one short line.
NAMES_LISTED = 3
# The holder of IPUs kept out for a partition that is gone, until their machine confirms the clear it
# did not answer (`unconfirmed`): no removal frees them, the machine's answer does.
UNCONFIRMED = "\0unconfirmed:"


def unconfirmed(agent_id: str, partition_id: str) -> str:
    """The holder `what_makes_room` names as waiting for `agent_id` to confirm it cleared `partition_id`."""
    return f"{UNCONFIRMED}{agent_id}:{partition_id}"


def never_fits(layout: ClusterLayout, allowed: Set[str], size: int, where: str, named: bool) -> InvalidArgument:
    """The rule a request breaks when no shape of it lies within the machines, however empty."""
    machines = [agent for agent in layout.agent_ids if agent in allowed]
    total = len(machines) * IPUS_PER_MACHINE
    if named:
        return InvalidArgument(f"the named IPUs are not a linkable set of {size} IPUs in {where}")
    if size > total:
        return InvalidArgument(f"{where} has {total} IPUs ({len(machines)} machines): a partition of {size} IPUs never fits in it")
    needs = (f"{size // IPUS_PER_MACHINE} consecutive machines of one IPU-Link domain, or a run at the same positions "
             "in every domain of a looped cluster")
    return InvalidArgument(f"a partition of {size} IPUs needs {needs}, with the routing asked; "
                           f"the machines of {where} ({span(layout, {(a, i) for a in machines for i in range(IPUS_PER_MACHINE)})}) "
                           "hold none")


def no_room(layout: ClusterLayout, allowed: Set[str], used: Mapping[str, Set[int]], size: int, where: str,
            possible: list[frozenset[Ipu]], largest: Sequence[PlacedIpu] | None, holders: Mapping[Ipu, str] | None = None,
            held: frozenset[Ipu] = frozenset(), held_for: str = "") -> NoRoom:
    """What is free and what would make room, for a request some shape of which could fit. `largest`
    are the IPUs of the largest partition that fits now (None if none does); `holders` names
    the partition holding each IPU in use; `held` are IPUs kept for `held_for`, first in the queue."""
    what = {1: "no free IPU", 2: "no free pair of IPUs"}.get(size, f"no free {size}-IPU run")
    machines = [agent for agent in layout.agent_ids if agent in allowed]
    total = len(machines) * IPUS_PER_MACHINE
    free = total - sum(len(used.get(agent, ())) for agent in machines)
    facts = []
    held_free: set[Ipu] = set()
    if free == 0:
        facts.append(f"all {total} of its IPUs are in use")
    else:
        facts.append(f"{free} of {total} IPUs are free")
        if largest is not None:
            kind = "run" if len(largest) >= IPUS_PER_MACHINE else "group"
            count = len(largest)
            facts.append(f"the largest free {kind} is {count} IPU{'s' if count > 1 else ''} "
                         f"({span(layout, {(i.agent_id, i.index) for i in largest})})")
        held_free = {ipu for ipu in held if ipu[1] not in used.get(ipu[0], ())}
        if held_free:
            count = len(held_free)
            facts.append(f"{count} free IPU{'s' if count > 1 else ''} ({span(layout, held_free)}) {'are' if count > 1 else 'is'} "
                         f"held for {held_for}, first in the queue")
    fix = what_makes_room(possible, holders, held, held_for) if holders is not None else ""
    return NoRoom(f"{what} in {where}: {', '.join(facts)}{'; ' + fix if fix else ''}", held_free=len(held_free))


def what_makes_room(possible: list[frozenset[Ipu]], holders: Mapping[Ipu, str], held: frozenset[Ipu] = frozenset(),
                    held_for: str = "") -> str:
    """Which partitions must go for some shape to be free: the fewest, each choice that needs no more."""
    choices: set[frozenset[str]] = set()
    fewest = None
    for shape in possible:
        if shape & held:
            continue  # those IPUs go to the first request in the queue
        blockers = frozenset(holders[ipu] for ipu in shape if ipu in holders)
        if not blockers:
            continue
        if fewest is None or len(blockers) < fewest:
            fewest, choices = len(blockers), set()
        if len(blockers) == fewest:
            choices.add(blockers)
    if fewest is None:
        return f"the IPUs it could take are held for {held_for}, first in the queue" if held else ""
    ordered = sorted((sorted(c, key=natural_key) for c in choices), key=lambda names: [natural_key(n) for n in names])
    waits = [name for name in ordered[0] if name.startswith(UNCONFIRMED)]
    if waits:
        return _when_confirmed(ordered[0], waits)
    if fewest == 1:
        return f"it fits when {_either(name for (name,) in ordered)} is removed"
    first = ordered[0]
    if fewest > NAMES_LISTED:
        return f"it fits when {fewest} partitions are removed ({', '.join(first[:NAMES_LISTED])}, ...)"
    alternative = f" (or {_both(ordered[1])})" if len(ordered) > 1 else ""
    return f"it fits when {_both(first)} are removed{alternative}"


def _when_confirmed(blockers: list[str], waits: list[str]) -> str:
    """What frees a shape some of whose IPUs wait for their machine to confirm a clear."""
    removed = [name for name in blockers if name not in waits]
    cleared = [name[len(UNCONFIRMED):].split(":", 1) for name in waits]
    confirmations = _both([f"{agent} confirms it cleared {partition}" for agent, partition in cleared[:NAMES_LISTED]]) \
        if len(cleared) > 1 else f"{cleared[0][0]} confirms it cleared {cleared[0][1]}"
    more = f" and {len(cleared) - NAMES_LISTED} more machines answer" if len(cleared) > NAMES_LISTED else ""
    removals = f"{_both(removed) if len(removed) > 1 else removed[0]} {'are' if len(removed) > 1 else 'is'} removed and " if removed else ""
    return (f"it fits when {removals}{confirmations}{more} (removed while it did not answer; asked again until it does, "
            "its IPUs are kept out meanwhile)")


def _either(names: Iterable[str]) -> str:
    names = list(names)
    if len(names) > NAMES_LISTED:
        return f"{', '.join(names[:NAMES_LISTED])} or one of {len(names) - NAMES_LISTED} others"
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"


def _both(names: list[str]) -> str:
    return f"{', '.join(names[:-1])} and {names[-1]}"


def span(layout: ClusterLayout, ipus: Iterable[Ipu]) -> str:
    """IPUs as people read them: runs of whole machines in rack order (`ag5-ag8`), then the IPUs of
    machines taken in part (`ag3 IPUs 0-1`); past four parts, how many more."""
    by_agent: dict[str, set[int]] = {}
    for agent, index in ipus:
        by_agent.setdefault(agent, set()).add(index)
    order = {agent: n for n, agent in enumerate(layout.agent_ids)}
    parts: list[str] = []
    run: list[str] = []

    def close_run() -> None:
        if run:
            parts.append(run[0] if len(run) == 1 else f"{run[0]}-{run[-1]}")
            run.clear()

    for agent in sorted(by_agent, key=lambda a: order.get(a, len(order))):
        indices = sorted(by_agent[agent])
        if len(indices) == IPUS_PER_MACHINE:
            if run and order.get(agent) != order.get(run[-1], -2) + 1:
                close_run()
            run.append(agent)
            continue
        close_run()
        if len(indices) == 1:
            parts.append(f"{agent} IPU {indices[0]}")
        elif indices == list(range(indices[0], indices[-1] + 1)):
            parts.append(f"{agent} IPUs {indices[0]}-{indices[-1]}")
        else:
            parts.append(f"{agent} IPUs {','.join(map(str, indices))}")
    close_run()
    if len(parts) > 4:
        return f"{', '.join(parts[:3])} and {len(parts) - 3} more"
    return ", ".join(parts)


def held_clause(expected_seconds: int, first_id: str, held_needed_at: float | None, now: float) -> str:
    """Why a request expected to run this long (0: unknown), started at `now`, may not start on the
    IPUs held for the first waiting request, needed at `held_needed_at` (None: unknown); empty when
    it would end in time (`ends_in_time`; their shape is then what keeps it off them)."""
    if not expected_seconds:
        return f"with no expected duration it may not start on the IPUs held for {first_id}"
    if held_needed_at is None:
        return f"the IPUs held for {first_id} are not known to be free at any time, so nothing starts on them"
    if ends_in_time(expected_seconds, held_needed_at, now):
        return ""
    return (f"it is expected to run {duration_text(expected_seconds)}, past {utc_text(held_needed_at)}, when the IPUs held for "
            f"{first_id} are expected to be needed")
