"""Allocator quality: a synthetic trace of partition requests replayed against the placement code.

Each request arrives, asks for a partition of a power-of-two size, holds it for a while and
releases it; a request that cannot be placed when it arrives is refused (no queue), which is
what `vipu create partition` does. Three allocators see the same trace:

- best-fit: vipu's placement (`vipu.model.placement.place_partition`), as the controller runs it;
- first-fit: the same shapes the hardware can link, the first that fits in cluster order;
- capacity bound: accepts whenever enough IPUs are free, whatever their shape; no allocator
  bound by IPU-Link cabling can accept more.

The trace (seeded, so every run replays the same requests):

- sizes 1..64 IPUs, powers of two, with probabilities 0.30, 0.20, 0.18, 0.14, 0.09, 0.06, 0.03:
  most jobs are small and the count falls with size, as in the GPU-cluster traces of Microsoft's
  Philly (Jeon et al., USENIX ATC 2019) and SenseTime's Helios (Hu et al., SC 2021), where most
  jobs take one accelerator and few take more than 64;
- Poisson arrivals, the rate set so the offered load (rate x mean size x mean duration) is a
  chosen fraction of the pod's IPUs (0.9 by default: busy, so placement decisions matter);
- log-normal durations (median 1 time unit, sigma 1.5: a few jobs run a hundred times longer
  than the median), the heavy tail both traces report for job run times.

    python -m bench.allocator --requests 10000 --machines 64 --load 0.9
"""

from __future__ import annotations

import heapq
import math
import random
import time
from collections.abc import Set
from dataclasses import dataclass, field

import click

from bench.common import save, table
from vipu.model.compaction import Movable, plan_for
from vipu.model.entities import IPUS_PER_MACHINE, IldTopology
from vipu.model.fragmentation import SizeMix
from vipu.model.placement import try_place
from vipu.model.topology import ClusterLayout

SIZES = (1, 2, 4, 8, 16, 32, 64)
SIZE_WEIGHTS = (0.30, 0.20, 0.18, 0.14, 0.09, 0.06, 0.03)
# A second mix, so that placement is not tuned to one: whole machines and more, large ones common
# (a pod serving training more than notebooks).
SIZE_MIXES = {"small-first": SIZE_WEIGHTS, "large-heavy": (0.05, 0.05, 0.15, 0.20, 0.20, 0.20, 0.15)}
DURATION_SIGMA = 1.5  # of the log-normal; its median is 1


@dataclass(frozen=True)
class Request:
    arrival: float
    size: int
    duration: float


def make_trace(requests: int, capacity_ipus: int, load: float, seed: int, weights: tuple[float, ...] = SIZE_WEIGHTS) -> list[Request]:
    rng = random.Random(seed)
    mean_size = sum(s * w for s, w in zip(SIZES, weights, strict=True))
    mean_duration = math.exp(DURATION_SIGMA**2 / 2)
    rate = load * capacity_ipus / (mean_size * mean_duration)
    trace, now = [], 0.0
    for _ in range(requests):
        now += rng.expovariate(rate)
        trace.append(Request(now, rng.choices(SIZES, weights)[0], rng.lognormvariate(0.0, DURATION_SIGMA)))
    return trace


@dataclass
class Outcome:
    accepted: int = 0
    refused: int = 0
    fragmented: int = 0  # refused although enough IPUs were free
    fragmented_by_size: dict[int, int] = field(default_factory=dict)
    ipu_time: float = 0.0  # integral of IPUs in use over time
    decision_seconds: list[float] = field(default_factory=list)
    moves: int = 0  # partitions moved by compaction
    started_by_compaction: int = 0
    plan_seconds: list[float] = field(default_factory=list)


@dataclass(frozen=True)
class Budget:
    """Compaction's bound on disruption, in the trace's time unit (the median job, read as an hour)."""

    moves_per_unit: int = 20
    partition_interval: float = 24.0  # a partition moves at most once in this long


class Pod:
    """The IPUs in use, by machine, with a placement rule deciding where a request goes."""

    def __init__(self, machines: int, rule: str):
        self.layout = ClusterLayout([f"m{n}" for n in range(machines)], IldTopology.TORUS)
        self.allowed = set(self.layout.agent_ids)
        self.used: dict[str, set[int]] = {}
        self.holders: dict[tuple[str, int], str] = {}
        self.free = machines * IPUS_PER_MACHINE
        self.rule = rule
        self.mix = SizeMix()

    def place(self, size: int) -> list[tuple[str, int]] | None:
        if self.rule == "capacity bound":
            return [] if size <= self.free else None
        scored = self.rule.startswith("vipu")
        if scored:
            self.mix = self.mix.saw(size)
        placement = try_place(self.layout, self.allowed, self.used, size, first_fit=self.rule == "first-fit",
                              mix=self.mix if scored else None)
        return None if placement is None else [(ipu.agent_id, ipu.index) for ipu in placement.ipus]

    def take(self, size: int, ipus: list[tuple[str, int]], holder: str = "") -> None:
        self.free -= size
        for agent, index in ipus:
            self.used.setdefault(agent, set()).add(index)
            self.holders[(agent, index)] = holder

    def release(self, size: int, ipus: list[tuple[str, int]]) -> None:
        self.free += size
        for agent, index in ipus:
            self.holders.pop((agent, index), None)
            self.used[agent].discard(index)
            if not self.used[agent]:
                del self.used[agent]


