"""Creating and releasing vPODs as recorded sequences of steps, resumed after a crash.

A vPOD's row says which step it has done; each step is safe to do again, and the next is
recorded only once it is done (a compare-and-set on the step and the state). So an orchestrator
killed at any moment and started again (`resume`) finishes every creation and release under
way, and the invariants hold throughout: a machine belongs to at most one vPOD (the store's
row), an Active vPOD has its controller running (the supervisor), and a controller runs only for
a vPOD that is not released. One orchestrator works on a store at a time. `vipu.vpod.crash`
names the points, after each step, at which the crash tests kill it.

Creation: reserved (the machines, with the vPOD's row, in one transaction) -> prepared (the
controller's directory, store, certificates) -> started -> handed (each machine's agent
registered in the tenant's controller, with the site's grant) -> configured (cluster,
allocation, the tenant's first user) -> active.
Release: emptied (every partition and cluster removed in the tenant's controller) -> tested (with
`test_on_release`: the cluster test on the vPOD's machines, in its controller; the machines a
failing test names are held back from the pool) -> taken back (each machine held by the
orchestrator again, cleared) -> stopped -> archived (the controller's directory kept under
archive/) -> released (the machines free, in one transaction).
A creation that fails, whatever the reason, gives its machines back: the vPOD is marked Failed
with the reason, then undone by the release's steps (nothing to empty or test: no tenant had it),
ending Released with that reason kept. An undoing cut short is finished by `resume`.
"""

from __future__ import annotations

import contextlib
import logging
import re
import shutil
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from vipu.api.protos import admin_pb2
from vipu.backends.sim.rack import Rack
from vipu.client.admin import AdminClient
from vipu.client.settings import ClientSettings, client_config_text, parse_hcl, write_client_config
from vipu.model.entities import IldTopology, check_id
from vipu.model.errors import AlreadyExists, ConcurrentUpdate, Conflict, InvalidArgument, Unavailable, VipuError
from vipu.vpod.agents import SiteAgents
from vipu.vpod.crash import crash_point
from vipu.vpod.site import pick_machines
from vipu.vpod.store import SiteMachine, Vpod, VpodStore
from vipu.vpod.tenants import ADMIN_USER, PoplarVm, TenantControllers, VmConfig, VmRequest, controller_name

log = logging.getLogger(__name__)

CREATE_STEPS = ("reserved", "prepared", "started", "handed", "configured", "active")
RELEASE_STEPS = ("emptied", "tested", "taken-back", "stopped", "archived")
CLUSTER_ID, ALLOCATION_ID = "cl0", "alloc-1"
RELEASE_TEST_CLUSTER = "release-test"
BUSY_DEADLINE_SECONDS = 300.0  # for another operation on the same vPOD to end
RELEASE_TEST_DEADLINE_SECONDS = 600.0  # a whole cluster test, each of its steps bounded by the controller
TOPOLOGIES = {"mesh": admin_pb2.ILD_TOPOLOGY_MESH, "torus": admin_pb2.ILD_TOPOLOGY_TORUS}


@dataclass(frozen=True)
class Credentials:
    """What the tenant's first user needs to reach their controller."""

    user_id: str
    access_key: str
    host: str
    port: int
    admin_port: int
    server_ca: bytes
    client_cert: bytes
    client_key: bytes


