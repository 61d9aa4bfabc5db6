"""A real PostgreSQL server for the tests, started from the machine's own binaries.

`scripts/test` installs Debian's PostgreSQL when it is missing. The server runs as the
`postgres` user when the tests run as root (PostgreSQL refuses root), in a private directory,
on a free loopback port, with fsync off: it is thrown away after the session. A durable server
(for benchmarks) keeps fsync but, like the store's SQLite setting, does not wait for it at commit.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from pathlib import Path

import psycopg

from tests.ports import free_port
from tests.processes import dying_with_parent


def find_binaries() -> Path | None:
    for candidate in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if Path(candidate, "postgres").exists():
            return Path(candidate)
    found = shutil.which("postgres")
    return Path(found).parent if found else None


class PostgresServer:
    def __init__(self, durable: bool = False, netns: str | None = None, host: str = "127.0.0.1"):
        """A server on a free port of `host`; with `netns`, in that network namespace, listening on
        every address it has there (`host` being one: where the tests reach it)."""
        bindir = find_binaries()
        if bindir is None:
            raise RuntimeError("PostgreSQL is not installed; scripts/test installs it (Debian package postgresql)")
        self.directory = Path(tempfile.mkdtemp(prefix="vipu-pg-"))
        self.port = free_port()
        self.host = host
        # As root, setpriv execs the server as postgres, so the process the tests hold is the postmaster itself:
        # runuser would stay between them, a parent that stops itself when its child is paused and then passes no signal on
        user = "postgres" if os.geteuid() == 0 else None
        if user:
            account = pwd.getpwnam(user)
            os.chown(self.directory, account.pw_uid, account.pw_gid)
        data = self.directory / "data"
        subprocess.run(
            dying_with_parent([str(bindir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres", "--no-sync"], user=user),
            check=True, capture_output=True,
        )
        if netns:  # initdb trusts loopback only; the namespace is the test's own, reached over its links
            with open(data / "pg_hba.conf", "a") as rules:
                rules.write("host all all 0.0.0.0/0 trust\n")
        self._command = [  # `ip netns exec` execs in turn: the process is still the postmaster
            *(("ip", "netns", "exec", netns) if netns else ()),
            *dying_with_parent([str(bindir / "postgres"), "-D", str(data), "-p", str(self.port), "-k", str(self.directory),
                                "-c", f"listen_addresses={'*' if netns else host}", "-c", "max_connections=300",
                                *(("-c", "synchronous_commit=off") if durable else ("-c", "fsync=off"))], user=user)]
        self.start()

    def start(self) -> None:
        """Start the server (again, after a kill: it recovers its data as after a crash)."""
        self.process = subprocess.Popen(self._command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 30
        while True:
            try:
                psycopg.connect(self.url("postgres"), connect_timeout=1).close()
                break
            except psycopg.OperationalError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("PostgreSQL did not start") from None
                time.sleep(0.1)

    def url(self, database: str, host: str | None = None) -> str:
        """The database's URL, at `host` if named (another of the server's addresses)."""
        return f"postgresql://postgres@{host or self.host}:{self.port}/{database}"

    def create_database(self) -> str:
        name = f"vipu_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.url("postgres"), autocommit=True) as connection:
            connection.execute(f"CREATE DATABASE {name}")
        return name

    def drop_database(self, name: str) -> None:
        with psycopg.connect(self.url("postgres"), autocommit=True) as connection:
            connection.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")

    def stop(self) -> None:
        """A fast shutdown (SIGINT: a SIGTERM would wait for every client to leave); an immediate one
        if that takes over 30 s. The server is thrown away, so nothing is lost either way."""
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.send_signal(signal.SIGQUIT)
            self.process.wait(timeout=30)
        shutil.rmtree(self.directory, ignore_errors=True)
