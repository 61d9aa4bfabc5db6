"""`vipu-vpod`: the site's orchestration service, and its command line.

    vipu-vpod init --data-dir /var/lib/vipu-vpod                   # store, site certificates, admin key
    vipu-vpod serve --data-dir /var/lib/vipu-vpod --rack site.yaml  # the REST API, on 127.0.0.1:8095
    vipu-vpod create acme --machines 8                              # a vPOD; writes acme.vipu-cli.hcl
    vipu-vpod list | get ID | release ID | machines | repaired MACHINE...

The client commands take `--url` and `--key` (or VIPU_VPOD_URL and VIPU_VPOD_KEY).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import logging
import os
import secrets
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

import click

from vipu.api.atomic import write_file
from vipu.api.listening import listening_socket
from vipu.api.tls import TlsFiles, default_hosts, generate, issue_link_certificate
from vipu.cli.common import (
    CONTEXT,
    CommandGroup,
    echo_json,
    refusing_to_start,
    render_table,
    reporting,
    run,
)
from vipu.client.settings import ClientSettings, write_client_config
from vipu.model.errors import Conflict, InvalidArgument, VipuError
from vipu.model.throttle import LoginThrottle
from vipu.vpod import crash
from vipu.vpod.handover import HandoverServer, fetch, server_tls
from vipu.vpod.store import VpodStore

DATA_DIR = Path("~/.local/share/vipu-vpod")
KEY_FILE = "admin.key"
DEFAULT_URL = "http://127.0.0.1:8095"
CALL_DEADLINE_SECONDS = 1800.0  # a release with its cluster test, on a large vPOD, takes a while

data_dir_option = click.option("--data-dir", type=click.Path(file_okay=False, path_type=Path), default=str(DATA_DIR),
                               show_default=True, help="The orchestrator's directory: store, certificates, tenants' controllers.")
db_option = click.option("--db", "db_url", default=None,
                         help="Store URL (sqlite:///PATH or postgresql://...). Default: vpod.db in the data directory.")


def store_url(data_dir: Path, db_url: str | None) -> str:
    return db_url or f"sqlite:///{data_dir / 'vpod.db'}"


def site_tls(data_dir: Path) -> TlsFiles:
    return TlsFiles(data_dir / "site-certs")


def identity_tls(data_dir: Path) -> TlsFiles:
    return TlsFiles(data_dir / "orchestrator")


@click.group(cls=CommandGroup, context_settings=CONTEXT)
@click.option("--url", envvar="VIPU_VPOD_URL", default=DEFAULT_URL, show_default=True, help="The orchestrator's REST API.")
@click.option("--key", envvar="VIPU_VPOD_KEY", default="",
              help="The orchestrator's administrator key. Default: the one vipu-vpod init kept in its default data directory.")
@click.option("--token", envvar="OS_TOKEN", default="", help="An OpenStack Keystone token instead: a tenant's, or a site administrator's.")
@click.pass_context
def cli(ctx, url, key, token):
    """Tenant vPODs of an IPU site: a controller per tenant, machines handed over safely."""
    if token:
        ctx.obj = (url.rstrip("/"), {"X-Auth-Token": token})
        return
    if not key:
        with contextlib.suppress(OSError):
            key = (DATA_DIR / KEY_FILE).expanduser().read_text().strip()
    ctx.obj = (url.rstrip("/"), {"Authorization": f"Bearer {key}"})


@cli.command("init")
@data_dir_option
@db_option
@click.option("--tls-hosts", default=None, help="Names and addresses the site's agents are reached by: H1,H2,... Default: this host's.")
def init(data_dir, db_url, tls_hosts):
    """Make the store, the site's certificates (unless there), the orchestrator's own, and an administrator key."""
    data_dir = data_dir.expanduser()
    with reporting("init"):
        store = VpodStore(store_url(data_dir, db_url))
        site = site_tls(data_dir)
        if not site.ca_cert.exists():
            generate(site, [h.strip() for h in tls_hosts.split(",")] if tls_hosts else default_hosts())
            click.echo(f"Generated the site's certificates in {site.root} (the agents use {site.agents_dir})")
        identity = identity_tls(data_dir)
        if not identity.controller_cert.exists():
            issue_link_certificate(site, "vipu-vpod", identity.controller_dir)
        if store.setting("admin_key") is not None:
            click.echo("An administrator key exists already; none was made.")
            return
        from vipu.vpod.api import hash_key

        key = secrets.token_urlsafe(16)
        store.set_setting("admin_key", hash_key(key))
        write_file(data_dir / KEY_FILE, (key + "\n").encode(), 0o600)
    click.echo(f"Administrator key is '{key}', kept in {data_dir / KEY_FILE} for this host's vipu-vpod commands.")


@cli.command("serve")
@data_dir_option
@db_option
@click.option("--rack", "rack_path", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="The site's rack description: machines in rack order, their agents, the cables.")
@click.option("--listen-address", default="127.0.0.1", show_default=True)
@click.option("--port", type=click.IntRange(1, 65535), default=8095, show_default=True)
@click.option("--advertise-host", default=None,
              help="The address tenants reach their controllers at; their listen address too. Default: 127.0.0.1.")
@click.option("--port-base", type=click.IntRange(1024, 65000), default=9100, show_default=True,
              help="Tenants' controllers take three ports each from here: user, admin, metrics.")
@click.option("--keystone-url", default=None, help="Accept OpenStack Keystone tokens, checked at this identity API (http://HOST:5000/v3).")
@click.option("--keystone-user", default="vipu-vpod", show_default=True, help="The orchestrator's service user in Keystone.")
@click.option("--keystone-password-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="A file holding that user's password (or set VIPU_VPOD_KEYSTONE_PASSWORD).")
@click.option("--keystone-project", default="service", show_default=True, help="The service user's project.")
@click.option("--keystone-admin-project", default="admin", show_default=True,
              help="Holders of the administrators' role on this project are site administrators; other projects are tenants.")
@click.option("--keystone-admin-role", default="admin", show_default=True)
@click.option("--kubernetes-namespace", default=None,
              help="Run tenants' controllers as Deployments in this namespace (KUBECONFIG, or the pod's service account), "
                   "not as processes of this host.")
@click.option("--kubernetes-image", default=None, help="With --kubernetes-namespace: the image holding vipu-server.")
@click.option("--kubernetes-store", default=None, envvar="VIPU_VPOD_KUBERNETES_STORE",
              help="With --kubernetes-namespace: a PostgreSQL server URL (13 or later) whose user may create databases and roles; "
                   "each tenant's controller gets a database and role of its own, kept when its vPOD is released. "
                   "VIPU_VPOD_KUBERNETES_STORE keeps the password out of the process list.")
@click.option("--kubernetes-controller-host", default=None,
              help="With --kubernetes-namespace: where the controllers are reached. Default: each one's Service, NAME.NAMESPACE.svc.")
@click.option("--provider", type=click.Choice(["local", "kubernetes", "openstack"]), default=None,
              help="Where tenants' controllers run: processes of this host (local), Deployments (kubernetes, the default with "
                   "--kubernetes-namespace) or OpenStack servers (openstack).")
@click.option("--openstack-cloud", default=None, help="With --provider openstack: the clouds.yaml entry to act as (OS_CLIENT_CONFIG_FILE "
                                                      "names the file, as for the openstack CLI).")
@click.option("--openstack-image", default=None, help="With --provider openstack: the controllers' image in Glance (name or id).")
@click.option("--openstack-flavor", default=None, help="With --provider openstack: the controllers' flavor.")
@click.option("--openstack-subnet-pool", default=None,
              help="With --provider openstack: the Neutron subnet pool each vPOD's network takes its subnet from.")
@click.option("--openstack-admit-cidr", default="",
              help="With --provider openstack: a network besides the vPOD's own that may reach its controller (this orchestrator's).")
@click.option("--openstack-router", default="",
              help="With --provider openstack: the site's Neutron router each vPOD's subnet is attached to, through which this "
                   "orchestrator, the store, the agents and the tenant's users reach it. Default: none (the site routes them).")
@click.option("--openstack-poplar-zone", default="",
              help="With --provider openstack: the availability zone of the site's Poplar hosts, where tenants' Poplar VMs go.")
@click.option("--openstack-ssh-user", default="debian", show_default=True,
              help="With --provider openstack: the user a Poplar VM's image lets in with its key pair.")
@click.option("--openstack-ssh-cidr", "openstack_ssh_cidrs", multiple=True, default=("0.0.0.0/0",), show_default=True,
              help="With --provider openstack, repeatable: a network (or address) tenants' users may reach their Poplar VMs by "
                   "SSH from: their vPOD's security group admits port 22 from these only (the images take keys only).")
@click.option("--openstack-vm-limit", type=click.IntRange(1), default=8, show_default=True,
              help="With --provider openstack: the most Poplar VMs a vPOD may have at once.")
@click.option("--openstack-projects", type=click.Choice(["tenant", "site"]), default="tenant", show_default=True,
              help="With --provider openstack: where each vPOD's servers, network and groups are made: in the Keystone project "
                   "named as its tenant (the clouds.yaml entry's user needs a role there), or all in the entry's own project.")
@click.option("--openstack-handover-address", default=None,
              help="With --provider openstack: the address the controllers' VMs reach this orchestrator at, where it hands each "
                   "its secrets once over HTTPS (the site's certificate). Default: --listen-address.")
@click.option("--openstack-handover-port", type=click.IntRange(1, 65535), default=8096, show_default=True,
              help="With --provider openstack: the port of that hand-over.")
@click.option("--openstack-store", default=None, envvar="VIPU_VPOD_OPENSTACK_STORE",
              help="With --provider openstack: a PostgreSQL server URL whose user may create databases and roles, as "
                   "--kubernetes-store. VIPU_VPOD_OPENSTACK_STORE keeps the password out of the process list.")
@click.option("--test-on-release", is_flag=True,
              help="Run the cluster test on a vPOD's machines when it is released; those it fails on are held back from the pool.")
@click.option("--login-failures", type=click.IntRange(0), default=10, show_default=True,
              help="Failures of one administrator key (or of none) from one address within --login-lockout that refuse that "
                   "key from that address for as long, unchecked; the right key still gets in; 0: never.")
@click.option("--trusted-proxy", "trusted_proxies", multiple=True, metavar="ADDRESS",
              help="A reverse proxy in front of the API (repeatable): only from these is X-Forwarded-For believed, so "
                   "that failures are counted by each caller's own address rather than the proxy's.")
@click.option("--login-lockout", type=click.FloatRange(1), default=60.0, show_default=True,
              help="Seconds a key stays refused from an address, and the window its failures are counted in.")
@click.option("--log-level", default="INFO", type=click.Choice(["DEBUG", "INFO", "WARNING", "ERROR"], case_sensitive=False))
def serve(data_dir, db_url, rack_path, listen_address, port, advertise_host, port_base, keystone_url, keystone_user,
          keystone_password_file, keystone_project, keystone_admin_project, keystone_admin_role, kubernetes_namespace,
          kubernetes_image, kubernetes_store, kubernetes_controller_host, provider, openstack_cloud, openstack_image, openstack_flavor,
          openstack_subnet_pool, openstack_admit_cidr, openstack_router, openstack_poplar_zone, openstack_ssh_user,
          openstack_ssh_cidrs, openstack_vm_limit, openstack_projects, openstack_handover_address, openstack_handover_port,
          openstack_store, test_on_release,
          login_failures, trusted_proxies, login_lockout, log_level):
    """Serve the REST API, resume what an earlier run left under way, and keep tenants' controllers running."""
    with refusing_to_start("vipu-vpod serve"):
        try:
            import uvicorn

            from vipu.vpod.agents import SiteAgents
            from vipu.vpod.api import make_app, server_config
            from vipu.vpod.identity import KeystoneTokens
            from vipu.vpod.orchestrator import Orchestrator
            from vipu.vpod.site import read_site, site_machines
            from vipu.vpod.tenants import LocalControllers, TenantControllers
        except ImportError as missing:
            raise InvalidArgument(f"serving needs vipu's vpod extra ({missing.name} is missing): pip install 'vipu[vpod]'") from None

    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    data_dir = data_dir.expanduser()
    stop = threading.Event()
    with refusing_to_start("vipu-vpod serve"):
        crash.check_setting()
        listening = listening_socket(listen_address, port)  # a taken port is refused before anything is resumed
        store = VpodStore(store_url(data_dir, db_url))
        rack = read_site(rack_path)
        store.add_machines(site_machines(rack))
        site = site_tls(data_dir)
        tenants: TenantControllers
        handover: HandoverServer | None = None
        provider = provider or ("kubernetes" if kubernetes_namespace else "local")
        openstack_options = {"--openstack-cloud": openstack_cloud, "--openstack-image": openstack_image,
                             "--openstack-flavor": openstack_flavor, "--openstack-subnet-pool": openstack_subnet_pool,
                             "--openstack-store": openstack_store}
        if provider == "openstack":
            absent = [name for name, value in openstack_options.items() if not value]
            if absent:
                raise InvalidArgument(f"--provider openstack needs {', '.join(absent)} too")
            if kubernetes_namespace or advertise_host:
                raise InvalidArgument("with --provider openstack, controllers are reached at their servers' addresses: "
                                      "--kubernetes-namespace and --advertise-host are for other providers")
            from vipu.vpod.openstack import OpenStackControllers

            use_runner(store, f"openstack:{openstack_cloud}")
            handover_address = openstack_handover_address or listen_address
            if _unspecified(handover_address):
                raise InvalidArgument(f"the controllers' VMs cannot be sent to {handover_address} for their secrets: give "
                                      "--openstack-handover-address, the address they reach this orchestrator at")
            host = f"[{handover_address}]" if ":" in handover_address else handover_address
            openstack_controllers = OpenStackControllers(
                data_dir, site, store.site_id(), openstack_cloud, openstack_image, openstack_flavor, openstack_subnet_pool,
                openstack_store, f"https://{host}:{openstack_handover_port}", openstack_admit_cidr, openstack_poplar_zone,
                openstack_ssh_user, openstack_router, openstack_ssh_cidrs, openstack_projects == "tenant", openstack_vm_limit)
            tenants = openstack_controllers
            handover = HandoverServer(listening_socket(handover_address, openstack_handover_port),
                                      server_tls(site, handover_address, identity_tls(data_dir).root),
                                      openstack_controllers.token_path, openstack_controllers.secrets)
            handover.start()  # before anything is resumed: a controller booting now asks for its secrets
        elif given := [name for name, value in [*openstack_options.items(), ("--openstack-admit-cidr", openstack_admit_cidr),
                                                ("--openstack-poplar-zone", openstack_poplar_zone),
                                                ("--openstack-router", openstack_router),
                                                ("--openstack-handover-address", openstack_handover_address)] if value]:
            raise InvalidArgument(f"{given[0]} is for controllers on OpenStack: give --provider openstack too")
        elif provider == "kubernetes" and not kubernetes_namespace:
            raise InvalidArgument("--provider kubernetes needs --kubernetes-namespace")
        elif provider == "local" and kubernetes_namespace:
            raise InvalidArgument("--kubernetes-namespace is for controllers on Kubernetes, not with --provider local")
        elif kubernetes_namespace:
            if not kubernetes_image or not kubernetes_store:
                raise InvalidArgument("--kubernetes-namespace needs --kubernetes-image and --kubernetes-store too")
            if advertise_host:
                raise InvalidArgument("with --kubernetes-namespace, controllers are reached at their Services, or at "
                                      "--kubernetes-controller-host; --advertise-host is for controllers on this host")
            from vipu.vpod.kubernetes import KubernetesControllers

            use_runner(store, f"kubernetes:{kubernetes_namespace}")
            tenants = KubernetesControllers(data_dir, site, store.site_id(), kubernetes_namespace, kubernetes_image,
                                            kubernetes_store, kubernetes_controller_host)
        else:
            given = [name for name, value in (("--kubernetes-image", kubernetes_image), ("--kubernetes-store", kubernetes_store),
                                              ("--kubernetes-controller-host", kubernetes_controller_host)) if value]
            if given:
                raise InvalidArgument(f"{given[0]} is for controllers on Kubernetes: give --kubernetes-namespace too")
            use_runner(store, "local")
            tenants = LocalControllers(data_dir, site, advertise_host or "127.0.0.1", advertise_host or "127.0.0.1")
        orchestrator = Orchestrator(store, rack, tenants, SiteAgents(site, identity_tls(data_dir)), port_base, test_on_release)
        orchestrator.resume()
        tokens = None
        if keystone_url:
            password = os.environ.get("VIPU_VPOD_KEYSTONE_PASSWORD", "")
            if keystone_password_file is not None:
                try:
                    password = keystone_password_file.read_text().strip()
                except OSError as error:
                    raise InvalidArgument(f"cannot read {keystone_password_file}: {error.strerror}") from None
            if not password:
                raise InvalidArgument("Keystone needs the service user's password: --keystone-password-file or VIPU_VPOD_KEYSTONE_PASSWORD")
            tokens = KeystoneTokens(keystone_url, keystone_user, password, keystone_project, keystone_admin_role, keystone_admin_project)
        threading.Thread(target=tenants.supervise, args=(orchestrator.running, stop), name="supervisor", daemon=True).start()
        app = make_app(orchestrator, tokens, LoginThrottle(login_failures, login_lockout))
    server = uvicorn.Server(server_config(app, listen_address, port, trusted_proxies, log_level="warning"))

    def announce() -> None:  # once it listens, for whoever waits for it
        while not server.started and not stop.wait(0.05):
            pass
        if server.started:
            logging.getLogger(__name__).info("vipu-vpod serves on %s:%d", listen_address, port)

    threading.Thread(target=announce, name="announce", daemon=True).start()
    try:
        server.run(sockets=[listening])
    finally:
        stop.set()
        if handover is not None:
            handover.stop()


