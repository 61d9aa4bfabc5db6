"""Fair share between accounts: how close each account's share of the pod stays to its entitlement
while it has work waiting, what quotas cost in utilisation, and whether a reclaim ever evicts more
than it must.

A discrete-event replay (simulated time, one process) of the rules the owner runs, with the
owner's own code for each of them: the pass over the queue (`vipu.model.queue.admit`), each
account's quota and cohort borrowing (`vipu.model.accounts.Quotas`), fair-share order by decayed
usage (`FairShare`, `fair_order`) and the reclaim of borrowed quota (`reclaim`), on real placement
(`vipu.model.placement`). Every request waits until it starts, as `vipu create partition --wait`
does. Accounts (entitlements 0.4, 0.3, 0.2, 0.1 by default, all in one cohort, so idle quota is
lent) each submit their own stream of `bench.allocator`'s trace mix (sizes 1-64, log-normal
durations), labelled with the front-end a team would use (Slurm-like, Kubernetes-like,
vPOD-like); each asks for more than it is entitled to by the same factor (or, `--demand equal`, an
equal part that differs from their entitlements), and the offered load (1.3 of the pod by default)
keeps work waiting. Half the partitions are preemptible. A reclaimed
partition is submitted again, as a Slurm job requeued on preemption is.

Reported per account: the time-weighted mean of |achieved share - entitled share| while it has
work waiting, in points of the pod; the same against its share of the entitlements of the accounts
that are busy then (what it can get while others lend to it); and the same of the IPUs in use
(its share of what runs against that entitlement: the order's fairness, the pod's idle IPUs
apart, which the first two count against every account alike); the utilisation
of the pod against the same trace without quotas (first come, first served with backfill: vipu
without accounts); and, for each reclaim, the IPUs evicted beyond the fewest that make room (by
brute force over the candidates where they are few enough).

    python -m bench.fairshare --machines 32 --requests 3000
"""

from __future__ import annotations

import heapq
import itertools
import random
from dataclasses import dataclass

import click

from bench.allocator import SIZE_WEIGHTS, make_trace
from bench.common import percentile, save, split, table
from vipu.model.accounts import Account, Candidate, FairShare, Quota, Quotas, fair_order, reclaim, standing
from vipu.model.entities import IPUS_PER_MACHINE, IldTopology
from vipu.model.placement import choose_held_shape, try_place
from vipu.model.queue import Lines, admit
from vipu.model.topology import ClusterLayout

FRONT_ENDS = ("slurm-like", "kubernetes-like", "vpod-like")
GRACE = 0.05  # time units between a reclaim's notice and the eviction (the median job runs 1)
BRUTE_FORCE_CANDIDATES = 12


@dataclass
class Job:
    name: str
    account: str
    size: int
    duration: float
    preemptible: bool
    sequence: int


@dataclass
class Running:
    job: Job
    ipus: frozenset[tuple[str, int]]
    ends: float
    reclaim_at: float = 0.0


