"""Real OpenStack services, as vipu-vpod's OpenStack provider (issue 31) will meet them: Keystone,
Placement, Glance, Nova with its fake virt driver, and Neutron with Linux bridge's agent, from
Debian's archive (tests/openstack.py). A server boots from a Glance image on a Neutron network with
the user data it was given, its port bound on the compute host, and everything made is deleted
again; the failures the provider must turn into one line come back as Nova gives them.
"""

from __future__ import annotations

import base64
import json
import os
import re
import signal
import subprocess
import urllib.error
import urllib.parse
import urllib.request

import pytest
import yaml
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding, PublicFormat

from tests.functional.harness import BIN, Result, failed_line, wait_until
from tests.functional.test_vpod import Site, created
from tests.keystone import ADMIN_PASSWORD
from tests.openstack import OpenStack
from tests.ports import free_port
from vipu.api.tls import TlsFiles

pytestmark = [pytest.mark.functional,
              pytest.mark.skipif(os.geteuid() != 0, reason="MariaDB, RabbitMQ and Neutron's agent run as root here")]
USER_DATA = "#!/bin/sh\necho the vPOD controller starts here\n"


@pytest.fixture(scope="module")
def openstack(tmp_path_factory):
    services = OpenStack(tmp_path_factory.mktemp("openstack")).start()
    yield services
    services.stop()


@pytest.fixture(scope="module")
def image(openstack) -> str:
    made = openstack.call("glance", "POST", "/v2/images", {"name": "vipu-controller", "disk_format": "raw", "container_format": "bare",
                                                           "visibility": "public"})  # as the README registers it: every tenant boots it
    openstack.upload(made["id"], b"\0" * 4096)
    assert openstack.call("glance", "GET", f"/v2/images/{made['id']}")["status"] == "active"
    return made["id"]


@pytest.fixture(scope="module")
def flavor(openstack) -> str:
    made = openstack.call("nova", "POST", "/flavors", {"flavor": {"name": "vpod-controller", "ram": 512, "vcpus": 1, "disk": 1}})
    return made["flavor"]["id"]


def named_servers(openstack: OpenStack, name: str) -> list[dict]:
    return openstack.call("nova", "GET", f"/servers/detail?all_tenants=1&name=^{name}$")["servers"]


def failure(call) -> tuple[int, str]:
    with pytest.raises(urllib.error.HTTPError) as refused:
        call()
    body = json.loads(refused.value.read())
    return refused.value.code, next(iter(body.values()))["message"]


def test_a_server_boots_from_glance_on_a_neutron_network_with_its_user_data_and_leaves_nothing_behind(openstack, image, flavor):
    network = openstack.call("neutron", "POST", "/v2.0/networks", {"network": {"name": "vpod-acme-1"}})["network"]
    assert network["provider:network_type"] == "local"
    subnet = openstack.call("neutron", "POST", "/v2.0/subnets", {"subnet": {
        "network_id": network["id"], "cidr": "10.20.0.0/24", "ip_version": 4}})["subnet"]
    group = openstack.call("neutron", "POST", "/v2.0/security-groups", {"security_group": {"name": "vpod-acme-1"}})["security_group"]
    openstack.call("neutron", "POST", "/v2.0/security-group-rules", {"security_group_rule": {
        "security_group_id": group["id"], "direction": "ingress", "protocol": "tcp", "port_range_min": 8090,
        "port_range_max": 8091, "remote_ip_prefix": subnet["cidr"]}})

    server = openstack.call("nova", "POST", "/servers", {"server": {
        "name": "vpod-acme-1-controller", "imageRef": image, "flavorRef": flavor, "networks": [{"uuid": network["id"]}],
        "security_groups": [{"name": "vpod-acme-1"}], "user_data": base64.b64encode(USER_DATA.encode()).decode()}})["server"]
    active = wait_until(lambda: (s := openstack.call("nova", "GET", f"/servers/{server['id']}")["server"])["status"] in ("ACTIVE", "ERROR")
                        and s, timeout=60, what="the server to boot")
    assert active["status"] == "ACTIVE", active.get("fault")
    address = active["addresses"]["vpod-acme-1"][0]["addr"]
    assert address.startswith("10.20.0.")
    ported = openstack.call("neutron", "GET", f"/v2.0/ports?device_id={server['id']}")["ports"]
    assert [(p["binding:host_id"], p["binding:vif_type"], p["security_groups"]) for p in ported] == [("compute1", "bridge", [group["id"]])]
    # What the harness's boot stand-in reads, as cloud-init does in a real VM
    detail = openstack.call("nova", "GET", f"/servers/{server['id']}", headers={"OpenStack-API-Version": "compute 2.3"})["server"]
    assert base64.b64decode(detail["OS-EXT-SRV-ATTR:user_data"]).decode() == USER_DATA

    openstack.call("nova", "DELETE", f"/servers/{server['id']}")
    wait_until(lambda: not openstack.call("nova", "GET", "/servers")["servers"], timeout=60, what="the server to go")
    wait_until(lambda: not openstack.call("neutron", "GET", f"/v2.0/ports?device_id={server['id']}")["ports"], what="its port to go")
    openstack.call("neutron", "DELETE", f"/v2.0/security-groups/{group['id']}")
    openstack.call("neutron", "DELETE", f"/v2.0/networks/{network['id']}")
    assert openstack.call("neutron", "GET", "/v2.0/networks")["networks"] == []
    assert [g["name"] for g in openstack.call("neutron", "GET", "/v2.0/security-groups")["security_groups"]] == ["default"]


