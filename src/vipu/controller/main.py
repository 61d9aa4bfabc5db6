"""`vipu-server`: the V-IPU controller."""

from __future__ import annotations

import atexit
import copy
import faulthandler
import getpass
import logging
import logging.handlers
import os
import queue
import signal
import socket
import sys
import threading
import time
from pathlib import Path

import click

from vipu import __version__, failpoints
from vipu.api.announcements import DISCOVERY_PORT
from vipu.api.tls import DEFAULT_DIRECTORY, TlsFiles, default_hosts, generate, generate_agent_link
from vipu.client.settings import ClientSettings, write_client_config
from vipu.controller.core.sharing import SharingPolicy
from vipu.controller.server import Controller, ServerConfig
from vipu.controller.simpod import ALLOCATION_ID, CLUSTER_ID, SimPod
from vipu.controller.usecases.users import UserService
from vipu.model.clustertests import TestType
from vipu.model.compaction import Budget
from vipu.model.entities import IPUS_PER_MACHINE, IldTopology
from vipu.model.errors import InvalidArgument, VipuError
from vipu.model.linkhealth import RemediationPolicy, TrendPolicy
from vipu.model.waiting import QueueLimits
from vipu.store.store import STATEMENT_DEADLINE_SECONDS, Store

log = logging.getLogger("vipu.server")


LOG_BATCH_SECONDS = 0.02  # how long the log writer waits for more lines after the first before writing them