class Orchestrator:
    def __init__(self, store: VpodStore, rack: Rack, tenants: TenantControllers, agents: SiteAgents,
                 port_base: int = 9100, test_on_release: bool = False):
        """`test_on_release`: a machine goes back to the pool only once the cluster test passed on it."""
        self.test_on_release = test_on_release
        self.store = store
        self.rack = rack
        self.tenants = tenants
        self.agents = agents
        self.port_base = port_base
        self._locks: dict[str, threading.Lock] = {}
        self._locks_lock = threading.Lock()

    @contextlib.contextmanager
    def _alone(self, vpod_id: str):
        """One operation at a time on a vPOD, in this orchestrator."""
        with self._locks_lock:
            lock = self._locks.setdefault(vpod_id, threading.Lock())
        if not lock.acquire(timeout=BUSY_DEADLINE_SECONDS):
            raise Conflict(f"vPOD {vpod_id} is busy with another operation; try again")
        try:
            yield
        finally:
            lock.release()

    # Creating

    def create(self, tenant: str, count: int, topology: str = "mesh", ilds: int = 1, user_id: str = "") -> tuple[Vpod, Credentials]:
        check_id("tenant", tenant)
        user_id = user_id or tenant
        check_id("user", user_id)
        if user_id == ADMIN_USER:
            raise InvalidArgument(f"user {ADMIN_USER} is the orchestrator's own in every tenant's controller; name another")
        if topology not in TOPOLOGIES:
            raise InvalidArgument(f"unknown topology {topology!r}: mesh or torus")
        for attempt in range(3):  # a create at the same moment may take the id, the machines or the ports; pick again
            vpod_id = f"{tenant}-{len(self.store.list(tenant, with_released=True)) + 1}"
            check_id("vPOD", controller_name(vpod_id))
            with self._alone(vpod_id):  # before the row exists: a release cannot slip in between
                machines = pick_machines(self.rack, self.store.machines(), count, IldTopology(topology), ilds)
                vpod = Vpod(vpod_id, tenant, "Creating", "reserved", machines, topology, ilds, user_id, self._free_ports())
                try:
                    self.store.add_vpod(vpod)
                except (ConcurrentUpdate, AlreadyExists):
                    if attempt == 2:
                        raise
                    continue
                log.info("vPOD %s of tenant %s: machines %s reserved", vpod.id, tenant, ", ".join(machines))
                crash_point("create:reserved")
                self._continue_create(vpod)
                return self.store.get(vpod.id), self.credentials(vpod.id)
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _continue_create(self, vpod: Vpod) -> None:
        steps = {"prepared": self._prepare, "started": self._start, "handed": self._hand_machines,
                 "configured": self._configure, "active": lambda v: None}
        try:
            for step in CREATE_STEPS[CREATE_STEPS.index(vpod.step) + 1:]:
                current = self.store.get(vpod.id)  # another orchestrator on the same store may have moved it
                if (current.state, current.step) != ("Creating", vpod.step):
                    raise ConcurrentUpdate(f"vPOD {vpod.id} is {current.state} at step {current.step} now; its creation stops")
                steps[step](vpod)
                self.store.advance(vpod.id, vpod.step, step, expected_state="Creating", state="Active" if step == "active" else None)
                vpod.step = step
                log.info("vPOD %s: %s", vpod.id, step)
                crash_point(f"create:{step}")
        except Exception as error:  # noqa: BLE001 - whatever stops a creation, its machines go back
            failure = as_failure(error)
            self._give_back(vpod, failure)
            raise failure from None

    def _give_back(self, vpod: Vpod, failure: VipuError) -> None:
        """Mark a creation that failed Failed, with the reason, and undo it: its machines taken
        back and cleared, its controller stopped and archived, the vPOD Released. Unless a release
        (or another orchestrator) has the vPOD by now: then that one ends it."""
        log.warning("vPOD %s failed after step %s: %s", vpod.id, vpod.step, failure.message)
        try:
            self.store.advance(vpod.id, vpod.step, vpod.step, expected_state="Creating", state="Failed", error=failure.message)
        except VipuError as error:
            log.warning("vPOD %s: not marked Failed (%s); whoever has it now ends it", vpod.id, error.message)
            return
        vpod.state, vpod.error = "Failed", failure.message
        try:
            self._continue_release(vpod)
        except VipuError as error:
            log.warning("vPOD %s: its machines are not all given back yet (%s); the next start of vipu-vpod, or "
                        "vipu-vpod release %s, finishes it", vpod.id, error.message, vpod.id)

    def _free_ports(self) -> list[int]:
        """Three consecutive ports from the base that no vPOD has and nothing listens on."""
        taken = {port for vpod in self.store.list() for port in vpod.ports}
        base = self.port_base
        while base + 2 < 65536:
            ports = [base, base + 1, base + 2]
            if not taken.intersection(ports) and all(_bindable(p) for p in ports):
                return ports
            base += 3
        raise Conflict(f"no three free ports from {self.port_base} for another controller")

    def _prepare(self, vpod: Vpod) -> None:
        self.tenants.prepare(vpod)

    def _start(self, vpod: Vpod) -> None:
        self.tenants.start(vpod)

    def _machines(self, vpod: Vpod) -> list[SiteMachine]:
        known = {m.name: m for m in self.store.machines()}
        return [known[name] for name in vpod.machines]

    def _hand_machines(self, vpod: Vpod) -> None:
        with self.tenants.admin(vpod.id) as admin:
            registered = {a.id for a in admin.list_agents()}
            for machine in self._machines(vpod):
                if machine.name in registered:
                    continue
                grant = self.agents.grant(machine, controller_name(vpod.id))
                admin.create_agent(machine.name, machine.host, machine.port, takeover_grant=grant)
                crash_point("create:handing")

    def _configure(self, vpod: Vpod) -> None:
        with self.tenants.admin(vpod.id) as admin:
            with contextlib.suppress(AlreadyExists):
                admin.create_cluster(CLUSTER_ID, tuple(vpod.machines), topology=TOPOLOGIES[vpod.topology], num_ipulinkdomains=vpod.ilds)
            with contextlib.suppress(AlreadyExists):
                admin.create_allocation(ALLOCATION_ID, CLUSTER_ID, agent_ids=tuple(vpod.machines))
            try:
                key = admin.create_user(vpod.user_id, (ALLOCATION_ID,)).access_key
            except AlreadyExists:  # made by an attempt that died before recording it: a new key
                if admin.get_user(vpod.user_id).admin:
                    raise InvalidArgument(f"user {vpod.user_id} is an administrator of the vPOD's controller, not its tenant") from None
                key = admin.update_user(vpod.user_id, rotate_key=True).access_key
        self._write_user_config(vpod, key)

    def _user_config(self, vpod_id: str, user_id: str) -> Path:
        return self.tenants.directory(vpod_id) / f"{user_id}.vipu-cli.hcl"

    def _write_user_config(self, vpod: Vpod, key: str) -> None:
        tls = self.tenants.tls(vpod.id)
        user_port, admin_port, _ = vpod.ports
        settings = ClientSettings(self.tenants.host(vpod.id), user_port, vpod.user_id, key, tls.ca_for(tls.client_dir), tls.client_cert,
                                  tls.client_key)
        write_client_config(self._user_config(vpod.id, vpod.user_id), settings, admin_port=admin_port)

    def credentials(self, vpod_id: str) -> Credentials:
        vpod = self.store.get(vpod_id)
        if vpod.state != "Active":
            raise Conflict(f"vPOD {vpod_id} is {vpod.state}, not Active")
        path = self._user_config(vpod_id, vpod.user_id)
        try:
            settings = parse_hcl(path.read_text(), str(path))
        except OSError as error:
            raise Unavailable(f"the credentials of vPOD {vpod_id} are missing ({error.strerror}); release it and create another") from None
        tls = self.tenants.tls(vpod_id)
        return Credentials(vpod.user_id, str(settings["api-access-key"]), self.tenants.host(vpod_id), vpod.ports[0], vpod.ports[1],
                           tls.ca_for(tls.client_dir).read_bytes(), tls.client_cert.read_bytes(), tls.client_key.read_bytes())

    # Tenants' Poplar VMs

    def create_vm(self, vpod_id: str, request: VmRequest) -> PoplarVm:
        """A Poplar VM on the vPOD's network, given the tenant's first user's configuration."""
        check_id("VM", request.name)
        with self._alone(vpod_id):
            credentials = self.credentials(vpod_id)
            files = {"certs/ca.pem": credentials.server_ca, "certs/client.pem": credentials.client_cert,
                     "certs/client-key.pem": credentials.client_key}
            config = client_config_text(ClientSettings(credentials.host, credentials.port, credentials.user_id, credentials.access_key,
                                                       Path("certs/ca.pem"), Path("certs/client.pem"), Path("certs/client-key.pem")),
                                        admin_port=credentials.admin_port)
            return self.tenants.create_vm(self.store.get(vpod_id), request, VmConfig(config, files))

    def vms(self, vpod_id: str) -> list[PoplarVm]:
        self.store.get(vpod_id)  # NotFound for no such vPOD
        return self.tenants.vms(vpod_id)

    def delete_vm(self, vpod_id: str, name: str) -> PoplarVm:
        with self._alone(vpod_id):
            return self.tenants.delete_vm(self.store.get(vpod_id).id, name)

    # Releasing

    def release(self, vpod_id: str) -> Vpod:
        with self._alone(vpod_id):
            vpod = self.store.start_release(vpod_id, test=self.test_on_release)
            log.info("vPOD %s: releasing, from step %s", vpod_id, vpod.step)
            crash_point("release:begun")
            self._continue_release(vpod)
        return self.store.get(vpod_id)

    def _continue_release(self, vpod: Vpod) -> None:
        """The release's steps from the one after the last recorded, for a vPOD Releasing, or Failed
        (a failed creation undone: its error, the creation's reason, is kept)."""
        steps = {"emptied": self._empty, "tested": self._test, "taken-back": self._take_back, "stopped": self._stop,
                 "archived": self._archive}
        releasing = vpod.state == "Releasing"
        if not releasing:  # a failed creation: no tenant had the vPOD, so nothing of theirs to empty or test
            steps.update(emptied=_nothing, tested=_nothing)
        first = RELEASE_STEPS.index(vpod.step) + 1 if vpod.step in RELEASE_STEPS else 0
        for step in RELEASE_STEPS[first:]:
            try:
                steps[step](vpod)
            except Exception as error:  # noqa: BLE001 - it stays where it is, saying why; a later release or restart tries again
                failure = as_failure(error)
                if releasing:
                    try:
                        self.store.advance(vpod.id, vpod.step, vpod.step, expected_state="Releasing", error=failure.message)
                    except VipuError as unrecorded:
                        log.warning("vPOD %s: the reason its release stopped is not recorded: %s", vpod.id, unrecorded.message)
                raise failure from None
            self.store.advance(vpod.id, vpod.step, step, expected_state=vpod.state, error="" if releasing else None)
            vpod.step = step
            log.info("vPOD %s: %s", vpod.id, step)
            crash_point(f"release:{step}")
        self.store.finish_release(vpod.id, vpod.step)
        log.info("vPOD %s released; machines %s are free", vpod.id, ", ".join(vpod.machines))
        crash_point("release:released")

    def _empty(self, vpod: Vpod) -> None:
        """Remove the tenant's partitions through their controller, so its store says what the
        machines will hold; a controller that never started, or does not answer, is passed over
        (the machines are cleared when taken back)."""
        if not (self.tenants.directory(vpod.id) / "prepared").exists():
            return
        try:
            self.tenants.start(vpod)
            with self.tenants.admin(vpod.id) as admin:
                for cluster in admin.list_clusters():
                    admin.remove_cluster(cluster.id, force=True)
        except VipuError as error:
            log.warning("vPOD %s: its controller could not remove its partitions (%s); the machines are cleared instead",
                        vpod.id, error.message)

    def _test(self, vpod: Vpod) -> None:
        """The cluster test's default suite on the vPOD's machines, through its controller (which
        holds them), before they go back. Each machine a failing test names is held back with the
        failing lines; every machine is, when the test names none or cannot run. A vPOD whose
        controller never started gave no tenant its machines: nothing to test."""
        if not vpod.release_test or not (self.tenants.directory(vpod.id) / "prepared").exists():
            return
        try:
            self.tenants.start(vpod)
            self._hand_machines(vpod)  # those a creation cut short never reached the tenant's controller
            with self.tenants.admin(vpod.id) as admin:
                with contextlib.suppress(AlreadyExists):
                    admin.create_cluster(RELEASE_TEST_CLUSTER, tuple(vpod.machines), topology=TOPOLOGIES[vpod.topology],
                                         num_ipulinkdomains=vpod.ilds)
                report = _run_cluster_test(admin, RELEASE_TEST_CLUSTER)
                with contextlib.suppress(VipuError):  # the verdict stands; the next attempt or the take-back clears it
                    admin.remove_cluster(RELEASE_TEST_CLUSTER, force=True)
        except VipuError as error:
            reasons = dict.fromkeys(vpod.machines, f"the release test of vPOD {vpod.id} could not run: {error.message}")
        else:
            reasons = failing_machines(report.results, vpod.machines)
        self.store.hold_back(vpod.id, reasons)
        if reasons:
            log.warning("vPOD %s: machines %s held back: the release test failed", vpod.id, ", ".join(sorted(reasons)))

    def _take_back(self, vpod: Vpod) -> None:
        for machine in self._machines(vpod):
            self.agents.take_back(machine)
            crash_point("release:taking-back")

    def _stop(self, vpod: Vpod) -> None:
        self.tenants.stop(vpod.id)

    def _archive(self, vpod: Vpod) -> None:
        directory, archive = self.tenants.directory(vpod.id), self.tenants.archive(vpod.id)
        if directory.exists():
            archive.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(directory), str(archive))

    # After a crash

    def resume(self) -> None:
        """Finish every creation and release an earlier orchestrator left under way; start the
        controllers of the vPODs that should run."""
        for vpod in self.store.list():
            try:
                with self._alone(vpod.id):
                    if vpod.state == "Creating":
                        log.info("vPOD %s: resuming its creation after step %s", vpod.id, vpod.step)
                        self._continue_create(vpod)
                    elif vpod.state == "Releasing":
                        log.info("vPOD %s: resuming its release after step %s", vpod.id, vpod.step)
                        self._continue_release(vpod)
                    elif vpod.state == "Failed":
                        log.info("vPOD %s: giving back the machines of its failed creation, after step %s", vpod.id, vpod.step)
                        self._continue_release(vpod)
                    elif vpod.state == "Active":
                        self.tenants.start(vpod)
            except VipuError as error:
                log.warning("vPOD %s: %s", vpod.id, error.message)
            except Exception:  # one vPOD must not keep the orchestrator from serving the others
                log.exception("vPOD %s: resuming failed", vpod.id)

    def running(self) -> list[Vpod]:
        """The vPODs whose controllers should run."""
        return [v for v in self.store.list() if v.state == "Active" or (v.state == "Creating" and v.step != "reserved")]


