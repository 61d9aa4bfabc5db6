"""The fault campaign: clients make and remove partitions against three replicas on PostgreSQL and
real agents while a nemesis injects faults; afterwards a checker judges every answer against the
final store and every agent.

Each client logs every call with its start, end and answer: ok, refused (a definite no: no room,
busy, failed at a machine and not kept) or unknown (the answer did not say; any Unavailable counts
here, the conservative reading, so the share of unknown answers is an upper bound). The nemesis
injects one fault at a time, at random, each bounded in time:

- `kill-leader`, `stop-leader`: SIGKILL, or SIGSTOP for 0.5 to 2 leases, of the leading replica;
- `kill-standby`: SIGKILL of a standby; `kill-agent`, `stop-agent`: of an agent (stopped 0.5 to 5 s);
- `pg-lock`: every table the controller writes locked by another connection (ACCESS EXCLUSIVE)
  for 0.1 to 0.5 of a lease (by default), or (`pg-lock-long`) for 1.2 to 2 leases;
- `pg-pause`: the PostgreSQL server's processes stopped (SIGSTOP) for 0.1 to 0.5 of a lease, or
  (`pg-pause-long`) from 1.2 leases to `--longest-stall` seconds (60 by default; log-uniform);
- `kill-postgres`: every PostgreSQL process SIGKILLed, and the server started again (crash recovery);
- `net-split`: the leader cut off from PostgreSQL by a network partition (`bench.netsplit`) from
  1.2 leases to `--longest-stall` seconds, where this machine allows network namespaces.

Slow agents and slow commits are there throughout: replica `c` runs with failpoints that hold each
of its commits and each partition it applies at an agent (`SLOW_REPLICA`), so whenever it leads
(a third of the time or so) every turn is slow; and a stopped agent or a locked table is slow too.

A killed or deposed replica, and a killed agent, is started again once the fault ends. Then the
checker, once a leader serves and two health passes have run: every acknowledged create present
(unless its remove was acknowledged, or unknown) and configured on exactly its agents, every
refused create and acknowledged remove absent, every unknown either, no IPU in two partitions,
nothing mid-operation, no agent holding what the store does not know, and never two replicas
elected in one term (from their logs). It also measures how long the pod was without a serving
leader after each fault of the leader or of PostgreSQL, counts elections during stalls shorter than
a lease (none is allowed) and after longer ones (one is expected).

    python -m bench.faults --faults 1000 --lease 3
"""

from __future__ import annotations

import math
import os
import random
import re
import shutil
import signal
import statistics
import threading
import time
import urllib.request
from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from tempfile import mkdtemp
from typing import Any

import click
import psycopg
from prometheus_client.parser import text_string_to_metric_families

from bench import netsplit
from bench.common import save, table
from tests.functional.harness import Pod, wait_until
from tests.functional.test_high_availability import Replica, readiness
from tests.postgres import PostgresServer
from vipu.api.protos import vipuuser_pb2 as pb
from vipu.client.settings import ClientSettings
from vipu.client.user import UserClient
from vipu.model.errors import AlreadyExists, Conflict, HardwareFailure, InvalidArgument, NotFound, VipuError

KINDS = ("kill-leader", "stop-leader", "kill-standby", "kill-agent", "stop-agent", "pg-lock", "pg-lock-long", "pg-pause",
         "pg-pause-long", "kill-postgres", "net-split")
PROBE_SECONDS = 0.25  # a readiness probe's timeout
SHORT_STALLS = ("pg-lock", "pg-pause")  # shorter than a lease: no change of leader is allowed
LONG_STALLS = ("pg-lock-long", "pg-pause-long", "net-split")  # longer than a lease: one change of leader is expected
LEADER_FAULTS = ("kill-leader", "stop-leader", "kill-postgres", *LONG_STALLS)  # timed until a replica serves again
SLOW_REPLICA = "store.commit=delay(0.05);agent.apply=delay(0.1)"  # replica c's failpoints: slow commits, slow agents
WRITTEN_TABLES = "leases, partitions, partition_ipus, partition_requests, agents"
SIZES = (1, 2, 4, 8)
DEFINITE = (Conflict, AlreadyExists, InvalidArgument, NotFound, HardwareFailure)  # refusals that say nothing was done


