"""Allocator quality with waiting: `bench.allocator`'s trace replayed with a queue instead of refusals.

Every request waits until it starts (no deadline), then holds its IPUs for its duration. These
policies see the same trace (`bench.allocator.make_trace`, the same seed and load):

- FIFO + backfill: vipu's queue as the controller runs it, `vipu.model.queue.admit` over vipu's
  placement: first come, first served, a shape held for the first waiting request as partitions
  end, and requests behind it started outside that shape (no durations known);
- FIFO + backfill by duration: the same, with every request's expected duration given to
  `admit`, so that a request behind the first also starts on the held shape's free IPUs when it
  is expected to end before the shape is needed (EASY backfill). Twice: with the exact durations
  ("exact"), and with over-estimates as users give them, a Slurm time limit being an upper bound
  ("over-estimated": the true duration times a factor drawn log-uniformly from 1 to 3, median
  1.73, seeded); a request still ends at its true duration;
- FIFO + backfill + compaction: FIFO + backfill, and when the first waiting request does not fit
  although enough IPUs are free, the compaction the controller's queue asks for: a plan of moves
  of relocatable partitions (every partition of the trace) that frees a shape for it, within
  `bench.allocator`'s budget, carried out at once (no durations known). Unlike the controller,
  which plans only at a pass that started nothing (the requests it starts take a while), the
  replay plans after the requests a pass starts, which take no time here;
- plain FIFO: the same placement with nothing started ahead of the first waiting request;
- capacity bound: a request starts, in arrival order, as soon as enough IPUs are free, whatever
  their shape and whatever waits ahead of it (nothing held): what the pod could do if cabling did
  not matter. It is the reference the others are measured against, not a policy vipu could
  run (large requests may wait behind small ones indefinitely); nor a strict bound: it starts
  greedily, blind to durations, so on a short trace a policy told durations can keep more IPUs
  busy while requests arrive (a negative distance to it).

Placement weighs the mix of sizes asked so far, as the controller's does. Recorded: the mean,
median and p99 wait (time from arrival to start, in units of the median job duration), mean
utilisation while requests arrive, the longest queue, each policy's distance to the capacity
bound, and what it is told of durations (`expected_durations`).

    python -m bench.queueing --requests 10000 --machines 64 --load 0.9
"""

from __future__ import annotations

import heapq
import math
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import click

from bench.allocator import Budget, Compactor, Pod, Request, make_trace, pod_ipus
from bench.common import save, table
from vipu.model.entities import IPUS_PER_MACHINE
from vipu.model.placement import choose_held_shape, shifted, try_place
from vipu.model.queue import admit
from vipu.model.reservations import Reservation, kept_from

BACKFILL_BY_DURATION = "FIFO + backfill by duration"
ESTIMATES = {"exact": "the true duration", "over-estimated": "the true duration x a factor log-uniform in [1, 3]"}
COMPACTING = "FIFO + backfill + compaction"
POLICIES = ("FIFO + backfill", COMPACTING, f"{BACKFILL_BY_DURATION} (exact)", f"{BACKFILL_BY_DURATION} (over-estimated)",
            "plain FIFO", "capacity bound")
OVER_ESTIMATE_UP_TO = 3.0


@dataclass(frozen=True)
class Job:
    number: int
    request: Request
    expected_duration: float | None = None  # what the queue is told; None: unknown

    @property
    def size(self) -> int:
        return self.request.size


@dataclass
class Waited:
    waits: list[float] = field(default_factory=list)
    ipu_time: float = 0.0  # IPUs in use, integrated over the arrival period
    longest_queue: int = 0
    pass_seconds: list[float] = field(default_factory=list)
    moves: int = 0  # partitions moved by compaction
    plan_seconds: list[float] = field(default_factory=list)  # the compaction plans' times


def expected_durations(trace: list[Request], policy: str, seed: int) -> list[float | None]:
    """What the queue is told of each request's duration under `policy` (seeded apart from the trace)."""
    if not policy.startswith(BACKFILL_BY_DURATION):
        return [None] * len(trace)
    if policy.endswith("(exact)"):
        return [request.duration for request in trace]
    rng = random.Random(f"{seed}:over-estimates")
    return [request.duration * math.exp(rng.uniform(0.0, math.log(OVER_ESTIMATE_UP_TO))) for request in trace]


