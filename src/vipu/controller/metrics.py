"""The controller's Prometheus metrics: entities by state, and requests by method; and whether it
is ready to serve.

Entity figures are read from the store at each scrape, so they are never stale and cost nothing
between scrapes. Request counts and latencies are recorded by the gRPC interceptor of both
end-points (`vipu.api.status.GuardInterceptor`). The same HTTP end-point answers `/readyz` with
200 while this controller serves requests and 503 while it stands by (`--ha`), so that a load
balancer or a Kubernetes readiness probe sends clients to the leader only.
"""

from __future__ import annotations

import threading
import time
from collections import Counter as Tally
from collections.abc import Callable, Mapping
from socketserver import ThreadingMixIn
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, make_wsgi_app
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from vipu.api.status import service_and_method
from vipu.model.accounts import Account
from vipu.model.entities import IPUS_PER_MACHINE, AgentStatus, OperationState, Partition, ReadyState
from vipu.model.errors import Unavailable
from vipu.model.linkhealth import LinkEvent, LinkHealth, LinkState, reliability
from vipu.model.reservations import TO_COME, UNDER_WAY
from vipu.model.usage import UsageRecord
from vipu.store.store import Store

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)


class EntityCollector:
    def __init__(self, store: Store):
        self.store = store
        # (partition, operation) -> when (monotonic) a scrape first saw the partition in that operation;
        # scrapes may overlap (two Prometheus replicas), each on a thread of its own
        self._in_operation: dict[tuple[str, str], float] = {}
        self._lock = threading.Lock()

    def collect(self):
        with self.store.reading() as tx:
            agents = tx.list_agents()
            clusters = tx.list_clusters()
            allocations = tx.list_allocations()
            partitions = tx.list_partitions()
            links = tx.links()
            events = tx.link_event_counts()
            failures = tx.failure_events()
            attempts = tx.attempt_counts()
            reservations = tx.list_reservations()
            accounts = tx.configuration().accounts
            used = tx.usage_totals()
            waiting = tx.list_requests()
        now = time.time()
        by_status = Tally(a.status.value for a in agents)
        family = GaugeMetricFamily("vipu_agents", "Agents by status", labels=["status"])
        for status in AgentStatus:
            family.add_metric([status.value], by_status[status.value])
        yield family
        occupied = {ipu.agent_id for p in partitions for ipu in p.ipus}
        drained = {a.id for a in agents if a.drain is not None} | {
            agent for r in reservations if r.maintenance and r.under_way(now) for agent in r.agent_ids}
        family = GaugeMetricFamily("vipu_agents_drained", "Agents drained (by an operator or a maintenance window under way), by "
                                   "whether a partition is still on them", labels=["state"])
        family.add_metric(["draining"], len(drained & occupied))
        family.add_metric(["drained"], len(drained - occupied))
        yield family
        family = GaugeMetricFamily("vipu_reserved_ipus", "IPUs of reservations not over, by kind and whether under way",
                                   labels=["kind", "phase"])
        reserved = Tally((r.kind, r.phase(now)) for r in reservations for _ in r.ipus)
        for kind in ("maintenance window", "reservation"):
            for phase in (TO_COME, UNDER_WAY):
                family.add_metric([kind.replace(" ", "_"), phase.lower().replace(" ", "_")], reserved[(kind, phase)])
        yield family
        yield GaugeMetricFamily("vipu_clusters", "Clusters", value=len(clusters))
        yield GaugeMetricFamily("vipu_allocations", "Allocations", value=len(allocations))
        by_state = Tally(p.ready_state.value for p in partitions)
        family = GaugeMetricFamily("vipu_partitions", "Partitions by ready state", labels=["state"])
        for state in ReadyState:
            family.add_metric([state.value], by_state[state.value])
        yield family
        in_partitions = sum(p.size for p in partitions)
        family = GaugeMetricFamily("vipu_ipus", "IPUs of all agents by use", labels=["use"])
        family.add_metric(["partition"], in_partitions)
        family.add_metric(["free"], len(agents) * IPUS_PER_MACHINE - in_partitions)
        yield family
        yield from self._transitions(partitions)
        queued = GaugeMetricFamily("vipu_queued_requests", "Requests waiting in each allocation's queue", labels=["allocation"])
        oldest = GaugeMetricFamily("vipu_queue_oldest_wait_seconds", "How long the request waiting longest in each allocation's "
                                   "queue has waited", labels=["allocation"])
        for allocation in allocations:
            mine = [w for w in waiting if w.allocation_id == allocation.id]
            queued.add_metric([allocation.id], len(mine))
            oldest.add_metric([allocation.id], max((now - w.since.timestamp() for w in mine), default=0.0))
        yield from (queued, oldest)
        yield from _account_families(accounts, [a.id for a in allocations], partitions, used, now)
        yield from _link_families(links, events)
        yield from _remediation_families(links, failures, attempts, time.time())


    def _transitions(self, partitions: list[Partition]):
        """For each operation a partition goes through, how long the partition in it longest has
        been seen in it (by this replica's scrapes): one stuck in CREATING or REMOVING shows."""
        now = time.monotonic()
        seen = {(p.id, p.operation_state.value) for p in partitions if p.operation_state is not OperationState.IDLE}
        with self._lock:
            for gone in self._in_operation.keys() - seen:
                del self._in_operation[gone]
            for key in seen:
                self._in_operation.setdefault(key, now)
            in_operation = dict(self._in_operation)
        family = GaugeMetricFamily("vipu_partition_operation_seconds", "How long the partition longest in each operation has been "
                                   "seen in it", labels=["operation"])
        for operation in OperationState:
            if operation is not OperationState.IDLE:
                family.add_metric([operation.value], max((now - at for (_, op), at in in_operation.items()
                                                          if op == operation.value), default=0.0))
        yield family


