"""Each vPOD's own controller: a secure `vipu-server` with a store and certificates of its own, kept running.

The orchestrator keeps a directory per vPOD: the controller's certificates (its own authority for
its users; for the agent link, a certificate the site issued, named `vpod-<id>`, and no key to
take machines with) and the orchestrator's administrator configuration for it. Where the
controller runs is the runner's business:

- `LocalControllers` (the embedded default): processes on this host, in sessions of their own,
  with the store (SQLite), log and process id in that directory. They outlive an orchestrator
  that stops or dies, and a new one adopts them by their process ids, or, when one died before
  writing the id down, by the `--data-dir` its command line names.
- `vipu.vpod.kubernetes.KubernetesControllers`: a Deployment per vPOD, its store a PostgreSQL
  database of its own.

Both are kept running by `supervise`, and stopped for good only by a release.
"""

from __future__ import annotations

import abc
import contextlib
import hashlib
import itertools
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives.serialization import load_ssh_public_key

from vipu.api.atomic import write_file
from vipu.api.tls import TlsFiles, issue_link_certificate
from vipu.client.admin import AdminClient
from vipu.model.entities import ID_MAX_LENGTH
from vipu.model.errors import InvalidArgument, NotFound, Unavailable, VipuError
from vipu.store.databases import close_database, make_database
from vipu.vpod.crash import crash_point
from vipu.vpod.store import Vpod

log = logging.getLogger(__name__)

ADMIN_USER = "vpod-admin"  # the orchestrator's administrator in each tenant's controller
START_DEADLINE_SECONDS = 60.0
STOP_DEADLINE_SECONDS = 30.0
SERVER_PROGRAM = "vipu-server"
STORE_FILE = "store-url"  # in the vPOD's directory: the tenant's own database URL, with its password


def controller_name(vpod_id: str) -> str:
    """What the site's agents know a vPOD's controller by: `vpod-<id>`, an id of at most
    ID_MAX_LENGTH characters; a longer vPOD id (a tenant's id may take all of them) is cut and
    ends in a digest of the whole, so that two vPODs never share a name."""
    name = f"vpod-{vpod_id}"
    if len(name) <= ID_MAX_LENGTH:
        return name
    digest = hashlib.sha256(vpod_id.encode()).hexdigest()[:12]
    return f"{name[:ID_MAX_LENGTH - len(digest) - 1]}-{digest}"