def _admission(pod: Pod, policy: str, reservations: Sequence[Reservation] = ()):
    """The policy as a function (waiting jobs, held, now, expected ends by IPU) -> (started [(job, its
    IPUs)], held, the first job still waiting), against the IPUs `pod` has in use and around the
    `reservations` as the controller's queue keeps off them (`vipu.model.reservations.kept_from`);
    the capacity bound's jobs take no IPUs in particular."""
    if policy == "capacity bound":
        def greedy(waiting: list[Job], held, now: float, ends: dict):
            started, free = [], pod.free
            for job in waiting:
                if job.size <= free:
                    started.append((job, []))
                    free -= job.size
            return started, frozenset(), None

        return greedy
    layout, allowed = pod.layout, pod.allowed

    by_duration = policy.startswith(BACKFILL_BY_DURATION)

    def queued(waiting: list[Job], held, now: float, ends: dict):
        live = [r for r in reservations if not r.ended(now)]

        def kept(job: Job) -> set[tuple[str, int]]:
            return set(kept_from(live, "", job.expected_duration or 0, now)) if live else set()  # type: ignore[arg-type]

        if held and waiting and not held.isdisjoint(kept(waiting[0])):
            held = frozenset()  # the first may no longer have it: another is held
        decided = admit(waiting, pod.used,
                        lambda job, taken: try_place(layout, allowed, shifted(taken, on=kept(job)), job.size, mix=pod.mix),
                        lambda job, taken, started: choose_held_shape(layout, allowed, taken, job.size, avoid=kept(job)), held=held,
                        backfill=policy != "plain FIFO",
                        expected_duration=(lambda job: job.expected_duration) if by_duration else None,
                        expected_ends=ends, now=now)
        started = [(job, [(i.agent_id, i.index) for i in placement.ipus]) for job, placement in decided.started]
        return started, decided.held, decided.first

    return queued


def replay(trace: list[Request], machines: int, policy: str, seed: int = 0, reservations: Sequence[Reservation] = ()) -> Waited:
    pod, outcome = Pod(machines, "vipu"), Waited()
    compactor = Compactor(pod, set(range(len(trace))), Budget()) if policy == COMPACTING else None
    expected = expected_durations(trace, policy, seed)
    by_duration = policy.startswith(BACKFILL_BY_DURATION)
    expected_end: dict[int, float | None] = {}  # job number -> when it is expected to end, as the queue is told
    running: dict[int, list[tuple[str, int]]] = {}  # job number -> its IPUs, which a compaction move changes
    decide = _admission(pod, policy, reservations)
    boundaries = sorted({moment for r in reservations for moment in (r.start, r.end)})  # when what may go where changes
    horizon = trace[-1].arrival
    departures: list[tuple[float, int]] = []  # (when, job number)
    waiting: list[Job] = []
    held: frozenset = frozenset()
    arrived, last = 0, 0.0

    def start(started: list[tuple[Job, list[tuple[str, int]]]], now: float) -> set[int]:
        for job, ipus in started:
            for r in reservations:  # the rule the replay is to keep: nothing runs into a reservation's time on its IPUs
                assert r.ipus.isdisjoint(ipus) or now >= r.end or now + job.request.duration <= r.start, (job, r.name)
            outcome.waits.append(now - job.request.arrival)
            pod.take(job.size, ipus, str(job.number))
            running[job.number] = ipus
            expected_end[job.number] = None if job.expected_duration is None else now + job.expected_duration
            heapq.heappush(departures, (now + job.request.duration, job.number))
        return {job.number for job, _ in started}

    def ends() -> dict[tuple[str, int], float | None]:
        """IPU -> when its job is expected to end: what backfill by duration reads (the others read nothing)."""
        return {ipu: expected_end[number] for number, ipus in running.items() for ipu in ipus} if by_duration else {}

    while arrived < len(trace) or waiting or departures:
        while boundaries and boundaries[0] <= last:
            boundaries.pop(0)
        now = min(trace[arrived].arrival if arrived < len(trace) else float("inf"),
                  departures[0][0] if departures else float("inf"), boundaries[0] if boundaries and waiting else float("inf"))
        outcome.ipu_time += (min(now, horizon) - min(last, horizon)) * (pod_ipus(pod) - pod.free)
        last = now
        while departures and departures[0][0] <= now:
            _, number = heapq.heappop(departures)
            pod.release(trace[number].size, running.pop(number))
            del expected_end[number]
        while arrived < len(trace) and trace[arrived].arrival <= now:
            waiting.append(Job(arrived, trace[arrived], expected[arrived]))
            pod.mix = pod.mix.saw(trace[arrived].size)
            arrived += 1
        outcome.longest_queue = max(outcome.longest_queue, len(waiting))
        known_ends = ends()
        began = time.perf_counter()
        started, held, first = decide(waiting, held, now, known_ends)
        outcome.pass_seconds.append(time.perf_counter() - began)
        starting = start(started, now)
        if compactor is not None and first is not None and first.size <= pod.free:
            moves = compactor.make_room(first.size, now, running)
            outcome.moves += moves
            if moves:  # the controller's queue starts it at the pass after the moves; here at once
                started, held, first = decide([job for job in waiting if job.number not in starting], held, now, ends())
                starting |= start(started, now)
        waiting = [job for job in waiting if job.number not in starting]
    assert len(outcome.waits) == len(trace) and pod.free == pod_ipus(pod), "every request ran, and every IPU came back"
    if compactor is not None:
        outcome.plan_seconds = compactor.plan_seconds
    return outcome


