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
  for 0.1 to 0.5 of a lease, or (`pg-lock-long`) for 1.2 to 2 leases;
- `pg-pause`: the PostgreSQL server's processes stopped (SIGSTOP) for 0.1 to 0.5 of a lease.

A killed or deposed replica, and a killed agent, is started again once the fault ends. Then the
checker, once a leader serves and two health passes have run: every acknowledged create present
(unless its remove was acknowledged, or unknown) and configured on exactly its agents, every
refused create and acknowledged remove absent, every unknown either, no IPU in two partitions,
nothing mid-operation, no agent holding what the store does not know, and never two replicas
elected in one term (from their logs). It also measures how long the pod was without a serving
leader after each fault of the leader, and counts elections during stalls shorter than a lease.

    python -m bench.faults --faults 1000 --lease 3
"""

from __future__ import annotations

import os
import random
import re
import signal
import statistics
import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from tempfile import TemporaryDirectory

import click
import psycopg

from bench.common import save, table
from tests.functional.harness import Pod, wait_until
from tests.functional.test_high_availability import Replica, readiness
from tests.postgres import PostgresServer
from vipu.api.protos import vipuuser_pb2 as pb
from vipu.client.settings import ClientSettings
from vipu.client.user import UserClient
from vipu.model.errors import AlreadyExists, Conflict, HardwareFailure, InvalidArgument, NotFound, VipuError

KINDS = ("kill-leader", "stop-leader", "kill-standby", "kill-agent", "stop-agent", "pg-lock", "pg-lock-long", "pg-pause")
SHORT_STALLS = ("pg-lock", "pg-pause")  # shorter than a lease: no change of leader is allowed
WRITTEN_TABLES = "leases, partitions, partition_ipus, partition_requests, agents"
SIZES = (1, 2, 4, 8)
DEFINITE = (Conflict, AlreadyExists, InvalidArgument, NotFound, HardwareFailure)  # refusals that say nothing was done


@dataclass
class Call:
    client: int
    operation: str  # create | remove
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


def client_loop(number: int, addresses: str, history: History, stop: threading.Event, seed: int) -> None:
    """One client: create and remove its own partitions, one call at a time, until `stop`."""
    chooser = random.Random(seed)
    client = UserClient(ClientSettings(addresses, 0), timeout=15)
    mine: list[str] = []
    serial, full = 0, False
    try:
        while not stop.is_set():
            if mine and (full or chooser.random() < 0.5):  # a pod with no room for it: make some
                partition_id, operation = mine.pop(chooser.randrange(len(mine))), "remove"
                work = lambda p=partition_id: client.remove_partition(p)  # noqa: E731
            else:
                serial += 1
                partition_id, operation = f"c{number}-{serial}", "create"
                work = lambda p=partition_id: client.create_partition(p, chooser.choice(SIZES))  # noqa: E731
            began = time.time()
            try:
                work()
                answer, detail = "ok", ""
            except DEFINITE as refusal:
                answer, detail = "refused", refusal.message
            except VipuError as error:
                # Passed over by every replica (standing by, or never reached): nothing was sent to be done.
                answer = "refused" if error.message.startswith("no vipu-server of") else "unknown"
                detail = f"{type(error).__name__}: {error.message}"
            full = operation == "create" and answer == "refused" and ("no free" in detail or "no room" in detail)
            history.add(Call(number, operation, partition_id, began, time.time(), answer, detail))
            if operation == "create" and answer != "refused":
                mine.append(partition_id)  # unknown creates are removed later too: their outcome is settled then
            elif operation == "remove" and answer == "refused" and "does not exist" not in detail:
                mine.append(partition_id)
            if answer == "unknown":
                stop.wait(0.2)
    finally:
        client.connection.close()


class Campaign:
    def __init__(self, directory: Path, postgres: PostgresServer, lease: float, machines: int, seed: int):
        self.chooser = random.Random(seed)
        self.postgres = postgres
        self.lease = lease
        self.database = postgres.create_database()
        self.pod = Pod(directory, machines=machines, db_url=postgres.url(self.database))
        for group in self.pod.agent_groups:
            self.pod.start_agent(*group)
        for machine in self.pod.rack.machines:
            self.pod.wait_for_agent(machine.name)
        self.replicas = [Replica(name, lease_seconds=lease).start(self.pod) for name in ("a", "b", "c")]
        leader = wait_until(self.leader, timeout=30, what="a leader")
        self.pod.admin_port = leader.admin_port
        self.pod.register()
        self.addresses = ",".join(r.address for r in self.replicas)
        self.takeovers: dict[str, list[float]] = defaultdict(list)
        self.stall_elections = 0
        self.stalls = 0
        self.injected: Counter[str] = Counter()

    # The replicas

    def leader(self) -> Replica | None:
        for replica in self.replicas:
            if replica.process is not None and replica.process.poll() is None and readiness(replica) == 200:
                return replica
        return None

    def revive(self) -> None:
        """Start again every replica that exited (killed, or deposed and gone to be a standby)."""
        for replica in self.replicas:
            if replica.process.poll() is not None:
                replica.start(self.pod)

    def elections(self) -> list[tuple[str, int]]:
        """(replica, term) of every election in the replicas' logs."""
        found = []
        for replica in self.replicas:
            log = (self.pod.directory / f"server-{replica.name}.log").read_text(errors="replace")
            found += [(replica.name, int(term)) for term in re.findall(r"elected leader \(term (\d+)\)", log)]
        return found

    def served_again(self, began: float) -> float:
        wait_until(self.leader, timeout=10 * self.lease + 30, what="a replica to serve")
        return time.monotonic() - began

    # The faults

    def inject(self, kind: str) -> None:
        self.injected[kind] += 1
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
        seconds = self.chooser.uniform(1.2, 2.0) * self.lease if kind == "pg-lock-long" else self.chooser.uniform(0.1, 0.5) * self.lease
        before = set(self.elections())
        if kind == "pg-pause":
            processes = self._postgres_processes()
            for pid in processes:
                os.kill(pid, signal.SIGSTOP)
            try:
                time.sleep(seconds)
            finally:
                for pid in reversed(processes):
                    os.kill(pid, signal.SIGCONT)
        else:
            with psycopg.connect(self.postgres.url(self.database)) as locking:
                locking.execute(f"LOCK TABLE {WRITTEN_TABLES} IN ACCESS EXCLUSIVE MODE")
                time.sleep(seconds)
                locking.rollback()
        if kind in SHORT_STALLS:
            self.stalls += 1
            time.sleep(self.lease)  # a change the stall caused would show by now
            self.stall_elections += len(set(self.elections()) - before)

    def _postgres_processes(self) -> list[int]:
        """The server's postmaster and every process it started (its backends and helpers)."""
        postmaster = self.postgres.process.pid
        return [postmaster, *(int(entry) for entry in os.listdir("/proc") if entry.isdigit() and _parent(int(entry)) == postmaster)]

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
        finally:
            client.connection.close()
        existing = {p.id: p for p in partitions}
        last: dict[str, Call] = {}
        refused: set[str] = set()
        for call in sorted(history.calls, key=lambda c: c.start):
            if call.operation == "create" and call.answer == "refused":
                refused.add(call.partition_id)
            last[call.partition_id] = call
        for partition_id, call in last.items():
            if call.answer == "unknown":
                continue
            kept_by_refusal = call.operation == "remove" and call.answer == "refused" and "does not exist" not in call.detail
            should_exist = (call.operation == "create" and call.answer == "ok") or kept_by_refusal
            if should_exist and partition_id not in existing:
                anomalies.append(f"{partition_id}: its {call.operation} was answered {call.answer}, and it is gone")
            if not should_exist and partition_id in existing and call.operation == "remove":
                anomalies.append(f"{partition_id}: its remove was answered {call.answer} ({call.detail or 'done'}), and it is there")
        for partition_id in refused & set(existing):
            if last[partition_id].operation == "create":
                anomalies.append(f"{partition_id}: its create was refused ({last[partition_id].detail}), and it is there")
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


