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
    def __init__(self, durable: bool = False):
        bindir = find_binaries()
        if bindir is None:
            raise RuntimeError("PostgreSQL is not installed; scripts/test installs it (Debian package postgresql)")
        self.directory = Path(tempfile.mkdtemp(prefix="vipu-pg-"))
        self.port = free_port()
        runner: list[str] = []
        if os.geteuid() == 0:
            account = pwd.getpwnam("postgres")
            os.chown(self.directory, account.pw_uid, account.pw_gid)
            runner = ["runuser", "-u", "postgres", "--"]
        data = self.directory / "data"
        subprocess.run(
            [*runner, str(bindir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres", "--no-sync"],
            check=True, capture_output=True,
        )
        self.process = subprocess.Popen(
            dying_with_parent([*runner, str(bindir / "postgres"), "-D", str(data), "-p", str(self.port), "-k", str(self.directory),
             "-c", "listen_addresses=127.0.0.1", "-c", "max_connections=300",
             *(("-c", "synchronous_commit=off") if durable else ("-c", "fsync=off"))]),
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                psycopg.connect(self.url("postgres"), connect_timeout=1).close()
                break
            except psycopg.OperationalError:
                if self.process.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError("PostgreSQL did not start") from None
                time.sleep(0.1)

    def url(self, database: str) -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def create_database(self) -> str:
        name = f"vipu_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.url("postgres"), autocommit=True) as connection:
            connection.execute(f"CREATE DATABASE {name}")
        return name

    def drop_database(self, name: str) -> None:
        with psycopg.connect(self.url("postgres"), autocommit=True) as connection:
            connection.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")

    def stop(self) -> None:
        self.process.terminate()
        self.process.wait(timeout=30)
        shutil.rmtree(self.directory, ignore_errors=True)