WEEK = 168.0  # in the trace's unit, the median job read as an hour
WINDOW_MACHINES = 4  # the weekly maintenance window's
WINDOW_START, WINDOW_HOURS = 5 * 24 + 2.0, 6.0  # Saturday 02:00 to 08:00, the trace starting on a Monday at midnight
RESERVED_IPUS = 16  # the weekly reservation for people's, which none of the trace's jobs is made in
RESERVATION_START, RESERVATION_HOURS = 2 * 24 + 9.0, 12.0  # Wednesday 09:00 to 21:00


def weekly_reservations(machines: int, until: float) -> list[Reservation]:
    """A maintenance window on the last `WINDOW_MACHINES` machines and a reservation of
    `RESERVED_IPUS` IPUs (placed as the controller places one: best fit on the empty pod, off the
    window's machines), every week until `until`."""
    layout = Pod(machines, "vipu").layout
    window = frozenset((agent, i) for agent in layout.agent_ids[-WINDOW_MACHINES:] for i in range(IPUS_PER_MACHINE))
    placed = try_place(layout, set(layout.agent_ids), shifted({}, on=window), RESERVED_IPUS)
    assert placed is not None
    reserved = frozenset((ipu.agent_id, ipu.index) for ipu in placed.ipus)
    weeks = range(math.ceil(until / WEEK))
    return ([Reservation(f"maintenance-{w}", "pod", window, w * WEEK + WINDOW_START, w * WEEK + WINDOW_START + WINDOW_HOURS,
                         "weekly maintenance", maintenance=True) for w in weeks]
            + [Reservation(f"team-{w}", "pod", reserved, w * WEEK + RESERVATION_START,
                           w * WEEK + RESERVATION_START + RESERVATION_HOURS, "a team's weekly slot", users=("team",)) for w in weeks])


def reserved_share(reservations: Sequence[Reservation], horizon: float, capacity_ipus: int) -> float:
    """The reservations' IPU-time while requests arrive, in points of the pod's: what they take by themselves."""
    held = sum(r.size * max(0.0, min(r.end, horizon) - min(r.start, horizon)) for r in reservations)
    return 100 * held / (horizon * capacity_ipus)


def percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


@click.command()
@click.option("--requests", default=10_000, show_default=True)
@click.option("--machines", default=64, show_default=True, help="IPU-Machines in the pod (one torus domain).")
@click.option("--load", "loads", default="0.9,0.7", show_default=True, help="Offered loads (fractions of the pod's IPUs), comma separated.")
@click.option("--seed", default=2026, show_default=True)
@click.option("--name", default="queueing", show_default=True, help="Results file: bench/results/NAME.json.")
@click.option("--reservations", "with_reservations", is_flag=True,
              help="Instead: the policies told durations, with and without a weekly maintenance window on 4 machines and a weekly "
                   "reservation of 16 IPUs, and the utilisation lost to them beyond their own IPU-hours.")