@dataclass
class Call:
    client: int
    operation: str  # create | remove | reset | queue (a create that may wait) | wait | cancel
    partition_id: str
    start: float
    end: float
    answer: str  # ok | refused | unknown
    detail: str = ""


@dataclass
class History:
    calls: list[Call] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, call: Call) -> None:
        with self.lock:
            self.calls.append(call)


class Client:
    """One client: makes, resets, queues, waits for, cancels and removes its own partitions, one
    call at a time, logging each call and its answer."""

    def __init__(self, number: int, addresses: str, history: History, seed: int):
        self.number = number
        self.chooser = random.Random(seed)
        self.client = UserClient(ClientSettings(addresses, 0), timeout=15)
        self.history = history
        self.mine: list[str] = []  # its partitions, and those whose outcome is not known yet
        self.serial = 0
        self.full = False  # its last create found no room: it removes one next

    def ask(self, operation: str, partition_id: str, work: Callable[[], Any]) -> tuple[Call, Any]:
        """Make one call: the call logged (its answer: ok, refused or unknown) and what it returned."""
        began, result, detail = time.time(), None, ""
        try:
            result, answer = work(), "ok"
        except DEFINITE as refusal:
            answer, detail = "refused", refusal.message
        except VipuError as error:
            # Passed over by every replica (standing by, or never reached): nothing was sent to be done.
            answer = "refused" if error.message.startswith("no vipu-server of") else "unknown"
            detail = f"{type(error).__name__}: {error.message}"
        call = Call(self.number, operation, partition_id, began, time.time(), answer, detail)
        self.history.add(call)
        return call, result

    def step(self) -> str:
        """One thing a user does; the answer of its last call."""
        client, chooser = self.client, self.chooser
        if self.mine and (self.full or chooser.random() < 0.5):  # a pod with no room for it: make some
            partition_id = self.mine.pop(chooser.randrange(len(self.mine)))
            if chooser.random() < 0.2:
                call, _ = self.ask("reset", partition_id, lambda: client.reset_partition(partition_id))
                self.mine.append(partition_id)
                return call.answer
            call, _ = self.ask("remove", partition_id, lambda: client.remove_partition(partition_id))
            if call.answer != "ok" and "does not exist" not in call.detail:
                self.mine.append(partition_id)
            return call.answer
        self.serial += 1
        partition_id, size = f"c{self.number}-{self.serial}", chooser.choice(SIZES)
        if chooser.random() < 0.7:
            call, _ = self.ask("create", partition_id, lambda: client.create_partition(partition_id, size))
            self.full = call.answer == "refused" and ("no free" in call.detail or "no room" in call.detail)
            if call.answer != "refused":
                self.mine.append(partition_id)  # unknown creates are removed later too: their outcome is settled then
            return call.answer
        call, reply = self.ask("queue", partition_id, lambda: client.create_or_queue(partition_id, size, wait_seconds=30))
        if call.answer == "refused":
            return call.answer
        self.mine.append(partition_id)  # made, waiting, or unknown: settled by the calls below, or by a remove later
        if call.answer == "unknown" or not reply.HasField("queued"):
            return call.answer
        call.detail = "queued"
        for _ in range(chooser.randrange(4)):  # wait a little for room, as create --wait does
            call, waited = self.ask("wait", partition_id, lambda: client.wait_once(partition_id, 1))
            if call.answer != "ok" or not waited.HasField("queued"):
                return call.answer
            call.detail = "queued"
        call, _ = self.ask("cancel", partition_id, lambda: client.cancel_queued(partition_id))
        if call.answer == "ok":
            self.mine.remove(partition_id)
        return call.answer


def should_exist(call: Call) -> bool | None:
    """Whether a partition should exist after `call`, the last made for it; None where its answer does not say."""
    if call.answer == "unknown":
        return None
    if call.operation == "create":
        return call.answer == "ok"
    if call.answer == "refused" and call.operation in ("remove", "reset"):  # it is left, unless refused for want of it
        return "does not exist" not in call.detail
    if call.operation in ("remove", "reset"):
        return call.operation == "reset"
    if call.operation in ("queue", "wait"):  # made at once, or made while it was waited for; or still waiting
        return None if call.answer != "ok" or call.detail == "queued" else True
    return False if call.answer == "ok" else None  # cancel: a refusal may be for a request granted meanwhile