class Compactor:
    """Compaction as the controller's queue and `vipu-admin compact` run it, replayed: on a refusal
    with enough IPUs free, a plan for the request among the relocatable partitions the budget lets
    move, carried out at once (a move takes no trace time)."""

    def __init__(self, pod: Pod, relocatable: Set[int], budget: Budget):
        self.pod, self.relocatable, self.budget = pod, relocatable, budget
        self.recent: list[float] = []  # when the moves of the last time unit were made
        self.last_moved: dict[int, float] = {}
        self.plan_seconds: list[float] = []  # how long each plan took to make

    def make_room(self, size: int, now: float, running: dict[int, list]) -> int:
        """The moves made (0: no plan) so that a request of `size` fits; `running` follows them."""
        self.recent = [t for t in self.recent if t > now - 1.0]
        movable = {str(n): Movable(str(n), frozenset(ipus)) for n, ipus in running.items()
                   if n in self.relocatable and now - self.last_moved.get(n, -math.inf) >= self.budget.partition_interval}
        started = time.perf_counter()
        plan = plan_for(self.pod.layout, self.pod.allowed, self.pod.used, self.pod.holders, size, movable,
                        max_moves=self.budget.moves_per_unit - len(self.recent), mix=self.pod.mix)
        self.plan_seconds.append(time.perf_counter() - started)
        if plan is None:
            return 0
        for move in plan.moves:
            number = int(move.partition_id)
            self.pod.release(len(move.before), list(move.before))
            running[number] = sorted(move.to)
            self.pod.take(len(move.to), running[number], move.partition_id)
            self.recent.append(now)
            self.last_moved[number] = now
        return len(plan.moves)


def replay(trace: list[Request], machines: int, rule: str, relocatable: Set[int] = frozenset(),
           budget: Budget = Budget()) -> Outcome:
    pod, outcome = Pod(machines, rule), Outcome()
    compactor = Compactor(pod, relocatable, budget) if rule.endswith("compaction") else None
    departures: list[tuple[float, int, int]] = []  # (time, request number, size)
    running: dict[int, list] = {}  # request number -> its IPUs, which a move changes
    last = 0.0
    for number, request in enumerate(trace):
        while departures and departures[0][0] <= request.arrival:
            when, ended, size = heapq.heappop(departures)
            outcome.ipu_time += (when - last) * (pod_ipus(pod) - pod.free)
            last = when
            pod.release(size, running.pop(ended))
        outcome.ipu_time += (request.arrival - last) * (pod_ipus(pod) - pod.free)
        last = request.arrival
        started = time.perf_counter()
        ipus = pod.place(request.size)
        outcome.decision_seconds.append(time.perf_counter() - started)
        if ipus is None and request.size <= pod.free and compactor is not None:
            moves = compactor.make_room(request.size, request.arrival, running)
            outcome.moves += moves
            if moves:
                ipus = pod.place(request.size)
                outcome.started_by_compaction += ipus is not None
        if ipus is None:
            outcome.refused += 1
            if request.size <= pod.free:
                outcome.fragmented += 1
                outcome.fragmented_by_size[request.size] = outcome.fragmented_by_size.get(request.size, 0) + 1
            continue
        outcome.accepted += 1
        pod.take(request.size, ipus, str(number))
        running[number] = ipus
        heapq.heappush(departures, (request.arrival + request.duration, number, request.size))
    if compactor is not None:
        outcome.plan_seconds = compactor.plan_seconds
    return outcome


def pod_ipus(pod: Pod) -> int:
    return len(pod.layout.agent_ids) * IPUS_PER_MACHINE


def relocatable_requests(trace: list[Request], share: float, seed: int) -> set[int]:
    """The numbers of the requests made relocatable: each with probability `share`, drawn apart
    from the trace so that the trace is the same whatever the share."""
    rng = random.Random(seed + 1)
    return {number for number in range(len(trace)) if rng.random() < share}


RULES = ("vipu", "vipu + compaction", "best-fit", "first-fit", "capacity bound")