def test_an_active_server_runs_its_user_data_at_its_own_address_until_it_is_deleted(openstack, image, flavor):
    port = free_port()
    user_data = f"#!/bin/sh\necho booted\nexec python3 -m http.server {port} --bind 0.0.0.0\n"
    network = openstack.call("neutron", "POST", "/v2.0/networks", {"network": {"name": "booted"}})["network"]
    openstack.call("neutron", "POST", "/v2.0/subnets", {"subnet": {"network_id": network["id"], "cidr": "10.22.0.0/24", "ip_version": 4}})
    try:
        server = openstack.call("nova", "POST", "/servers", {"server": {
            "name": "booted", "imageRef": image, "flavorRef": flavor, "networks": [{"uuid": network["id"]}],
            "user_data": base64.b64encode(user_data.encode()).decode()}})["server"]
        active = wait_until(lambda: (s := openstack.call("nova", "GET", f"/servers/{server['id']}")["server"])["status"] == "ACTIVE"
                            and s, timeout=60, what="the server to boot")
        address = active["addresses"]["booted"][0]["addr"]

        def answers() -> bool:
            try:
                return urllib.request.urlopen(f"http://{address}:{port}/", timeout=2).status == 200
            except OSError:
                return False
        wait_until(answers, timeout=30, what="the server's user data to serve at its address")
        assert openstack.machines.log(server["id"]).startswith("booted\n")
        openstack.call("nova", "DELETE", f"/servers/{server['id']}")
        wait_until(lambda: not answers(), timeout=60, what="the deleted server's process to stop")
        wait_until(lambda: address not in subprocess.run(["ip", "-4", "address", "show", "dev", "lo"], capture_output=True,
                                                         text=True).stdout, what="the deleted server's address to go")
    finally:
        wait_until(lambda: not openstack.call("nova", "GET", "/servers")["servers"], timeout=60, what="the server to go")
        openstack.call("neutron", "DELETE", f"/v2.0/networks/{network['id']}")


def test_a_quota_and_a_missing_image_are_refused_by_nova_in_a_line(openstack, image, flavor):
    network = openstack.call("neutron", "POST", "/v2.0/networks", {"network": {"name": "refusals"}})["network"]
    openstack.call("neutron", "POST", "/v2.0/subnets", {"subnet": {"network_id": network["id"], "cidr": "10.21.0.0/24", "ip_version": 4}})
    try:
        def boot(image_id: str):
            return openstack.call("nova", "POST", "/servers", {"server": {
                "name": "refused", "imageRef": image_id, "flavorRef": flavor, "networks": [{"uuid": network["id"]}]}})

        code, message = failure(lambda: boot("0d7b4fd8-8e5c-4a3a-8f0b-000000000000"))
        assert (code, message) == (400, "Can not find requested image")
        project = openstack.keystone._id("projects", "admin")
        openstack.call("nova", "PUT", f"/os-quota-sets/{project}", {"quota_set": {"instances": 0}})
        try:
            code, message = failure(lambda: boot(image))
            assert code == 403 and message.startswith("Quota exceeded for instances"), message
        finally:
            openstack.call("nova", "DELETE", f"/os-quota-sets/{project}")
        assert openstack.call("nova", "GET", "/servers")["servers"] == []
    finally:
        openstack.call("neutron", "DELETE", f"/v2.0/networks/{network['id']}")