class Replay:
    def __init__(self, machines: int, entitlements: dict[str, float], quotas_on: bool, half_life: float):
        self.layout = ClusterLayout([f"ag{i}" for i in range(1, machines + 1)], IldTopology.MESH)
        self.allowed = set(self.layout.agent_ids)
        self.capacity = machines * IPUS_PER_MACHINE
        self.entitlements = entitlements
        self.accounts = {name: Account(name, (), "pod", {"": Quota(round(share * self.capacity))}) for name, share in entitlements.items()}
        self.quotas_on = quotas_on
        self.usage = FairShare(half_life)
        self.running: dict[str, Running] = {}
        self.used: dict[str, set[int]] = {}
        self.waiting: list[Job] = []
        self.held: frozenset = frozenset()
        self.held_for = ""
        self.reclaimed_for: dict[str, tuple[str, frozenset[str]]] = {}  # waiting job -> (its account, accounts reclaimed from)
        self.events: list[tuple[float, int, str, object]] = []
        self.counter = itertools.count()
        self.now = 0.0
        self.ipu_time = 0.0
        self.deviation = {name: 0.0 for name in entitlements}  # integral of |achieved - entitled| while waiting
        self.busy_deviation = {name: 0.0 for name in entitlements}  # the same against the busy accounts' entitlements
        self.used_deviation = {name: 0.0 for name in entitlements}  # the same, its share of the IPUs in use (idle ones apart)
        self.waiting_time = {name: 0.0 for name in entitlements}
        self.achieved = {name: 0.0 for name in entitlements}  # integral of the achieved share while waiting
        self.evictions = 0
        self.evicted_ipus = 0
        self.excess_ipus = 0  # beyond the fewest that make room, where brute force could tell
        self.reclaims = 0
        self.started = 0

    def schedule(self, at: float, kind: str, payload: object) -> None:
        heapq.heappush(self.events, (at, next(self.counter), kind, payload))

    def advance(self, to: float) -> None:
        dt = to - self.now
        if dt <= 0:
            return
        held = {name: 0 for name in self.entitlements}
        for r in self.running.values():
            held[r.job.account] += r.job.size
        self.ipu_time += sum(held.values()) * dt
        waiting = {job.account for job in self.waiting}
        busy = waiting | {name for name, ipus in held.items() if ipus}
        busy_total = sum(self.entitlements[name] for name in busy) or 1.0
        for name in waiting:
            achieved = held[name] / self.capacity
            self.deviation[name] += abs(achieved - self.entitlements[name]) * dt
            self.achieved[name] += achieved * dt
            self.busy_deviation[name] += abs(achieved - self.entitlements[name] / busy_total) * dt
            in_use = sum(held.values())
            if in_use:
                self.used_deviation[name] += abs(held[name] / in_use - self.entitlements[name] / busy_total) * dt
            self.waiting_time[name] += dt
        self.now = to

    def place(self, job: Job, used):
        return try_place(self.layout, self.allowed, used, job.size)

    def hold(self, job: Job, used, started):
        return choose_held_shape(self.layout, self.allowed, used, job.size)

    def start(self, job: Job, ipus) -> None:
        taken = frozenset((ipu.agent_id, ipu.index) for ipu in ipus)
        for agent, index in taken:
            self.used.setdefault(agent, set()).add(index)
        self.running[job.name] = Running(job, taken, self.now + job.duration)
        self.waiting.remove(job)
        self.schedule(self.now + job.duration, "end", job.name)
        self.started += 1

    def end(self, name: str, evicted: bool = False) -> Job | None:
        running = self.running.pop(name, None)
        if running is None:
            return None
        for agent, index in running.ipus:
            self.used[agent].discard(index)
        self.usage.record(running.job.account, running.job.size, running.ends - running.job.duration, self.now)
        return running.job

    def quotas(self) -> Quotas:
        return Quotas.of(self.accounts, "a1", ((r.job.account, r.job.size) for r in self.running.values()))

    def run_pass(self) -> None:
        if not self.waiting:
            self.held, self.held_for = frozenset(), ""
            return
        allowed = None
        if self.quotas_on:
            quotas = self.quotas()
            usage = self.usage.usage(self.now, ((r.job.account, r.job.size, r.ends - r.job.duration) for r in self.running.values()))
            ordered = fair_order(self.waiting, lambda job: job.account,
                                 lambda name: standing(usage, name, quotas.entitled_share(name)))
            waiting = {job.name for job in self.waiting}
            self.reclaimed_for = {name: ab for name, ab in self.reclaimed_for.items() if name in waiting}
            barred: dict[str, set[str]] = {}
            for lender, borrowers in self.reclaimed_for.values():
                for borrower in borrowers:
                    barred.setdefault(borrower, set()).add(lender)
            counted = [0]

            def allowed(job: Job, started) -> bool:
                for earlier, _ in started[counted[0]:]:
                    quotas.take(earlier.account, earlier.size)
                counted[0] = len(started)
                return quotas.verdict(job.account, job.size, barred.get(job.account, set())).allowed

            queue: Lines[Job] | list[Job] = Lines.of(ordered, lambda job: job.size)
        else:
            queue = sorted(self.waiting, key=lambda job: job.sequence)
        first_candidate = next(iter(queue), None)
        held = self.held if first_candidate is not None and first_candidate.name == self.held_for else frozenset()
        admission = admit(queue, {a: set(s) for a, s in self.used.items()}, self.place, self.hold, held=held, allowed=allowed)
        for job, placement in admission.started:
            self.start(job, placement.ipus)
        self.held, self.held_for = (admission.held, admission.first.name) if admission.first is not None else (frozenset(), "")
        if self.quotas_on and admission.first is not None:
            self.reclaim_for(ordered)

    def reclaim_for(self, ordered: list[Job]) -> None:
        if any(r.reclaim_at for r in self.running.values()):
            return  # one reclaim at a time, as the owner
        quotas = self.quotas()
        for job in ordered:
            if job not in self.waiting or not quotas.within_own(job.account, job.size):
                continue
            candidates = [Candidate(name, r.job.account, r.job.size) for name, r in self.running.items()
                          if r.job.preemptible and r.job.account != job.account and quotas.borrowing(r.job.account) > 0]
            if not candidates:
                continue

            def frees(ids, job=job) -> bool:
                freed = {agent: set(indices) for agent, indices in self.used.items()}
                for name in ids:
                    for agent, index in self.running[name].ipus:
                        freed[agent].discard(index)
                return self.place(job, freed) is not None

            chosen = reclaim(candidates, quotas, frees)
            if not chosen:
                continue
            self.reclaims += 1
            ipus = sum(self.running[name].job.size for name in chosen)
            if len(candidates) <= BRUTE_FORCE_CANDIDATES:
                self.excess_ipus += ipus - fewest(candidates, quotas, frees)
            self.reclaimed_for[job.name] = (job.account, frozenset(self.running[name].job.account for name in chosen))
            for name in chosen:
                self.running[name].reclaim_at = self.now + GRACE
                self.schedule(self.now + GRACE, "reclaim", name)
            return

    def replay(self, jobs: list[tuple[float, Job]]) -> None:
        for arrival, job in jobs:
            self.schedule(arrival, "arrive", job)
        horizon = jobs[-1][0]
        while self.events:
            at, _, kind, payload = heapq.heappop(self.events)
            if at > horizon:
                break  # measured over the arrivals' window, while the load is offered
            self.advance(at)
            if kind == "arrive":
                self.waiting.append(payload)  # type: ignore[arg-type]
            elif kind == "end":
                running = self.running.get(payload)  # type: ignore[arg-type]
                if running is not None and running.ends <= at:
                    self.end(payload)  # type: ignore[arg-type]
            elif kind == "reclaim":
                running = self.running.get(payload)  # type: ignore[arg-type]
                if running is None or not running.reclaim_at:
                    continue
                quotas = self.quotas()
                lenders = {job.account for job in self.waiting if quotas.within_own(job.account, job.size)}
                if lenders - {running.job.account}:
                    job = self.end(payload, evicted=True)  # type: ignore[arg-type]
                    self.evictions += 1
                    self.evicted_ipus += job.size
                    left = running.ends - self.now
                    self.waiting.append(Job(job.name + "'", job.account, job.size, left, job.preemptible, next(self.counter)))
                else:
                    running.reclaim_at = 0.0
            self.run_pass()
        self.horizon = horizon


