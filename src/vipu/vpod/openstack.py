"""Tenants' controllers as OpenStack servers (seed 003: the orchestration spawns a VM, via
OpenStack, running the tenant's V-IPU controller).

For each vPOD, through openstacksdk and the site's `clouds.yaml` entry (its user scoped to the
Keystone project named as the vPOD's tenant, so that the tenant sees and is charged for them; or
all in the entry's own project), in this order and each found again by its name if an earlier
attempt made it (`vpod-<id>`):

1. a Neutron network and a subnet from the site's subnet pool (so no two vPODs' addresses meet),
2. a security group admitting the controller's ports from that subnet (and the orchestrator's
   CIDR, where the site names one), and nothing else,
3. a port on the network with that group: its fixed address is the controller's, in its
   certificate, before anything is started,
4. the controller as a Nova server from the site's controller image and flavor, on that port, its
   user data a script that cloud-init runs at first boot: it fetches the controller's secrets (its
   certificates' keys, the store's URL) once from vipu-vpod with a one-time token
   (`vipu.vpod.handover`), for Nova keeps user data where others read it, and starts `vipu-server`.

Tenants' Poplar VMs go in a security group of the vPOD's (SSH from the addresses the site names,
and each other), at most `vm_limit` to a vPOD.

The store is a PostgreSQL database of the vPOD's own, as on Kubernetes. Stopping deletes the
server and waits for it to go, then the port, the security group and the network (the subnet goes
with it). Every OpenStack refusal (a quota, no valid host, a missing image or flavor, a server in
ERROR) becomes Unavailable with OpenStack's reason in one line; the orchestrator then undoes the
vPOD, which deletes whatever was made.
"""

from __future__ import annotations

import base64
import ipaddress
import logging
import shlex
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import openstack
from keystoneauth1 import exceptions as keystone_errors
from openstack import exceptions as sdk_errors

from vipu.api.atomic import write_file
from vipu.api.tls import TlsFiles
from vipu.model.errors import AlreadyExists, Conflict, InvalidArgument, NotFound, Unavailable, VipuError
from vipu.store.databases import server_url
from vipu.vpod.crash import crash_point
from vipu.vpod.handover import PATH_PREFIX, issue_token
from vipu.vpod.store import Vpod
from vipu.vpod.tenants import SERVER_PROGRAM, STOP_DEADLINE_SECONDS, DatabasePerVpod, PoplarVm, VmConfig, VmRequest, controller_name

log = logging.getLogger(__name__)
T = TypeVar("T")
ADDRESS_FILE = "address"
PROJECT_FILE = "project"  # the Keystone project the vPOD's resources are in (empty: the clouds.yaml entry's)
HANDOVER_FILE = "handover"  # the controller's one-time token, hashed, until its VM uses it
STORE_URL_FILE = "store-url"  # in the controller's state directory, as handed over
AUTHORITY_FILE = "site-ca.pem"  # ditto: the site's authority, which issued the handover end-point's certificate
STATE_DIR = "/var/lib/vipu"  # in the controller's VM
CONTROLLER_UNIT = "/etc/systemd/system/vipu-controller.service"  # scripts/vm-images' controller image has it
SERVER_DEADLINE_SECONDS = 300.0  # a server to become ACTIVE, or to go
# Nova's states of a server that runs or soon will
RUNNING = ("ACTIVE", "BUILD", "REBOOT", "HARD_REBOOT", "REBUILD", "RESIZE", "VERIFY_RESIZE", "REVERT_RESIZE", "MIGRATING", "PASSWORD")
# openstacksdk's own, and keystoneauth's, which it passes on unwrapped (Keystone or a service unreachable)
OPENSTACK_ERRORS = (sdk_errors.SDKException, keystone_errors.ClientException)