def _unspecified(address: str) -> bool:
    """Whether the address means every address of this host (0.0.0.0, ::), which names no host to reach."""
    try:
        return ipaddress.ip_address(address).is_unspecified
    except ValueError:  # a host name
        return False


def use_runner(store: VpodStore, runner: str) -> None:
    """Record where tenants' controllers run; refuse another place while vPODs live in the first,
    whose controllers the new one would neither find nor stop."""
    recorded = store.setting("runner") or "local"
    if recorded != runner and any(v.state != "Released" for v in store.list()):
        kind, _, place = recorded.partition(":")
        where = {"local": "as processes of this host", "kubernetes": f"on Kubernetes, namespace {place}",
                 "openstack": f"on OpenStack cloud {place}"}[kind]
        raise Conflict(f"the vPODs of this orchestrator have their controllers {where}; release them first, or serve as before")
    store.set_setting("runner", runner)


def call(ctx: click.Context, method: str, path: str, body: dict | None = None) -> dict:
    """One REST call; a refusal raises VipuError with the server's one line."""
    url, credentials = ctx.obj
    request = urllib.request.Request(f"{url}{path}", method=method, data=json.dumps(body).encode() if body is not None else None,
                                     headers={**credentials, "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=CALL_DEADLINE_SECONDS) as answer:
            return json.loads(answer.read() or b"{}")
    except urllib.error.HTTPError as error:
        try:
            reason = json.loads(error.read()).get("error") or error.reason
        except (ValueError, AttributeError):  # not the API's {"error": ...}: a proxy's page, say
            reason = error.reason
        raise VipuError(str(reason)) from None
    except (urllib.error.URLError, OSError) as error:
        raise VipuError(f"cannot reach the orchestrator at {url}: {getattr(error, 'reason', error)}") from None
    except ValueError as error:  # a URL or key that cannot go into a request at all
        raise VipuError(f"cannot call the orchestrator at {url}: {error}") from None


def write_credentials(directory: Path, credentials: dict) -> Path:
    """The tenant's user's configuration file and the certificates it names; its path."""
    user = credentials["user"]
    certs = directory / f"{user}-certs"
    write_file(certs / "ca.pem", credentials["server_ca"].encode())
    write_file(certs / "client.pem", credentials["client_cert"].encode())
    write_file(certs / "client-key.pem", credentials["client_key"].encode(), 0o600)
    path = directory / f"{user}.vipu-cli.hcl"
    write_client_config(path, ClientSettings(credentials["host"], credentials["port"], user, credentials["access_key"],
                                             certs / "ca.pem", certs / "client.pem", certs / "client-key.pem"),
                        admin_port=credentials["admin_port"])
    return path


def show(vpods: list[dict], as_json: bool) -> None:
    if as_json:
        echo_json(vpods)
        return
    click.echo(render_table(["ID", "Tenant", "State", "Machines", "Topology", "User", "User port", "Error"],
                            [[v["id"], v["tenant"], v["state"], f"{v['machines'][0]}..{v['machines'][-1]} ({len(v['machines'])})",
                              v["topology"], v["user"], v["user_port"], v["error"]] for v in vpods]))


json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON instead of a table.")


@cli.command("create")
@click.argument("tenant")
@click.option("--machines", type=click.IntRange(1, 4096), required=True, help="IPU-Machines, consecutive in a rack.")
@click.option("--topology", type=click.Choice(["mesh", "torus"]), default="mesh", show_default=True)
@click.option("--ilds", type=click.IntRange(1, 1024), default=1, show_default=True, help="IPU-Link domains.")
@click.option("--user", default="", help="The tenant's first user. Default: the tenant's name.")
@click.option("--out", type=click.Path(file_okay=False, path_type=Path), default=Path("."), show_default=True,
              help="Where to write the user's configuration file and certificates.")
@click.pass_context
def create(ctx, tenant, machines, topology, ilds, user, out):
    """Create a tenant's vPOD: its controller, its machines, its first user."""
    with reporting("create vpod", tenant):
        reply = call(ctx, "POST", "/v1/vpods", {"tenant": tenant, "machines": machines, "topology": topology, "ilds": ilds,
                                                "user": user})
        path = write_credentials(out, reply["credentials"])
    vpod = reply["vpod"]
    click.echo(f"create vpod ({vpod['id']}): success. Machines {', '.join(vpod['machines'])}; "
               f"user {reply['credentials']['user']}'s configuration: {path}")


@cli.command("list")
@json_option
@click.option("--tenant", default=None, help="Only this tenant's vPODs.")
@click.pass_context
def list_vpods(ctx, as_json, tenant):
    """List the vPODs that are not released."""
    with reporting("list vpods"):
        reply = call(ctx, "GET", "/v1/vpods" + (f"?tenant={tenant}" if tenant else ""))
    show(reply["vpods"], as_json)


@cli.command("get")
@click.argument("vpod_id")
@json_option
@click.option("--credentials", "out", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Write the user's configuration file and certificates into this directory too.")
@click.pass_context
def get(ctx, vpod_id, as_json, out):
    """Show one vPOD."""
    with reporting("get vpod", vpod_id):
        reply = call(ctx, "GET", f"/v1/vpods/{vpod_id}")
        if out is not None:
            path = write_credentials(out, call(ctx, "GET", f"/v1/vpods/{vpod_id}/credentials")["credentials"])
            click.echo(f"configuration written: {path}", err=True)
    show([reply["vpod"]], as_json)


@cli.command("release")
@click.argument("vpod_id")
@click.pass_context
def release(ctx, vpod_id):
    """Release a vPOD: its partitions removed, its machines cleared and free, its controller stopped and archived."""
    with reporting("release vpod", vpod_id):
        call(ctx, "DELETE", f"/v1/vpods/{vpod_id}")
    click.echo(f"release vpod ({vpod_id}): success.")


@cli.group("vm")
def vm():
    """Tenants' Poplar VMs: OpenStack servers on their vPOD's network, vipu configured for its controller."""


def show_vms(vms: list[dict], as_json: bool) -> None:
    if as_json:
        echo_json(vms)
        return
    click.echo(render_table(["Name", "Status", "Address", "Log in", "Server"],
                            [[v["name"], v["status"], v["address"], v["ssh"], v["server_id"]] for v in vms]))


@vm.command("create")
@click.argument("vpod_id")
@click.argument("name")
@click.option("--flavor", required=True, help="A Nova flavor.")
@click.option("--image", required=True, help="A Glance image: a Poplar image with vipu installed.")
@click.option("--key", default="", help="A Nova key pair of the orchestrator's OpenStack user whose key may log in.")
@click.option("--public-key", "public_key_file", type=click.Path(dir_okay=False, path_type=Path),
              help="A file with an OpenSSH public key that may log in (as ~/.ssh/id_ed25519.pub): your own key, which the VM "
                   "is given in its user data.")
@click.pass_context
def create_vm(ctx, vpod_id, name, flavor, image, key, public_key_file):
    """Boot a Poplar VM on the vPOD's network; `vipu` in it reaches the vPOD's controller as its first user."""
    with reporting("create vm", name):
        try:
            public_key = public_key_file.read_text() if public_key_file else ""
        except (OSError, UnicodeDecodeError) as error:
            raise InvalidArgument(f"cannot read {public_key_file}: {getattr(error, 'strerror', None) or 'not text'}") from None
        made = call(ctx, "POST", f"/v1/vpods/{vpod_id}/vms",
                    {"name": name, "flavor": flavor, "image": image, "key": key, "public_key": public_key})["vm"]
    click.echo(f"create vm ({name}): success. Address {made['address']}; log in with: {made['ssh']}")


@vm.command("list")
@click.argument("vpod_id")
@json_option
@click.pass_context
def list_vms(ctx, vpod_id, as_json):
    """The vPOD's Poplar VMs."""
    with reporting("list vms", vpod_id):
        reply = call(ctx, "GET", f"/v1/vpods/{vpod_id}/vms")
    show_vms(reply["vms"], as_json)


@vm.command("delete")
@click.argument("vpod_id")
@click.argument("name")
@click.pass_context
def delete_vm(ctx, vpod_id, name):
    """Delete a Poplar VM."""
    with reporting("delete vm", name):
        call(ctx, "DELETE", f"/v1/vpods/{vpod_id}/vms/{name}")
    click.echo(f"delete vm ({name}): success.")


@cli.command("fetch-secrets")
@click.argument("url")
@click.option("--authority", required=True, type=click.Path(dir_okay=False, exists=True, path_type=Path),
              help="The site's certificate authority, which issued the hand-over's certificate.")
@click.option("--into", required=True, type=click.Path(file_okay=False, path_type=Path), help="Where the files go.")
def fetch_secrets(url, authority, into):
    """In a vPOD controller's VM, at its first boot: fetch its secrets once from vipu-vpod (the
    one-time token from the user data on standard input, kept out of the process list)."""
    with reporting("fetch secrets", url):
        token = sys.stdin.readline().strip()
        if not token:
            raise InvalidArgument("give the one-time token on standard input")
        written = fetch(url, authority, token, into)
    click.echo(f"fetch secrets ({url}): success. {len(written)} files in {into}")


@cli.command("machines")
@json_option
@click.pass_context
def machines(ctx, as_json):
    """The site's machines in rack order, and the vPOD holding each."""
    with reporting("list machines"):
        reply = call(ctx, "GET", "/v1/machines")
    if as_json:
        echo_json(reply["machines"])
        return
    click.echo(render_table(["Machine", "Agent", "vPOD", "Held back"],
                            [[m["name"], f"{m['host']}:{m['port']}", m["vpod"] or "-", m["held_back"] or "-"]
                             for m in reply["machines"]]))


@cli.command("repaired")
@click.argument("names", nargs=-1, required=True)
@click.pass_context
def repaired(ctx, names):
    """Return machines held back by a failed release test to the pool, once repaired."""
    with reporting("repaired", ",".join(names)):
        call(ctx, "POST", "/v1/machines/repaired", {"machines": list(names)})
    click.echo(f"repaired ({','.join(names)}): success.")


def main() -> None:
    run(cli, "vipu-vpod")

