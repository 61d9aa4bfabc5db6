"""The controller assembled: store, use cases and owners, end-points, health passes and metrics.

`Controller` is also the in-process controller of the testing kit: a test can start one on a
SQLite file, point it at simulated agents and drive it through its real end-points.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import grpc

from vipu.api.announcements import DISCOVERY_PORT
from vipu.api.protos import admin_pb2_grpc, version_pb2_grpc, vipuuser_pb2_grpc
from vipu.api.serving import serve
from vipu.api.status import GuardInterceptor
from vipu.api.tls import DEFAULT_DIRECTORY, TlsFiles, agent_channel_credentials, forwarding_proof, server_credentials
from vipu.api.tls import takeover_grant as tls_takeover_grant
from vipu.controller.auth import UNAUTHENTICATED_METHODS, Authenticator
from vipu.controller.core.changes import ChangeFeed, Topic
from vipu.controller.core.sharing import DEFAULT_SHARING, SharingPolicy
from vipu.controller.infrastructure.agentclient import GrpcAgentGateway
from vipu.controller.infrastructure.discovery import DiscoveryListener
from vipu.controller.infrastructure.leadership import Leadership
from vipu.controller.metrics import ControllerMetrics
from vipu.controller.servicers.admin import AdminServicer
from vipu.controller.servicers.user import UserServicer
from vipu.controller.servicers.version import VersionServicer
from vipu.controller.usecases.agents import no_takeover
from vipu.controller.usecases.users import UserService
from vipu.controller.wiring import ControllerServices
from vipu.model.clustertests import TestType
from vipu.model.compaction import DEFAULT_BUDGET, Budget
from vipu.model.errors import InvalidArgument, VipuError
from vipu.model.linkhealth import DEFAULT_POLICY, DEFAULT_REMEDIATION, DEFAULT_RETENTION, RemediationPolicy, Retention, TrendPolicy
from vipu.model.throttle import LoginThrottle
from vipu.model.waiting import QueueLimits
from vipu.store.store import CONFIGURATION_CHANGED, STATEMENT_DEADLINE_SECONDS, TESTS_CHANGED, USERS_CHANGED, Store

log = logging.getLogger(__name__)
# How long a clean stop waits for a health pass under way to end; each of its agent calls is
# bounded by the agent timeout.
HEALTH_PASS_DEADLINE_SECONDS = 30.0
# What the store says a commit changed -> the topic it is published under, for live views.
_TOPICS = {CONFIGURATION_CHANGED: Topic.CONFIGURATION, USERS_CHANGED: Topic.USERS, TESTS_CHANGED: Topic.TESTS}


@dataclass
class ServerConfig:
    db_url: str
    listen_address: str = "0.0.0.0"
    port: int = 8090
    admin_listen_address: str = "0.0.0.0"
    admin_port: int = 8091
    metrics_port: int = 8092  # 0: no metrics end-point
    agent_timeout: float = 10.0
    health_interval: float = 10.0
    link_sample_interval: float = 60.0  # seconds between readings of every link's counters; 0: none
    watch_interval: float = 1.0  # seconds between collections of the machines' telemetry and log lines; 0: none
    link_policy: TrendPolicy = DEFAULT_POLICY  # when a link's trend makes it suspect
    link_history_days: float = DEFAULT_RETENTION.days
    idle_tests: frozenset[TestType] = frozenset()  # the tests run on free machines (of IDLE_TESTS); empty: none
    idle_test_interval: float = 3600.0  # seconds between rounds of idle-time tests
    compaction: Budget = DEFAULT_BUDGET  # the bound on compaction's moves in each allocation
    sharing: SharingPolicy = DEFAULT_SHARING  # fair share's half-life and a reclaim's grace (`vipu.model.accounts`)
    link_remediation: RemediationPolicy = DEFAULT_REMEDIATION  # automatic reset and re-test of a failed link, and the breaker
    workers: int = 32
    discovery_interfaces: tuple[str, ...] = ()  # empty: agent discovery is off
    discovery_port: int = DISCOVERY_PORT
    secure: bool = False  # mutual TLS on both end-points, and users with access keys
    tls_dir: Path = DEFAULT_DIRECTORY
    ha_lease_seconds: float = 0.0  # above 0: one of several replicas, leading while it holds the store's lease
    advertise_address: str = ""  # how clients reach this replica, as a standby tells them of the leader
    login_failures: int = 10  # failed logins of one user from one address within login_lockout that lock it out there; 0: never
    login_failures_per_address: int = 0  # of any users, that lock out an address but for users proven from it; 0: never
    login_lockout: float = 60.0
    max_waiting_per_user: int = QueueLimits.per_user  # requests one user of secure mode may have waiting for room
    max_waiting: int = QueueLimits.total  # requests that may wait for room on this controller, in all
    request_lease_seconds: float = QueueLimits.lease_seconds  # a waiting request nobody asks after for this long is withdrawn
    statement_deadline: float = STATEMENT_DEADLINE_SECONDS  # the longest a store statement, or a wait for the write turn, takes


def agent_link(config: ServerConfig) -> grpc.ChannelCredentials | None:
    """In secure mode, the agent link's mutual TLS (the certificates `--tls-init` makes in the TLS
    directory's controller/); plaintext in open mode only. A secure controller without them refuses
    to start: reaching agents in plaintext would let anyone who reaches them configure machines."""
    if not config.secure:
        return None
    files = TlsFiles(config.tls_dir)
    if not files.has_agent_link:
        raise InvalidArgument(f"secure mode needs the agent link's certificate in {files.controller_dir}, and its agents those in "
                              f"{files.agents_dir}; 'vipu-server --init --secure --tls-dir {files.root}' makes them")
    return agent_channel_credentials(files)


def takeover_grant(config: ServerConfig) -> Callable[[str], str]:
    """How this controller gets the site's grant to take a machine from another controller."""
    if config.secure and TlsFiles(config.tls_dir).has_agent_link:
        return lambda machine_serial: tls_takeover_grant(TlsFiles(config.tls_dir), machine_serial)
    return no_takeover