def connect(cloud: str) -> openstack.connection.Connection:
    """The site's cloud, by its clouds.yaml entry (openstacksdk finds the file as the openstack CLI does)."""
    try:
        return openstack.connect(cloud=cloud)
    except sdk_errors.ConfigException as error:
        raise Unavailable(f"cannot use OpenStack cloud {cloud}: {error}") from None


def _reason(error: Exception) -> str:
    """OpenStack's own words for a refusal, on one line."""
    details = getattr(error, "details", None) or getattr(error, "message", None) or str(error)
    return " ".join(str(details).split())


class OpenStackControllers(DatabasePerVpod):
    start_deadline_seconds = 300.0  # a server's boot takes a while

    def __init__(self, root: Path, site: TlsFiles, site_id: str, cloud: str, image: str, flavor: str, subnet_pool: str,
                 store_server: str, handover_url: str, admit_cidr: str = "", poplar_zone: str = "", ssh_user: str = "debian",
                 router: str = "", ssh_cidrs: tuple[str, ...] = ("0.0.0.0/0",), tenant_projects: bool = True, vm_limit: int = 8,
                 connection: openstack.connection.Connection | None = None):
        """`cloud`: the clouds.yaml entry vipu-vpod acts as; `image`, `flavor`: the controller's
        server's, by name or id; `subnet_pool`: the Neutron subnet pool each vPOD's subnet comes
        from; `store_server`: a PostgreSQL server URL whose user may create databases and roles;
        `handover_url`: where the controllers' VMs fetch their secrets (https://HOST:PORT, a
        `vipu.vpod.handover.HandoverServer` of this orchestrator's);
        `admit_cidr`: another network allowed to reach the controllers (the orchestrator's);
        `poplar_zone`: the availability zone of the site's Poplar hosts, where Poplar VMs go;
        `ssh_user`: the user a Poplar VM's image lets in with the key pair's key; `router`: the
        site's Neutron router each vPOD's subnet is attached to, through which the orchestrator, the
        store, the agents and the tenant's users reach the vPOD's network (none: the site routes it);
        `ssh_cidrs`: the networks (or addresses) tenants' users reach their Poplar VMs by SSH from;
        `tenant_projects`: each vPOD's resources in the Keystone project named as its tenant (in
        the clouds.yaml entry's project domain), else all in the entry's project. The router is
        always the entry's. `vm_limit`: the most Poplar VMs a vPOD may have at once."""
        super().__init__(root, site)
        self.site_id = site_id
        self.image, self.flavor, self.subnet_pool = image, flavor, subnet_pool
        self.admit_cidr = _network("--openstack-admit-cidr", admit_cidr, strict=False) if admit_cidr else ""  # as Neutron keeps it
        self.poplar_zone, self.ssh_user, self.router = poplar_zone, ssh_user, router
        self.ssh_cidrs = tuple(_network("--openstack-ssh-cidr", cidr) for cidr in ssh_cidrs)
        self.handover_url, self.vm_limit = handover_url.rstrip("/"), vm_limit
        self.store_server = server_url(store_server)
        self.tenant_projects = tenant_projects
        self.cloud = connection or connect(cloud)
        self._connections_lock = threading.Lock()
        self._connections: dict[str, openstack.connection.Connection] = {}  # by project

    def _call(self, what: str, call: Callable[..., T], *args, **kwargs) -> T:
        """One OpenStack call; Unavailable, with OpenStack's reason, when it refuses or does not answer."""
        try:
            return call(*args, **kwargs)
        except OPENSTACK_ERRORS as error:
            raise Unavailable(f"cannot {what}: {_reason(error)}") from None

    def _service(self, kind: str, vpod_id: str | None = None):
        """The compute, network or image service (found in Keystone's catalog on first use), as the
        vPOD's project sees it; without a vPOD, as the clouds.yaml entry's project does."""
        return self._call(f"reach OpenStack's {kind} service", getattr, self._connection(vpod_id), kind)

    def _connection(self, vpod_id: str | None) -> openstack.connection.Connection:
        """The clouds.yaml entry's connection, scoped to the Keystone project the vPOD's resources are
        in (its tenant's, recorded when it was prepared; none recorded: the entry's own)."""
        try:
            project = (self.directory(vpod_id) / PROJECT_FILE).read_text().strip() if vpod_id else ""
        except FileNotFoundError:
            project = ""
        if not project:
            return self.cloud
        with self._connections_lock:
            known = self._connections.get(project)
        if known is not None:
            return known
        scoped = self._call(f"act in Keystone project {project}", self.cloud.connect_as_project, project)
        self._call(f"act in Keystone project {project} (vipu-vpod's OpenStack user needs a role there)", scoped.authorize)
        with self._connections_lock:
            return self._connections.setdefault(project, scoped)

    # Where things are

    def host(self, vpod_id: str) -> str:
        try:
            return (self.directory(vpod_id) / ADDRESS_FILE).read_text().strip()
        except OSError:
            raise Unavailable(f"the controller of vPOD {vpod_id} has no address yet; release it") from None

    def tls_hosts(self, vpod_id: str) -> str:
        return f"localhost,127.0.0.1,{self.host(vpod_id)}"

    # The vPOD's network, made before its certificate names the controller's address

    def prepare(self, vpod: Vpod) -> None:
        if not (self.directory(vpod.id) / "prepared").exists():
            self.directory(vpod.id).mkdir(parents=True, exist_ok=True)
            project = self.directory(vpod.id) / PROJECT_FILE
            write_file(project, (vpod.tenant if self.tenant_projects else "").encode())
            try:
                self._connection(vpod.id)
            except Unavailable:
                project.unlink()  # nothing is made there: the undo looks in the entry's project, and finds nothing
                raise
            self._network(vpod)
        super().prepare(vpod)

    def _network(self, vpod: Vpod) -> None:
        name, net = controller_name(vpod.id), self._service("network", vpod.id)
        network = self._call(f"look for network {name}", net.find_network, name) or \
            self._call(f"make network {name}", net.create_network, name=name)
        subnet = self._subnet(net, network)
        if subnet is None:
            pool = self._call(f"find subnet pool {self.subnet_pool}", net.find_subnet_pool, self.subnet_pool)
            if pool is None:
                raise Unavailable(f"cannot make subnet {name}: Neutron has no subnet pool {self.subnet_pool}")
            subnet = self._call(f"make subnet {name}", net.create_subnet, name=name, network_id=network.id, ip_version=4,
                                subnet_pool_id=pool.id)
        if self.router:
            self._attach(network.id, subnet.id)
        span = (min(vpod.ports), max(vpod.ports))
        group = self._security_group(vpod.id, name, "vipu vPOD controller: its user, administration and metrics ports",
                                     {(source, *span) for source in (subnet.cidr, self.admit_cidr) if source})
        port = self._call(f"look for port {name}", net.find_port, name) or \
            self._call(f"make port {name}", net.create_port, name=name, network_id=network.id, security_group_ids=[group.id])
        crash_point("openstack:network-made")
        write_file(self.directory(vpod.id) / ADDRESS_FILE, port.fixed_ips[0]["ip_address"].encode())

    def _subnet(self, net, network):
        """The vPOD network's subnet (it has one), or None where an attempt was cut short before it."""
        return self._call(f"look for the subnet of {network.name}", lambda: next(iter(net.subnets(network_id=network.id)), None))

    def _site_router(self):
        router = self._call(f"find router {self.router}", self._service("network").find_router, self.router)
        if router is None:
            raise Unavailable(f"Neutron has no router {self.router}")
        return router

    def _router_ports(self, router_id: str, network_id: str) -> list:
        return self._call("list the router's ports", lambda: list(self._service("network").ports(device_id=router_id,
                                                                                                 network_id=network_id)))

    def _attach(self, network_id: str, subnet_id: str) -> None:
        """The subnet on the site's router, unless an earlier attempt put it there."""
        router = self._site_router()
        if not self._router_ports(router.id, network_id):
            self._call(f"attach the subnet to router {self.router}", self._service("network").add_interface_to_router, router,
                       subnet_id=subnet_id)

    def _detach(self, network_id: str) -> None:
        router = self._site_router()
        for port in self._router_ports(router.id, network_id):
            self._call(f"detach a subnet from router {self.router}", self._service("network").remove_interface_from_router, router,
                       port_id=port.id)

    def _security_group(self, vpod_id: str, name: str, description: str, admitted: set[tuple[str, int | None, int | None]]):
        """The group of that name, made or found, with exactly these ingress rules (an attempt cut
        short left it with fewer): TCP from each (CIDR, first port, last port), None: every port.
        The egress rules Neutron adds stay."""
        net = self._service("network", vpod_id)
        group = self._call(f"look for security group {name}", net.find_security_group, name) or \
            self._call(f"make security group {name}", net.create_security_group, name=name, description=description)
        wanted = set(admitted)
        for rule in list(group.security_group_rules or []):
            if rule["direction"] != "ingress":
                continue
            found = (rule["remote_ip_prefix"], rule["port_range_min"], rule["port_range_max"])
            if rule["protocol"] == "tcp" and found in wanted:
                wanted.discard(found)
            else:
                self._call(f"remove a rule of security group {name}", net.delete_security_group_rule, rule["id"])
        for source, first, last in sorted(wanted, key=str):
            ethertype = f"IPv{ipaddress.ip_network(source).version}"
            self._call(f"admit {source} in security group {name}", net.create_security_group_rule, security_group_id=group.id,
                       direction="ingress", ethertype=ethertype, protocol="tcp", port_range_min=first, port_range_max=last,
                       remote_ip_prefix=source)
        return group

    def _image_and_flavor(self, vpod_id: str, image: str, flavor: str, refusal: type[VipuError],
                          context: str = "") -> tuple[Any, Any]:
        """The Glance image and Nova flavor of those names (or ids); `refusal` naming the one missing."""
        found_image = self._call(f"find image {image}", self._service("image", vpod_id).find_image, image)
        if found_image is None:
            raise refusal(f"{context}Glance has no image {image}")
        found_flavor = self._call(f"find flavor {flavor}", self._service("compute", vpod_id).find_flavor, flavor)
        if found_flavor is None:
            raise refusal(f"{context}Nova has no flavor {flavor}")
        return found_image, found_flavor

    def _fault(self, vpod_id: str, server_id: str, otherwise: str) -> str:
        """Why Nova failed the server, in its words; `otherwise` when it gives none or cannot be asked."""
        try:
            server = self._call("read a server", self._service("compute", vpod_id).get_server, server_id)
            return (server.fault or {}).get("message", otherwise)
        except Unavailable:
            return otherwise

    # Life

    def _server(self, vpod_id: str):
        return self._call("look for a server", self._service("compute", vpod_id).find_server, controller_name(vpod_id))

    def alive(self, vpod_id: str) -> bool:
        """Whether its server runs or is on its way to (a stopped, paused, shelved or failed one is
        made again: its store is PostgreSQL's, its configuration its user data); an OpenStack that
        does not answer counts as alive, so that nothing is made again blindly."""
        try:
            server = self._server(vpod_id)
        except Unavailable as error:
            log.warning("vPOD %s: %s", vpod_id, error.message)
            return True
        return server is not None and server.status in RUNNING

    def _why_not_ready(self, vpod_id: str) -> str | None:
        server = self._server(vpod_id)
        if server is None:
            return "has no server"
        if server.status == "ERROR":
            return f"failed in Nova: {self._fault(vpod_id, server.id, 'no reason given')}"
        return None

    def _launch(self, vpod: Vpod) -> None:
        name = controller_name(vpod.id)
        server = self._server(vpod.id)
        if server is not None:  # a failed or stopped server goes first: its port is wanted
            self._delete_server(vpod.id, server)
        image, flavor = self._image_and_flavor(vpod.id, self.image, self.flavor, Unavailable,
                                               f"cannot start the controller of vPOD {vpod.id}: ")
        port = self._call(f"find port {name}", self._service("network", vpod.id).find_port, name)
        if port is None:
            raise Unavailable(f"the controller of vPOD {vpod.id} has no port {name}; release it")
        user_data = base64.b64encode(self.user_data(vpod).encode()).decode()
        server = self._call(f"start the controller of vPOD {vpod.id}", self._service("compute", vpod.id).create_server, name=name,
                            image_id=image.id, flavor_id=flavor.id, networks=[{"port": port.id}], user_data=user_data,
                            metadata={"vipu-vpod": vpod.id})
        log.info("vPOD %s: server %s (%s) made on %s", vpod.id, name, server.id, self.host(vpod.id))
        crash_point("controller:launched")
        try:
            self._service("compute", vpod.id).wait_for_server(server, status="ACTIVE", failures=["ERROR"], interval=1,
                                                              wait=SERVER_DEADLINE_SECONDS)
        except sdk_errors.ResourceFailure:
            raise Unavailable(f"cannot start the controller of vPOD {vpod.id}: {self._why_not_ready(vpod.id)}") from None
        except sdk_errors.ResourceTimeout:
            raise Unavailable(f"cannot start the controller of vPOD {vpod.id}: server {name} was not ACTIVE within "
                              f"{SERVER_DEADLINE_SECONDS:.0f} s") from None
        except OPENSTACK_ERRORS as error:
            raise Unavailable(f"cannot start the controller of vPOD {vpod.id}: {_reason(error)}") from None

    def user_data(self, vpod: Vpod) -> str:
        """The script cloud-init runs at the server's first boot, with a new one-time token (any
        earlier one is void): it fetches the controller's certificates and its store's URL from
        vipu-vpod's handover end-point (`vipu-vpod fetch-secrets`, the token on its input), writes
        the script that starts vipu-server with that URL (readable by the controller's user only),
        then has the image's unit run it; an image without the unit runs it in the foreground. No
        secret is in it: Nova's administrators, and the VM's processes, can read user data."""
        token = issue_token(self.directory(vpod.id) / HANDOVER_FILE)
        user_port, admin_port, metrics_port = vpod.ports
        lines = ["#!/bin/sh", f"# vipu-vpod: the V-IPU controller of vPOD {vpod.id}", "set -eu", "umask 077",
                 f'state="${{VIPU_STATE_DIR:-{STATE_DIR}}}"', 'mkdir -p "$state/certs" "$state/data"', 'PATH="/opt/vipu/bin:$PATH"']
        lines += _written("$state", Path(AUTHORITY_FILE), self.site.ca_cert.read_bytes())
        url = shlex.quote(f"{self.handover_url}{PATH_PREFIX}{vpod.id}")
        lines += [f'echo {shlex.quote(token)} | vipu-vpod fetch-secrets {url} --authority "$state/{AUTHORITY_FILE}" --into "$state"']
        server = " ".join([f"exec {SERVER_PROGRAM} --secure", '--tls-dir "$state/certs" --data-dir "$state/data"',
                           f"--listen-address {shlex.quote(self.host(vpod.id))}",  # its port's: the only one the group opens
                           f"--advertise-address {shlex.quote(self.host(vpod.id))}",
                           f"--port {user_port} --admin-port {admin_port} --metrics-port {metrics_port}"])
        lines += ['{ echo "#!/bin/sh"; echo "set -eu"; echo "state=\'$state\'"', "cat << 'END'",
                  f'VIPU_SERVER_DB=$(cat "$state/{STORE_URL_FILE}")', "export VIPU_SERVER_DB", 'PATH="/opt/vipu/bin:$PATH"', server, 'END',
                  '} > "$state/controller"', 'chmod 0700 "$state/controller"',
                  f"if [ -f {CONTROLLER_UNIT} ]; then  # the controller image's unit runs it, as user vipu",
                  '    chown -R vipu:vipu "$state"', f"    systemctl enable {Path(CONTROLLER_UNIT).name}",
                  f"    systemctl start --no-block {Path(CONTROLLER_UNIT).name}",  # cloud-init's own unit is still starting
                  "else", '    exec "$state/controller"', "fi"]
        return "\n".join(lines) + "\n"

    def token_path(self, vpod_id: str) -> Path:
        """Where the digest of the token its controller's user data carried is kept until it is used."""
        return self.directory(vpod_id) / HANDOVER_FILE

    def secrets(self, vpod_id: str) -> dict[str, bytes]:
        """The controller's secrets, relative to its state directory, as the hand-over gives them
        once (`vipu.vpod.handover.HandoverServer`, for the token kept at `token_path`)."""
        tls = self.tls(vpod_id)
        files = {f"certs/{path.relative_to(tls.root)}": path.read_bytes() for directory in (tls.server_dir, tls.controller_dir)
                 for path in directory.iterdir() if path.is_file()}
        return {**files, STORE_URL_FILE: self.db_url(vpod_id).encode()}

    def _delete_server(self, vpod_id: str, server) -> None:
        self._call(f"delete server {server.name}", self._service("compute", vpod_id).delete_server, server, ignore_missing=True)
        try:
            self._service("compute", vpod_id).wait_for_delete(server, interval=1, wait=SERVER_DEADLINE_SECONDS)
        except sdk_errors.ResourceTimeout:
            raise Unavailable(f"server {server.name} was not gone within {SERVER_DEADLINE_SECONDS:.0f} s") from None
        except OPENSTACK_ERRORS as error:
            raise Unavailable(f"cannot delete server {server.name}: {_reason(error)}") from None

    def _halt(self, vpod_id: str) -> None:
        """Delete the Poplar VMs and the server, waiting for each to go, then the port, the VMs' and
        the controller's security groups and the network, and close the tenant's database (kept,
        its role no longer able to log in)."""
        name, net = controller_name(vpod_id), self._service("network", vpod_id)
        for vm in self._vm_servers(vpod_id):  # the tenant's Poplar VMs first: they are on the vPOD's network
            self._delete_server(vpod_id, vm)
        server = self._server(vpod_id)
        if server is not None:
            self._delete_server(vpod_id, server)
        network = self._call(f"look for network {name}", net.find_network, name)
        if self.router and network is not None:
            self._detach(network.id)
        deadline = time.monotonic() + STOP_DEADLINE_SECONDS
        kinds: list[tuple[Callable[..., Any], Callable[..., Any], str]] = [
            (net.find_port, net.delete_port, name), (net.find_security_group, net.delete_security_group, self._vm_group_name(vpod_id)),
            (net.find_security_group, net.delete_security_group, name), (net.find_network, net.delete_network, name)]
        for find, delete, named in kinds:
            while (found := self._call(f"look for {named}", find, named)) is not None:
                try:
                    delete(found, ignore_missing=True)
                except sdk_errors.ConflictException as error:  # still in use for a moment after the server went
                    if time.monotonic() > deadline:
                        raise Unavailable(f"cannot delete {named}: {_reason(error)}") from None
                    time.sleep(0.5)
                except OPENSTACK_ERRORS as error:
                    raise Unavailable(f"cannot delete {named}: {_reason(error)}") from None
        try:
            self._close_store(vpod_id)
        except Unavailable as error:
            log.warning("vPOD %s: %s", vpod_id, error.message)
        log.info("vPOD %s: server, port, security group and network %s deleted", vpod_id, name)

    def _reap(self) -> None:
        """Nothing: OpenStack keeps the servers."""

    # Poplar VMs: Nova's servers are the record (name vpod-<id>-vm-<name>, metadata naming both)

    def _vm_name(self, vpod_id: str, name: str) -> str:
        return f"{controller_name(vpod_id)}-vm-{name}"

    def _vm_group_name(self, vpod_id: str) -> str:
        return f"{controller_name(vpod_id)}-vms"

    def _vm_group(self, vpod_id: str, subnet_cidr: str):
        """The Poplar VMs' security group: SSH from each of --openstack-ssh-cidr's networks, every
        TCP port from the vPOD's subnet (its VMs work together; the controller's own group guards
        the controller); no other, Neutron's default group included."""
        return self._security_group(vpod_id, self._vm_group_name(vpod_id), "vipu vPOD Poplar VMs: SSH, and each other",
                                    {*((cidr, 22, 22) for cidr in self.ssh_cidrs), (subnet_cidr, None, None)})

    def _vm_servers(self, vpod_id: str) -> list:
        compute = self._service("compute", vpod_id)
        listed = self._call("list servers", lambda: list(compute.servers(name=f"^{controller_name(vpod_id)}-vm-")))
        return [server for server in listed if (server.metadata or {}).get("vipu-vpod") == vpod_id]

    def _vm(self, vpod_id: str, server) -> PoplarVm:
        addresses = [entry["addr"] for entries in (server.addresses or {}).values() for entry in entries if entry.get("version") == 4]
        address = addresses[0] if addresses else ""
        ssh = f"ssh {self.ssh_user}@{address}" if address else "no address yet"
        return PoplarVm(server.metadata["vipu-vpod-vm"], server.id, server.status, address, ssh)

    def vms(self, vpod_id: str) -> list[PoplarVm]:
        return sorted((self._vm(vpod_id, server) for server in self._vm_servers(vpod_id)), key=lambda vm: vm.name)

    def create_vm(self, vpod: Vpod, request: VmRequest, config: VmConfig) -> PoplarVm:
        """Boot the VM on the vPOD's network, in the Poplar hosts' zone, and wait for it (deadline);
        one that fails is deleted again and its reason given in one line. A vPOD with as many VMs
        as the site allows is refused before anything is made (the orchestrator makes one VM of a
        vPOD at a time)."""
        name = self._vm_name(vpod.id, request.name)
        if self._call("look for a server", self._service("compute", vpod.id).find_server, name) is not None:
            raise AlreadyExists(f"vPOD {vpod.id} has a Poplar VM {request.name} already")
        if (count := len(self._vm_servers(vpod.id))) >= self.vm_limit:
            raise Conflict(f"vPOD {vpod.id} has {count} Poplar VM{'s' if count > 1 else ''}, as many as the site allows a vPOD "
                           f"(--openstack-vm-limit {self.vm_limit}); delete one first")
        image, flavor = self._image_and_flavor(vpod.id, request.image, request.flavor, InvalidArgument)
        if request.key and self._call(f"find key pair {request.key}", self._service("compute", vpod.id).find_keypair,
                                      request.key) is None:
            raise InvalidArgument(f"Nova has no key pair {request.key}")
        net = self._service("network", vpod.id)
        network = self._call(f"find network {controller_name(vpod.id)}", net.find_network, controller_name(vpod.id))
        subnet = None if network is None else self._subnet(net, network)
        if network is None or subnet is None:
            raise Unavailable(f"vPOD {vpod.id} has no network {controller_name(vpod.id)}; release it")
        group = self._vm_group(vpod.id, subnet.cidr)
        placed = {"availability_zone": self.poplar_zone} if self.poplar_zone else {}
        if request.key:
            placed["key_name"] = request.key
        user_data = vm_user_data(vpod.id, request.name, config, request.public_key, self.ssh_user)
        server = self._call(f"boot Poplar VM {request.name}", self._service("compute", vpod.id).create_server, name=name, image_id=image.id,
                            flavor_id=flavor.id, networks=[{"uuid": network.id}],
                            security_groups=[{"name": group.name}],
                            user_data=base64.b64encode(user_data.encode()).decode(),
                            metadata={"vipu-vpod": vpod.id, "vipu-vpod-vm": request.name}, **placed)
        try:
            server = self._service("compute", vpod.id).wait_for_server(server, status="ACTIVE", failures=["ERROR"], interval=1,
                                                              wait=SERVER_DEADLINE_SECONDS)
        except OPENSTACK_ERRORS:
            fault = self._fault(vpod.id, server.id, "not ACTIVE in time")
            self._delete_server(vpod.id, server)
            raise Unavailable(f"Poplar VM {request.name} failed in Nova: {fault}") from None
        log.info("vPOD %s: Poplar VM %s (%s) booted", vpod.id, request.name, server.id)
        return self._vm(vpod.id, server)

    def delete_vm(self, vpod_id: str, name: str) -> PoplarVm:
        server = next((s for s in self._vm_servers(vpod_id) if s.metadata.get("vipu-vpod-vm") == name), None)
        if server is None:
            raise NotFound(f"vPOD {vpod_id} has no Poplar VM {name}")
        self._delete_server(vpod_id, server)
        return self._vm(vpod_id, server)


