"""A real PostgreSQL server for the tests: initdb into a temporary directory (as the
`postgres` user when running as root), listening on a free loopback port, stopped at the end."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg2

from .procs import free_port


def _bin(name: str) -> str:
    found = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"))
    if found:
        return found[-1]
    path = shutil.which(name)
    if path:
        return path
    raise RuntimeError(f"PostgreSQL's {name} is not installed: run `make test` (it installs "
                       "the postgresql package as root) or apt-get install postgresql")


class PostgresServer:
    def __init__(self) -> None:
        self.dir = Path(tempfile.mkdtemp(prefix="llmgw-pg-"))
        self.port = free_port()
        self.user = "llmgw"
        self._prefix: list[str] = []
        if os.geteuid() == 0:
            shutil.chown(self.dir, "postgres", "postgres")
            self._prefix = ["runuser", "-u", "postgres", "--"]
        os.chmod(self.dir, 0o700)
        self.data = self.dir / "data"
        self.log = self.dir / "server.log"

    def _run(self, *argv: str) -> None:
        subprocess.run(self._prefix + list(argv), check=True, stdout=subprocess.DEVNULL,
                       stderr=subprocess.PIPE)

    def start(self) -> PostgresServer:
        self._run(_bin("initdb"), "-D", str(self.data), "-A", "trust", "-U", self.user,
                  "--no-sync", "-E", "UTF8")
        opts = (f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.dir} -c fsync=off "
                "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200")
        self._run(_bin("pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-o", opts,
                  "-w", "start")
        deadline = time.monotonic() + 20
        while True:
            try:
                psycopg2.connect(self.url("postgres")).close()
                break
            except psycopg2.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        return self

    def url(self, db: str) -> str:
        return f"postgresql://{self.user}@127.0.0.1:{self.port}/{db}"

    def create_database(self, name: str) -> str:
        conn = psycopg2.connect(self.url("postgres"))
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(f'CREATE DATABASE "{name}"')
        conn.close()
        return self.url(name)

    def stop(self) -> None:
        try:
            self._run(_bin("pg_ctl"), "-D", str(self.data), "-m", "immediate", "stop")
        except subprocess.CalledProcessError:
            pass
        shutil.rmtree(self.dir, ignore_errors=True)