def client_loop(number: int, addresses: str, history: History, stop: threading.Event, seed: int) -> None:
    """One client's calls until `stop`."""
    user = Client(number, addresses, history, seed)
    try:
        while not stop.is_set():
            if user.step() == "unknown":
                stop.wait(0.2)
    finally:
        user.client.connection.close()


class Campaign:
    def __init__(self, directory: Path, postgres: PostgresServer, links: netsplit.Links | None, lease: float, machines: int,
                 seed: int, longest_stall: float, short_stall_share: float = 0.5):
        """With `links`, PostgreSQL runs in their namespace: the campaign reaches it over link 0, replica N over link N."""
        self.chooser = random.Random(seed)
        self.postgres = postgres
        self.links = links
        self.lease = lease
        self.longest_stall = max(longest_stall, 1.5 * lease)
        self.short_stall_share = short_stall_share  # of the lease: the longest a short stall lasts
        self.database = postgres.create_database()
        self.pod = Pod(directory, machines=machines, db_url=postgres.url(self.database))
        for group in self.pod.agent_groups:
            self.pod.start_agent(*group)
        for machine in self.pod.rack.machines:
            self.pod.wait_for_agent(machine.name)
        self.replicas = [Replica(name, lease_seconds=lease, environment={"VIPU_FAILPOINTS": SLOW_REPLICA} if name == "c" else {},
                                 db_url=postgres.url(self.database, links.address(number) if links else None)).start(self.pod)
                         for number, name in enumerate(("a", "b", "c"), start=1)]
        leader = wait_until(self.leader, timeout=30, what="a leader")
        self.pod.admin_port = leader.admin_port
        self.pod.register()
        self.addresses = ",".join(r.address for r in self.replicas)
        self.takeovers: dict[str, list[float]] = defaultdict(list)
        self.stall_elections = 0
        self.stall_depositions: list[str] = []  # why a leader was deposed during a short stall: "replica: reason"
        self.stalls = 0
        self.elections_after_long_stalls: Counter[int] = Counter()  # elections a stall longer than the lease caused: how often
        self.injected: Counter[str] = Counter()
        self.claims: dict[int, dict[float, float]] = {}  # replica process: its lease claims so far, cumulative per bucket

    # The replicas

    def leader(self) -> Replica | None:
        """The replica a load balancer would send to now. Its probe is short (as a balancer's is), or
        a stopped leader, asked first, would hold the look past the time a standby took over."""
        for replica in self.replicas:
            if replica.process is not None and replica.process.poll() is None and readiness(replica, PROBE_SECONDS) == 200:
                return replica
        return None

    def revive(self, wait: bool = True) -> None:
        """Start again every replica that exited (killed, or deposed and gone to be a standby);
        with `wait`, until each answers."""
        for replica in self.replicas:
            if replica.process.poll() is not None:
                replica.start(self.pod, wait)

    def elections(self) -> list[tuple[str, int]]:
        """(replica, term) of every election in the replicas' logs."""
        found = []
        for replica in self.replicas:
            log = (self.pod.directory / f"server-{replica.name}.log").read_text(errors="replace")
            found += [(replica.name, int(term)) for term in re.findall(r"elected leader \(term (\d+)\)", log)]
        return found

    def depositions(self) -> set[tuple[str, int, str]]:
        """(replica, which, why) of every deposition in the replicas' logs."""
        found = set()
        for replica in self.replicas:
            log = (self.pod.directory / f"server-{replica.name}.log").read_text(errors="replace")
            found |= {(replica.name, n, why) for n, why in enumerate(re.findall(r"leadership: no longer the leader: (.*)", log))}
        return found

    def served_again(self, began: float) -> float:
        """Seconds from `began` until a replica serves, those that exit meanwhile started again as
        their supervisor would (a deposed leader exits, to come back as a standby)."""

        def serving() -> Replica | None:
            self.revive(wait=False)
            return self.leader()

        wait_until(serving, timeout=10 * self.lease + 30, what="a replica to serve")
        return time.monotonic() - began

    def sample_claims(self) -> None:
        """Read each replica's histogram of how long its lease claims took (kept per process: a
        replica started again counts from nothing)."""
        for replica in self.replicas:
            try:
                text = urllib.request.urlopen(f"http://127.0.0.1:{replica.metrics_port}/metrics", timeout=PROBE_SECONDS).read()
            except OSError:
                continue
            for family in text_string_to_metric_families(text.decode()):
                if family.name == "vipu_lease_claim_seconds":
                    self.claims[replica.process.pid] = {float(sample.labels["le"]): sample.value for sample in family.samples
                                                        if sample.name.endswith("_bucket")}

    def claim_quantiles(self) -> dict:
        """Quantiles of the claims' time over every replica process, each as the bucket's upper bound."""
        buckets: Counter[float] = Counter()
        for counts in self.claims.values():
            buckets.update(counts)
        total = buckets.get(math.inf, 0)

        def quantile(share: float) -> float | None:
            return next((bound for bound in sorted(buckets) if buckets[bound] >= share * total), None) if total else None

        return {"count": int(total), **{f"{name}_s_at_most": quantile(share) for name, share in
                                        (("p50", 0.5), ("p99", 0.99), ("p999", 0.999))}}

    # The faults

    def inject(self, kind: str) -> None:
        self.injected[kind] += 1
        self.sample_claims()
        leader = wait_until(self.leader, timeout=10 * self.lease + 30, what="a leader before the fault")
        began = time.monotonic()
        if kind == "kill-leader":
            leader.process.kill()
            leader.process.wait()
            self.takeovers[kind].append(self.served_again(began))
        elif kind == "stop-leader":
            leader.process.send_signal(signal.SIGSTOP)
            time.sleep(self.chooser.uniform(0.5, 2.0) * self.lease)
            leader.process.send_signal(signal.SIGCONT)
            self.takeovers[kind].append(self.served_again(began))
        elif kind == "kill-standby":
            self.chooser.choice([r for r in self.replicas if r is not leader]).process.kill()
        elif kind in ("kill-agent", "stop-agent"):
            group = self.chooser.choice(self.pod.agent_groups)
            process = self.pod.agents[group[0]]
            if kind == "kill-agent":
                self.pod.stop_agent(group[0])
                self.pod.start_agent(*group)
            else:
                process.send_signal(signal.SIGSTOP)
                time.sleep(self.chooser.uniform(0.5, 5.0))
                process.send_signal(signal.SIGCONT)
        else:
            self.stall(kind, leader)
        self.revive()

    def stall(self, kind: str, leader: Replica) -> None:
        if kind in SHORT_STALLS:
            seconds = self.chooser.uniform(0.1, self.short_stall_share) * self.lease
        elif kind == "pg-lock-long":
            seconds = self.chooser.uniform(1.2, 2.0) * self.lease
        else:  # log-uniform: as many stalls of 2 to 4 s as of 20 to 40 s
            seconds = math.exp(self.chooser.uniform(math.log(1.2 * self.lease), math.log(self.longest_stall)))
        before, deposed_before = set(self.elections()), self.depositions()
        began = time.monotonic()
        if kind == "kill-postgres":
            self._kill_postgres()
        elif kind in ("pg-pause", "pg-pause-long"):
            processes = self._postgres_processes()
            for pid in processes:
                os.kill(pid, signal.SIGSTOP)
            try:
                time.sleep(seconds)
            finally:
                for pid in reversed(processes):
                    os.kill(pid, signal.SIGCONT)
        elif kind == "net-split":
            self.takeovers[kind].append(self._split(leader, seconds))
        else:
            with psycopg.connect(self.postgres.url(self.database)) as locking:
                locking.execute(f"LOCK TABLE {WRITTEN_TABLES} IN ACCESS EXCLUSIVE MODE")
                time.sleep(seconds)
                locking.rollback()
        if kind.startswith("pg-"):
            began = time.monotonic()  # no replica can serve while the store cannot: served again counts from its return
        if kind in LEADER_FAULTS and kind != "net-split":
            self.takeovers[kind].append(self.served_again(began))
        if kind in SHORT_STALLS:
            self.stalls += 1
            time.sleep(self.lease)  # a change the stall caused would show by now
            self.stall_elections += len(set(self.elections()) - before)
            self.stall_depositions += [f"{replica}: {why} ({kind} of {seconds:.2f} s)"
                                       for replica, _, why in sorted(self.depositions() - deposed_before)]
        elif kind in LONG_STALLS:
            time.sleep(self.lease)
            self.elections_after_long_stalls[len(set(self.elections()) - before)] += 1

    def _split(self, leader: Replica, seconds: float) -> float:
        """Cut the leader off from PostgreSQL for `seconds`; how long until a replica served again
        (another, during the partition; or any, after it, if it was too short for a takeover)."""
        assert self.links is not None
        link = self.replicas.index(leader) + 1
        began = time.monotonic()
        self.links.cut(link)
        try:
            while time.monotonic() < began + seconds:
                serving = self.leader()
                if serving is not None and serving is not leader:
                    took = time.monotonic() - began
                    time.sleep(max(0.0, began + seconds - time.monotonic()))
                    return took
                time.sleep(0.05)
        finally:
            self.links.heal(link)
        return self.served_again(began)

    def _postgres_processes(self) -> list[int]:
        """The server's postmaster and every process it started (its backends and helpers)."""
        postmaster = self.postgres.process.pid
        return [postmaster, *(int(entry) for entry in os.listdir("/proc") if entry.isdigit() and _parent(int(entry)) == postmaster)]

    def _kill_postgres(self) -> None:
        """SIGKILL every process of the server, as a crash of its machine would, and start it again.
        The postmaster is stopped first, so that it starts no process while they are listed."""
        os.kill(self.postgres.process.pid, signal.SIGSTOP)
        processes = self._postgres_processes()
        for pid in processes:
            os.kill(pid, signal.SIGKILL)
        self.postgres.process.wait(timeout=30)
        # a new server would not start beside a backend of the old one still attached to its memory
        wait_until(lambda: not any(_alive(pid) for pid in processes), timeout=30, what="the killed server's processes to end")
        self.postgres.start()

    # The verdict

    def check(self, history: History) -> list[str]:
        """Every anomaly the final store, the agents and the logs show against the answers given."""
        wait_until(self.leader, timeout=10 * self.lease + 30, what="a leader to check against")
        anomalies: list[str] = []
        client = UserClient(ClientSettings(self.addresses, 0), timeout=30)
        try:
            def settled() -> tuple[list, set[str]] | None:
                partitions = client.list_partitions()
                statuses = [client.partition_status(p.id) for p in partitions]
                busy[:] = [f"{s.partition_id} {pb.PartitionOperationState.Name(s.operation_state)}" for s in statuses
                           if s.operation_state not in (pb.POS_IDLE, pb.POS_FAILED)]  # settled: ACTIVE, or ERROR
                if busy:
                    return None
                return partitions, {s.partition_id for s in statuses if s.ready_state == pb.PS_ACTIVE}

            busy: list[str] = []
            try:
                partitions, active = wait_until(settled, timeout=60, what="no partition mid-operation")
            except AssertionError:
                anomalies.append(f"left mid-operation a minute after the last fault: {', '.join(busy)}")
                partitions = client.list_partitions()
                active = {p.id for p in partitions if client.partition_status(p.id).ready_state == pb.PS_ACTIVE}
            waiting = {request.partition_id for request in client.list_queued()}
        finally:
            client.connection.close()
        existing = {p.id: p for p in partitions}
        last: dict[str, Call] = {}
        for call in sorted(history.calls, key=lambda c: c.start):
            last[call.partition_id] = call
        for partition_id, call in last.items():
            said = f"its {call.operation} was answered {call.answer}{f' ({call.detail})' if call.detail else ''}"
            if should_exist(call) is True and partition_id not in existing:
                anomalies.append(f"{partition_id}: {said}, and it is gone")
            if should_exist(call) is False and partition_id in existing:
                anomalies.append(f"{partition_id}: {said}, and it is there")
            if should_exist(call) is False and partition_id in waiting:
                anomalies.append(f"{partition_id}: {said}, and its request still waits")
        ipus = [(ipu.agent_id, ipu.agent_ipu_index) for p in partitions for ipu in p.spec.ipus]
        if len(ipus) != len(set(ipus)):
            anomalies.append("an IPU is in two partitions")
        machine_of = {f"ag{n}": m.name for n, m in enumerate(self.pod.rack.machines, start=1)}
        wanted: dict[str, dict[str, list[int]]] = defaultdict(dict)
        for p in partitions:
            for ipu in p.spec.ipus if p.id in active else ():  # a partition in ERROR is configured nowhere
                wanted[machine_of[ipu.agent_id]].setdefault(p.id, []).append(ipu.agent_ipu_index)

        def agents_agree() -> bool:
            return all(self.pod.held(m.name) == {p: sorted(i) for p, i in wanted[m.name].items()} for m in self.pod.rack.machines)

        try:
            wait_until(agents_agree, timeout=30, what="every agent to hold what the store says")
        except AssertionError:
            for machine in self.pod.rack.machines:
                held, expected = self.pod.held(machine.name), {p: sorted(i) for p, i in wanted[machine.name].items()}
                if held != expected:
                    anomalies.append(f"{machine.name} holds {held}, the store says {expected}")
        terms = Counter(term for _, term in set(self.elections()))
        anomalies += [f"term {term} was won by {count} replicas" for term, count in terms.items() if count > 1]
        return anomalies

    def close(self) -> None:
        for replica in self.replicas:
            if replica.process is not None and replica.process.poll() is None:
                replica.process.send_signal(signal.SIGCONT)
                replica.process.kill()
                replica.process.wait()
        self.pod.stop()
        self.postgres.drop_database(self.database)