class TenantControllers(abc.ABC):
    """What every runner shares: the vPODs' directories, preparing a controller, reaching it."""

    start_deadline_seconds = START_DEADLINE_SECONDS  # to answer once started

    def __init__(self, root: Path, site: TlsFiles):
        self.root = root
        self.site = site
        self.server_program = Path(sys.executable).with_name(SERVER_PROGRAM)
        self._locks_lock = threading.Lock()
        self._locks: dict[str, threading.Lock] = {}
        self._stopping: set[str] = set()  # released: not to be started again by the supervisor

    def _lock(self, vpod_id: str) -> threading.Lock:
        """Starting and stopping one vPOD's controller, one at a time (a runner's calls may be slow:
        other vPODs do not wait for them)."""
        with self._locks_lock:
            return self._locks.setdefault(vpod_id, threading.Lock())

    # Where things are

    def directory(self, vpod_id: str) -> Path:
        return self.root / "vpods" / vpod_id

    def archive(self, vpod_id: str) -> Path:
        return self.root / "archive" / vpod_id

    def admin_config(self, vpod_id: str) -> Path:
        return self.directory(vpod_id) / f"{ADMIN_USER}.vipu-cli.hcl"

    def tls(self, vpod_id: str) -> TlsFiles:
        return TlsFiles(self.directory(vpod_id) / "vipu-certs")

    @abc.abstractmethod
    def host(self, vpod_id: str) -> str:
        """Where the vPOD's controller is reached, by the orchestrator and by the tenant's users."""

    @abc.abstractmethod
    def tls_hosts(self, vpod_id: str) -> str:
        """The names the controller's server certificate covers: H1,H2,..."""

    @abc.abstractmethod
    def db_url(self, vpod_id: str) -> str:
        """The URL of the controller's store."""

    @abc.abstractmethod
    def _fresh_store(self, vpod_id: str) -> None:
        """An empty store for the controller, whatever an interrupted preparation left."""

    # Life

    @abc.abstractmethod
    def alive(self, vpod_id: str) -> bool:
        """Whether the controller runs, or is kept running by its runner."""

    @abc.abstractmethod
    def _launch(self, vpod: Vpod) -> None:
        """Set the controller running (the caller holds the lock and found it not alive)."""

    @abc.abstractmethod
    def _halt(self, vpod_id: str) -> None:
        """Stop the controller for good, within a deadline."""

    @abc.abstractmethod
    def _why_not_ready(self, vpod_id: str) -> str | None:
        """The reason the controller cannot answer (it exited, say), or None while it may yet."""

    def prepare(self, vpod: Vpod) -> None:
        """The controller's store, certificates and the orchestrator's administrator in it. What an
        interrupted attempt left is made again, except the site's certificate, issued once."""
        directory, tls = self.directory(vpod.id), self.tls(vpod.id)
        if (directory / "prepared").exists():
            return
        directory.mkdir(parents=True, exist_ok=True)
        for leftover in directory.glob("*.vipu-cli.hcl"):
            leftover.unlink()
        self._fresh_store(vpod.id)
        for leftover in (tls.root / "ca", tls.server_dir, tls.client_dir):
            shutil.rmtree(leftover, ignore_errors=True)
        if not tls.controller_cert.exists():  # the certificate is written last: a key without it is an interrupted issue
            shutil.rmtree(tls.controller_dir, ignore_errors=True)
            issue_link_certificate(self.site, controller_name(vpod.id), tls.controller_dir)
        user_port, admin_port, _ = vpod.ports
        try:
            done = subprocess.run(  # the store's URL in the environment: it may hold a password
                [str(self.server_program), "--init", "--secure", "--tls-dir", str(tls.root), "--tls-hosts", self.tls_hosts(vpod.id),
                 "--default-user-id", ADMIN_USER, "--port", str(user_port), "--admin-port", str(admin_port)],
                env={**os.environ, "VIPU_SERVER_DB": self.db_url(vpod.id)}, cwd=directory, capture_output=True, text=True,
                timeout=120)
        except (OSError, subprocess.SubprocessError) as error:
            raise Unavailable(f"cannot initialise the controller of vPOD {vpod.id}: {error}") from None
        if done.returncode != 0 or not self.admin_config(vpod.id).exists():
            reason = (done.stderr.strip().splitlines() or ["no reason given"])[-1]
            raise Unavailable(f"cannot initialise the controller of vPOD {vpod.id}: {reason}")
        (directory / "prepared").write_text("")

    def start(self, vpod: Vpod) -> None:
        """Start the controller unless it runs; return once it answers its administrator."""
        with self._lock(vpod.id):
            self._stopping.discard(vpod.id)
            if not self.alive(vpod.id):
                try:
                    self._launch(vpod)
                except OSError as error:
                    raise Unavailable(f"cannot start the controller of vPOD {vpod.id}: {error}") from None
        self.wait_ready(vpod.id)

    def admin(self, vpod_id: str, timeout: float = 30.0) -> AdminClient:
        # The tenant's file is the truth: a VIPU_ADMIN_API_PORT in the orchestrator's environment is not about its tenants.
        return AdminClient.connect(self.host(vpod_id), config=self.admin_config(vpod_id), timeout=timeout, environment=False)

    def wait_ready(self, vpod_id: str) -> None:
        deadline_seconds = self.start_deadline_seconds
        deadline = time.monotonic() + deadline_seconds
        while True:
            reason = self._why_not_ready(vpod_id)
            if reason is not None:
                raise Unavailable(f"the controller of vPOD {vpod_id} {reason}")
            try:
                with self.admin(vpod_id, timeout=2.0) as admin:
                    admin.list_agents()
                return
            except VipuError as error:
                if time.monotonic() > deadline:
                    raise Unavailable(f"the controller of vPOD {vpod_id} did not answer within {deadline_seconds:.0f} s: "
                                      f"{error.message}") from None
            time.sleep(0.2)

    def stop(self, vpod_id: str) -> None:
        """Stop the controller; the supervisor leaves it stopped."""
        with self._lock(vpod_id):
            self._stopping.add(vpod_id)
            self._halt(vpod_id)

    def supervise(self, running: Callable[[], list[Vpod]], stop: threading.Event, interval: float = 1.0) -> None:
        """Restart, every `interval` seconds, the controller of each vPOD that should run and does not.
        Nothing ends the supervision but `stop`: a store or runner that fails is tried again."""
        while not stop.wait(interval):
            try:
                vpods = running()
            except VipuError as error:
                log.warning("cannot list the vPODs to supervise: %s", error.message)
                continue
            for vpod in vpods:
                if stop.is_set():
                    return
                try:
                    self._restart_if_stopped(vpod, running)
                except Exception as error:  # noqa: BLE001 - one vPOD must not end the supervision of the others
                    log.warning("vPOD %s: cannot start its controller: %s", vpod.id, getattr(error, "message", error))
            self._reap()

    def _restart_if_stopped(self, vpod: Vpod, running: Callable[[], list[Vpod]]) -> None:
        if self.alive(vpod.id) or not (self.directory(vpod.id) / "prepared").exists():
            return
        with self._lock(vpod.id):  # looked at again: a release may be stopping it
            if vpod.id not in self._stopping and not self.alive(vpod.id) and vpod.id in {v.id for v in running()}:
                log.warning("vPOD %s: its controller is not running; starting it again", vpod.id)
                self._launch(vpod)

    @abc.abstractmethod
    def _reap(self) -> None:
        """Collect what ended of the controllers this orchestrator started, if that is its to do."""

    # Tenants' Poplar VMs (seed 003, steps 4 to 6): OpenStack servers, so only that runner has them

    def create_vm(self, vpod: Vpod, request: VmRequest, config: VmConfig) -> PoplarVm:
        raise InvalidArgument("Poplar VMs are OpenStack servers: serve with --provider openstack to make them")

    def vms(self, vpod_id: str) -> list[PoplarVm]:
        return []

    def delete_vm(self, vpod_id: str, name: str) -> PoplarVm:
        raise NotFound(f"vPOD {vpod_id} has no Poplar VM {name}")