@pytest.fixture(scope="module")
def cloud(openstack, tmp_path_factory, image, flavor) -> dict[str, str]:
    """A clouds.yaml naming the site's cloud as vipu-vpod acts as it, and the subnet pool of vPODs' networks."""
    openstack.call("neutron", "POST", "/v2.0/subnetpools", {"subnetpool": {
        "name": "vpods", "prefixes": ["10.40.0.0/16"], "default_prefixlen": 28, "shared": True}})  # tenants' projects take from it
    openstack.call("neutron", "POST", "/v2.0/routers", {"router": {"name": "site-router"}})
    clouds = tmp_path_factory.mktemp("cloud") / "clouds.yaml"
    clouds.write_text(yaml.safe_dump({"clouds": {"site": {
        "auth": {"auth_url": openstack.keystone.url, "username": "admin", "password": ADMIN_PASSWORD, "project_name": "admin",
                 "user_domain_name": "Default", "project_domain_name": "Default"},
        "region_name": "RegionOne", "identity_api_version": 3}}}))
    return {**os.environ, "OS_CLIENT_CONFIG_FILE": str(clouds)}


def seen_by(openstack: OpenStack, token: str) -> dict[str, set[str]]:
    """The names of the servers, networks, ports and security groups a Keystone token's project sees."""
    as_it = {"X-Auth-Token": token}
    return {"servers": {s["name"] for s in openstack.call("nova", "GET", "/servers", headers=as_it)["servers"]},
            **{kind: {r["name"] for r in openstack.call("neutron", "GET", f"/v2.0/{kind}", headers=as_it)[kind.replace("-", "_")]}
               for kind in ("networks", "ports", "security-groups")}}


def handed_over(user_data: str) -> tuple[str, str]:
    """The one-time token and the hand-over's URL in a controller's user data."""
    found = re.search(r"^echo (\S+) \| vipu-vpod fetch-secrets (\S+) ", user_data, re.MULTILINE)
    assert found is not None, user_data
    return found[1], found[2]


def carried(user_data: str) -> str:
    """The user data with each file it writes (`echo BASE64 | base64 -d`) decoded."""
    return "\n".join([user_data, *(base64.b64decode(blob).decode(errors="replace")
                                   for blob in re.findall(r"echo (\S+) \| base64 -d", user_data))])