def _alive(pid: int) -> bool:
    """Whether the process runs still (a zombie has let go of everything)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def _parent(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def campaign(faults: int, lease: float, clients: int, machines: int, seed: int, kinds: tuple[str, ...] = KINDS,
             in_turn: bool = False, longest_stall: float = 60.0, short_stall_share: float = 0.5) -> dict:
    """Run `faults` faults drawn at random among `kinds` (or each kind in turn) under `clients`
    clients; what the checker found. Network partitions are left out where namespaces cannot be made."""
    left_out = {}
    if "net-split" in kinds and not netsplit.possible():
        kinds = tuple(kind for kind in kinds if kind != "net-split")
        left_out["net-split"] = "this machine makes no network namespaces (ip netns add was refused)"
    links = netsplit.Links(4) if "net-split" in kinds else None
    postgres = PostgresServer(netns=links.namespace, host=links.address(0)) if links else PostgresServer()
    directory = mkdtemp(prefix="vipu-faults-")
    try:
        run = Campaign(Path(directory), postgres, links, lease, machines, seed, longest_stall, short_stall_share)
        history, stop = History(), threading.Event()
        began = time.monotonic()
        threads = [threading.Thread(target=client_loop, args=(n, run.addresses, history, stop, seed + n), daemon=True)
                   for n in range(clients)]
        try:
            for thread in threads:
                thread.start()
            for number in range(faults):
                run.inject(kinds[number % len(kinds)] if in_turn else run.chooser.choice(kinds))
                time.sleep(run.chooser.uniform(0.2, 1.0))
                if number % 50 == 49:
                    click.echo(f"faults: {number + 1} injected, {len(history.calls)} calls", err=True)
            stop.set()
            for thread in threads:
                thread.join(timeout=60)
            anomalies = run.check(history)
        finally:
            stop.set()
            run.sample_claims()
            run.close()
        answers = Counter(call.answer for call in history.calls)
        takeovers = {kind: {"count": len(times), "p50_s": round(statistics.median(times), 2),
                            "p99_s": round(sorted(times)[max(0, round(0.99 * len(times)) - 1)], 2), "max_s": round(max(times), 2)}
                     for kind, times in run.takeovers.items() if times}
        return {"faults": faults, "injected": dict(run.injected), "lease_seconds": lease, "clients": clients, "machines": machines,
                "seed": seed, "calls": len(history.calls), "answers": dict(answers),
                "answers_by_operation": {f"{operation} {answer}": count for (operation, answer), count in sorted(
                    Counter((call.operation, call.answer) for call in history.calls).items())},
                "unknown_share": round(answers["unknown"] / max(1, len(history.calls)), 4), "anomalies": len(anomalies),
                "first_anomalies": anomalies[:20], "takeover_after": takeovers, "short_stalls": run.stalls,
                "elections_during_short_stalls": run.stall_elections, "depositions_during_short_stalls": run.stall_depositions,
                "longest_stall_s": run.longest_stall,
                "elections_after_long_stalls": {str(n): count for n, count in sorted(run.elections_after_long_stalls.items())},
                "lease_claims": run.claim_quantiles(), "slow_replica": SLOW_REPLICA, "left_out": left_out,
                "seconds": round(time.monotonic() - began, 1)}
    except BaseException:
        click.echo(f"the campaign's logs are kept in {directory}", err=True)
        directory = ""
        raise
    finally:
        postgres.stop()
        if links:
            links.close()
        if directory:
            shutil.rmtree(directory, ignore_errors=True)


@click.command()
@click.option("--faults", default=1000, show_default=True, help="Faults to inject, one at a time, of kinds drawn at random.")
@click.option("--kinds", default=",".join(KINDS), show_default=True, help="The kinds to draw from.")
@click.option("--lease", default=3.0, show_default=True, help="The replicas' --ha-lease-seconds.")
@click.option("--clients", default=4, show_default=True, help="Client threads making and removing partitions.")
@click.option("--machines", default=4, show_default=True, help="Machines in the pod, an agent process each.")
@click.option("--seed", default=20261206, show_default=True, help="Seed of the faults, their lengths and the clients' requests.")
@click.option("--longest-stall", default=60.0, show_default=True, help="Seconds the longest PostgreSQL pause or network partition lasts.")
@click.option("--name", default="faults", show_default=True, help="Results file: bench/results/NAME.json.")
def main(faults, kinds, lease, clients, machines, seed, longest_stall, name):
    """Inject faults under load and judge every answer (the target: no anomaly)."""
    chosen = tuple(k.strip() for k in kinds.split(",") if k.strip())
    unknown = [k for k in chosen if k not in KINDS]
    if unknown:
        raise click.BadParameter(f"no fault kind {unknown[0]!r}; the kinds are {', '.join(KINDS)}", param_hint="--kinds")
    result = campaign(faults, lease, clients, machines, seed, chosen, longest_stall=longest_stall)
    path = save(name, {"benchmark": "faults", **result})
    click.echo(table(["faults", "calls", "ok", "refused", "unknown", "unknown share", "anomalies", "elections in short stalls"],
                     [[result["faults"], result["calls"], result["answers"].get("ok", 0), result["answers"].get("refused", 0),
                       result["answers"].get("unknown", 0), result["unknown_share"], result["anomalies"],
                       f"{result['elections_during_short_stalls']} of {result['short_stalls']}"]]))
    for kind, figures in result["takeover_after"].items():
        click.echo(f"served again after {kind}: p50 {figures['p50_s']} s, p99 {figures['p99_s']} s, max {figures['max_s']} s "
                   f"({figures['count']})")
    click.echo(f"elections after a stall longer than the lease (count: stalls): {result['elections_after_long_stalls']}")
    claims = result["lease_claims"]
    click.echo(f"lease claims: {claims['count']}, p50 <= {claims['p50_s_at_most']} s, p99 <= {claims['p99_s_at_most']} s, "
               f"p99.9 <= {claims['p999_s_at_most']} s")
    for kind, why in result["left_out"].items():
        click.echo(f"left out: {kind}: {why}")
    for anomaly in result["first_anomalies"]:
        click.echo(f"anomaly: {anomaly}")
    click.echo(f"written: {path}")
    if result["anomalies"] or result["elections_during_short_stalls"]:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