class _LogWriter:
    """Writes the controller's log lines on a thread of its own, in batches: woken by the first
    line after a quiet spell, it waits LOG_BATCH_SECONDS for more and writes them together. A busy
    controller then pays one wake-up per batch instead of one per line (a wake-up costs several
    times the writing); a quiet one writes a line at most that much later."""

    _STOP = object()

    def __init__(self, records: queue.SimpleQueue, handler: logging.Handler):
        self._records = records
        self._handler = handler
        self._thread = threading.Thread(target=self._write, name="log-writer", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        """Write what is left, and end (at most 5 s)."""
        self._records.put(self._STOP)
        self._thread.join(5.0)

    def flush(self, seconds: float) -> None:
        """Wait up to `seconds` until the lines logged so far are written: what the controller
        prints itself (that it is ready) then comes after them."""
        written = threading.Event()
        self._records.put(written)
        written.wait(seconds)

    def _write(self) -> None:
        while True:
            batch = [self._records.get()]
            time.sleep(LOG_BATCH_SECONDS)
            while True:
                try:
                    batch.append(self._records.get_nowait())
                except queue.Empty:
                    break
            for record in batch:
                if record is self._STOP:
                    return
                if isinstance(record, threading.Event):
                    record.set()
                else:
                    self._handler.handle(record)


class _SecondsFormatter(logging.Formatter):
    """The log's format, its time of day worked out once a second rather than once a line: a busy
    controller writes a line per create and per remove, and `time.strftime` was a fifth of it."""

    def __init__(self, fmt: str):
        super().__init__(fmt)
        self._second, self._text = -1, ""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        second = int(record.created)
        if second != self._second:
            self._second, self._text = second, time.strftime("%Y-%m-%d %H:%M:%S", self.converter(second))
        return f"{self._text},{int(record.msecs):03d}"


class _QueueHandler(logging.handlers.QueueHandler):
    """Puts a line in the writer's queue with its message made, and nothing formatted twice."""

    def prepare(self, record: logging.LogRecord) -> logging.LogRecord:
        prepared = copy.copy(record)  # other handlers (a test's) may still read the record as it was
        prepared.msg, prepared.args = record.getMessage(), None
        if record.exc_info:
            prepared.exc_text = logging.Formatter().formatException(record.exc_info)
        prepared.exc_info = None
        return prepared


def log_off_the_request_path(level: str) -> _LogWriter:
    """Log lines go through a queue to a thread of their own that writes them, so that no request
    waits for standard error; the thread writes what is left when the process exits."""
    records: queue.SimpleQueue = queue.SimpleQueue()
    handler = logging.StreamHandler()
    handler.setFormatter(_SecondsFormatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    writer = _LogWriter(records, handler)
    root = logging.getLogger()
    root.setLevel(level)
    root.addHandler(_QueueHandler(records))
    writer.start()
    atexit.register(writer.stop)
    return writer


DEFAULT_DATA_DIR = Path("~/.local/share/vipu")


SIGNAL_POLL_SECONDS = 0.5


class Stopping:
    """What SIGTERM and SIGINT do, installed before any thread starts so that none is lost: during
    start-up they abort it (SystemExit, so that whatever started is stopped again); once the
    controller serves, they set `event`, which the main thread waits on. SIGUSR1 writes every
    thread's stack to stderr, for a controller that seems stuck."""

    def __init__(self) -> None:
        self.event = threading.Event()
        self.serving = False
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._received)
        faulthandler.register(signal.SIGUSR1, all_threads=True)

    def _received(self, signum: int, _frame) -> None:
        self.event.set()
        if not self.serving:
            raise SystemExit(128 + signum)

    def wait(self) -> None:
        """Until a signal (or `event.set()`). The wait must wake now and then: the kernel may hand
        the signal to any thread (gRPC's included), and then nothing interrupts the main thread's
        wait, while Python runs the handler only on the main thread, once it runs again."""
        while not self.event.wait(SIGNAL_POLL_SECONDS):
            pass


def sim_agent_tls(files: TlsFiles) -> Path:
    """The files the simulated agents of a secure --sim serve the agent link with."""
    if not files.agent_cert.exists():
        raise InvalidArgument(f"secure --sim needs the agents' certificates in {files.agents_dir} "
                              "(vipu-server --tls-init makes them; vipu-certs agent issues them)")
    return files.agents_dir


def initialise(db_url: str, store_too: bool, secure: bool, certificates: bool, tls_dir: Path, tls_hosts: str | None,
               default_user_id: str, user_port: int, admin_port: int) -> None:
    """--init and --tls-init: the store, the certificates, and a first administrator, as asked."""
    store = Store(db_url) if store_too else None
    if store is not None:
        click.echo(f"Initialised storage: {store.describe()}")
    files = TlsFiles(tls_dir)
    if certificates or (store_too and secure):
        hosts = [h.strip() for h in tls_hosts.split(",") if h.strip()] if tls_hosts else default_hosts()
        if certificates or not files.server_cert.exists():
            issued_link = files.has_agent_link  # a certificate the site issued this controller, kept
            generate(files, hosts)
            click.echo(f"Generated server TLS certificates in the directory: {files.server_dir}")
            click.echo(f"Generated client TLS certificates in the directory: {files.client_dir}")
            if issued_link:
                click.echo(f"Using the agent link certificate the site issued in the directory: {files.controller_dir}")
            else:
                click.echo(f"Generated agent link TLS certificates in the directories: {files.agents_dir}, {files.controller_dir}")
        else:
            click.echo(f"Using the TLS certificates in the directory: {files.root}")
            if not files.has_agent_link:  # made before the agent link had certificates of its own
                generate_agent_link(files, hosts)
                click.echo(f"Generated agent link TLS certificates in the directories: {files.agents_dir}, {files.controller_dir}")
    if store is not None and secure:
        users = UserService(store)
        if users.has_administrator():
            click.echo("An administrator exists already; no default user was created.")
        else:
            user, key = users.create(default_user_id, admin=True)
            click.echo(f"Default user is: {user.id}")
            click.echo(f"Access key is '{key}'.")
            path = Path(f"{user.id}.vipu-cli.hcl")
            settings = ClientSettings("localhost", user_port, user.id, key, files.ca_for(files.client_dir),
                                      files.client_cert, files.client_key)
            write_client_config(path, settings, admin_port=admin_port)
            click.echo(f"vipu configuration file for the user '{user.id}' written: {path}")
    if store is not None:
        store.close()


# --idle-test-types' names, as vipu-admin test cluster's options name the tests.
IDLE_TEST_NAMES = {"ipulink": TestType.IPULINK, "traffic": TestType.TRAFFIC}


def idle_tests_named(text: str) -> frozenset[TestType]:
    """--idle-test-types NAME,... as tests; a one-line refusal of a name that is no idle-time test."""
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names or any(name not in IDLE_TEST_NAMES for name in names):
        raise InvalidArgument(f"--idle-test-types {text!r}: idle-time tests are {' and '.join(IDLE_TEST_NAMES)} (they drive only "
                              "the links between the free machines they test), one or both, e.g. ipulink,traffic")
    return frozenset(IDLE_TEST_NAMES[name] for name in names)


def link_trend_policy(text: str) -> TrendPolicy:
    """--link-trend K,N,SECONDS as a policy; a one-line refusal of anything else."""
    try:
        growing, windows, seconds = (part.strip() for part in text.split(","))
        return TrendPolicy(float(seconds), int(windows), int(growing))
    except ValueError:  # not three parts, or one not a number
        raise InvalidArgument(f"--link-trend {text!r}: expected K,N,SECONDS, e.g. 4,12,3600") from None


@click.command(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="vipu-server")
@click.option("--data-dir", type=click.Path(path_type=Path), default=DEFAULT_DATA_DIR, show_default=True,
              help="Where the default SQLite store, the simulated rack and agent logs live.")
@click.option("--db", "db_url", default=None, envvar="VIPU_SERVER_DB",
              help="Store URL: sqlite:///PATH or postgresql://USER:PASSWORD@HOST/DB (or VIPU_SERVER_DB, which keeps a "
                   "password out of the process list). Default: DATA_DIR/vipu.db.")
@click.option("--listen-address", default="0.0.0.0", show_default=True, help="Address of the user end-point.")
@click.option("--port", default=8090, show_default=True, help="Port of the user end-point.")
@click.option("--admin-listen-address", default=None, help="Address of the admin end-point. Default: --listen-address.")
@click.option("--admin-port", default=8091, show_default=True, help="Port of the admin end-point.")
@click.option("--metrics-port", default=8092, show_default=True, help="Port of the Prometheus metrics end-point (0: off).")
@click.option("--agent-timeout", default=10.0, show_default=True, help="Seconds to wait for an agent's answer.")
@click.option("--health-interval", default=10.0, show_default=True, help="Seconds between agent health and reconciliation passes.")
@click.option("-a", "--autodiscovery-listen-interfaces", "discovery_interfaces", default="",
              help="Listen for agents' announcements on these network interfaces (IF1,IF2); without it, discovery is off.")
@click.option("--autodiscovery-port", "discovery_port", type=click.IntRange(1, 65535), default=DISCOVERY_PORT, show_default=True,
              help="UDP port of the agents' multicast announcements.")
@click.option("--init", "init_only", is_flag=True,
              help="Initialise the store and exit; with --secure, also the TLS certificates and a default administrator.")
@click.option("--secure", is_flag=True, help="Mutual TLS on both end-points, and users who prove themselves with access keys.")
@click.option("--login-failures", type=click.IntRange(0, 10_000), default=10, show_default=True,
              help="With --secure: failed logins of one user from one address, within --login-lockout seconds, that refuse "
                   "that user from that address for as long; 0: never.")
@click.option("--login-failures-per-address", type=click.IntRange(0, 1_000_000), default=0, show_default=True,
              help="With --secure: failed logins from one address, of any users, within --login-lockout seconds, that refuse "
                   "that address for as long to every user who has not logged in from it in the last day; 0: never. "
                   "Not for an address many users share (a NAT, a proxy): anyone there could lock them out.")
@click.option("--login-lockout", type=click.FloatRange(1, 86_400), default=60.0, show_default=True,
              help="With --secure: the window in which failed logins are counted, and how long a lockout lasts.")
@click.option("--tls-init", is_flag=True, help="Generate a certificate authority and server and client certificates, and exit.")
@click.option("--tls-dir", type=click.Path(file_okay=False, path_type=Path), default=DEFAULT_DIRECTORY, show_default=True,
              help="Where the TLS certificates are (server/, client/, ca/).")
@click.option("--tls-hosts", default=None, help="Names and addresses the server certificate is for: H1,H2,... Default: this host's.")
@click.option("--default-user-id", default=None, help="Name of the administrator --init --secure creates. Default: your user name.")
@click.option("--sim", "sim_machines", type=click.IntRange(1, 4096), default=None,
              help="Also start a simulated pod of this many IPU-Machines and register it (cluster cl0, allocation alloc-1).")
@click.option("--sim-topology", type=click.Choice(["mesh", "torus"]), default="torus", show_default=True)
@click.option("--sim-ilds", type=click.IntRange(1, 64), default=1, show_default=True, help="IPU-Link domains of the simulated pod.")
@click.option("--sim-rebuild", is_flag=True,
              help="Replace a simulated pod of another shape in --data-dir (its partitions go with it) instead of refusing.")
@click.option("--sim-base-port", type=click.IntRange(1024, 65535 - 6 * 4096), default=18101, show_default=True,
              help="Port of the first simulated agent; the others follow, and IPUoF ports sit 2000 and 4000 above.")
@click.option("--ha", is_flag=True,
              help="Run as one of several replicas on one store (PostgreSQL): the replica holding the store's lease serves, "
                   "the others stand by and refuse requests, and one takes over when the leader stops or its lease runs out.")
@click.option("--ha-lease-seconds", type=click.FloatRange(0.5, 300), default=5.0, show_default=True,
              help="With --ha: how long the leader's lease lasts unrenewed (it renews five times as often).")
@click.option("--advertise-address", default=None,
              help="With --ha: the host name clients reach this replica by, which standbys name as the leader's. "
                   "Default: --listen-address, or this host's name when listening on all addresses.")
@click.option("--max-waiting-per-user", type=click.IntRange(1, 1_000_000), default=QueueLimits.per_user, show_default=True,
              help="With --secure: how many requests one user may have waiting for room (create --wait); one more is refused.")
@click.option("--max-waiting", type=click.IntRange(1, 10_000_000), default=QueueLimits.total, show_default=True,
              help="How many requests may wait for room on this controller in all; one more is refused.")
@click.option("--request-lease", type=click.FloatRange(5, 86_400), default=QueueLimits.lease_seconds, show_default=True,
              help="Seconds a waiting request lives without its waiter asking after it (create --wait asks every 20 s at "
                   "most); then it is withdrawn, its waiter being gone. Requests made to be picked up later have no lease.")
@click.option("--link-sample-interval", type=click.FloatRange(0, 86_400), default=60.0, show_default=True,
              help="Seconds between readings of every link's error and recovery counters, for the link ledger (0: none).")
@click.option("--watch-interval", type=click.FloatRange(0, 3600), default=1.0, show_default=True,
              help="Seconds between collections of the machines' telemetry and log lines from their agents (0: none).")
@click.option("--link-trend", default="4,12,3600", show_default=True, metavar="K,N,SECONDS",
              help="A link is suspect when its counters grew in K of its last N windows of SECONDS each.")
@click.option("--link-history-days", type=click.FloatRange(30, 36_500), default=400.0, show_default=True,
              help="Days of each link's history the ledger keeps (compacted as they age).")
@click.option("--link-remediation-attempts", type=click.IntRange(0, 100), default=3, show_default=True,
              help="Automatic resets and re-tests of a failed link, at most, per link and per machine in 7 days (0: none).")
@click.option("--link-remediation-settle", type=click.FloatRange(0, 600), default=5.0, show_default=True,
              help="Seconds a reset link is given to train before it is re-tested.")
@click.option("--link-breaker-percent", type=click.FloatRange(1, 100), default=20.0, show_default=True,
              help="No automatic quarantine that leaves more than this share of an allocation's machines with a quarantined link.")
@click.option("--idle-tests", is_flag=True,
              help="Test the links of free machines in idle time: every --idle-test-interval seconds each allocation lends its "
                   "machines with no partition to the IPU-Link and Traffic tests, and a partition that needs one takes it "
                   "back at once (the test stops, and the results of the tests it finished are kept).")
@click.option("--idle-test-interval", type=click.FloatRange(0.1, 30 * 86_400), default=3600.0, show_default=True,
              help="With --idle-tests: seconds from the end of one round of idle-time tests to the next.")
@click.option("--idle-test-types", default="ipulink,traffic", show_default=True, metavar="NAME,...",
              help="With --idle-tests: the tests to run, ipulink and traffic, one or both.")
@click.option("--compaction-moves-per-hour", type=click.IntRange(0, 10_000), default=Budget.moves_per_hour, show_default=True,
              help="Compaction moves at most this many partitions an hour in each allocation (0: none).")
@click.option("--compaction-partition-interval", type=click.FloatRange(0, 365 * 86_400), default=Budget.partition_interval,
              show_default=True, help="Seconds before compaction may move the same partition again.")
@click.option("--fair-share-half-life", type=click.FloatRange(1, 366 * 86_400), default=SharingPolicy.half_life,
              show_default=True, help="Seconds after which an account's use counts half in fair share (vipu-admin create account).")
@click.option("--reclaim-grace", type=click.FloatRange(0, 86_400), default=SharingPolicy.reclaim_grace, show_default=True,
              help="Seconds between the notice of a reclaim of borrowed quota and the removal of the partitions it names.")
@click.option("--statement-deadline", type=click.FloatRange(0.1, 3600), default=STATEMENT_DEADLINE_SECONDS, show_default=True,
              help="Seconds a store statement, or a write waiting for its turn, may take before it is refused as the store "
                   "being busy (a stalled database or disk); a write given up on is withdrawn, never committed later.")
@click.option("--log-level", default="INFO", show_default=True,
              type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False))