def _parent(pid: int) -> int:
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, IndexError, ValueError):
        return 0


def campaign(faults: int, lease: float, clients: int, machines: int, seed: int, kinds: tuple[str, ...] = KINDS,
             in_turn: bool = False) -> dict:
    """Run `faults` faults drawn at random among `kinds` (or each kind in turn) under `clients`
    clients; what the checker found."""
    postgres = PostgresServer()
    try:
        with TemporaryDirectory(prefix="vipu-faults-") as directory:
            run = Campaign(Path(directory), postgres, lease, machines, seed)
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
                run.close()
            answers = Counter(call.answer for call in history.calls)
            takeovers = {kind: {"count": len(times), "p50_s": round(statistics.median(times), 2),
                                "p99_s": round(sorted(times)[max(0, round(0.99 * len(times)) - 1)], 2), "max_s": round(max(times), 2)}
                         for kind, times in run.takeovers.items() if times}
            return {"faults": faults, "injected": dict(run.injected), "lease_seconds": lease, "clients": clients, "machines": machines,
                    "seed": seed, "calls": len(history.calls), "answers": dict(answers),
                    "unknown_share": round(answers["unknown"] / max(1, len(history.calls)), 4), "anomalies": len(anomalies),
                    "first_anomalies": anomalies[:20], "takeover_after": takeovers, "short_stalls": run.stalls,
                    "elections_during_short_stalls": run.stall_elections, "seconds": round(time.monotonic() - began, 1)}
    finally:
        postgres.stop()


