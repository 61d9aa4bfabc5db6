"""Real OpenStack services for the tests, from Debian's archive: MariaDB and RabbitMQ of their own,
Keystone (tests/keystone.py), Placement, Glance, Nova (API, conductor, scheduler, and a compute
service with Nova's fake virt driver, which runs no VM) and Neutron, each a process on loopback
with its own ports, as a site runs them.

Every service is Debian's packaged code run with Debian's Python, configured here the way the
OpenStack install guides configure them, with two differences a test needs: the fake virt driver,
and Nova not waiting for a VIF to be plugged (no virtual switch plugs one here).
"""

from __future__ import annotations

import base64
import concurrent.futures
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path

from tests.keystone import Keystone
from tests.ports import free_port
from tests.processes import dying_with_parent

PYTHON = "/usr/bin/python3"  # Debian's, whose dist-packages hold the services
SERVICE_PASSWORD = "openstack-service-secret"
DB_PASSWORD = "openstack-db-secret"
SERVICES = ("nova", "placement", "glance", "neutron")
IMAGE_PROGRAMS = Path(sys.executable).parent  # vipu's programs, which a server's image has in /opt/vipu/bin


def _wait(what: str, ready, process: subprocess.Popen | None = None, log: Path | None = None, timeout: float = 120.0):
    deadline = time.monotonic() + timeout
    while True:
        if process is not None and process.poll() is not None:
            raise AssertionError(f"{what} exited with {process.returncode}: {log.read_text()[-4000:] if log else ''}")
        try:
            value = ready()
        except OSError:
            value = None
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}: {log.read_text()[-4000:] if log and log.exists() else ''}")
        time.sleep(0.3)


class Processes:
    """Started processes with their logs, stopped together (SIGTERM, then SIGKILL)."""

    def __init__(self, directory: Path):
        self.directory = directory
        self.running: list[tuple[str, subprocess.Popen]] = []

    def start(self, name: str, command: list[str], env: dict[str, str] | None = None) -> subprocess.Popen:
        with open(self.directory / f"{name}.log", "ab") as log:
            process = subprocess.Popen(dying_with_parent(command), stdout=log, stderr=subprocess.STDOUT,
                                       env={**os.environ, **(env or {})}, cwd=self.directory)
        self.running.append((name, process))
        return process

    def log(self, name: str) -> Path:
        return self.directory / f"{name}.log"

    def stop(self) -> None:
        for _, process in reversed(self.running):
            if process.poll() is None:
                process.terminate()
        for _, process in reversed(self.running):
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


class MariaDB:
    """A MariaDB server of the test's own, on a free port, with a database per service."""

    def __init__(self, directory: Path, processes: Processes):
        self.directory, self.processes = directory, processes
        self.port = free_port()
        self.socket = directory / "mysqld.sock"

    def start(self) -> MariaDB:
        data = self.directory / "data"
        subprocess.run(["mariadb-install-db", "--no-defaults", f"--datadir={data}", "--user=root",
                        "--auth-root-authentication-method=normal", "--skip-test-db"], check=True, capture_output=True, timeout=120)
        process = self.processes.start("mariadb", [
            "mariadbd", "--no-defaults", f"--datadir={data}", f"--socket={self.socket}", f"--port={self.port}",
            "--bind-address=127.0.0.1", "--user=root", "--skip-name-resolve", "--innodb-flush-log-at-trx-commit=0",
            "--innodb-buffer-pool-size=64M", "--max-connections=500"])
        _wait("mariadb", lambda: self.sql("SELECT 1").returncode == 0, process, self.processes.log("mariadb"))
        return self

    def sql(self, statement: str) -> subprocess.CompletedProcess:
        return subprocess.run(["mariadb", "--no-defaults", f"--socket={self.socket}", "-uroot", "-e", statement],
                              capture_output=True, text=True, timeout=60)

    def database(self, name: str) -> str:
        """A new database and its URL for OpenStack (PyMySQL)."""
        done = self.sql(f"CREATE DATABASE {name}; GRANT ALL ON {name}.* TO 'openstack'@'%' IDENTIFIED BY '{DB_PASSWORD}';")
        assert done.returncode == 0, done.stderr
        return f"mysql+pymysql://openstack:{DB_PASSWORD}@127.0.0.1:{self.port}/{name}?charset=utf8"