def _account_families(accounts: Mapping[str, Account], allocation_ids: list[str], partitions: list[Partition],
                      used: Mapping[str, float], now: float):
    """Each account's IPUs in use and quota by allocation, and the IPU-seconds it used, ended and running."""
    holding = GaugeMetricFamily("vipu_account_ipus", "IPUs in partitions of each account, by allocation", labels=["account", "allocation"])
    held = Tally((p.account, p.allocation_id) for p in partitions for _ in range(p.size) if p.account)
    for (account, allocation), ipus in sorted(held.items()):
        holding.add_metric([account, allocation], ipus)
    quota = GaugeMetricFamily("vipu_account_quota_ipus", "Each account's quota, by allocation", labels=["account", "allocation"])
    for named in accounts.values():
        for allocation in allocation_ids:
            found = named.quota_in(allocation)
            if found is not None:
                quota.add_metric([named.name, allocation], found.ipus)
    seconds = CounterMetricFamily("vipu_account_ipu_seconds", "IPU-seconds used on each account (\"\": none), by partitions ended "
                                  "and running", labels=["account"])
    totals = dict(used)
    for p in partitions:
        totals[p.account] = totals.get(p.account, 0.0) + UsageRecord.of(p, now).ipu_seconds
    for account, total in sorted(totals.items()):
        seconds.add_metric([account], total)
    yield from (holding, quota, seconds)


def _link_families(links: list[LinkState], events: dict[str, int]):
    """The link ledger: links by health, each unhealthy one by name (for an alert to name it), and
    the events it keeps (as long as its history)."""
    by_health = Tally(link.health.value for link in links)
    family = GaugeMetricFamily("vipu_links", "Links in the link ledger by health", labels=["health"])
    for health in LinkHealth:
        family.add_metric([health.value], by_health[health.value])
    yield family
    family = GaugeMetricFamily("vipu_link_unhealthy", "1 for each link that is suspect or failed", labels=["link", "health"])
    for link in links:
        if link.health is not LinkHealth.HEALTHY:
            family.add_metric([str(link.name), link.health.value], 1)
    yield family
    kept = GaugeMetricFamily("vipu_link_events", "Events the link ledger keeps (changes of health, cables replaced; older ones "
                             "go with the history), by the link's health after each", labels=["health"])
    for health in LinkHealth:
        kept.add_metric([health.value], events.get(health.value, 0))
    yield kept


def _remediation_families(links: list[LinkState], failures: list[LinkEvent], attempts: dict[str, int], now: float):
    """Failed links quarantined or held out of it by the breaker, automatic remediations, and how
    often each link (and each machine's links) failed and how soon it came back, over the events kept."""
    failed = [link for link in links if link.health is LinkHealth.FAILED]
    yield GaugeMetricFamily("vipu_link_quarantined", "Failed links kept out of every partition's shape",
                            value=sum(link.quarantined for link in failed))
    yield GaugeMetricFamily("vipu_link_breaker_held", "Failed links the breaker keeps out of quarantine",
                            value=sum(not link.quarantined for link in failed))
    family = GaugeMetricFamily("vipu_link_remediations", "Automatic remediations kept, attempted and refused by the caps",
                               labels=["result"])
    for result in ("attempted", "refused"):
        family.add_metric([result], attempts.get(result, 0))
    yield family
    first_seen = {str(link.name): link.first_seen for link in links}
    by_link: dict[str, list[LinkEvent]] = {}
    by_machine: dict[str, list[LinkEvent]] = {}
    machine_seen: dict[str, float] = {}
    for event in failures:
        by_link.setdefault(str(event.name), []).append(event)
        by_machine.setdefault(event.name.agent_id, []).append(event)
    for link in links:
        if link.name.agent_id in by_machine:
            machine_seen[link.name.agent_id] = min(machine_seen.get(link.name.agent_id, link.first_seen), link.first_seen)
    yield from _reliability_families("link", "link", by_link, first_seen, now)
    yield from _reliability_families("machine", "agent", by_machine, machine_seen, now)