def fewest(candidates: list[Candidate], quotas: Quotas, frees) -> int:
    """The fewest IPUs of any set of the candidates that frees the room (none below its quota)."""
    best = None
    for count in range(1, len(candidates) + 1):
        for combo in itertools.combinations(candidates, count):
            ipus = sum(c.size for c in combo)
            if best is not None and ipus >= best:
                continue
            taken: dict[str, int] = {}
            for c in combo:
                taken[c.account] = taken.get(c.account, 0) + c.size
            if all(taken[a] <= quotas.borrowing(a) for a in taken) and frees(frozenset(c.partition_id for c in combo)):
                best = ipus
    return best if best is not None else 0


def jobs_of(entitlements: dict[str, float], requests: int, machines: int, load: float, seed: int, preemptible: float,
            demand: str) -> list:
    """Each account's stream of the allocator's trace mix, merged by arrival: a part of the load
    in proportion to its entitlement (`demand` "entitled": each asks for more than it is entitled
    to by the same factor) or an equal part ("equal")."""
    rng = random.Random(seed)
    merged = []
    for n, (name, share) in enumerate(entitlements.items()):
        part = share if demand == "entitled" else 1 / len(entitlements)
        trace = make_trace(max(1, round(requests * part)), machines * IPUS_PER_MACHINE, load * part, seed + n, SIZE_WEIGHTS)
        for i, request in enumerate(trace):
            size = min(request.size, machines * IPUS_PER_MACHINE)
            merged.append((request.arrival, Job(f"{name}-{i}", name, size, request.duration, rng.random() < preemptible, 0)))
    merged.sort(key=lambda item: item[0])
    for sequence, (_, job) in enumerate(merged):
        job.sequence = sequence
    return merged


@click.command()
@click.option("--machines", type=click.IntRange(2, 1024), default=32, show_default=True)
@click.option("--requests", type=click.IntRange(40, 200_000), default=3000, show_default=True, help="In all, over the accounts.")
@click.option("--entitlements", default="0.4,0.3,0.2,0.1", show_default=True, help="Each account's share of the pod (3 to 5).")
@click.option("--load", type=click.FloatRange(0.1, 5.0), default=1.3, show_default=True, help="Offered load, of the pod's IPUs.")
@click.option("--half-life", type=click.FloatRange(0.01, 1e6), default=5.0, show_default=True,
              help="Fair share's half-life, in time units (the median job runs 1).")