@click.command()
@click.option("--requests", default=10_000, show_default=True)
@click.option("--machines", default=64, show_default=True, help="IPU-Machines in the pod (one torus domain).")
@click.option("--load", default=0.9, show_default=True, help="Offered load as a fraction of the pod's IPUs.")
@click.option("--seed", default=2026, show_default=True)
@click.option("--mix", "mix_name", type=click.Choice(sorted(SIZE_MIXES)), default="small-first", show_default=True,
              help="The trace's sizes: small-first (most jobs small) or large-heavy.")
@click.option("--relocatable", "share", default=1.0, show_default=True, help="Share of the requests made relocatable.")
@click.option("--moves-per-hour", default=20, show_default=True, help="Compaction's moves per time unit (the median job).")
@click.option("--partition-interval", default=24.0, show_default=True, help="Time units before a partition may move again.")
@click.option("--seeds", default="", help="More seeds, comma-separated: each allocator's refusals with enough IPUs free on the "
              "trace of each, and their mean (the spread one trace hides: a single choice changes all that follows).")
@click.option("--name", default="allocator", show_default=True, help="Results file: bench/results/NAME.json.")
def main(requests, machines, load, seed, mix_name, share, moves_per_hour, partition_interval, seeds, name):
    """Acceptance, utilisation and fragmentation of vipu's placement (with and without compaction),
    the best-fit it replaced, first-fit and the capacity bound."""
    weights = SIZE_MIXES[mix_name]
    trace = make_trace(requests, machines * IPUS_PER_MACHINE, load, seed, weights)
    relocatable = relocatable_requests(trace, share, seed)
    budget = Budget(moves_per_hour, partition_interval)
    horizon = trace[-1].arrival
    results = []
    for rule in RULES:
        outcome = replay(trace, machines, rule, relocatable, budget)
        decisions = sorted(outcome.decision_seconds)
        plans = sorted(outcome.plan_seconds) or [0.0]
        results.append({
            "allocator": rule,
            "accepted": outcome.accepted,
            "acceptance_percent": round(100 * outcome.accepted / requests, 2),
            "refused": outcome.refused,
            "fragmentation_refusals": outcome.fragmented,
            "fragmentation_refusals_by_size": {str(k): v for k, v in sorted(outcome.fragmented_by_size.items())},
            "mean_utilisation_percent": round(100 * outcome.ipu_time / (horizon * machines * IPUS_PER_MACHINE), 2),
            "decision_p99_ms": round(1000 * decisions[int(0.99 * (len(decisions) - 1))], 3),
            "moves": outcome.moves,
            "started_by_compaction": outcome.started_by_compaction,
            "plan_p99_ms": round(1000 * plans[int(0.99 * (len(plans) - 1))], 3),
        })
    more = [other for other in dict.fromkeys(int(text) for text in seeds.split(",") if text.strip()) if other != seed]
    across = {r["allocator"]: {str(seed): r["fragmentation_refusals"]} for r in results}
    for other in more:
        trace = make_trace(requests, machines * IPUS_PER_MACHINE, load, other, weights)
        for rule in RULES:
            across[rule][str(other)] = replay(trace, machines, rule, relocatable_requests(trace, share, other), budget).fragmented
    for counts in across.values():
        counts["mean"] = round(sum(counts.values()) / len(counts), 1)
    path = save(name, {"benchmark": "allocator", "requests": requests, "machines": machines, "load": load, "seed": seed,
                       "mix": mix_name, "sizes": dict(zip(map(str, SIZES), weights, strict=True)),
                       "duration": {"distribution": "log-normal", "median": 1, "sigma": DURATION_SIGMA},
                       "relocatable_share": share, "relocatable_requests": len(relocatable),
                       "budget": {"moves_per_time_unit": moves_per_hour, "partition_interval_units": partition_interval},
                       "results": results,
                       **({"fragmentation_refusals_by_seed": across} if more else {})})
    click.echo(table(["allocator", "accepted %", "refused", "refused with IPUs free", "mean utilisation %", "decision p99 ms",
                      "moves", "plan p99 ms"],
                     [[r["allocator"], r["acceptance_percent"], r["refused"], r["fragmentation_refusals"],
                       r["mean_utilisation_percent"], r["decision_p99_ms"], r["moves"], r["plan_p99_ms"]] for r in results]))
    if more:
        order = [str(seed), *map(str, more), "mean"]
        click.echo(table(["refused with IPUs free, by seed", *order],
                         [[rule, *(counts[s] for s in order)] for rule, counts in across.items()]))
    click.echo(f"relocatable: {len(relocatable)} of {requests} requests ({100 * len(relocatable) / requests:.0f} %); "
               f"budget {moves_per_hour} moves per time unit, a partition at most once in {partition_interval:g}")
    click.echo(f"written: {path}")


if __name__ == "__main__":
    main()