@dataclass(frozen=True)
class VmRequest:
    """A tenant's Poplar VM, as asked for: Nova's flavor and Glance's image, by name or id, and who
    may log in: a Nova key pair of the orchestrator's user, or an OpenSSH public key (the tenant's
    own key pairs are its users', which Nova lets no one else boot with), or both."""

    name: str
    flavor: str
    image: str
    key: str = ""
    public_key: str = ""

    def __post_init__(self):
        if not self.key and not self.public_key:
            raise InvalidArgument("say who may log in to the VM: a Nova key pair (--key) or a public key (--public-key)")
        if self.public_key:
            try:
                load_ssh_public_key(self.public_key.strip().encode())
            except (ValueError, UnsupportedAlgorithm):
                raise InvalidArgument("the public key is not an OpenSSH public key (one line, as in id_ed25519.pub)") from None


@dataclass(frozen=True)
class VmConfig:
    """What a Poplar VM is given so that `vipu` works inside it: the tenant's user's configuration
    file (certificate paths relative to it) and the certificates it names."""

    config: str
    files: dict[str, bytes]  # path relative to the configuration's directory: contents


@dataclass(frozen=True)
class PoplarVm:
    name: str
    server_id: str
    status: str
    address: str
    ssh: str  # how to reach it


class DatabasePerVpod(TenantControllers):
    """For runners whose controllers live elsewhere (Kubernetes, OpenStack): each vPOD's store is a
    PostgreSQL database and role of its own on the site's server, its URL (with its password) kept
    in the vPOD's directory."""

    store_server: str  # a PostgreSQL server URL whose user may create databases and roles
    site_id: str  # this orchestrator's, marking the databases it makes

    def db_url(self, vpod_id: str) -> str:
        try:
            return (self.directory(vpod_id) / STORE_FILE).read_text().strip()
        except OSError as error:
            raise Unavailable(f"the store of vPOD {vpod_id} is not known ({error.strerror}); release it") from None

    def _fresh_store(self, vpod_id: str) -> None:
        url = make_database(self.store_server, controller_name(vpod_id), self.site_id)
        write_file(self.directory(vpod_id) / STORE_FILE, url.encode(), 0o600)

    def _close_store(self, vpod_id: str) -> None:
        """Keep the database as the vPOD's archive, its role no longer able to log in."""
        close_database(self.store_server, controller_name(vpod_id))