def _network(option: str, cidr: str, strict: bool = True) -> str:
    """A network in the form Neutron keeps (an address alone: itself, /32 or /128); InvalidArgument
    otherwise, and, if `strict`, for one with host bits set (198.51.100.7/24 would open a /24 to
    whoever meant one address)."""
    try:
        return ipaddress.ip_network(cidr.strip(), strict=strict).with_prefixlen
    except ValueError as error:
        if "host bits set" in str(error):
            network = ipaddress.ip_network(cidr.strip(), strict=False)
            raise InvalidArgument(f"{option} {cidr!r} has host bits set: write the network ({network}) or the address alone") from None
        raise InvalidArgument(f"{option} {cidr!r} is not a network (192.0.2.0/24) or an address") from None


def _written(directory: str, relative: Path, content: bytes) -> list[str]:
    """A user-data script's lines that write a file under `directory` (a shell variable), its
    content carried in base64 so that nothing in it reaches the shell."""
    return [f'mkdir -p "{directory}/{relative.parent}"',
            f'echo {base64.b64encode(content).decode()} | base64 -d > "{directory}/{relative}"']


def vm_user_data(vpod_id: str, name: str, config: VmConfig, public_key: str = "", ssh_user: str = "debian") -> str:
    """The script cloud-init runs at a Poplar VM's first boot: the tenant's vipu configuration goes
    where `vipu` looks for it (/etc/vipu/vipu-cli.hcl), its certificates beside it; a public key
    given goes to the image's user's authorized keys (an image without that user has none to add)."""
    lines = ["#!/bin/sh", f"# vipu-vpod: Poplar VM {name} of vPOD {vpod_id}: the tenant's vipu configuration", "set -eu",
             "umask 077", 'config="${VIPU_STATE_DIR:-/etc/vipu}"', 'mkdir -p "$config"']
    for relative, content in sorted({**config.files, "vipu-cli.hcl": config.config.encode()}.items()):
        lines += _written("$config", Path(relative), content)
    lines.append('chmod -R a+rX "$config"')  # the VM's users run vipu; the VM is the tenant's own
    if public_key:
        user, key = shlex.quote(ssh_user), base64.b64encode(public_key.strip().encode() + b"\n").decode()
        lines += [f"if home=$(getent passwd {user} | cut -d: -f6) && [ -n \"$home\" ]; then",
                  '    install -d -m 0700 "$home/.ssh"', f'    echo {key} | base64 -d >> "$home/.ssh/authorized_keys"',
                  f'    chmod 0600 "$home/.ssh/authorized_keys" && chown -R {user}: "$home/.ssh"', "fi"]
    return "\n".join(lines) + "\n"
