"""A real OpenStack Keystone for the tests: Debian's python3-keystone (scripts/system-deps), on
loopback, with a SQLite database and fernet tokens, bootstrapped with an administrator; and the
few calls of its REST API the tests need (projects, users, roles, tokens).

Making the database takes Keystone's migrations a quarter of a minute, so the bootstrapped
database and keys are kept, per Keystone version, under ~/.cache/vipu-tests and copied for each
run (the catalog they hold names another port; nothing here reads the catalog).
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import subprocess
import urllib.request
from pathlib import Path

from tests.ports import free_port
from tests.processes import dying_with_parent

KEYSTONE_MANAGE = Path("/usr/bin/keystone-manage")
KEYSTONE_WSGI = Path("/usr/bin/keystone-wsgi-public")
ADMIN_PASSWORD = "keystone-admin-secret"
CACHE = Path(os.environ.get("XDG_CACHE_HOME", "~/.cache")).expanduser() / "vipu-tests"
TEMPLATE_FILES = ("keystone.db", "fernet-keys", "fernet-receipts", "credential-keys")
TEMPLATE_VERSION = 2  # raise it when the configuration the template was bootstrapped with changes


class Keystone:
    def __init__(self, directory: Path, token_seconds: int = 3600):
        self.directory = directory
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/v3"
        self.config = directory / "keystone.conf"
        directory.mkdir(parents=True, exist_ok=True)
        self.config.write_text(
            "[DEFAULT]\n"
            f"log_file = {directory / 'keystone.log'}\n"
            "[database]\n"
            f"connection = sqlite:///{directory / 'keystone.db'}\n"
            "[identity]\n"
            "password_hash_rounds = 4\n"  # bcrypt's least: a login costs milliseconds, not a third of a second
            "[token]\n"
            "provider = fernet\n"
            f"expiration = {token_seconds}\n"
            "[fernet_tokens]\n"
            f"key_repository = {directory / 'fernet-keys'}\n"
            "[fernet_receipts]\n"
            f"key_repository = {directory / 'fernet-receipts'}\n"
            "[credential]\n"
            f"key_repository = {directory / 'credential-keys'}\n"
        )
        self.process: subprocess.Popen | None = None

    def _manage(self, *args: str) -> None:
        subprocess.run([str(KEYSTONE_MANAGE), "--config-file", str(self.config), *args], check=True, capture_output=True, timeout=300)

    def _bootstrap(self) -> None:
        user = ("--keystone-user", "root", "--keystone-group", "root")
        self._manage("db_sync")
        self._manage("fernet_setup", *user)
        self._manage("credential_setup", *user)
        self._manage("bootstrap", "--bootstrap-password", ADMIN_PASSWORD, "--bootstrap-admin-url", self.url,
                     "--bootstrap-public-url", self.url, "--bootstrap-internal-url", self.url, "--bootstrap-region-id", "RegionOne")
        with sqlite3.connect(self.directory / "keystone.db") as database:  # its readers then never hold up a write
            database.execute("PRAGMA journal_mode=WAL")

    def start(self) -> Keystone:
        versions = sorted(KEYSTONE_MANAGE.parent.parent.glob("lib/python3/dist-packages/keystone-*.egg-info"))
        template = CACHE / f"{versions[-1].name if versions else 'keystone'}-{TEMPLATE_VERSION}"
        if (template / "complete").exists():
            for name in TEMPLATE_FILES:
                source, target = template / name, self.directory / name
                (shutil.copytree if source.is_dir() else shutil.copy)(source, target)
        else:
            self._bootstrap()
            staging = template.with_name(template.name + f".{os.getpid()}")
            staging.mkdir(parents=True, exist_ok=True)
            for name in TEMPLATE_FILES:
                source = self.directory / name
                (shutil.copytree if source.is_dir() else shutil.copy)(source, staging / name)
            (staging / "complete").write_text("")
            shutil.rmtree(template, ignore_errors=True)
            staging.rename(template)
        env = {**os.environ, "OS_KEYSTONE_CONFIG_FILES": str(self.config)}
        with open(self.directory / "wsgi.log", "ab") as log:
            self.process = subprocess.Popen(dying_with_parent([str(KEYSTONE_WSGI), "--host", "127.0.0.1", "--port", str(self.port)]),
                                            env=env, stdout=log, stderr=subprocess.STDOUT)
        from tests.functional.harness import wait_until

        wait_until(self._answers, timeout=60, what="keystone")
        return self

    def _answers(self) -> bool:
        if self.process is not None and self.process.poll() is not None:
            raise AssertionError((self.directory / "wsgi.log").read_text()[-3000:])
        try:
            urllib.request.urlopen(self.url, timeout=2).read()
            return True
        except OSError:
            return False

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            self.process.wait(timeout=30)

    def _call(self, method: str, path: str, body: dict | None = None, token: str | None = None) -> tuple[dict, dict]:
        headers = {"Content-Type": "application/json", "X-Auth-Token": token or self.admin_token()}
        request = urllib.request.Request(f"{self.url}{path}", method=method, headers=headers,
                                         data=json.dumps(body).encode() if body is not None else None)
        with urllib.request.urlopen(request, timeout=30) as answer:
            text = answer.read()
            return (json.loads(text) if text else {}), dict(answer.headers)

    def token(self, user: str, password: str, project: str | None) -> str:
        """A token for the user, scoped to the project (unscoped without one)."""
        auth: dict = {"identity": {"methods": ["password"], "password": {"user": {
            "name": user, "domain": {"id": "default"}, "password": password}}}}
        if project is not None:
            auth["scope"] = {"project": {"name": project, "domain": {"id": "default"}}}
        request = urllib.request.Request(f"{self.url}/auth/tokens", method="POST", headers={"Content-Type": "application/json"},
                                         data=json.dumps({"auth": auth}).encode())
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.headers["X-Subject-Token"]

    def admin_token(self) -> str:
        """A fresh token of Keystone's administrator: tests may make tokens expire within seconds."""
        return self.token("admin", ADMIN_PASSWORD, "admin")

    def revoke(self, token: str) -> None:
        request = urllib.request.Request(f"{self.url}/auth/tokens", method="DELETE",
                                         headers={"X-Auth-Token": self.admin_token(), "X-Subject-Token": token})
        urllib.request.urlopen(request, timeout=30).read()

    def _id(self, kind: str, name: str) -> str:
        body, _ = self._call("GET", f"/{kind}?name={name}")
        return body[kind][0]["id"]

    def project(self, name: str) -> None:
        self._call("POST", "/projects", {"project": {"name": name, "domain_id": "default"}})

    def user(self, name: str, password: str, project: str, role: str = "member") -> None:
        """A user with `role` on `project` (the role is made if Keystone has none of that name)."""
        self._call("POST", "/users", {"user": {"name": name, "password": password, "domain_id": "default"}})
        self.grant(name, project, role)

    def grant(self, user: str, project: str, role: str) -> None:
        """`role` on `project` for `user` (the role is made if Keystone has none of that name)."""
        try:
            role_id = self._id("roles", role)
        except IndexError:
            role_id = self._call("POST", "/roles", {"role": {"name": role}})[0]["role"]["id"]
        self._call("PUT", f"/projects/{self._id('projects', project)}/users/{self._id('users', user)}/roles/{role_id}")