class LocalControllers(TenantControllers):
    """Controllers as processes of this host, each with a SQLite store in its vPOD's directory."""

    def __init__(self, root: Path, site: TlsFiles, listen_address: str = "127.0.0.1", advertise_host: str = "127.0.0.1"):
        super().__init__(root, site)
        self.listen_address = listen_address
        self.advertise_host = advertise_host
        self._children: dict[str, subprocess.Popen] = {}  # those this orchestrator started, to reap when they end
        self._launching: set[str] = set()  # vPODs whose controller is being started, its pid file not yet written

    def host(self, vpod_id: str) -> str:
        return self.advertise_host

    def tls_hosts(self, vpod_id: str) -> str:
        return f"localhost,127.0.0.1,{self.advertise_host}"

    def db_url(self, vpod_id: str) -> str:
        return f"sqlite:///{self.directory(vpod_id) / 'vipu.db'}"

    def _fresh_store(self, vpod_id: str) -> None:
        for leftover in self.directory(vpod_id).glob("vipu.db*"):
            leftover.unlink()

    def _pid(self, vpod_id: str) -> int | None:
        """The controller's process id while it runs: a child of ours, or one an earlier
        orchestrator started, known by its pid file; failing that, any process serving the vPOD's
        directory (one whose starter died before writing its pid file), adopted."""
        child = self._children.get(vpod_id)
        if child is not None and child.poll() is None:
            return child.pid
        directory = self.directory(vpod_id)
        try:
            pid: int | None = int((directory / "controller.pid").read_text())
        except (OSError, ValueError):
            pid = None
        if pid is not None and _serves(pid, directory):
            return pid
        orphan = next((int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit() and _serves(int(p.name), directory)), None)
        if orphan is not None and vpod_id in self._launching:
            return orphan  # ours, being started (the supervisor looks without the vPOD's lock): its pid file comes
        if orphan is not None:
            log.warning("vPOD %s: adopting its controller, process %d, which no pid file named", vpod_id, orphan)
            with contextlib.suppress(OSError):  # the pid file only spares the next look a search
                write_file(directory / "controller.pid", str(orphan).encode())
        return orphan

    def alive(self, vpod_id: str) -> bool:
        return self._pid(vpod_id) is not None

    def _why_not_ready(self, vpod_id: str) -> str | None:
        if self.alive(vpod_id):
            return None
        tail = (self.directory(vpod_id) / "server.log").read_text(errors="replace").strip().splitlines()[-1:]
        return f"exited: {tail[0] if tail else 'no log'}"

    def _launch(self, vpod: Vpod) -> None:
        directory = self.directory(vpod.id)
        user_port, admin_port, metrics_port = vpod.ports
        self._launching.add(vpod.id)
        try:
            with open(directory / "server.log", "ab") as out:
                process = subprocess.Popen(  # OSError: the caller's to report
                    [str(self.server_program), "--db", self.db_url(vpod.id), "--data-dir", str(directory), "--secure",
                     "--tls-dir", str(self.tls(vpod.id).root), "--listen-address", self.listen_address, "--port", str(user_port),
                     "--admin-listen-address", self.listen_address, "--admin-port", str(admin_port), "--metrics-port",
                     str(metrics_port)],
                    stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=directory, start_new_session=True)
            self._children[vpod.id] = process
            crash_point("controller:launched")
            write_file(directory / "controller.pid", str(process.pid).encode())
        finally:
            self._launching.discard(vpod.id)
        log.info("vPOD %s: controller started (process %d, user port %d, admin port %d)", vpod.id, process.pid, user_port, admin_port)

    def _halt(self, vpod_id: str) -> None:
        """SIGTERM, then SIGKILL after a deadline."""
        pid = self._pid(vpod_id)
        if pid is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + STOP_DEADLINE_SECONDS
        while self.alive(vpod_id) and time.monotonic() < deadline:
            time.sleep(0.1)
        if self.alive(vpod_id):
            log.warning("vPOD %s: controller did not stop within %.0f s of SIGTERM; killed", vpod_id, STOP_DEADLINE_SECONDS)
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        child = self._children.pop(vpod_id, None)
        if child is not None:
            child.wait(timeout=STOP_DEADLINE_SECONDS)

    def _reap(self) -> None:
        for child in list(self._children.values()):
            child.poll()  # reaps one that ended


def _serves(pid: int, directory: Path) -> bool:
    """Whether the process is alive and a controller of that data directory (its command line
    names it): not a number that went to another process since."""
    try:
        arguments = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return False
    data_dir = str(directory).encode()
    return any(a == b"--data-dir" and b == data_dir for a, b in itertools.pairwise(arguments)) and not _zombie(pid)


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True