def test_a_vpods_controller_is_a_nova_server_on_a_network_of_its_own_and_a_release_leaves_nothing(
        openstack, cloud, postgres_of_its_own, tmp_path):
    site = Site(tmp_path / "site", machines=4, env=cloud)
    tokens = {}
    for tenant in ("acme", "bravo"):  # each tenant's resources in its own project, where vipu-vpod's user is given a role
        openstack.keystone.project(tenant)
        openstack.keystone.grant("admin", tenant, "member")
        openstack.keystone.user(f"{tenant}-user", "tenant-password", tenant)  # the tenant's own OpenStack user
        tokens[tenant] = openstack.keystone.token(f"{tenant}-user", "tenant-password", tenant)
    try:
        site.serve("--provider", "openstack", "--openstack-cloud", "site", "--openstack-image", "vipu-controller",
                   "--openstack-flavor", "vpod-controller", "--openstack-subnet-pool", "vpods", "--openstack-router", "site-router",
                   "--openstack-poplar-zone", "nova", "--openstack-store", postgres_of_its_own.url("postgres"),
                   "--openstack-handover-port", str(free_port()), "--openstack-vm-limit", "1",
                   "--openstack-ssh-cidr", "192.0.2.0/24", "--openstack-ssh-cidr", "198.51.100.7")
        acme_id = created(site.vpod("create", "acme", "--machines", "4", "--out", str(tmp_path / "acme")))
        name = f"vpod-{acme_id}"
        (server,) = openstack.call("nova", "GET", f"/servers/detail?all_tenants=1&name={name}")["servers"]
        assert server["status"] == "ACTIVE" and server["metadata"] == {"vipu-vpod": acme_id}
        (network,) = openstack.call("neutron", "GET", f"/v2.0/networks?name={name}")["networks"]
        acme_project = openstack.keystone._id("projects", "acme")
        assert server["tenant_id"] == network["project_id"] == acme_project  # the tenant's, not the orchestrator's
        # The tenant's own token sees them; another tenant's sees none of them
        seen = seen_by(openstack, tokens["acme"])
        seen["ports"].discard("")  # Neutron's own on the network (DHCP, the router's interface), unnamed
        assert seen == {"servers": {name}, "networks": {name}, "ports": {name}, "security-groups": {name, "default"}}
        assert seen_by(openstack, tokens["bravo"]) == {"servers": set(), "networks": set(), "ports": set(),
                                                       "security-groups": {"default"}}

        # No secret in the user data Nova keeps: the controller fetched them once, with a token that is spent
        detail = openstack.call("nova", "GET", f"/servers/{server['id']}", headers={"OpenStack-API-Version": "compute 2.3"})["server"]
        user_data = base64.b64decode(detail["OS-EXT-SRV-ATTR:user_data"]).decode()
        directory = site.data / "vpods" / acme_id
        store_url = (directory / "store-url").read_text().strip()
        password = urllib.parse.urlsplit(store_url).password
        assert password and len(password) >= 16
        keys = [path.read_text() for path in (directory / "vipu-certs").rglob("*-key.pem")]
        assert len(keys) >= 2  # the controller's server key and its agent-link key
        written = carried(user_data)
        assert "PRIVATE KEY" not in written and password not in written and store_url not in written
        assert not any(key in written for key in keys)
        token, url = handed_over(user_data)
        assert url.startswith("https://127.0.0.1:") and url.endswith(f"/v1/controller-secrets/{acme_id}")
        authority = TlsFiles(site.data / "site-certs").ca_cert
        again = subprocess.run([str(BIN / "vipu-vpod"), "fetch-secrets", url, "--authority", str(authority),
                                "--into", str(tmp_path / "stolen")], input=token + "\n", capture_output=True, text=True, timeout=60)
        failed_line(Result(again.returncode, again.stdout, again.stderr), "fetch secrets", url,
                    "refused the controller's secrets: no controller secrets are waiting for this token: it was used already")
        assert not (tmp_path / "stolen").exists()
        (subnet,) = openstack.call("neutron", "GET", f"/v2.0/subnets?network_id={network['id']}")["subnets"]
        assert subnet["cidr"].startswith("10.40.") and subnet["cidr"].endswith("/28")
        address = server["addresses"][name][0]["addr"]
        (group,) = openstack.call("neutron", "GET", f"/v2.0/security-groups?name={name}")["security_groups"]
        ingress = [(r["protocol"], r["remote_ip_prefix"]) for r in group["security_group_rules"] if r["direction"] == "ingress"]
        assert ingress == [("tcp", subnet["cidr"])]  # from the vPOD's network only
        assert [(r["port_range_min"], r["port_range_max"]) for r in group["security_group_rules"] if r["direction"] == "ingress"] == [
            (min(site.rest("GET", f"/v1/vpods/{acme_id}")["vpod"][p] for p in ("user_port", "admin_port", "metrics_port")),
             max(site.rest("GET", f"/v1/vpods/{acme_id}")["vpod"][p] for p in ("user_port", "admin_port", "metrics_port")))]
        (router,) = openstack.call("neutron", "GET", "/v2.0/routers?name=site-router")["routers"]
        interfaces = openstack.call("neutron", "GET", f"/v2.0/ports?device_id={router['id']}")["ports"]
        assert [p["fixed_ips"][0]["subnet_id"] for p in interfaces] == [subnet["id"]]  # reached through the site's router
        config = tmp_path / "acme" / "acme.vipu-cli.hcl"
        assert address in config.read_text()  # the tenant reaches its controller at its server

        # The user's Poplar VM, on the Poplar hosts' zone, on the vPOD's network, its vipu configured
        public_key = Ed25519PrivateKey.generate().public_key().public_bytes(Encoding.OpenSSH, PublicFormat.OpenSSH).decode()
        openstack.call("nova", "POST", "/os-keypairs", {"keypair": {"name": "alice", "public_key": public_key}})
        booted = site.vpod("vm", "create", acme_id, "poplar1", "--flavor", "vpod-controller", "--image", "vipu-controller",
                           "--key", "alice")
        assert booted.code == 0, booted.err
        (vm,) = site.rest("GET", f"/v1/vpods/{acme_id}/vms")["vms"]
        assert booted.out == f"create vm (poplar1): success. Address {vm['address']}; log in with: ssh debian@{vm['address']}\n"
        assert vm["status"] == "ACTIVE" and vm["address"].startswith(subnet["cidr"].rsplit(".", 1)[0])
        server = openstack.call("nova", "GET", f"/servers/{vm['server_id']}")["server"]
        assert (server["key_name"], server["OS-EXT-AZ:availability_zone"], list(server["addresses"])) == ("alice", "nova", [name])
        assert server["security_groups"] == [{"name": f"{name}-vms"}]  # SSH from the site's networks, and each other; not the default
        (vm_group,) = openstack.call("neutron", "GET", f"/v2.0/security-groups?name={name}-vms")["security_groups"]
        assert sorted(((r["protocol"], r["port_range_min"], r["port_range_max"], r["remote_ip_prefix"])
                       for r in vm_group["security_group_rules"] if r["direction"] == "ingress"), key=str) == [
            ("tcp", 22, 22, "192.0.2.0/24"), ("tcp", 22, 22, "198.51.100.7/32"), ("tcp", None, None, subnet["cidr"])]
        # The site's limit of Poplar VMs per vPOD (1 here): the next is refused in one line, nothing made
        failed_line(site.vpod("vm", "create", acme_id, "poplar2", "--flavor", "vpod-controller", "--image", "vipu-controller",
                              "--key", "alice"), "create vm", "poplar2",
                    f"vPOD {acme_id} has 1 Poplar VM, as many as the site allows a vPOD (--openstack-vm-limit 1); delete one first")
        assert sorted(s["name"] for s in openstack.call("nova", "GET", "/servers?all_tenants=1")["servers"]) == [name, f"{name}-vm-poplar1"]

        # Inside the VM (its vipu configuration is where the boot put it): a partition, and a program on its IPUs
        inside = openstack.machines.directory / vm["server_id"]

        def user(*args: str) -> subprocess.CompletedProcess:
            return subprocess.run([str(BIN / "vipu"), "--config", str(inside / "vipu-cli.hcl"), *args], capture_output=True,
                                  text=True, timeout=60)
        made = user("create", "partition", "p1", "--size", "8")
        assert made.returncode == 0, made.stderr
        assert site.held("m01") == ["p1"]

        # The controller's server stopped (a host's maintenance, say): vipu-vpod makes it again, its partition kept
        (controller,) = named_servers(openstack, name)
        openstack.call("nova", "POST", f"/servers/{controller['id']}/action", {"os-stop": None})
        wait_until(lambda: [(s["id"] != controller["id"], s["status"]) for s in named_servers(openstack, name)] == [(True, "ACTIVE")],
                   timeout=120, what="the stopped controller's server to be made again")
        wait_until(lambda: user("list", "partitions").returncode == 0, timeout=60, what="the new server's controller")
        assert " p1 " in user("list", "partitions").stdout
        configs = user("get", "partition", "p1", "--ipu-configs", "--json")
        assert configs.returncode == 0, configs.stderr
        files = []
        for entry in json.loads(configs.stdout):
            files.append(inside / f"p1_gcd{entry['gcd']}_ipuof.conf")
            files[-1].write_text(json.dumps(entry["ipuof_config"]))
        ran = subprocess.run([str(BIN / "vipu-ipuof"), "run", *map(str, files)], capture_output=True, text=True, timeout=60)
        assert ran.returncode == 0 and "ran the test program" in ran.stdout, ran.stdout + ran.stderr
        assert user("remove", "partition", "p1").returncode == 0
        assert site.vpod("vm", "delete", acme_id, "poplar1").out == "delete vm (poplar1): success.\n"
        assert site.rest("GET", f"/v1/vpods/{acme_id}/vms")["vms"] == []
        failed_line(site.vpod("vm", "create", acme_id, "poplar2", "--flavor", "vpod-controller", "--image", "no-such-image",
                              "--key", "alice"), "create vm", "poplar2", "Glance has no image no-such-image")
        # The tenant's own key instead of a key pair of the orchestrator's user: it rides in the user data
        (tmp_path / "alice.pub").write_text(public_key + "\n")
        (tmp_path / "junk.pub").write_text("not a key\n")
        failed_line(site.vpod("vm", "create", acme_id, "poplar3", "--flavor", "vpod-controller", "--image", "vipu-controller"),
                    "create vm", "poplar3", "say who may log in to the VM: a Nova key pair (--key) or a public key (--public-key)")
        failed_line(site.vpod("vm", "create", acme_id, "poplar3", "--flavor", "vpod-controller", "--image", "vipu-controller",
                              "--public-key", str(tmp_path / "junk.pub")),
                    "create vm", "poplar3", "the public key is not an OpenSSH public key (one line, as in id_ed25519.pub)")
        assert site.vpod("vm", "create", acme_id, "poplar3", "--flavor", "vpod-controller", "--image", "vipu-controller",
                         "--public-key", str(tmp_path / "alice.pub")).code == 0  # one left for the release to delete
        (vm,) = site.rest("GET", f"/v1/vpods/{acme_id}/vms")["vms"]
        server = openstack.call("nova", "GET", f"/servers/{vm['server_id']}", headers={"OpenStack-API-Version": "compute 2.3"})["server"]
        assert server["key_name"] is None
        assert base64.b64encode(public_key.encode() + b"\n").decode() in base64.b64decode(server["OS-EXT-SRV-ATTR:user_data"]).decode()

        released = site.vpod("release", acme_id)
        assert released.code == 0, released.err
        assert openstack.call("nova", "GET", "/servers?all_tenants=1")["servers"] == []  # the VM too
        assert openstack.call("neutron", "GET", f"/v2.0/ports?device_id={router['id']}")["ports"] == []  # detached
        for kind, path in (("nova", f"/servers?all_tenants=1&name={name}"), ("neutron", f"/v2.0/networks?name={name}"),
                           ("neutron", f"/v2.0/ports?name={name}"), ("neutron", f"/v2.0/security-groups?name={name}"),
                           ("neutron", f"/v2.0/security-groups?name={name}-vms")):
            assert next(iter(openstack.call(kind, "GET", path).values())) == [], path
        assert all(site.held(f"m0{n}") == [] for n in range(1, 5))

        # Nova's refusal is the creation's one line, and the undo leaves nothing in OpenStack
        project = openstack.keystone._id("projects", "bravo")
        openstack.call("nova", "PUT", f"/os-quota-sets/{project}", {"quota_set": {"instances": 0}})
        try:
            refused = site.vpod("create", "bravo", "--machines", "4")
        finally:
            openstack.call("nova", "DELETE", f"/os-quota-sets/{project}")
        assert refused.code == 1 and refused.out == "", refused
        (line,) = refused.err.splitlines()
        assert line.startswith("create vpod (bravo): failed: cannot start the controller of vPOD bravo-1: ")
        assert "Quota exceeded for instances" in line, line
        assert openstack.call("nova", "GET", "/servers?all_tenants=1")["servers"] == []
        assert openstack.call("neutron", "GET", "/v2.0/networks")["networks"] == []
        groups = openstack.call("neutron", "GET", "/v2.0/security-groups")["security_groups"]
        assert {g["name"] for g in groups} == {"default"}  # each project's own, which Neutron made
        bravo = site.rest("GET", "/v1/vpods/bravo-1")["vpod"]
        assert bravo["state"] == "Released" and "Quota exceeded for instances" in bravo["error"]  # undone, the reason kept
        assert all(not machine["vpod"] for machine in site.rest("GET", "/v1/machines")["machines"])

        # A tenant with no project in Keystone (or none where vipu-vpod's user has a role): one line, nothing made
        refused = site.vpod("create", "charlie", "--machines", "4")
        assert refused.code == 1 and len(refused.err.splitlines()) == 1, refused
        assert refused.err.startswith("create vpod (charlie): failed: cannot act in Keystone project charlie "), refused.err
        assert site.rest("GET", "/v1/vpods/charlie-1")["vpod"]["state"] == "Released"
        assert openstack.call("neutron", "GET", "/v2.0/networks")["networks"] == []
        assert all(not machine["vpod"] for machine in site.rest("GET", "/v1/machines")["machines"])
    finally:
        site.stop()


