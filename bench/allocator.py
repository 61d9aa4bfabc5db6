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
from dataclasses import dataclass, field

import click

from bench.common import save, table
from vipu.model.entities import IPUS_PER_MACHINE, IldTopology
from vipu.model.errors import Conflict
from vipu.model.placement import place_partition
from vipu.model.topology import ClusterLayout

SIZES = (1, 2, 4, 8, 16, 32, 64)
SIZE_WEIGHTS = (0.30, 0.20, 0.18, 0.14, 0.09, 0.06, 0.03)
DURATION_SIGMA = 1.5  # of the log-normal; its median is 1


@dataclass(frozen=True)
class Request:
    arrival: float
    size: int
    duration: float


def make_trace(requests: int, capacity_ipus: int, load: float, seed: int) -> list[Request]:
    rng = random.Random(seed)
    mean_size = sum(s * w for s, w in zip(SIZES, SIZE_WEIGHTS, strict=True))
    mean_duration = math.exp(DURATION_SIGMA**2 / 2)
    rate = load * capacity_ipus / (mean_size * mean_duration)
    trace, now = [], 0.0
    for _ in range(requests):
        now += rng.expovariate(rate)
        trace.append(Request(now, rng.choices(SIZES, SIZE_WEIGHTS)[0], rng.lognormvariate(0.0, DURATION_SIGMA)))
    return trace


@dataclass
class Outcome:
    accepted: int = 0
    refused: int = 0
    fragmented: int = 0  # refused although enough IPUs were free
    fragmented_by_size: dict[int, int] = field(default_factory=dict)
    ipu_time: float = 0.0  # integral of IPUs in use over time
    decision_seconds: list[float] = field(default_factory=list)


class Pod:
    """The IPUs in use, by machine, with a placement rule deciding where a request goes."""

    def __init__(self, machines: int, rule: str):
        self.layout = ClusterLayout([f"m{n}" for n in range(machines)], IldTopology.TORUS)
        self.allowed = set(self.layout.agent_ids)
        self.used: dict[str, set[int]] = {}
        self.free = machines * IPUS_PER_MACHINE
        self.rule = rule

    def place(self, size: int) -> list[tuple[str, int]] | None:
        if self.rule == "capacity bound":
            return [] if size <= self.free else None
        try:
            placement = place_partition(self.layout, self.allowed, self.used, size, first_fit=self.rule == "first-fit")
        except Conflict:
            return None
        return [(ipu.agent_id, ipu.index) for ipu in placement.ipus]

    def take(self, size: int, ipus: list[tuple[str, int]]) -> None:
        self.free -= size
        for agent, index in ipus:
            self.used.setdefault(agent, set()).add(index)

    def release(self, size: int, ipus: list[tuple[str, int]]) -> None:
        self.free += size
        for agent, index in ipus:
            self.used[agent].discard(index)
            if not self.used[agent]:
                del self.used[agent]


def replay(trace: list[Request], machines: int, rule: str) -> Outcome:
    pod, outcome = Pod(machines, rule), Outcome()
    departures: list[tuple[float, int, int, list]] = []  # (time, request number, size, IPUs)
    last = 0.0
    for number, request in enumerate(trace):
        while departures and departures[0][0] <= request.arrival:
            when, _, size, ipus = heapq.heappop(departures)
            outcome.ipu_time += (when - last) * (pod_ipus(pod) - pod.free)
            last = when
            pod.release(size, ipus)
        outcome.ipu_time += (request.arrival - last) * (pod_ipus(pod) - pod.free)
        last = request.arrival
        started = time.perf_counter()
        ipus = pod.place(request.size)
        outcome.decision_seconds.append(time.perf_counter() - started)
        if ipus is None:
            outcome.refused += 1
            if request.size <= pod.free:
                outcome.fragmented += 1
                outcome.fragmented_by_size[request.size] = outcome.fragmented_by_size.get(request.size, 0) + 1
            continue
        outcome.accepted += 1
        pod.take(request.size, ipus)
        heapq.heappush(departures, (request.arrival + request.duration, number, request.size, ipus))
    return outcome


def pod_ipus(pod: Pod) -> int:
    return len(pod.layout.agent_ids) * IPUS_PER_MACHINE


@click.command()
@click.option("--requests", default=10_000, show_default=True)
@click.option("--machines", default=64, show_default=True, help="IPU-Machines in the pod (one torus domain).")
@click.option("--load", default=0.9, show_default=True, help="Offered load as a fraction of the pod's IPUs.")
@click.option("--seed", default=2026, show_default=True)
@click.option("--name", default="allocator", show_default=True, help="Results file: bench/results/NAME.json.")
def main(requests, machines, load, seed, name):
    """Acceptance, utilisation and fragmentation of best-fit, first-fit and the capacity bound."""
    trace = make_trace(requests, machines * IPUS_PER_MACHINE, load, seed)
    horizon = trace[-1].arrival
    results = []
    for rule in ("best-fit", "first-fit", "capacity bound"):
        outcome = replay(trace, machines, rule)
        decisions = sorted(outcome.decision_seconds)
        results.append({
            "allocator": rule,
            "accepted": outcome.accepted,
            "acceptance_percent": round(100 * outcome.accepted / requests, 2),
            "refused": outcome.refused,
            "fragmentation_refusals": outcome.fragmented,
            "fragmentation_refusals_by_size": {str(k): v for k, v in sorted(outcome.fragmented_by_size.items())},
            "mean_utilisation_percent": round(100 * outcome.ipu_time / (horizon * machines * IPUS_PER_MACHINE), 2),
            "decision_p99_ms": round(1000 * decisions[int(0.99 * (len(decisions) - 1))], 3),
        })
    path = save(name, {"benchmark": "allocator", "requests": requests, "machines": machines, "load": load, "seed": seed,
                       "sizes": dict(zip(map(str, SIZES), SIZE_WEIGHTS, strict=True)),
                       "duration": {"distribution": "log-normal", "median": 1, "sigma": DURATION_SIGMA},
                       "results": results})
    click.echo(table(["allocator", "accepted %", "refused", "refused with IPUs free", "mean utilisation %", "decision p99 ms"],
                     [[r["allocator"], r["acceptance_percent"], r["refused"], r["fragmentation_refusals"],
                       r["mean_utilisation_percent"], r["decision_p99_ms"]] for r in results]))
    best, first = results[0]["fragmentation_refusals"], results[1]["fragmentation_refusals"]
    click.echo(f"fragmentation refusals: best-fit {best}, first-fit {first} "
               f"({'under' if best < first / 2 else 'NOT under'} half of first-fit's)")
    click.echo(f"written: {path}")


if __name__ == "__main__":
    main()