class RabbitMQ:
    """A RabbitMQ node of the test's own: its own node name, ports, epmd and files."""

    def __init__(self, directory: Path, processes: Processes):
        self.directory, self.processes = directory, processes
        self.port = free_port()
        self.env = {
            "HOME": str(directory), "RABBITMQ_NODENAME": f"vipu{self.port}@localhost", "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.port), "RABBITMQ_DIST_PORT": str(free_port()), "ERL_EPMD_PORT": str(free_port()),
            "RABBITMQ_MNESIA_BASE": str(directory / "mnesia"), "RABBITMQ_LOG_BASE": str(directory / "log"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(directory / "enabled_plugins"),
            "RABBITMQ_CONFIG_FILE": str(directory / "rabbitmq"),
        }
        self.url = f"rabbit://guest:guest@127.0.0.1:{self.port}/"

    def start(self) -> RabbitMQ:
        (self.directory / "enabled_plugins").write_text("[].\n")
        process = self.processes.start("rabbitmq", ["/usr/lib/rabbitmq/bin/rabbitmq-server"], self.env)
        _wait("rabbitmq", lambda: "Starting broker... completed" in self.processes.log("rabbitmq").read_text(), process,
              self.processes.log("rabbitmq"))
        return self

    def stop(self) -> None:
        """After the node has stopped: Erlang's port mapper, which the node started as a daemon of its own."""
        subprocess.run(["epmd", "-kill"], env={**os.environ, **self.env}, capture_output=True, timeout=60)


def _ini(sections: dict[str, dict[str, object]]) -> str:
    return "".join(f"[{name}]\n" + "".join(f"{key} = {value}\n" for key, value in options.items()) + "\n"
                   for name, options in sections.items())


class OpenStack:
    """Keystone, Placement, Glance, Nova and Neutron on loopback, started together."""

    def __init__(self, directory: Path):
        self.directory = directory
        directory.mkdir(parents=True, exist_ok=True)
        self.processes = Processes(directory)
        self.db = MariaDB(directory / "mariadb", self.processes)
        self.broker = RabbitMQ(directory / "rabbitmq", self.processes)
        (directory / "mariadb").mkdir()
        (directory / "rabbitmq").mkdir()
        self.keystone = Keystone(directory / "keystone")
        self.machines = BootStandIn(self, directory / "machines")
        self._token: tuple[float, str] | None = None
        self.ports = {name: free_port() for name in ("placement", "glance", "nova", "neutron")}
        self.urls = {"placement": f"http://127.0.0.1:{self.ports['placement']}",
                     "glance": f"http://127.0.0.1:{self.ports['glance']}",
                     "nova": f"http://127.0.0.1:{self.ports['nova']}/v2.1",
                     "neutron": f"http://127.0.0.1:{self.ports['neutron']}"}

    # Keystone: a service user per service, and the catalog the services find each other in

    def _catalog(self) -> None:
        keystone = self.keystone
        identity = keystone._id("services", "keystone")  # Keystone's own entries: the cached bootstrap names another port
        for endpoint in keystone._call("GET", f"/endpoints?service_id={identity}")[0]["endpoints"]:
            keystone._call("PATCH", f"/endpoints/{endpoint['id']}", {"endpoint": {"url": keystone.url}})
        keystone._call("POST", "/projects", {"project": {"name": "service", "domain_id": "default"}})
        # admin for their calls, service for the service tokens they send with a user's (authtoken requires it)
        roles = [keystone._id("roles", "admin"), keystone._call("POST", "/roles", {"role": {"name": "service"}})[0]["role"]["id"]]
        service_project = keystone._id("projects", "service")
        for name in SERVICES:
            user, _ = keystone._call("POST", "/users", {"user": {"name": name, "password": SERVICE_PASSWORD, "domain_id": "default"}})
            for role in roles:
                keystone._call("PUT", f"/projects/{service_project}/users/{user['user']['id']}/roles/{role}")
        kinds = {"placement": "placement", "glance": "image", "nova": "compute", "neutron": "network"}
        for name, kind in kinds.items():
            service, _ = keystone._call("POST", "/services", {"service": {"name": name, "type": kind}})
            for interface in ("public", "internal", "admin"):
                keystone._call("POST", "/endpoints", {"endpoint": {"service_id": service["service"]["id"], "interface": interface,
                                                                   "url": self.urls[name], "region_id": "RegionOne"}})

    def _auth(self, user: str) -> dict[str, object]:
        return {"auth_type": "password", "auth_url": self.keystone.url.removesuffix("/v3"), "project_name": "service",
                "project_domain_name": "Default", "user_domain_name": "Default", "username": user,
                "password": SERVICE_PASSWORD, "region_name": "RegionOne"}

    def _authtoken(self, user: str) -> dict[str, object]:
        return {**self._auth(user), "www_authenticate_uri": self.keystone.url.removesuffix("/v3"), "service_token_roles_required": True}

    # The services

    def _run(self, name: str, module: str, function: str, *args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
        code = f"import sys; sys.argv[0] = {name!r}; from {module} import {function}; sys.exit({function}())"
        return self.processes.start(name, [PYTHON, "-c", code, *args], env)

    def _rule_taking_ebtables(self) -> dict[str, str]:
        """The environment of a Linux bridge agent whose `ebtables` takes every rule and lists none.
        The agent guards each port it binds against ARP spoofing with ebtables, which needs the
        kernel's bridge tables; a kernel without them (as in this project's sandboxes) makes Debian's
        ebtables fail, and the agent then retries for ever (or dies, with no ebtables at all). The
        fake virt driver's servers send no frame, so the guard protects nothing here."""
        directory = self.directory / "agent-bin"
        directory.mkdir(exist_ok=True)
        ebtables = directory / "ebtables"
        ebtables.write_text("#!/bin/sh\nexit 0\n")
        ebtables.chmod(0o755)
        return {"PATH": f"{directory}:{os.environ.get('PATH', '')}"}

    def _manage(self, module: str, *args: str) -> None:
        code = f"import sys; sys.argv[0] = 'manage'; from {module} import main; sys.exit(main())"
        done = subprocess.run([PYTHON, "-c", code, *args], capture_output=True, text=True, timeout=600, cwd=self.directory)
        assert done.returncode == 0, f"{module} {' '.join(args)}: {done.stdout[-2000:]}{done.stderr[-4000:]}"

    def _answers(self, url: str) -> bool:
        """Whether the service answers at all (401 and the like count); a refused connection is an
        OSError, which _wait takes for not yet."""
        with contextlib.suppress(urllib.error.HTTPError):
            urllib.request.urlopen(url, timeout=3).read()
        return True

    def _placement(self) -> Callable[[], subprocess.Popen]:
        conf = self.directory / "placement.conf"
        conf.write_text(_ini({
            "DEFAULT": {"log_file": self.directory / "placement-service.log"},
            "placement_database": {"connection": self.db.database("placement")},
            "api": {"auth_strategy": "keystone"},
            "keystone_authtoken": self._authtoken("placement"),
        }))
        env = {"OS_PLACEMENT_CONFIG_DIR": str(self.directory), "OS_PLACEMENT_CONFIG_FILES": "placement.conf"}
        done = subprocess.run(["placement-manage", "--config-file", str(conf), "db", "sync"], capture_output=True, text=True,
                              timeout=300, env={**os.environ, **env})
        assert done.returncode == 0, done.stderr[-3000:]
        return lambda: self.processes.start(
            "placement", ["placement-api", "--host", "127.0.0.1", "--port", str(self.ports["placement"])], env)

    def _glance(self) -> Callable[[], subprocess.Popen]:
        conf = self.directory / "glance-api.conf"
        conf.write_text(_ini({
            "DEFAULT": {"bind_host": "127.0.0.1", "bind_port": self.ports["glance"], "workers": 1,
                        "log_file": self.directory / "glance-service.log", "enabled_backends": "local:file"},
            "database": {"connection": self.db.database("glance")},
            "keystone_authtoken": self._authtoken("glance"),
            "paste_deploy": {"flavor": "keystone", "config_file": "/etc/glance/glance-api-paste.ini"},
            "glance_store": {"default_backend": "local"},
            "local": {"filesystem_store_datadir": self.directory / "images"},
            "os_glance_staging_store": {"filesystem_store_datadir": self.directory / "staging"},
            "os_glance_tasks_store": {"filesystem_store_datadir": self.directory / "tasks"},
        }))
        self._manage("glance.cmd.manage", "--config-file", str(conf), "db_sync")
        return lambda: self._run("glance", "glance.cmd.api", "main", "--config-file", str(conf))

    def _nova(self) -> Callable[[], subprocess.Popen]:
        conf = self.directory / "nova.conf"
        conf.write_text(_ini({
            "DEFAULT": {"transport_url": self.broker.url, "host": "compute1", "compute_driver": "fake.FakeDriver",
                        "log_file": self.directory / "nova-service.log", "state_path": self.directory / "nova-state",
                        "osapi_compute_listen": "127.0.0.1", "osapi_compute_listen_port": self.ports["nova"],
                        "osapi_compute_workers": 1, "enabled_apis": "osapi_compute", "use_rootwrap_daemon": False,
                        "vif_plugging_is_fatal": False, "vif_plugging_timeout": 0, "instance_name_template": "vm-%08x"},
            "api": {"auth_strategy": "keystone"},
            "api_database": {"connection": self.db.database("nova_api")},
            "database": {"connection": self.db.database("nova")},
            "keystone_authtoken": self._authtoken("nova"),
            "service_user": {**self._auth("nova"), "send_service_user_token": True},
            "placement": self._auth("placement"),
            "glance": {"api_servers": self.urls["glance"]},
            "neutron": {**self._auth("neutron")},
            "conductor": {"workers": 1},
            "scheduler": {"workers": 1, "discover_hosts_in_cells_interval": 2},
            "oslo_concurrency": {"lock_path": self.directory / "nova-locks"},
            "oslo_messaging_notifications": {"driver": "noop"},
            "wsgi": {"api_paste_config": "/etc/nova/api-paste.ini"},
        }))
        cell0 = self.db.database("nova_cell0")
        self._manage("nova.cmd.manage", "--config-file", str(conf), "api_db", "sync")
        self._manage("nova.cmd.manage", "--config-file", str(conf), "cell_v2", "map_cell0", "--database_connection", cell0)
        self._manage("nova.cmd.manage", "--config-file", str(conf), "cell_v2", "create_cell", "--name", "cell1")
        self._manage("nova.cmd.manage", "--config-file", str(conf), "db", "sync")

        def start() -> subprocess.Popen:
            for name, module in (("nova-conductor", "nova.cmd.conductor"), ("nova-scheduler", "nova.cmd.scheduler"),
                                 ("nova-compute", "nova.cmd.compute")):
                self._run(name, module, "main", "--config-file", str(conf))
            return self._run("nova-api", "nova.cmd.api_os_compute", "main", "--config-file", str(conf))
        return start

    def _join_compute_host(self) -> None:
        """The compute host joins its cell as an operator adds one: discover_hosts once it has reported."""
        _wait("nova-compute to report", lambda: self.call("nova", "GET", "/os-services?binary=nova-compute")["services"],
              None, self.processes.log("nova-compute"))
        self._manage("nova.cmd.manage", "--config-file", str(self.directory / "nova.conf"), "cell_v2", "discover_hosts")
        _wait("the compute host in its cell", lambda: self.call("nova", "GET", "/os-hypervisors")["hypervisors"],
              None, self.processes.log("nova-compute"))

    def _neutron(self) -> Callable[[], subprocess.Popen]:
        """Neutron's server with ML2 and Linux bridge's mechanism driver, and Linux bridge's real agent
        on the compute host: with no agent alive on a host, ML2 binds no port there and Nova fails
        the server. Tenant networks are of type local (a bridge on the one compute host, which needs
        no tunnel to another); security groups are kept by Neutron and not enforced (noop): no VM's
        traffic passes here to be filtered."""
        conf, ml2, agent = self.directory / "neutron.conf", self.directory / "ml2_conf.ini", self.directory / "linuxbridge_agent.ini"
        conf.write_text(_ini({
            "DEFAULT": {"core_plugin": "ml2", "service_plugins": "router", "transport_url": self.broker.url, "auth_strategy": "keystone",
                        "bind_host": "127.0.0.1", "bind_port": self.ports["neutron"], "api_workers": 1, "rpc_workers": 1,
                        "rpc_state_report_workers": 1, "log_file": self.directory / "neutron-service.log",
                        "state_path": self.directory / "neutron-state", "api_paste_config": "/etc/neutron/api-paste.ini",
                        "notify_nova_on_port_status_changes": True, "notify_nova_on_port_data_changes": True},
            "database": {"connection": self.db.database("neutron")},
            "keystone_authtoken": self._authtoken("neutron"),
            "nova": self._auth("nova"),
            "oslo_concurrency": {"lock_path": self.directory / "neutron-locks"},
            "agent": {"root_helper": "env", "use_helper_for_ns_read": False},
            "experimental": {"linuxbridge": True},  # Zed marks it so; it is the agent that needs no virtual switch
        }))
        ml2.write_text(_ini({
            "ml2": {"type_drivers": "local,flat", "tenant_network_types": "local", "mechanism_drivers": "linuxbridge",
                    "extension_drivers": "port_security"},
            "securitygroup": {"enable_security_group": True, "firewall_driver": "noop"},
        }))
        agent.write_text(_ini({
            "DEFAULT": {"host": "compute1", "transport_url": self.broker.url, "log_file": self.directory / "neutron-agent.log",
                        "state_path": self.directory / "neutron-state"},
            "agent": {"root_helper": "env", "use_helper_for_ns_read": False, "report_interval": 2},
            "linux_bridge": {"physical_interface_mappings": ""},
            "vxlan": {"enable_vxlan": False},
            "securitygroup": {"enable_security_group": True, "firewall_driver": "noop"},
            "oslo_concurrency": {"lock_path": self.directory / "neutron-locks"},
        }))
        self._manage("neutron.db.migration.cli", "--config-file", str(conf), "--config-file", str(ml2), "upgrade", "heads")

        def start() -> subprocess.Popen:
            self._run("neutron-linuxbridge-agent", "neutron.cmd.eventlet.plugins.linuxbridge_neutron_agent", "main",
                      "--config-file", str(conf), "--config-file", str(agent), env=self._rule_taking_ebtables())
            return self._run("neutron-server", "neutron.cmd.eventlet.server", "main", "--config-file", str(conf), "--config-file", str(ml2))
        return start

    def start(self) -> OpenStack:
        """Everything, the services' database migrations side by side (they are most of the minute)."""
        self.db.start()
        self.broker.start()
        self.keystone.start()
        self._catalog()
        with concurrent.futures.ThreadPoolExecutor(4) as pool:  # processes start from this thread: their death signal is its
            steps = {"placement": self._placement, "glance": self._glance, "neutron": self._neutron, "nova": self._nova}
            starters = {name: pool.submit(step) for name, step in steps.items()}
            servers = {name: starter.result()() for name, starter in starters.items()}
        for name, process in servers.items():
            log = self.processes.log({"neutron": "neutron-server", "nova": "nova-api"}.get(name, name))
            _wait(name, lambda name=name: self._answers(self.urls[name]), process, log)
        self._join_compute_host()
        self.machines.start()
        return self

    def stop(self) -> None:
        self.machines.stop()
        self.keystone.stop()
        self.processes.stop()
        self.broker.stop()
        shutil.rmtree(self.directory / "mariadb" / "data", ignore_errors=True)

    def admin_token(self) -> str:
        """Keystone's administrator's token, made again every 10 minutes (they last an hour)."""
        if self._token is None or time.monotonic() - self._token[0] > 600:
            self._token = (time.monotonic(), self.keystone.admin_token())
        return self._token[1]

    def call(self, service: str, method: str, path: str, body: dict | None = None, headers: dict | None = None) -> dict:
        request = urllib.request.Request(self.urls[service] + path, method=method,
                                         data=json.dumps(body).encode() if body is not None else None,
                                         headers={"Content-Type": "application/json", "X-Auth-Token": self.admin_token(),
                                                  **(headers or {})})
        with urllib.request.urlopen(request, timeout=60) as reply:
            text = reply.read()
        return json.loads(text) if text else {}

    def upload(self, image_id: str, data: bytes) -> None:
        """An image's data, as `openstack image create --file` sends it."""
        request = urllib.request.Request(f"{self.urls['glance']}/v2/images/{image_id}/file", data=data, method="PUT",
                                         headers={"Content-Type": "application/octet-stream", "X-Auth-Token": self.admin_token()})
        urllib.request.urlopen(request, timeout=60).read()


class BootStandIn:
    """What Nova's fake virt driver leaves out: a server's boot. When Nova reports a server ACTIVE,
    its fixed addresses are put on this host's loopback interface (as the test kubelet gives pods
    this host's address) and its user data is run as cloud-init runs a `#!` script at first boot,
    with HOME and VIPU_STATE_DIR a directory of the server's own and vipu's programs on its PATH
    (the controller image's); when the server is deleted (or
    stops being ACTIVE) its processes are stopped and its addresses taken back. Everything the
    server was made with is Nova's and Neutron's: the stand-in only reads it."""

    def __init__(self, openstack: OpenStack, directory: Path, interval: float = 0.3):
        self.openstack, self.directory, self.interval = openstack, directory, interval
        self.running: dict[str, tuple[subprocess.Popen | None, list[str]]] = {}  # by server id: its process, its addresses
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="boot stand-in", daemon=True)

    def start(self) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=30)
        for server in list(self.running):
            self._halt(server)

    def log(self, server_id: str) -> str:
        path = self.directory / server_id / "console.log"
        return path.read_text(errors="replace") if path.exists() else ""

    def _watch(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                servers = self.openstack.call("nova", "GET", "/servers/detail?all_tenants=1",
                                              headers={"OpenStack-API-Version": "compute 2.3"})["servers"]
            except Exception as error:  # noqa: BLE001 - a service restarting, say: the next round, and a line for a failing test
                with open(self.directory / "stand-in.log", "a") as log:
                    log.write(f"cannot list the servers: {error!r}\n")
                continue
            active = {server["id"]: server for server in servers if server["status"] == "ACTIVE"}
            for server_id in [s for s in self.running if s not in active]:
                self._halt(server_id)
            for server_id, server in active.items():
                if server_id not in self.running:
                    self._boot(server)

    def _boot(self, server: dict) -> None:
        home = self.directory / server["id"]
        home.mkdir(parents=True, exist_ok=True)
        addresses = [entry["addr"] for entries in server["addresses"].values() for entry in entries if entry["version"] == 4]
        for address in addresses:
            subprocess.run(["ip", "address", "add", f"{address}/32", "dev", "lo"], capture_output=True, timeout=30)
        process = None
        user_data = base64.b64decode(server.get("OS-EXT-SRV-ATTR:user_data") or "")
        if user_data.startswith(b"#!"):
            script = home / "user-data"
            script.write_bytes(user_data)
            script.chmod(0o700)
            with open(home / "console.log", "ab") as console:
                process = subprocess.Popen(dying_with_parent([str(script)]), stdout=console, stderr=subprocess.STDOUT, cwd=home,
                                           start_new_session=True, env={**os.environ, "HOME": str(home), "VIPU_STATE_DIR": str(home),
                                                                        "PATH": f"{IMAGE_PROGRAMS}:{os.environ['PATH']}"})
        self.running[server["id"]] = (process, addresses)

    def _halt(self, server_id: str) -> None:
        process, addresses = self.running.pop(server_id)
        if process is not None and process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
        for address in addresses:
            subprocess.run(["ip", "address", "del", f"{address}/32", "dev", "lo"], capture_output=True, timeout=30)