def test_kill_9_of_the_orchestrator_at_each_step_leaks_nothing_in_openstack(openstack, cloud, postgres_of_its_own, tmp_path):
    """vipu-vpod SIGKILLs itself at a point of a creation, is started again and finishes it (one
    server, one network of the vPOD's), then at a point of the release, and finishes that (nothing
    of the vPOD's left in Nova or Neutron)."""
    site = Site(tmp_path / "site", machines=4, env=cloud)
    options = ("--provider", "openstack", "--openstack-cloud", "site", "--openstack-image", "vipu-controller",
               "--openstack-flavor", "vpod-controller", "--openstack-subnet-pool", "vpods",
               "--openstack-store", postgres_of_its_own.url("postgres"), "--openstack-handover-port", str(free_port()),
               "--openstack-projects", "site")  # all in the clouds.yaml entry's project: tenants t0, t1, t2 have none

    def named(service: str, path: str, name: str) -> list[dict]:
        return next(iter(openstack.call(service, "GET", f"{path}?name={name}").values()))

    def killed_at(point: str, call: subprocess.Popen) -> None:
        assert site.server is not None
        call.communicate(timeout=300)
        assert site.server.wait(timeout=120) == -signal.SIGKILL, point
        assert site.log_since_served().rstrip().endswith(f"crash point {point} reached: SIGKILL"), point
        site.serve(*options)  # resumes what was under way

    rounds = [("openstack:network-made", "release:emptied"), ("controller:launched", "release:taken-back"),
              ("create:started", "release:stopped")]
    try:
        for n, (create_at, release_at) in enumerate(rounds):
            tenant = f"t{n}"
            vpod_id, name = f"{tenant}-1", f"vpod-{tenant}-1"
            site.serve(*options, crash_at=create_at)
            killed_at(create_at, site.vpod_in_background("create", tenant, "--machines", "4"))
            wait_until(lambda vpod_id=vpod_id: site.rest("GET", f"/v1/vpods/{vpod_id}")["vpod"]["state"] == "Active",
                       timeout=120, what=f"the creation cut at {create_at} to be finished")
            assert [(s["status"], s["tenant_id"]) for s in named("nova", "/servers/detail", name)] == [
                ("ACTIVE", openstack.keystone._id("projects", "admin"))], create_at  # the clouds.yaml entry's project
            assert len(named("neutron", "/v2.0/networks", name)) == len(named("neutron", "/v2.0/ports", name)) == 1, create_at
            site.server.terminate()
            site.server.wait(timeout=30)
            site.serve(*options, crash_at=release_at)
            killed_at(release_at, site.vpod_in_background("release", vpod_id))
            wait_until(lambda vpod_id=vpod_id: site.rest("GET", f"/v1/vpods/{vpod_id}")["vpod"]["state"] == "Released",
                       timeout=120, what=f"the release cut at {release_at} to be finished")
            for service, path in (("nova", "/servers"), ("neutron", "/v2.0/networks"), ("neutron", "/v2.0/ports"),
                                  ("neutron", "/v2.0/security-groups")):
                assert named(service, path, name) == [], (release_at, path)
            assert all(not machine["vpod"] for machine in site.rest("GET", "/v1/machines")["machines"]), release_at
            site.server.terminate()
            site.server.wait(timeout=30)
    finally:
        site.stop()