class Controller:
    """A controller; with `ha_lease_seconds`, one replica of several, serving only while it leads.

    `on_deposed(reason)` is called if a leading replica loses the lead; it has stopped acting by
    then, and should end (to start again as a standby).
    """

    def __init__(self, config: ServerConfig, on_deposed: Callable[[str], None] = lambda reason: None):
        if (config.listen_address, config.port) == (config.admin_listen_address, config.admin_port):
            raise InvalidArgument("the user and admin end-points need different addresses or ports")
        self.config = config
        link = agent_link(config)
        # A replica cut off from PostgreSQL mid-transaction holds locks a standby's claim waits for:
        # the server ends such a transaction once it has waited a lease on the replica.
        self.store = Store(config.db_url, config.statement_deadline, idle_seconds=config.ha_lease_seconds or None)
        self.gateway = GrpcAgentGateway(config.agent_timeout, credentials=link)
        self.changes = ChangeFeed()
        self.store.on_commit = self._committed
        self.services = services = ControllerServices(self.store, self.gateway, self.changes, config.workers,
                                                      QueueLimits(config.max_waiting_per_user, config.max_waiting,
                                                                  config.request_lease_seconds), takeover_grant(config),
                                                      config.link_policy, Retention.keeping(config.link_history_days),
                                                      config.link_remediation, config.compaction, config.sharing)
        self.owners, self.partitions, self.requests = services.owners, services.partitions, services.requests
        self.allocations, self.clusters, self.agents = services.allocations, services.clusters, services.agents
        self.clustertests, self.health = services.clustertests, services.health
        self.discovery = (DiscoveryListener(list(config.discovery_interfaces), port=config.discovery_port)
                          if config.discovery_interfaces else None)
        self.metrics = ControllerMetrics(self.store)
        throttle = LoginThrottle(config.login_failures, config.login_lockout, config.login_failures_per_address)
        self.users = UserService(self.store, throttle, self.metrics.count_failed_login) if config.secure else None
        self.leadership = None
        if config.ha_lease_seconds > 0:
            where = f"{config.advertise_address or config.listen_address}, user port {config.port}, admin port {config.admin_port}"
            self.leadership = Leadership(self.store, where, config.ha_lease_seconds,
                                         on_elected=self._take_over, on_deposed=self._deposed)
            # Every agent call carries the lease's term, as every store write is fenced by it.
            self.gateway.epoch = lambda: self.store.fenced.term if self.store.fenced is not None else 0
            self.metrics.follow(self.leadership)
        self._on_deposed = on_deposed
        self._servers: list[grpc.Server] = []
        self._stop = threading.Event()
        self._health: threading.Thread | None = None

    def _committed(self, changed: frozenset[str]) -> None:
        for what in changed:
            self.changes.publish(_TOPICS[what])

    def start(self) -> None:
        """Serve: at once if alone, or as a standby that takes over when elected."""
        if self.users is not None and not self.users.has_administrator():
            raise VipuError("secure mode needs an administrator, and the store has none; run vipu-server --init --secure")
        if self.leadership is None:
            self._recover()
        c = self.config
        self._servers.append(self._serve(c.listen_address, c.port, self._register_user, admin_only=False))
        self._servers.append(self._serve(c.admin_listen_address, c.admin_port, self._register_admin, admin_only=True))
        if c.metrics_port:
            self.metrics.serve(c.listen_address, c.metrics_port, ready=lambda: self.leadership is None or self.leadership.ready)
        if self.leadership is None:
            self._start_health()
        else:
            self.leadership.start()

    def _recover(self) -> None:
        """Finish what a stopped controller left half-done, and start listening for agents. From
        now on this controller is the store's only writer (a standby writes nothing)."""
        self.store.own()
        self.health.recover()
        self.clustertests.recover()
        if self.discovery is not None:
            self.discovery.start()

    def _start_health(self) -> None:
        """Health passes, link readings and idle-time tests, each in a thread of its own."""
        self._health = threading.Thread(target=self.health.run, args=(self.config.health_interval, self._stop), name="health",
                                        daemon=True)
        self._health.start()
        if self.config.link_sample_interval > 0:
            threading.Thread(target=self.services.links.run, args=(self.config.link_sample_interval, self._stop), name="links",
                             daemon=True).start()
        threading.Thread(target=self.services.accounts.run, args=(self._stop,), name="usage", daemon=True).start()
        if self.config.watch_interval > 0:
            threading.Thread(target=self.services.telemetry.run, args=(self.config.watch_interval, self._stop), name="watch",
                             daemon=True).start()
        if self.config.idle_tests:
            threading.Thread(target=self.clustertests.run_idle, args=(self.config.idle_test_interval, self.config.idle_tests,
                                                                      self._stop), name="idle-tests", daemon=True).start()

    def _take_over(self) -> None:
        """Elected: recover the store's state as after a restart, then serve."""
        try:
            self._recover()
        except Exception as error:  # a leader that cannot recover must not serve
            log.exception("taking over failed")
            self._deposed(f"taking over failed: {error}")
            return
        self._start_health()
        if self.leadership is not None:  # always: the leadership elected us
            self.leadership.serving()
        log.info("leading: serving requests")

    def _deposed(self, reason: str) -> None:
        self._stop.set()
        self.owners.stop(f"this vipu-server is no longer the leader: {reason}", seconds=0)
        self.store.own(False)
        self._on_deposed(reason)

    @contextmanager
    def _admitting(self, authenticate: Authenticator, method: str, metadata: Mapping[str, str], peer: str) -> Iterator[None]:
        """Authenticate the caller, after refusing the call if this replica stands by."""
        if self.leadership is not None and method not in UNAUTHENTICATED_METHODS:
            self.leadership.admit()
        with authenticate(method, metadata, peer):
            yield

    def _register_user(self, server: grpc.Server) -> None:
        vipuuser_pb2_grpc.add_UserServiceServicer_to_server(
            UserServicer(self.partitions, self.requests, self.changes, self.services.telemetry), server)
        version_pb2_grpc.add_VersionServiceServicer_to_server(VersionServicer(), server)

    def _register_admin(self, server: grpc.Server) -> None:
        servicer = AdminServicer(self.agents, self.clusters, self.allocations, self.clustertests, self.discovery,
                                 self.users, self.config.port, self.partitions, self.requests, self.services.links,
                                 self.services.accounts, self.services.telemetry)
        admin_pb2_grpc.add_AdminServiceServicer_to_server(servicer, server)
        version_pb2_grpc.add_VersionServiceServicer_to_server(VersionServicer(), server)

    def _serve(self, host: str, port: int, register: Callable[[grpc.Server], None], admin_only: bool) -> grpc.Server:
        files = TlsFiles(self.config.tls_dir)
        authenticate = Authenticator(self.users, admin_only, forwarding_proof(files) if self.config.secure else None)
        guard = GuardInterceptor(self.metrics.observe,
                                 lambda method, metadata, peer: self._admitting(authenticate, method, metadata, peer),
                                 self.metrics.count_malformed)
        credentials = server_credentials(files) if self.config.secure else None
        return serve(register, host, port, guard, workers=self.config.workers, credentials=credentials)

    def stop(self) -> None:
        """Stop health passes, cluster tests, discovery and the servers (letting requests under
        way finish), then let go of the agents and the store. Whatever the controller started
        (the simulated pod of --sim) is stopped after this, so no pass sees its agents go."""
        self._stop.set()
        self.changes.close()  # before the servers stop: their grace must not wait on watchers
        self.clustertests.shutdown()
        if self.discovery is not None:
            self.discovery.stop()
        for server in self._servers:
            server.stop(grace=2).wait()
        if self._health is not None:
            self._health.join(timeout=HEALTH_PASS_DEADLINE_SECONDS)
        self.services.stop("this vipu-server is stopping")
        if self.leadership is not None:
            self.leadership.stop()  # after the last request, so that the next leader starts from what it left
        self.gateway.close()
        self.store.close()