def main(requests, machines, loads, seed, name, with_reservations):
    """Waits, utilisation and distance to the capacity bound of vipu's queue (FIFO + backfill, with
    compaction, and with expected durations) and plain FIFO."""
    if with_reservations:
        return reservations_main(requests, machines, loads, seed, name)
    runs = []
    for load in [float(text) for text in loads.split(",")]:
        trace = make_trace(requests, machines * IPUS_PER_MACHINE, load, seed)
        horizon = trace[-1].arrival
        results = {}
        for policy in POLICIES:
            waited = replay(trace, machines, policy, seed)
            estimate = policy.removeprefix(f"{BACKFILL_BY_DURATION} (").removesuffix(")")
            results[policy] = {
                "policy": policy,
                "expected_durations": ESTIMATES.get(estimate, "unknown"),
                "mean_wait": round(statistics.fmean(waited.waits), 3),
                "median_wait": round(statistics.median(waited.waits), 3),
                "p99_wait": round(percentile(waited.waits, 0.99), 3),
                "started_at_once_percent": round(100 * sum(w == 0 for w in waited.waits) / len(waited.waits), 1),
                "mean_utilisation_percent": round(100 * waited.ipu_time / (horizon * machines * IPUS_PER_MACHINE), 2),
                "longest_queue": waited.longest_queue,
                "pass_p99_ms": round(1000 * percentile(waited.pass_seconds, 0.99), 3),
                "moves": waited.moves,
                "plan_p99_ms": round(1000 * percentile(waited.plan_seconds, 0.99), 3) if waited.plan_seconds else 0.0,
            }
        bound = results["capacity bound"]
        for result in results.values():
            result["utilisation_below_bound_points"] = round(bound["mean_utilisation_percent"] - result["mean_utilisation_percent"], 2)
            result["mean_wait_over_bound"] = round(result["mean_wait"] / bound["mean_wait"], 2) if bound["mean_wait"] else None
        runs.append({"load": load, "results": list(results.values())})
        click.echo(f"offered load {load}:")
        click.echo(table(["policy", "mean wait", "median wait", "p99 wait", "started at once %", "mean utilisation %",
                          "below bound (points)", "longest queue", "pass p99 ms", "moves"],
                         [[r["policy"], r["mean_wait"], r["median_wait"], r["p99_wait"], r["started_at_once_percent"],
                           r["mean_utilisation_percent"], r["utilisation_below_bound_points"], r["longest_queue"], r["pass_p99_ms"],
                           r["moves"]]
                          for r in results.values()]))
    path = save(name, {"benchmark": "queueing", "requests": requests, "machines": machines, "seed": seed,
                       "wait_unit": "the median job duration",
                       "expected_durations": ESTIMATES, "runs": runs})
    click.echo(f"written: {path}")



def reservations_main(requests: int, machines: int, loads: str, seed: int, name: str) -> None:
    """The cost of maintenance windows and reservations to everyone else: utilisation with and
    without them, the same trace, less the IPU-time they take by themselves."""
    runs = []
    for load in [float(text) for text in loads.split(",")]:
        trace = make_trace(requests, machines * IPUS_PER_MACHINE, load, seed)
        horizon = trace[-1].arrival
        reservations = weekly_reservations(machines, horizon + 2 * WEEK)
        share = reserved_share(reservations, horizon, machines * IPUS_PER_MACHINE)
        results = []
        for policy in (f"{BACKFILL_BY_DURATION} (exact)", f"{BACKFILL_BY_DURATION} (over-estimated)"):
            without, with_them = (replay(trace, machines, policy, seed, kept) for kept in ((), reservations))
            plain, reserved = (100 * w.ipu_time / (horizon * machines * IPUS_PER_MACHINE) for w in (without, with_them))
            results.append({
                "policy": policy, "utilisation_percent": round(plain, 2), "with_reservations_percent": round(reserved, 2),
                "reserved_points": round(share, 2), "lost_beyond_reserved_points": round(plain - reserved - share, 2),
                "mean_wait": round(statistics.fmean(without.waits), 3),
                "mean_wait_with_reservations": round(statistics.fmean(with_them.waits), 3)})
        runs.append({"load": load, "results": results})
        click.echo(f"offered load {load}:")
        click.echo(table(["policy", "utilisation %", "with reservations %", "reserved (points)", "lost beyond (points)",
                          "mean wait", "with reservations"],
                         [[r["policy"], r["utilisation_percent"], r["with_reservations_percent"], r["reserved_points"],
                           r["lost_beyond_reserved_points"], r["mean_wait"], r["mean_wait_with_reservations"]] for r in results]))
    path = save(name, {"benchmark": "queueing-reservations", "requests": requests, "machines": machines, "seed": seed,
                       "wait_unit": "the median job duration, read as an hour",
                       "reservations": {"maintenance_window": f"{WINDOW_MACHINES} machines, {WINDOW_HOURS:g} h a week",
                                        "for_people": f"{RESERVED_IPUS} IPUs, {RESERVATION_HOURS:g} h a week, no job of the trace in it"},
                       "runs": runs})
    click.echo(f"written: {path}")


if __name__ == "__main__":
    main()