def _run_cluster_test(admin: AdminClient, cluster_id: str) -> admin_pb2.ClusterTestReport:
    """Run the default suite and follow it to its end, stopping it past the deadline. A run of
    this cluster under way (started before the orchestrator died) is followed, not started again."""
    try:
        under_way = admin.cluster_test_progress()
    except Conflict:  # no test has run in this controller
        under_way = None
    if under_way is None or (under_way.cluster_id, under_way.state) != (cluster_id, "running"):
        admin.test_cluster(cluster_id, wait=False)
        crash_point("release:testing")
    deadline = time.monotonic() + RELEASE_TEST_DEADLINE_SECONDS
    while True:
        report = admin.cluster_test_progress()
        if report.cluster_id == cluster_id and report.state != "running":
            if report.state != "finished":  # stopped or interrupted: not every machine was tested
                raise Unavailable(f"the cluster test was {report.state} before it ended")
            return report
        if time.monotonic() > deadline:
            with contextlib.suppress(VipuError):
                admin.stop_cluster_test()
            raise Unavailable(f"the cluster test did not end within {RELEASE_TEST_DEADLINE_SECONDS:.0f} s")
        time.sleep(0.2)


def _nothing(vpod: Vpod) -> None:
    """A step with nothing to do for this vPOD, recorded all the same."""