@click.command()
@click.option("--faults", default=1000, show_default=True, help="Faults to inject, one at a time, of kinds drawn at random.")
@click.option("--kinds", default=",".join(KINDS), show_default=True, help="The kinds to draw from.")
@click.option("--lease", default=3.0, show_default=True, help="The replicas' --ha-lease-seconds.")
@click.option("--clients", default=4, show_default=True, help="Client threads making and removing partitions.")
@click.option("--machines", default=4, show_default=True, help="Machines in the pod, an agent process each.")
@click.option("--seed", default=20261206, show_default=True, help="Seed of the faults, their lengths and the clients' requests.")
@click.option("--name", default="faults", show_default=True, help="Results file: bench/results/NAME.json.")
def main(faults, kinds, lease, clients, machines, seed, name):
    """Inject faults under load and judge every answer (the target: no anomaly)."""
    chosen = tuple(k.strip() for k in kinds.split(",") if k.strip())
    unknown = [k for k in chosen if k not in KINDS]
    if unknown:
        raise click.BadParameter(f"no fault kind {unknown[0]!r}; the kinds are {', '.join(KINDS)}", param_hint="--kinds")
    result = campaign(faults, lease, clients, machines, seed, chosen)
    path = save(name, {"benchmark": "faults", **result})
    click.echo(table(["faults", "calls", "ok", "refused", "unknown", "unknown share", "anomalies", "elections in short stalls"],
                     [[result["faults"], result["calls"], result["answers"].get("ok", 0), result["answers"].get("refused", 0),
                       result["answers"].get("unknown", 0), result["unknown_share"], result["anomalies"],
                       f"{result['elections_during_short_stalls']} of {result['short_stalls']}"]]))
    for kind, figures in result["takeover_after"].items():
        click.echo(f"served again after {kind}: p50 {figures['p50_s']} s, p99 {figures['p99_s']} s, max {figures['max_s']} s "
                   f"({figures['count']})")
    for anomaly in result["first_anomalies"]:
        click.echo(f"anomaly: {anomaly}")
    click.echo(f"written: {path}")
    if result["anomalies"] or result["elections_during_short_stalls"]:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