def main(data_dir, db_url, listen_address, port, admin_listen_address, admin_port, metrics_port, agent_timeout,
         health_interval, discovery_interfaces, discovery_port, init_only, secure, login_failures, login_failures_per_address,
         login_lockout, tls_init, tls_dir, tls_hosts, default_user_id, sim_machines, sim_topology, sim_ilds, sim_rebuild,
         sim_base_port, ha, ha_lease_seconds, advertise_address, max_waiting_per_user, max_waiting, request_lease,
         link_sample_interval, watch_interval, link_trend, link_history_days, link_remediation_attempts, link_remediation_settle,
         link_breaker_percent, idle_tests, idle_test_interval, idle_test_types, compaction_moves_per_hour,
         compaction_partition_interval, fair_share_half_life, reclaim_grace, statement_deadline, log_level):
    """Run the V-IPU controller: the user end-point for partitions, the admin end-point for the pod."""
    log_writer = log_off_the_request_path(log_level.upper())
    data_dir = data_dir.expanduser()
    db_url = db_url or str(data_dir / "vipu.db")
    stopping = Stopping()
    try:
        if ha and sim_machines:
            raise InvalidArgument("--sim starts a pod for one controller; it cannot be combined with --ha")
        failpoints.arm_from_environment()
        if init_only or tls_init:
            initialise(db_url, init_only, secure, tls_init, tls_dir, tls_hosts, default_user_id or getpass.getuser(), port, admin_port)
            return
        idle_tested = idle_tests_named(idle_test_types)  # checked with or without --idle-tests
        config = ServerConfig(
            db_url=db_url,
            listen_address=listen_address,
            port=port,
            admin_listen_address=admin_listen_address or listen_address,
            admin_port=admin_port,
            metrics_port=metrics_port,
            agent_timeout=agent_timeout,
            health_interval=health_interval,
            discovery_interfaces=tuple(i.strip() for i in discovery_interfaces.split(",") if i.strip()),
            discovery_port=discovery_port,
            secure=secure,
            login_failures=login_failures,
            login_failures_per_address=login_failures_per_address,
            login_lockout=login_lockout,
            tls_dir=tls_dir,
            ha_lease_seconds=ha_lease_seconds if ha else 0.0,
            advertise_address=advertise_address or (listen_address if listen_address not in ("0.0.0.0", "::") else socket.getfqdn()),
            max_waiting_per_user=max_waiting_per_user,
            max_waiting=max_waiting,
            request_lease_seconds=request_lease,
            link_sample_interval=link_sample_interval,
            watch_interval=watch_interval,
            link_policy=link_trend_policy(link_trend),
            link_history_days=link_history_days,
            link_remediation=RemediationPolicy(link_remediation_attempts, settle_seconds=link_remediation_settle,
                                               breaker_share=link_breaker_percent / 100),
            idle_tests=idle_tested if idle_tests else frozenset(),
            idle_test_interval=idle_test_interval,
            compaction=Budget(compaction_moves_per_hour, compaction_partition_interval),
            sharing=SharingPolicy(fair_share_half_life, reclaim_grace),
            statement_deadline=statement_deadline,
        )
        deposed: list[str] = []

        def end_when_deposed(reason: str) -> None:
            deposed.append(reason)
            stopping.event.set()

        controller = Controller(config, on_deposed=end_when_deposed)
    except VipuError as error:
        click.echo(f"vipu-server: {error.message}", err=True)
        sys.exit(2)

    pod = None
    registered_now = False
    try:
        if sim_machines:
            agent_tls = sim_agent_tls(TlsFiles(tls_dir)) if controller.gateway.credentials is not None else None  # as it reaches them
            pod = SimPod(data_dir, sim_machines, IldTopology(sim_topology), sim_ilds, sim_base_port, rebuild=sim_rebuild,
                         agent_tls=agent_tls)
            rack = pod.rack()
            pod.start(rack)
            pod.wait_ready(controller, rack)
        controller.start()
        if pod is not None:
            registered_now = pod.register(controller, rack)
    except BaseException as error:
        controller.stop()
        if pod is not None:
            pod.stop()
        if not isinstance(error, VipuError):
            raise
        click.echo(f"vipu-server: {error.message}", err=True)
        sys.exit(1)
    stopping.serving = True

    if secure:
        log.info("secure mode: mutual TLS with the certificates in %s, and users with access keys", tls_dir)
    else:
        log.warning("open mode: no TLS and no authentication; anyone who reaches the end-points may use them")
    log_writer.flush(1.0)
    click.echo(
        f"vipu-server {__version__} ready: user end-point {config.listen_address}:{config.port}, "
        f"admin end-point {config.admin_listen_address}:{config.admin_port}, store {controller.store.describe()}",
        err=True,
    )
    if pod is not None:
        registration = (f"as agents ag1..ag{sim_machines} in cluster {CLUSTER_ID}, allocation {ALLOCATION_ID}" if registered_now
                        else "registered on an earlier start, kept as the store has it ('vipu-admin list agents')")
        name, kept = pod.first_free_name(controller)
        kept_note = f" ({kept} partition(s) kept from an earlier start: 'vipu list partitions')" if kept else ""
        click.echo(
            f"simulated pod: {sim_machines} IPU-Machines ({sim_machines * IPUS_PER_MACHINE} IPUs, {sim_topology}, "
            f"{sim_ilds} IPU-Link domain(s)) {registration}; rack description {pod.rack_path}\n"
            f"try: vipu create partition {name} --size 4{kept_note}",
            err=True,
        )

    if ha:
        log.info("high availability: this replica serves while it holds the store's lease, and stands by otherwise")
    stopping.wait()
    log.info("stopping")
    controller.stop()  # first, so that no health pass sees the simulated pod's agents go
    if pod is not None:
        pod.stop()
    if deposed:
        log_writer.flush(1.0)
        click.echo(f"vipu-server: no longer the leader ({deposed[0]}); exiting, to be started again as a standby", err=True)
        # At once, without waiting for its threads: a commit a stalled store still holds (fenced since)
        # would keep the process, and its ports, from its supervisor for as long as the stall lasts.
        sys.stderr.flush()
        failpoints.hit("server.exit")
        os._exit(3)