def as_failure(error: Exception) -> VipuError:
    """What a caller is told of an error, in one line: a VipuError as it is; anything else (a
    fault of vipu-vpod's own) as `internal_error`, logged whole."""
    if isinstance(error, VipuError):
        return error
    log.error("internal error", exc_info=error)
    return internal_error(error)


def internal_error(error: Exception) -> VipuError:
    """A fault of vipu-vpod's own, in one line naming its kind, not its text, which may say more
    than a tenant should hear (the log has it)."""
    return VipuError(f"internal error of vipu-vpod ({type(error).__name__}); its log says more")


def _names(line: str, machine: str) -> bool:
    """Whether a cluster test's line names the machine (its agent id), not merely a longer name."""
    return re.search(rf"(?<![\w.-]){re.escape(machine)}(?![\w.-])", line) is not None


def failing_machines(results, machines: list[str]) -> dict[str, str]:
    """From a cluster test's results, each machine a failing test names, with that test's lines
    naming it (every machine, with all the lines, when a failing test names none)."""
    reasons: dict[str, list[str]] = {}
    for result in results:
        if result.status != "failed":
            continue
        lines = [line for line in result.summary[1:] if line] or list(result.summary)
        named = {m: found for m in machines if (found := [line for line in lines if _names(line, m)])}
        for machine in named or machines:
            reasons.setdefault(machine, []).append(f"{result.test} {result.passed}/{result.total}: "
                                                   f"{'; '.join(named.get(machine, lines))}")
    return {machine: "; ".join(parts) for machine, parts in reasons.items()}


def _bindable(port: int) -> bool:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(("", port))
            return True
        except OSError:
            return False