@click.option("--preemptible", type=click.FloatRange(0.0, 1.0), default=0.5, show_default=True, help="The share of jobs preemptible.")
@click.option("--demand", type=click.Choice(["entitled", "equal"]), default="entitled", show_default=True,
              help="Each account's part of the load: in proportion to its entitlement, or equal.")
@click.option("--seed", type=int, default=1, show_default=True)
@click.option("--name", default="fairshare", show_default=True, help="Results file name under bench/results.")
def main(machines, requests, entitlements, load, half_life, preemptible, demand, seed, name):
    """Fair share's distance from entitlement, its cost in utilisation, and evictions beyond the minimum."""
    shares = [float(x) for x in split(entitlements)]
    if not 3 <= len(shares) <= 5 or abs(sum(shares) - 1.0) > 1e-6:
        raise click.BadParameter("3 to 5 shares that sum to 1", param_hint="--entitlements")
    names = {f"team-{chr(ord('a') + n)}": share for n, share in enumerate(shares)}
    jobs = jobs_of(names, requests, machines, load, seed, preemptible, demand)
    fair = Replay(machines, names, True, half_life)
    fair.replay([(at, Job(j.name, j.account, j.size, j.duration, j.preemptible, j.sequence)) for at, j in jobs])
    plain = Replay(machines, names, False, half_life)
    plain.replay([(at, Job(j.name, j.account, j.size, j.duration, j.preemptible, j.sequence)) for at, j in jobs])
    rows, accounts = [], []
    for n, (account, share) in enumerate(names.items()):
        entry = {"account": account, "front_end": FRONT_ENDS[n % len(FRONT_ENDS)], "entitled_share": share}
        for label, replay in (("fair", fair), ("plain", plain)):
            waited = replay.waiting_time[account] or 1e-12
            entry[f"{label}_mean_deviation_points"] = round(100 * replay.deviation[account] / waited, 2)
            entry[f"{label}_mean_deviation_among_busy_points"] = round(100 * replay.busy_deviation[account] / waited, 2)
            entry[f"{label}_mean_deviation_of_used_points"] = round(100 * replay.used_deviation[account] / waited, 2)
            entry[f"{label}_waiting_fraction"] = round(replay.waiting_time[account] / replay.now, 3)
            entry[f"{label}_mean_share_while_waiting"] = round(replay.achieved[account] / waited, 3)
        accounts.append(entry)
        rows.append([account, entry["front_end"], share, entry["fair_mean_share_while_waiting"], entry["fair_mean_deviation_points"],
                     entry["fair_mean_deviation_among_busy_points"], entry["plain_mean_deviation_points"],
                     entry["plain_mean_deviation_among_busy_points"]])
    summary = {}
    for label, replay in (("fair", fair), ("plain", plain)):
        summary[label] = {
            "p95_deviation_points": round(percentile([a[f"{label}_mean_deviation_points"] for a in accounts], 0.95), 2),
            "p95_deviation_among_busy_points": round(percentile([a[f"{label}_mean_deviation_among_busy_points"] for a in accounts],
                                                                0.95), 2),
            "p95_deviation_of_used_points": round(percentile([a[f"{label}_mean_deviation_of_used_points"] for a in accounts], 0.95), 2),
            "utilisation_percent": round(100 * replay.ipu_time / (replay.now * replay.capacity), 2),
            "started": replay.started,
        }
    summary["fair"].update({"reclaims": fair.reclaims, "evictions": fair.evictions, "evicted_ipus": fair.evicted_ipus,
                            "ipus_evicted_beyond_the_fewest": fair.excess_ipus})
    path = save(name, {"benchmark": "fairshare", "machines": machines, "requests": requests, "load": load, "demand": demand,
                       "half_life": half_life,
                       "preemptible_share": preemptible, "seed": seed, "grace": GRACE, "accounts": accounts, "summary": summary})
    click.echo(table(["account", "front-end", "entitled", "fair: share", "fair: |dev| pts", "fair: vs busy", "FCFS: |dev| pts",
                      "FCFS: vs busy"], rows))
    click.echo(table(["", "p95 |dev| pts", "p95 vs busy pts", "p95 of used pts", "utilisation %", "started"],
                     [[label, s["p95_deviation_points"], s["p95_deviation_among_busy_points"], s["p95_deviation_of_used_points"],
                       s["utilisation_percent"], s["started"]]
                      for label, s in summary.items()]))
    click.echo(f"reclaims {fair.reclaims}, evictions {fair.evictions} ({fair.evicted_ipus} IPUs), "
               f"IPUs evicted beyond the fewest: {fair.excess_ipus}")
    click.echo(f"written: {path}")


if __name__ == "__main__":
    main()
