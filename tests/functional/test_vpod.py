"""Tenant vPODs on a simulated site of 16 machines: a controller per tenant, machines handed over
through agent ownership, tenants kept apart, releases that leave machines clean for the next."""

from __future__ import annotations

import base64
import itertools
import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import psycopg
import pytest

from tests.functional.harness import BIN, Result, blocks, failed_line, wait_until
from tests.keystone import ADMIN_PASSWORD, Keystone
from tests.kubecluster import KubeCluster
from tests.kubelet import Kubelet
from tests.ports import free_port, free_run
from tests.processes import dying_with_parent
from vipu.api.protos import agent_pb2, agent_pb2_grpc
from vipu.api.tls import TlsFiles, client_credentials
from vipu.backends.sim.rack import generate_rack, save_rack
from vipu.client.settings import ClientSettings, parse_hcl, write_client_config
from vipu.model.entities import IldTopology
from vipu.vpod.crash import CRASH_AT_VARIABLE, CRASH_POINTS, CREATE_POINTS, RELEASE_POINTS
from vipu.vpod.store import VpodStore

pytestmark = pytest.mark.functional

RBAC = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes" / "vipu-vpod-rbac.yaml"


class Site:
    """A site: its rack's agents (one process), `vipu-vpod init` and `vipu-vpod serve`."""

    def __init__(self, directory: Path, machines: int = 16, env: dict[str, str] | None = None,
                 topology: IldTopology = IldTopology.MESH, ilds: int = 1, db_url: str | None = None):
        """`env`: vipu-vpod's environment (KUBECONFIG, say); `topology` and `ilds`: how the rack is
        cabled; `db_url`: the orchestrator's store, if not SQLite in its data directory."""
        self.directory = directory
        self.env = env
        self.data = directory / "vpod"
        self.db_options = ("--db", db_url) if db_url else ()
        self.rack_path = directory / "site.yaml"
        self.rack = generate_rack(machines, topology=topology, num_ilds=ilds, time_scale=0.001)
        for machine in self.rack.machines:
            machine.port, machine.ipuof_port = free_port(), free_port()
        save_rack(self.rack, self.rack_path)
        self.port = free_port()
        self.port_base = free_run(30)  # tenants' controllers: three ports each from here
        self.server: subprocess.Popen | None = None
        self.serve_options: tuple[str, ...] = ()  # kept for restarts
        done = subprocess.run([str(BIN / "vipu-vpod"), "init", "--data-dir", str(self.data), *self.db_options, "--tls-hosts",
                               "localhost,127.0.0.1"],
                              capture_output=True, text=True, timeout=60, check=True)
        self.key = next(line.split("'")[1] for line in done.stdout.splitlines() if line.startswith("Administrator key is"))
        with open(directory / "agents.log", "ab") as log:
            self.agents = subprocess.Popen(dying_with_parent(
                [sys.executable, "-m", "vipu.agent", "--rack", str(self.rack_path), "--all-machines", "--announce-interval", "0",
                 "--tls-dir", str(TlsFiles(self.data / "site-certs").agents_dir)]), stdout=log, stderr=subprocess.STDOUT)
        wait_until(lambda: "served on" in (directory / "agents.log").read_text()
                   and (directory / "agents.log").read_text().count("served on") == machines, what="the site's agents")

    def serve(self, *extra: str, crash_at: str | None = None) -> None:
        """Start vipu-vpod; with `crash_at`, one that SIGKILLs itself at that point (vipu.vpod.crash)."""
        self.serve_options = extra or self.serve_options
        env = {**(self.env or os.environ)}
        env.pop(CRASH_AT_VARIABLE, None)
        if crash_at is not None:
            env[CRASH_AT_VARIABLE] = crash_at
        self.served_from = self.log_size()
        with open(self.directory / "vpod.log", "ab") as log:
            self.server = subprocess.Popen(
                [str(BIN / "vipu-vpod"), "serve", "--data-dir", str(self.data), *self.db_options, "--rack", str(self.rack_path),
                 "--port", str(self.port), "--port-base", str(self.port_base), *self.serve_options],
                stdout=log, stderr=subprocess.STDOUT, env=env)
        wait_until(self._answers, timeout=60, what="vipu-vpod")

    def log_size(self) -> int:
        log = self.directory / "vpod.log"
        return log.stat().st_size if log.exists() else 0

    def log_since_served(self) -> str:
        return (self.directory / "vpod.log").read_text()[self.served_from:]

    def _answers(self) -> bool:
        if self.server is not None and self.server.poll() is not None:
            raise AssertionError((self.directory / "vpod.log").read_text()[-3000:])
        try:
            self.rest("GET", "/v1/machines")
            return True
        except OSError:
            return False

    def rest(self, method: str, path: str, key: str | None = None, body: dict | None = None) -> dict:
        request = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", method=method,
                                         data=json.dumps(body).encode() if body is not None else None,
                                         headers={"Authorization": f"Bearer {self.key if key is None else key}",
                                                  "Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=60) as answer:
            return json.loads(answer.read())

    def refused(self, method: str, path: str, key: str | None = None, body: dict | None = None) -> tuple[int, dict]:
        """The status and body of a call that must be refused."""
        with pytest.raises(urllib.error.HTTPError) as refusal:
            self.rest(method, path, key, body)
        return refusal.value.code, json.loads(refusal.value.read())

    def vpod(self, *args: str, cwd: Path | None = None) -> Result:
        done = subprocess.run([str(BIN / "vipu-vpod"), *args], capture_output=True, text=True, timeout=300, env=self._client_env(),
                              cwd=cwd or self.directory)
        return Result(done.returncode, done.stdout, done.stderr)

    def vpod_in_background(self, *args: str) -> subprocess.Popen:
        return subprocess.Popen([str(BIN / "vipu-vpod"), *args], env=self._client_env(), cwd=self.directory, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)

    def _client_env(self) -> dict[str, str]:
        return {**os.environ, "VIPU_VPOD_URL": f"http://127.0.0.1:{self.port}", "VIPU_VPOD_KEY": self.key}

    def controllers(self) -> dict[str, list[int]]:
        """The tenants' controllers running now, by vPOD id: every live process whose command line
        serves a vPOD's directory, whatever its pid file says (or if it has none)."""
        running: dict[str, list[int]] = {}
        vpods = str(self.data / "vpods") + "/"
        for entry in Path("/proc").iterdir():
            try:
                arguments = (entry / "cmdline").read_bytes().decode().split("\0") if entry.name.isdigit() else []
            except OSError:
                continue
            for option, value in itertools.pairwise(arguments):
                if option == "--data-dir" and value.startswith(vpods):
                    running.setdefault(value.removeprefix(vpods), []).append(int(entry.name))
        return running

    def controller_pids(self) -> dict[str, int]:
        """The tenants' controllers running now, by vPOD id: one each."""
        running = self.controllers()
        assert all(len(pids) == 1 for pids in running.values()), running
        return {vpod_id: pids[0] for vpod_id, pids in running.items()}

    def holder(self, machine_name: str) -> str:
        """The controller the machine's agent obeys ("" for none yet)."""
        address = f"127.0.0.1:{self.rack.machine(machine_name).port}"
        return self._agent(address, TlsFiles(self.data / "orchestrator")).GetInventory(agent_pb2.GetInventoryRequest(), timeout=10).holder

    def recorded(self, vpod_id: str) -> tuple[str, str]:
        """The vPOD's state and last step as its store has them, read while no vipu-vpod runs."""
        store = VpodStore(f"sqlite:///{self.data / 'vpod.db'}")
        try:
            vpod = store.get(vpod_id)
            return vpod.state, vpod.step
        finally:
            store.close()

    def held(self, machine_name: str) -> list[str]:
        """The partitions a machine holds, read as the controller holding it (or the orchestrator)."""
        address = f"127.0.0.1:{self.rack.machine(machine_name).port}"
        orchestrator = TlsFiles(self.data / "orchestrator")
        holder = self.holder(machine_name)
        reader = TlsFiles(self.data / "vpods" / holder.removeprefix("vpod-") / "vipu-certs") if holder.startswith("vpod-") else orchestrator
        reply = self._agent(address, reader).ListPartitions(agent_pb2.ListPartitionsRequest(), timeout=10)
        return [p.partition_id for p in reply.partitions]

    def _agent(self, address: str, identity: TlsFiles):
        credentials = client_credentials(identity.ca_for(identity.controller_dir), identity.controller_cert, identity.controller_key)
        return agent_pb2_grpc.AgentServiceStub(grpc.secure_channel(address, credentials))

    def stop(self) -> None:
        for vpod in self.rest("GET", "/v1/vpods")["vpods"] if self.server and self.server.poll() is None else []:
            self.vpod("release", vpod["id"])
        for pids in self.controllers().values():
            for pid in pids:
                os.kill(pid, signal.SIGKILL)
        for process in (self.server, self.agents):
            if process is not None and process.poll() is None:
                process.terminate()
                process.wait(timeout=30)


@pytest.fixture
def site(tmp_path):
    site = Site(tmp_path)
    try:
        site.serve()
        yield site
    finally:
        site.stop()


def created(result: Result) -> str:
    assert result.code == 0, result.err
    return result.out.split("(", 1)[1].split(")", 1)[0]


def run_vipu(config: Path, *args: str) -> Result:
    """vipu, as a tenant's user with that configuration file."""
    done = subprocess.run([str(BIN / "vipu"), "--config", str(config), *args], capture_output=True, text=True, timeout=60)
    return Result(done.returncode, done.stdout, done.stderr)


def test_two_tenants_of_keystone_get_controllers_of_their_own_kept_apart_and_a_release_leaves_machines_clean_for_a_third(tmp_path):
    """Seed 003 on a site of 16 machines, a real Keystone the tenants' identity: each tenant's
    user makes a vPOD of 8 machines with their project's token and partitions in their own
    controller; neither reaches the other's machines, controller or vPOD; a release leaves the
    machines clean for a third tenant. A project's token lists only its own vPODs, the
    administrators' token every tenant's; an expired, revoked or unknown token is refused in one line."""
    keystone = Keystone(tmp_path / "keystone", token_seconds=8).start()
    site = None
    try:
        for project in ("service", "acme", "bravo", "charlie"):
            keystone.project(project)
        keystone.user("vipu-vpod", "service-secret", "service", role="service")
        for user, project in (("alice", "acme"), ("bob", "bravo"), ("carol", "charlie")):
            keystone.user(user, f"{user}-secret", project)
        (tmp_path / "keystone-password").write_text("service-secret\n")
        site = Site(tmp_path / "site", topology=IldTopology.TORUS, ilds=2)  # two tori of 8 machines
        site.serve("--keystone-url", keystone.url, "--keystone-password-file", str(tmp_path / "keystone-password"))
        schemas = openapi(site, ["KeystoneToken", "AdminKey"])
        tokens = {"alice": "acme", "bob": "bravo", "carol": "charlie", "admin": "admin"}

        def token(user: str) -> str:
            return keystone.token(user, f"{user}-secret" if user != "admin" else ADMIN_PASSWORD, tokens[user])

        def as_user(user: str, *args: str) -> Result:
            return site.vpod("--token", token(user), *args)

        def rest(user: str, method: str, path: str, given: str | None = None) -> tuple[int, dict]:
            request = urllib.request.Request(f"http://127.0.0.1:{site.port}{path}", method=method,
                                             headers={"X-Auth-Token": given or token(user)})
            try:
                with urllib.request.urlopen(request, timeout=60) as answer:
                    return answer.status, json.loads(answer.read())
            except urllib.error.HTTPError as refused:
                return refused.code, json.loads(refused.read())

        acme_id = created(as_user("alice", "create", "acme", "--machines", "8", "--topology", "torus", "--out", str(tmp_path / "acme")))
        bravo_id = created(as_user("bob", "create", "bravo", "--machines", "8", "--out", str(tmp_path / "bravo")))
        acme, bravo = tmp_path / "acme" / "acme.vipu-cli.hcl", tmp_path / "bravo" / "bravo.vipu-cli.hcl"
        vpods = {v["id"]: v for v in site.rest("GET", "/v1/vpods")["vpods"]}
        assert sorted(vpods[acme_id]) == sorted(schemas["VpodView"]["properties"])  # the reply is the documented model
        assert (vpods[acme_id]["machines"], vpods[acme_id]["topology"], vpods[acme_id]["state"]) == (
            [f"m{n:02d}" for n in range(1, 9)], "torus", "Active")
        assert vpods[bravo_id]["machines"] == [f"m{n:02d}" for n in range(9, 17)]
        assert set(site.controller_pids()) == {acme_id, bravo_id}

        # the orchestration API: a project's token is that tenant, and another tenant's vPOD does not exist for it
        assert [v["id"] for v in rest("alice", "GET", "/v1/vpods")[1]["vpods"]] == [acme_id]
        assert sorted(v["id"] for v in rest("admin", "GET", "/v1/vpods")[1]["vpods"]) == sorted([acme_id, bravo_id])
        for method, path in (("GET", f"/v1/vpods/{bravo_id}"), ("GET", f"/v1/vpods/{bravo_id}/credentials"),
                             ("DELETE", f"/v1/vpods/{bravo_id}")):
            assert rest("alice", method, path) == (404, {"error": f"vPOD {bravo_id} does not exist"})
        failed_line(as_user("alice", "get", bravo_id, "--credentials", str(tmp_path / "stolen")), "get vpod", bravo_id,
                    f"vPOD {bravo_id} does not exist")
        failed_line(as_user("alice", "release", bravo_id), "release vpod", bravo_id, f"vPOD {bravo_id} does not exist")
        failed_line(as_user("alice", "create", "bravo", "--machines", "1"), "create vpod", "bravo",
                    "a token of project acme makes vPODs of tenant acme only, not bravo")
        assert rest("alice", "GET", "/v1/machines") == (403, {"error": "the site's machines are for its administrators"})
        assert not (tmp_path / "stolen").exists() and site.rest("GET", f"/v1/vpods/{bravo_id}")["vpod"]["state"] == "Active"

        # each tenant's user makes partitions in their own controller
        assert run_vipu(acme, "create", "partition", "a1", "--size", "32").code == 0
        assert run_vipu(bravo, "create", "partition", "b1", "--size", "8").code == 0
        assert site.held("m01") == ["a1"] and site.held("m09") == ["b1"]
        # a tenant's controller that dies is started again by the orchestrator and resumes from its store
        killed = site.controller_pids()[acme_id]
        os.kill(killed, signal.SIGKILL)
        wait_until(lambda: site.controller_pids().get(acme_id, killed) != killed and " a1 " in run_vipu(acme, "list", "partitions").out,
                   timeout=60, what="acme's controller to be started again with its partition")
        # acme's controller cannot configure bravo's machines, even as its administrator, nor take them
        acme_admin = site.data / "vpods" / acme_id / "vpod-admin.vipu-cli.hcl"
        register = [str(BIN / "vipu-admin"), "--config", str(acme_admin), "create", "agent", "stolen", "--host", "127.0.0.1",
                    "--port", str(site.rack.machine("m09").port)]
        for extra, reason in (((), f"machine m09 is held by controller vpod-{bravo_id}, not vpod-{acme_id}"),
                              (("--take-over",), "this controller does not hold the site's agent-link authority key")):
            done = subprocess.run([*register, *extra], capture_output=True, text=True, timeout=60)
            failed_line(Result(done.returncode, done.stdout, done.stderr), "create agent", "stolen", reason)
        assert site.held("m09") == ["b1"]
        # acme's credentials aimed at bravo's controller. As written, acme's client trusts acme's authority only
        # and refuses bravo's server; told to trust bravo's, it is refused by bravo's controller itself: acme's
        # client certificate at the handshake, and acme's user and key (with bravo's user's certificate) at the login
        alice_key = str(parse_hcl(acme.read_text(), str(acme))["api-access-key"])
        acme_certs, bravo_certs = tmp_path / "acme" / "acme-certs", tmp_path / "bravo" / "bravo-certs"
        bravo_port, bravo_metrics = vpods[bravo_id]["user_port"], vpods[bravo_id]["metrics_port"]
        failed_line(run_vipu(acme, "--api-port", str(bravo_port), "list", "partitions"), "list partitions", None,
                    f"vipu-server at 127.0.0.1:{bravo_port}: its certificate is not signed by the certificate authority in "
                    f"{acme_certs / 'ca.pem'}")
        refusals = failed_logins(bravo_metrics)
        for name, certificate, key, reason in (
            ("acme-certificate", acme_certs / "client.pem", acme_certs / "client-key.pem",
             f"vipu-server at 127.0.0.1:{bravo_port} closed the TLS connection: it does not accept the client certificate "
             f"{acme_certs / 'client.pem'}"),
            ("bravo-certificate", bravo_certs / "client.pem", bravo_certs / "client-key.pem",
             "invalid user id or access key for user acme"),
        ):
            config = tmp_path / f"{name}.vipu-cli.hcl"
            settings = ClientSettings("127.0.0.1", bravo_port, "acme", alice_key, bravo_certs / "ca.pem", certificate, key)
            write_client_config(config, settings)
            failed_line(run_vipu(config, "list", "partitions"), "list partitions", None, reason)
        assert failed_logins(bravo_metrics) == refusals + 1  # bravo's controller checked acme's key, and refused it
        assert run_vipu(bravo, "list", "partitions").code == 0

        # tokens that are not valid, in one line
        revoked, expiring = token("alice"), token("alice")
        keystone.revoke(revoked)
        assert rest("alice", "GET", "/v1/vpods", given=expiring)[0] == 200
        not_valid = (401, {"error": "the Keystone token is not valid: expired, revoked, or from another Keystone"})
        for given in (revoked, "not-a-token-of-this-keystone"):
            assert rest("alice", "GET", "/v1/vpods", given=given) == not_valid
        failed_line(site.vpod("--token", revoked, "list"), "list vpods", None, "the Keystone token is not valid")

        released = as_user("alice", "release", acme_id)
        assert (released.code, released.out) == (0, f"release vpod ({acme_id}): success.\n"), released.err
        assert acme_id not in site.controller_pids() and (site.data / "archive" / acme_id / "vipu.db").exists()
        machines = {m["name"]: m["vpod"] for m in site.rest("GET", "/v1/machines")["machines"]}
        assert [machines[f"m{n:02d}"] for n in range(1, 9)] == [""] * 8 and machines["m09"] == bravo_id
        assert all(site.held(f"m{n:02d}") == [] for n in range(1, 9))  # clean
        assert site.held("m09") == ["b1"]  # bravo untouched

        charlie_id = created(as_user("carol", "create", "charlie", "--machines", "8", "--out", str(tmp_path / "charlie")))
        assert site.rest("GET", f"/v1/vpods/{charlie_id}")["vpod"]["machines"] == [f"m{n:02d}" for n in range(1, 9)]
        assert run_vipu(tmp_path / "charlie" / "charlie.vipu-cli.hcl", "create", "partition", "c1", "--size", "32").code == 0
        assert site.held("m08") == ["c1"]
        assert sorted(v["id"] for v in json.loads(as_user("admin", "list", "--json").out)) == sorted([bravo_id, charlie_id])
        wait_until(lambda: rest("alice", "GET", "/v1/vpods", given=expiring) == not_valid, timeout=30,
                   what="the token to expire")  # remembered no longer than the token lives
        failed_line(site.vpod("--token", expiring, "list"), "list vpods", None, "the Keystone token is not valid")
    finally:
        if site is not None:
            site.stop()
        keystone.stop()


def failed_logins(metrics_port: int) -> float:
    """The logins a controller refused for invalid credentials, by its metrics."""
    with urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/metrics", timeout=10) as answer:
        lines = answer.read().decode().splitlines()
    return sum(float(line.split()[-1]) for line in lines if line.startswith('vipu_failed_logins_total{reason="invalid credentials"}'))


def test_refusals_are_one_line_and_change_nothing(site):
    before = site.rest("GET", "/v1/machines")
    for args, subject, reason in (
        (("create", "acme", "--machines", "17"), "acme", "no 17 free machines side by side: 16 of 16 are free"),
        (("create", "acme", "--machines", "8", "--topology", "torus"), "acme",
         "no run of 8 free machines is cabled as a torus"),
        (("create", "bad name", "--machines", "1"), "bad name", "invalid tenant id 'bad name'"),
        (("create", "acme", "--machines", "1", "--user", "vpod-admin"), "acme", "user vpod-admin is the orchestrator's own"),
        (("get", "nope"), "nope", "vPOD nope does not exist"),
        (("release", "nope"), "nope", "vPOD nope does not exist"),
    ):
        action = "get vpod" if args[0] == "get" else f"{args[0]} vpod"
        failed_line(site.vpod(*args), action, subject, reason)
    # and through the API, each refusal one line in the document's error model
    assert site.refused("POST", "/v1/vpods", body={"tenant": "acme", "machines": 0}) == (
        422, {"error": "the request is not valid: machines: Input should be greater than or equal to 1"})
    assert site.refused("POST", "/v1/vpods", body={"machines": 1}) == (422, {"error": "the request is not valid: tenant: Field required"})
    assert site.refused("GET", "/v1/nothing-here") == (404, {"error": "Not Found"})
    assert site.refused("GET", "/v1/vpods", key="not-the-key") == (
        401, {"error": "give the orchestrator's administrator key (Authorization: Bearer KEY)"})
    assert site.rest("GET", "/v1/machines") == before and site.rest("GET", "/v1/vpods")["vpods"] == []
    assert site.controller_pids() == {}


# Each route of the API: its success status and the model of its reply.
ROUTES = {("post", "/v1/vpods"): ("201", "CreatedReply"), ("get", "/v1/vpods"): ("200", "VpodsReply"),
          ("get", "/v1/vpods/{vpod_id}"): ("200", "VpodReply"), ("get", "/v1/vpods/{vpod_id}/credentials"): ("200", "CredentialsReply"),
          ("delete", "/v1/vpods/{vpod_id}"): ("200", "VpodReply"), ("get", "/v1/machines"): ("200", "MachinesReply"),
          ("post", "/v1/machines/repaired"): ("200", "MachinesReply"), ("post", "/v1/vpods/{vpod_id}/vms"): ("201", "VmReply"),
          ("get", "/v1/vpods/{vpod_id}/vms"): ("200", "VmsReply"), ("delete", "/v1/vpods/{vpod_id}/vms/{name}"): ("200", "VmReply")}


def openapi(site: Site, schemes: list[str]) -> dict:
    """The API's OpenAPI document, read with no credentials: every route there with its reply's
    model, its errors' model, and exactly `schemes` as the ways to authenticate. Its schemas."""
    with urllib.request.urlopen(f"http://127.0.0.1:{site.port}/openapi.json", timeout=30) as answer:
        document = json.loads(answer.read())
    operations = {(method, path): operation for path, item in document["paths"].items() for method, operation in item.items()}
    assert sorted(operations) == sorted(ROUTES)
    for route, (status, model) in ROUTES.items():
        responses = operations[route]["responses"]
        assert responses[status]["content"]["application/json"]["schema"] == {"$ref": f"#/components/schemas/{model}"}, route
        errors = [code for code in responses if code[0] in "45"]
        assert {"401", "500", "503"} <= set(errors) and ("422" in errors) == (route != ("get", "/v1/machines")), (route, errors)
        assert all(responses[code]["content"]["application/json"]["schema"] == {"$ref": "#/components/schemas/ErrorReply"}
                   for code in errors), route
        assert operations[route]["security"] == [{scheme: []} for scheme in schemes], route
    schemes_declared = document["components"]["securitySchemes"]
    assert sorted(schemes_declared) == sorted(schemes)
    assert (schemes_declared["AdminKey"]["type"], schemes_declared["AdminKey"]["scheme"]) == ("http", "bearer")
    if "KeystoneToken" in schemes:
        assert {k: schemes_declared["KeystoneToken"][k] for k in ("type", "in", "name")} == {"type": "apiKey", "in": "header",
                                                                                            "name": "X-Auth-Token"}
    assert "HTTPValidationError" not in json.dumps(document)  # validation errors are ErrorReply lines too
    return document["components"]["schemas"]


def test_the_openapi_document_declares_every_route_with_its_replies_and_security(site):
    schemas = openapi(site, ["AdminKey"])
    machine = site.rest("GET", "/v1/machines")["machines"][0]
    assert sorted(machine) == sorted(schemas["MachineView"]["properties"]) == sorted(schemas["MachineView"]["required"])


def check_invariants(site: Site) -> dict[str, dict]:
    """What must hold whenever vipu-vpod is up again: every vPOD not released is Active (a
    creation or release under way was finished) with exactly one controller running; no
    controller runs for anything else; no machine is in two vPODs; each machine of a vPOD obeys
    that vPOD's controller, as its agent says, and each free machine obeys no tenant and is clean.
    The vPODs, by id."""
    vpods = {v["id"]: v for v in site.rest("GET", "/v1/vpods")["vpods"]}
    machines = {m["name"]: m["vpod"] for m in site.rest("GET", "/v1/machines")["machines"]}
    for vpod in vpods.values():
        assert vpod["state"] == "Active", vpod
        assert all(machines[name] == vpod["id"] for name in vpod["machines"]), (vpod, machines)
    assert {owner for owner in machines.values() if owner} <= set(vpods)
    running = site.controllers()
    assert sorted(running) == sorted(vpods) and all(len(pids) == 1 for pids in running.values()), (running, vpods)
    for name, owner in machines.items():
        holder = site.holder(name)
        if owner:
            assert holder == f"vpod-{owner}", (name, owner, holder)
        else:
            assert holder in ("", "vipu-vpod") and site.held(name) == [], (name, holder)
    return vpods


# What the store says at each crash point: the step recorded last, and the vPOD's state then.
RECORDED_AT = {"openstack:network-made": ("Creating", "reserved"),  # test_openstack.py's
               "create:reserved": ("Creating", "reserved"), "create:prepared": ("Creating", "prepared"),
               "controller:launched": ("Creating", "prepared"), "create:started": ("Creating", "started"),
               "create:handing": ("Creating", "started"), "create:handed": ("Creating", "handed"),
               "create:configured": ("Creating", "configured"), "create:active": ("Active", "active"),
               "release:begun": ("Releasing", "active"), "release:emptied": ("Releasing", "emptied"),
               "release:testing": ("Releasing", "emptied"), "release:tested": ("Releasing", "tested"),
               "release:taking-back": ("Releasing", "tested"), "release:taken-back": ("Releasing", "taken-back"),
               "release:stopped": ("Releasing", "stopped"), "release:archived": ("Releasing", "archived"),
               "release:released": ("Released", "released")}


def test_kill_9_of_the_orchestrator_at_every_step_of_a_create_and_a_release_leaves_the_invariants(site, tmp_path):
    """vipu-vpod SIGKILLs itself at each crash point of vipu.vpod.crash in turn (each step of a
    creation and of a release, right after the store recorded it, and the points in the middle of
    steps), beside a vPOD of another tenant that must not notice. Each time the test checks where
    it died, starts it again, and checks the invariants once the operation was finished. Releases
    run the cluster test too."""
    assert sorted(RECORDED_AT) == sorted(CRASH_POINTS)
    bystander_id = created(site.vpod("create", "keep", "--machines", "4", "--out", str(tmp_path / "keep")))
    keep = tmp_path / "keep" / "keep.vipu-cli.hcl"
    assert run_vipu(keep, "create", "partition", "k1", "--size", "16").code == 0
    rounds = list(itertools.zip_longest(CREATE_POINTS, RELEASE_POINTS))
    restart(site, "--test-on-release", crash_at=rounds[0][0])
    for n, (create_at, release_at) in enumerate(rounds):
        tenant, vpod_id = f"t{n}", f"t{n}-1"
        creating = site.vpod_in_background("create", tenant, "--machines", "4", "--out", str(tmp_path / tenant))
        died_at(site, create_at, vpod_id, creating)
        restart(site, crash_at=release_at)  # resumes the creation
        vpods = check_invariants(site)
        assert vpods[vpod_id]["machines"] == ["m05", "m06", "m07", "m08"], (create_at, vpods[vpod_id])
        assert vpods[bystander_id]["machines"] == ["m01", "m02", "m03", "m04"] and site.held("m01") == ["k1"]  # untouched
        got = site.vpod("get", vpod_id, "--credentials", str(tmp_path / tenant))  # whether or not the creator heard back
        assert got.code == 0 and got.err == f"configuration written: {tmp_path / tenant / f'{tenant}.vipu-cli.hcl'}\n", got.err
        assert run_vipu(tmp_path / tenant / f"{tenant}.vipu-cli.hcl", "create", "partition", "p", "--size", "16").code == 0

        releasing = site.vpod_in_background("release", vpod_id)
        died_at(site, release_at, vpod_id, releasing)
        next_create = rounds[n + 1][0] if n + 1 < len(rounds) else None
        restart(site, crash_at=next_create)  # resumes the release
        assert vpod_id not in check_invariants(site), release_at
        assert site.rest("GET", f"/v1/vpods/{vpod_id}")["vpod"]["state"] == "Released"
        assert [m["name"] for m in site.rest("GET", "/v1/machines")["machines"] if m["held_back"]] == [], release_at
    assert site.held("m01") == ["k1"] and run_vipu(keep, "list", "partitions").code == 0


def restart(site: Site, *options: str, crash_at: str | None) -> None:
    """Start vipu-vpod again, stopping it first if it did not kill itself."""
    assert site.server is not None
    if site.server.poll() is None:
        site.server.terminate()
        site.server.wait(timeout=30)
    site.serve(*options, crash_at=crash_at)


def died_at(site: Site, point: str | None, vpod_id: str, client: subprocess.Popen) -> None:
    """vipu-vpod killed itself at `point` during the client's call (none: the call succeeded), and
    what the store, the machines and the controllers show is that point, no earlier, no later."""
    assert site.server is not None
    _, err = client.communicate(timeout=300)
    if point is None:
        assert client.returncode == 0, err
        return
    assert site.server.wait(timeout=60) == -signal.SIGKILL, point
    assert site.log_since_served().rstrip().endswith(f"crash point {point} reached: SIGKILL"), (point, site.log_since_served()[-2000:])
    assert client.returncode == 1 and len(err.splitlines()) == 1 and "cannot reach the orchestrator" in err, (point, err)
    assert site.recorded(vpod_id) == RECORDED_AT[point], point
    machines = ["m05", "m06", "m07", "m08"]
    controllers = site.controllers()
    if point == "controller:launched":  # started, and its pid file never written: only its command line finds it
        assert len(controllers.get(vpod_id, [])) == 1 and not (site.data / "vpods" / vpod_id / "controller.pid").exists()
    if point == "create:handing":
        assert [site.holder(m) == f"vpod-{vpod_id}" for m in machines] == [True, False, False, False]
    if point == "release:taking-back":
        assert [site.holder(m) for m in machines] == ["vipu-vpod"] + [f"vpod-{vpod_id}"] * 3
    if point in ("release:stopped", "release:archived", "release:released"):
        assert vpod_id not in controllers


@pytest.mark.postgres
def test_on_postgresql_a_torus_of_two_ipu_link_domains_is_made_shown_resumed_and_released(tmp_path, postgres_url):
    """The orchestrator's store on a real PostgreSQL (serve --db), a vPOD asked for with --topology
    and --ilds, shown by get, adopted by a restarted vipu-vpod, and released."""
    site = Site(tmp_path, machines=8, topology=IldTopology.TORUS, ilds=2, db_url=postgres_url)
    try:
        site.serve()
        vpod_id = created(site.vpod("create", "acme", "--machines", "8", "--topology", "torus", "--ilds", "2",
                                    "--out", str(tmp_path / "acme")))
        (document,) = json.loads(site.vpod("get", vpod_id, "--json").out)
        assert (document["topology"], document["ilds"], document["state"]) == ("torus", 2, "Active")
        shown = site.vpod("get", vpod_id)
        assert shown.code == 0 and [[cell.strip() for cell in line.split("|")] for line in blocks(shown.out)[1]] == [
            [vpod_id, "acme", "Active", "m01..m08 (8)", "torus", "acme", str(document["user_port"]), ""]], shown.out
        cluster = subprocess.run([str(BIN / "vipu-admin"), "--config", str(site.data / "vpods" / vpod_id / "vpod-admin.vipu-cli.hcl"),
                                  "get", "cluster", "cl0", "--json"], capture_output=True, text=True, timeout=60)
        assert cluster.returncode == 0, cluster.stderr
        shape = {k: v for k, v in json.loads(cluster.stdout).items() if k in ("topology", "num_ipulinkdomains", "agent_ids")}
        assert shape == {"topology": "ILD_TOPOLOGY_TORUS", "num_ipulinkdomains": 2, "agent_ids": [f"m0{n}" for n in range(1, 9)]}
        with psycopg.connect(postgres_url) as store:  # the orchestrator's rows are there, not in a SQLite file
            assert store.execute("SELECT id, state, topology, ilds FROM vpods").fetchall() == [(vpod_id, "Active", "torus", 2)]
        assert not (site.data / "vpod.db").exists()

        config = tmp_path / "acme" / "acme.vipu-cli.hcl"
        assert run_vipu(config, "create", "partition", "p1", "--size", "16").code == 0
        restart(site, crash_at=None)  # adopts the controller, from what PostgreSQL keeps
        assert check_invariants(site)[vpod_id]["state"] == "Active" and " p1 " in run_vipu(config, "list", "partitions").out
        released = site.vpod("release", vpod_id)
        assert released.code == 0, released.err
        with psycopg.connect(postgres_url) as store:
            assert store.execute("SELECT state FROM vpods").fetchall() == [("Released",)]
            assert store.execute("SELECT count(*) FROM site_machines WHERE vpod_id IS NOT NULL").fetchone() == (0,)
        assert check_invariants(site) == {}
    finally:
        site.stop()


def test_with_a_release_test_the_machines_a_failing_cable_joins_are_held_back_until_repaired(tmp_path):
    site = Site(tmp_path, machines=8)
    try:
        site.serve("--test-on-release")
        acme_id = created(site.vpod("create", "acme", "--machines", "4", "--out", str(tmp_path / "acme")))
        unplugged = subprocess.run([str(BIN / "vipu-sim"), "fault", str(site.rack_path), "--unplug", "m02:IPU-Link:5"],
                                   capture_output=True, text=True, timeout=60)
        assert unplugged.returncode == 0, unplugged.stderr
        released = site.vpod("release", acme_id)
        assert released.code == 0, released.err
        machines = {m["name"]: m for m in site.rest("GET", "/v1/machines")["machines"]}
        assert [bool(machines[f"m0{n}"]["held_back"]) for n in range(1, 6)] == [False, True, True, False, False]
        failed_cable = "Cabling 11/12: m02:5 [IPU-Link] <--> m03:1 [IPU-Link] (failed)"
        assert machines["m02"]["held_back"] == machines["m03"]["held_back"] == failed_cable
        assert all(machines[f"m0{n}"]["vpod"] == "" and site.held(f"m0{n}") == [] for n in range(1, 5))  # clean all the same
        assert "m02:5 [IPU-Link] <--> m03:1" in site.vpod("machines").out

        bravo_id = created(site.vpod("create", "bravo", "--machines", "4", "--out", str(tmp_path / "bravo")))
        assert site.rest("GET", f"/v1/vpods/{bravo_id}")["vpod"]["machines"] == ["m04", "m05", "m06", "m07"]
        failed_line(site.vpod("create", "charlie", "--machines", "2"), "create vpod", "charlie",
                    "no 2 free machines side by side: 2 of 8 are free (2 held back after a failed release test)")
        failed_line(site.vpod("repaired", "m01", "m02"), "repaired", "m01,m02", "machine m01 is not held back; it is in the pool already")
        assert site.vpod("repaired", "m02", "m03").out == "repaired (m02,m03): success.\n"
        charlie_id = created(site.vpod("create", "charlie", "--machines", "2", "--out", str(tmp_path / "charlie")))
        assert site.rest("GET", f"/v1/vpods/{charlie_id}")["vpod"]["machines"] == ["m01", "m02"]
    finally:
        site.stop()


def test_on_kubernetes_each_tenant_controller_is_a_deployment_that_resumes_from_its_own_database(tmp_path, postgres_of_its_own):
    """With a namespace, a vPOD's controller is a Deployment (real API server, Deployment and
    ReplicaSet controllers, scheduler; the test kubelet runs pods as processes here), its store a
    PostgreSQL database of its own: a pod deleted, or the Deployment itself, comes back with the
    tenant's partitions; a release leaves no object behind and keeps the database."""
    kube = KubeCluster(workload_controllers=True)
    kubelet = site = None
    try:
        kube.add_node("vpod-host")
        kube.kubectl("apply", "-f", str(RBAC))  # vipu-vpod acts with the rights the project documents, no more
        token = kube.kubectl("create", "token", "vipu-vpod", "--namespace", "vipu-vpod", "--duration", "1h").stdout.strip()
        kubeconfig = kube.write_kubeconfig(tmp_path / "vipu-vpod.kubeconfig", {"token": token})
        kubelet = Kubelet(kube, tmp_path / "kubelet", path=[str(BIN)])
        site = Site(tmp_path / "site", machines=4, env={**os.environ, "KUBECONFIG": str(kubeconfig)})
        site.serve("--kubernetes-namespace", "vpods", "--kubernetes-image", "registry.example/vipu:test", "--kubernetes-store",
                   postgres_of_its_own.url("postgres"), "--kubernetes-controller-host", "127.0.0.1")
        acme_id = created(site.vpod("create", "acme", "--machines", "4", "--out", str(tmp_path / "acme")))
        config = tmp_path / "acme" / "acme.vipu-cli.hcl"

        def user(*args: str) -> Result:
            done = subprocess.run([str(BIN / "vipu"), "--config", str(config), *args], capture_output=True, text=True, timeout=60)
            return Result(done.returncode, done.stdout, done.stderr)

        def objects(kind: str) -> list[dict]:
            return json.loads(kube.kubectl("get", kind, "--namespace", "vpods", "-o", "json").stdout)["items"]

        (deployment,) = objects("deployments")
        name = deployment["metadata"]["name"]
        assert deployment["metadata"]["annotations"]["vipu.graphcore.ai/vpod-id"] == acme_id
        assert [o["metadata"]["name"] for o in objects("services")] == [name]
        (secret,) = [o for o in objects("secrets") if o["metadata"]["name"] == name]
        assert sorted(secret["data"]) == ["controller__ca.pem", "controller__controller-key.pem", "controller__controller.pem",
                                          "server__ca.pem", "server__server-key.pem", "server__server.pem", "store-url"]  # no CA key
        store_url = base64.b64decode(secret["data"]["store-url"]).decode()
        assert f"://vpod-{acme_id}:" in store_url and store_url.endswith(f"/vpod-{acme_id}")  # a role and database of its own
        assert site.controller_pids() == {}  # no controller of this host's
        assert user("create", "partition", "p1", "--size", "8").code == 0
        assert site.held("m01") == ["p1"]
        metrics_port = site.rest("GET", f"/v1/vpods/{acme_id}")["vpod"]["metrics_port"]
        assert urllib.request.urlopen(f"http://127.0.0.1:{metrics_port}/readyz", timeout=5).status == 200  # it leads its store

        def running_pod() -> str | None:
            pods = [p for p in objects("pods") if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")]
            return pods[0]["metadata"]["uid"] if len(pods) == 1 else None

        def answers_with_p1() -> bool:
            listed = user("list", "partitions")
            return listed.code == 0 and " p1 " in listed.out and "ACTIVE" in listed.out

        first = running_pod()
        assert first is not None
        kube.kubectl("delete", "pod", "--namespace", "vpods", "--all", "--wait=false")
        wait_until(lambda: running_pod() not in (None, first) and answers_with_p1(), timeout=90,
                   what="the ReplicaSet's new pod to serve the tenant's partition from its store")
        kube.kubectl("delete", "deployment", name, "--namespace", "vpods")
        wait_until(lambda: [d["metadata"]["name"] for d in objects("deployments")] == [name] and answers_with_p1(), timeout=90,
                   what="vipu-vpod's supervisor to make the Deployment again")
        assert user("create", "partition", "p2", "--size", "4").code == 0

        released = site.vpod("release", acme_id)
        assert released.code == 0, released.err
        assert objects("deployments") == [] and objects("services") == [] and objects("pods") == []
        assert name not in [o["metadata"]["name"] for o in objects("secrets")]
        assert all(site.held(f"m0{n}") == [] for n in range(1, 5))
        with psycopg.connect(postgres_of_its_own.url(f"vpod-{acme_id}")) as archive:  # the tenant's store, kept
            assert sorted(row[0] for row in archive.execute("SELECT id FROM users")) == ["acme", "vpod-admin"]
            assert sorted(row[0] for row in archive.execute("SELECT id FROM agents")) == ["m01", "m02", "m03", "m04"]
            assert archive.execute("SELECT rolcanlogin FROM pg_roles WHERE rolname = %s", (f"vpod-{acme_id}",)).fetchone() == (False,)
            (access,) = archive.execute("SELECT datacl FROM pg_database WHERE datname = %s", (f"vpod-{acme_id}",)).fetchone()
            assert not any(entry.startswith("=") and "c" in entry.split("/")[0] for entry in access)  # PUBLIC may not connect
    finally:
        if site is not None:
            site.stop()
        if kubelet is not None:
            kubelet.stop()
        kube.stop()