def _reliability_families(scope: str, label: str, groups: dict[str, list[LinkEvent]], first_seen: dict[str, float], now: float):
    count = GaugeMetricFamily(f"vipu_{scope}_failures", f"Failures of each {scope}'s links within the events kept", labels=[label])
    mtbf = GaugeMetricFamily(f"vipu_{scope}_mtbf_seconds", f"Mean time between failures of each {scope}'s links", labels=[label])
    mttr = GaugeMetricFamily(f"vipu_{scope}_mttr_seconds", f"Mean time to repair of each {scope}'s links, of the failures repaired",
                             labels=[label])
    for key, events in sorted(groups.items()):
        found = reliability(events, first_seen.get(key) or min(e.at for e in events), now)
        count.add_metric([key], found.failures)
        mtbf.add_metric([key], found.mtbf_seconds)
        if found.mttr_seconds:
            mttr.add_metric([key], found.mttr_seconds)
    yield from (count, mtbf, mttr)


class ControllerMetrics:
    def __init__(self, store: Store):
        self.registry = CollectorRegistry()
        self.requests = Counter(
            "vipu_requests", "gRPC requests handled, by service, method and status code",
            ["service", "method", "code"], registry=self.registry,
        )
        self.latency = Histogram(
            "vipu_request_duration_seconds", "Time to handle a gRPC request, by service and method",
            ["service", "method"], buckets=LATENCY_BUCKETS, registry=self.registry,
        )
        self.malformed = Counter(
            "vipu_malformed_requests", "Requests whose bytes were not the method's message, by service and method",
            ["service", "method"], registry=self.registry,
        )
        self.failed_logins = Counter("vipu_failed_logins", "Logins refused in secure mode, by reason", ["reason"],
                                     registry=self.registry)
        self.registry.register(EntityCollector(store))
        commits = Histogram("vipu_store_commit_seconds", "How long the store took to commit a write", registry=self.registry,
                            buckets=LATENCY_BUCKETS)
        store.on_commit_seconds = commits.observe

    def follow(self, leadership) -> None:
        """Export whether this replica leads (`vipu-server --ha`), and how long its claims of the lease take."""
        gauge = Gauge("vipu_leader", "1 while this vipu-server replica leads, 0 while it stands by", registry=self.registry)
        gauge.set_function(lambda: 1.0 if leadership.leading else 0.0)
        claims = Histogram("vipu_lease_claim_seconds", "How long a claim or renewal of the leader's lease took, from its "
                           "start to the store's answer: a lease should be ten times the slowest", registry=self.registry,
                           buckets=(0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0))
        leadership.on_claim = claims.observe

    def observe(self, method_path: str, code: str, seconds: float) -> None:
        """Record one call; `method_path` is gRPC's '/package.Service/Method'."""
        service, method = service_and_method(method_path)
        self.requests.labels(service, method, code).inc()
        self.latency.labels(service, method).observe(seconds)

    def count_malformed(self, method_path: str) -> None:
        self.malformed.labels(*service_and_method(method_path)).inc()

    def count_failed_login(self, reason: str) -> None:
        self.failed_logins.labels(reason).inc()

    def serve(self, host: str, port: int, ready: Callable[[], bool] = lambda: True) -> None:
        """The metrics, and `/readyz` answering whether `ready()`, on a thread of their own."""
        metrics = make_wsgi_app(self.registry)

        def app(environ, start_response):
            if environ.get("PATH_INFO") == "/readyz":
                serving = ready()
                start_response("200 OK" if serving else "503 Service Unavailable", [("Content-Type", "text/plain")])
                return [b"serving\n" if serving else b"standing by\n"]
            return metrics(environ, start_response)

        try:
            server = make_server(host, port, app, _ThreadingServer, handler_class=_QuietHandler)
        except OSError as error:
            raise Unavailable(f"cannot serve metrics on {host}:{port}: {error.strerror}") from error
        threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()


class _ThreadingServer(ThreadingMixIn, WSGIServer):
    daemon_threads = True


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format, *args) -> None:
        """Scrapes and probes are not worth a log line each."""
