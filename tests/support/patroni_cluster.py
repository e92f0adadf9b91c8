"""A real replicated store on loopback: 3 etcd members and 2-3 Patroni members running
PostgreSQL 15, for the failover tests and the store benchmark (shared/recipes/
patroni-loopback.md).

    cluster = PatroniCluster(3).start()    # healthy: leader, streaming replicas, sync standby
    store = Store(cluster.url())           # multi-host, target_session_attrs=read-write
    cluster.kill_postgres(cluster.leader())   # or crash_node / stop_member, then
    cluster.wait_healthy()                 # (restart_member first for a crashed/stopped one)
    cluster.stop()                         # no process left behind

Everything binds to 127.0.0.1 on free ports and lives under one temporary directory.
PostgreSQL refuses to run as root, so Patroni runs as ``postgres`` (``setpriv``) in a new
session with a clean environment (``env -i``: a PGPASSWORD leaking into Patroni breaks
replication authentication)."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg2

from .procs import descendants, free_port, pid_alive, terminate, wait_until

PATRONI = "/usr/bin/patroni"
ETCD = "/usr/bin/etcd"
PG_BIN = "/usr/lib/postgresql/15/bin"
RUN_AS = ["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups"]


def missing_tools() -> str | None:
    """Why the cluster cannot run here, or None (the fixture fails with this reason)."""
    for path, package in ((PATRONI, "patroni"), (ETCD, "etcd-server"),
                          (f"{PG_BIN}/postgres", "postgresql-15")):
        if not os.path.exists(path):
            return f"{path} is missing: apt-get install {package} (or `make system-deps`)"
    if os.geteuid() != 0:
        return "the Patroni cluster harness starts PostgreSQL as `postgres`: run as root"
    return None


def _get(url: str, timeout: float = 1.0) -> tuple[int, Any]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            body = resp.read()
            return resp.status, json.loads(body) if body else None
    except urllib.error.HTTPError as exc:
        try:
            return exc.code, json.loads(exc.read() or b"null")
        except ValueError:
            return exc.code, None
    except (OSError, ValueError):
        return 0, None


@dataclass
class Etcd:
    name: str
    client_port: int
    peer_port: int
    data: Path
    proc: subprocess.Popen[bytes] | None = None


@dataclass
class Member:
    name: str
    pg_port: int
    rest_port: int
    dir: Path
    config: Path
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    logs: list[Any] = field(default_factory=list)

    @property
    def data(self) -> Path:
        return self.dir / "data"

    def rest(self, path: str) -> str:
        return f"http://127.0.0.1:{self.rest_port}{path}"

    def postmaster_pid(self) -> int | None:
        try:
            first = (self.data / "postmaster.pid").read_text().split("\n", 1)[0]
            pid = int(first)
        except (OSError, ValueError):
            return None
        return pid if pid_alive(pid) else None


class PatroniCluster:
    """``start()`` it, use ``url()``, inject failures by member name, ``stop()`` it."""

    def __init__(self, members: int = 3, *, scope: str | None = None,
                 strict: bool = False) -> None:
        if not 2 <= members <= 5:
            raise ValueError("a cluster has 2 to 5 Patroni members")
        self.root = Path(tempfile.mkdtemp(prefix="llmgw-patroni-"))
        os.chmod(self.root, 0o755)                  # postgres must reach its own dirs
        self.scope = scope or f"llmgw-{secrets.token_hex(3)}"
        self.strict = strict
        self.password = secrets.token_hex(12)       # the llmgw role's
        self._superuser = secrets.token_hex(12)
        self._replicator = secrets.token_hex(12)
        self.etcd = [Etcd(f"etcd{i}", free_port(), free_port(), self.root / f"etcd{i}")
                     for i in range(3)]
        self.nodes: dict[str, Member] = {}        # by member name: pg0, pg1, ...
        for i in range(members):
            name = f"pg{i}"
            mdir = self.root / name
            self.nodes[name] = Member(name, free_port(), free_port(), mdir,
                                        mdir / "patroni.yml", self.root / f"{name}.log")

    # ------------------------------------------------------------ start

    def start(self, timeout: float = 120) -> PatroniCluster:
        try:
            self._start_etcd()
            for member in self.nodes.values():
                self._write_config(member)
                self.start_member(member.name)
            self.wait_healthy(timeout)
            self._create_database()
        except BaseException as exc:
            tails = self.log_tails()
            self.stop()
            if not isinstance(exc, Exception):
                raise
            raise RuntimeError(f"the Patroni cluster did not come up ({exc}); "
                               f"logs:\n{tails}") from exc
        return self

    def _start_etcd(self) -> None:
        initial = ",".join(f"{e.name}=http://127.0.0.1:{e.peer_port}" for e in self.etcd)
        for e in self.etcd:
            e.data.mkdir(mode=0o700)
            log = open(self.root / f"{e.name}.log", "ab")  # noqa: SIM115 - child owns it
            e.proc = subprocess.Popen(
                [ETCD, "--name", e.name, "--data-dir", str(e.data),
                 "--listen-client-urls", f"http://127.0.0.1:{e.client_port}",
                 "--advertise-client-urls", f"http://127.0.0.1:{e.client_port}",
                 "--listen-peer-urls", f"http://127.0.0.1:{e.peer_port}",
                 "--initial-advertise-peer-urls", f"http://127.0.0.1:{e.peer_port}",
                 "--initial-cluster", initial, "--initial-cluster-state", "new",
                 "--initial-cluster-token", self.scope, "--listen-metrics-urls", "",
                 "--logger", "zap", "--log-outputs", "stderr"],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True)
            log.close()

        def healthy() -> bool:
            return all((_get(f"http://127.0.0.1:{e.client_port}/health")[1] or {})
                       .get("health") == "true" for e in self.etcd)
        wait_until(healthy, 30, "3 healthy etcd members", interval=0.2)

    def _write_config(self, member: Member) -> None:
        member.dir.mkdir(mode=0o700, exist_ok=True)
        (member.dir / "sock").mkdir(mode=0o700, exist_ok=True)
        hosts = ",".join(f"127.0.0.1:{e.client_port}" for e in self.etcd)
        config = {
            "scope": self.scope,
            "namespace": "/llmgw-test/",
            "name": member.name,
            "log": {"level": "INFO"},
            "restapi": {"listen": f"127.0.0.1:{member.rest_port}",
                        "connect_address": f"127.0.0.1:{member.rest_port}"},
            "etcd3": {"hosts": hosts},
            "bootstrap": {
                "dcs": {"ttl": 20, "loop_wait": 1, "retry_timeout": 5,
                        "primary_start_timeout": 0, "maximum_lag_on_failover": 1048576,
                        "synchronous_mode": True, "synchronous_mode_strict": self.strict,
                        "postgresql": {"use_pg_rewind": True, "use_slots": True,
                                       "parameters": {"wal_log_hints": "on",
                                                      "max_connections": 100,
                                                      "wal_keep_size": "128MB"}}},
                "initdb": [{"encoding": "UTF8"}, {"locale": "C.UTF-8"}],
                "pg_hba": ["local all all trust",
                           "host replication replicator 127.0.0.1/32 scram-sha-256",
                           "host all all 127.0.0.1/32 scram-sha-256"],
            },
            "postgresql": {
                "listen": f"127.0.0.1:{member.pg_port}",
                "connect_address": f"127.0.0.1:{member.pg_port}",
                "data_dir": str(member.data),
                "bin_dir": PG_BIN,
                "pgpass": str(member.dir / "pgpass"),
                "authentication": {
                    "superuser": {"username": "postgres", "password": self._superuser},
                    "replication": {"username": "replicator", "password": self._replicator},
                    "rewind": {"username": "postgres", "password": self._superuser},
                },
                "parameters": {"unix_socket_directories": str(member.dir / "sock"),
                               "logging_collector": "off"},
            },
            "tags": {"nofailover": False, "noloadbalance": False, "clonefrom": False},
        }
        member.config.write_text(json.dumps(config, indent=1))   # JSON is YAML
        for path in (member.dir, member.dir / "sock", member.config):
            shutil.chown(path, "postgres", "postgres")

    # ------------------------------------------------------------ health

    def cluster_view(self) -> list[dict[str, Any]]:
        """``GET /cluster`` from the first member that answers (may be stale: see healthy)."""
        for member in self.nodes.values():
            status, body = _get(member.rest("/cluster"))
            if status == 200 and isinstance(body, dict):
                return list(body.get("members", []))
        return []

    def members(self) -> list[dict[str, Any]]:
        """The members as Patroni's REST API lists them (name, role, state, lag...)."""
        return self.cluster_view()

    def leader(self) -> str | None:
        """The member whose own REST API says it is the writable primary."""
        for member in self.nodes.values():
            if _get(member.rest("/primary"))[0] == 200:
                return member.name
        return None

    def replicas(self) -> list[str]:
        return [m.name for m in self.nodes.values() if _get(m.rest("/replica"))[0] == 200]

    def healthy(self, expect: int | None = None) -> bool:
        """One running leader, the rest streaming, a sync standby, and the members' own
        ``/primary`` and ``/replica`` agree (``/cluster`` alone can be stale)."""
        expect = len(self.nodes) if expect is None else expect
        view = self.cluster_view()
        if len(view) != expect:
            return False
        leaders = [m for m in view if m.get("role") == "leader" and m.get("state") == "running"]
        others = [m for m in view if m.get("role") != "leader"]
        # Patroni 3.0 says "running" for a replica; newer ones "streaming". The leader's
        # pg_stat_replication (in its /patroni) is the ground truth either way.
        if len(leaders) != 1 or not all(m.get("state") in ("streaming", "running")
                                        for m in others):
            return False
        if not any(m.get("role") == "sync_standby" for m in others):
            return False
        leader = self.nodes[leaders[0]["name"]]
        status, body = _get(leader.rest("/patroni"))
        if status != 200 or (body or {}).get("role") != "master" and \
                (body or {}).get("role") != "primary":
            return False
        streaming = {r.get("application_name") for r in (body or {}).get("replication", [])
                     if r.get("state") == "streaming"}
        if not {m["name"] for m in others} <= streaming:
            return False
        if _get(leader.rest("/primary"))[0] != 200:
            return False
        return all(_get(self.nodes[m["name"]].rest("/replica"))[0] == 200 for m in others)

    def wait_healthy(self, timeout: float = 90, expect: int | None = None) -> None:
        try:
            wait_until(lambda: self.healthy(expect), timeout, "a healthy Patroni cluster",
                       interval=0.3)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n/cluster: {self.cluster_view()}") from None

    # ------------------------------------------------------------ client side

    def hosts(self) -> str:
        return ",".join(f"127.0.0.1:{m.pg_port}" for m in self.nodes.values())

    def url(self, db: str = "llmgw") -> str:
        return (f"postgresql://llmgw:{self.password}@{self.hosts()}/{db}"
                "?target_session_attrs=read-write&connect_timeout=2")

    def superuser_dsn(self, member: str, db: str = "postgres") -> str:
        return (f"host=127.0.0.1 port={self.nodes[member].pg_port} dbname={db} "
                f"user=postgres password={self._superuser} connect_timeout=2")

    def _create_database(self) -> None:
        leader = self.leader()
        assert leader, "no leader to create the llmgw database on"
        conn = psycopg2.connect(self.superuser_dsn(leader))
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(f"CREATE ROLE llmgw LOGIN PASSWORD '{self.password}'")
            cur.execute("CREATE DATABASE llmgw OWNER llmgw")
        conn.close()

        def everywhere() -> bool:     # replicas replay it a moment after the commit
            for name in self.nodes:
                conn = psycopg2.connect(self.superuser_dsn(name))
                try:
                    with conn.cursor() as cur:
                        cur.execute("SELECT 1 FROM pg_database WHERE datname = 'llmgw'")
                        if cur.fetchone() is None:
                            return False
                finally:
                    conn.close()
            return True
        wait_until(everywhere, 20, "the llmgw database on every member")

    # ------------------------------------------------------------ members

    def start_member(self, name: str) -> None:
        member = self.nodes[name]
        if member.proc is not None and member.proc.poll() is None:
            raise RuntimeError(f"Patroni member {name} is already running")
        log = open(member.log, "ab")  # noqa: SIM115 - the child owns it
        env = ["env", "-i", "PATH=/usr/bin:/bin", f"HOME={member.dir}", "LANG=C.UTF-8",
               "LC_ALL=C.UTF-8", "PYTHONUNBUFFERED=1"]
        member.proc = subprocess.Popen(
            [*RUN_AS, *env, PATRONI, str(member.config)], stdout=log,
            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
            cwd=str(member.dir))
        log.close()

    def restart_member(self, name: str, timeout: float = 90) -> None:
        """Stop the member cleanly if it runs, start it again, wait for the whole cluster
        (also how a crashed or stopped member comes back)."""
        self.stop_member(name)
        self._reap(name)
        self.start_member(name)
        self.wait_healthy(timeout)

    def kill_postgres(self, name: str) -> int:
        """kill -9 the member's postmaster (Patroni stays); returns its pid."""
        pid = self.nodes[name].postmaster_pid()
        if pid is None:
            raise RuntimeError(f"member {name} runs no PostgreSQL")
        os.kill(pid, signal.SIGKILL)
        return pid

    def crash_node(self, name: str) -> None:
        """kill -9 Patroni, its postmaster and every backend at once: the node is gone."""
        member = self.nodes[name]
        pids: set[int] = set()
        if member.proc is not None and member.proc.poll() is None:
            pids |= {member.proc.pid} | descendants(member.proc.pid)
        postmaster = member.postmaster_pid()
        if postmaster is not None:
            pids |= {postmaster} | descendants(postmaster)
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self._reap(name)

    def freeze_postgres(self, name: str) -> None:
        """SIGSTOP the member's PostgreSQL (postmaster and every child): a hung standby.
        Its connections stay open, so a primary keeps waiting for it."""
        self._signal_postgres(name, signal.SIGSTOP)

    def thaw_postgres(self, name: str) -> None:
        self._signal_postgres(name, signal.SIGCONT)

    def _signal_postgres(self, name: str, sig: int) -> None:
        postmaster = self.nodes[name].postmaster_pid()
        if postmaster is None:
            raise RuntimeError(f"member {name} runs no PostgreSQL")
        for pid in {postmaster} | descendants(postmaster):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass

    def sync_standby(self) -> str | None:
        return next((m["name"] for m in self.members() if m.get("role") == "sync_standby"),
                    None)

    def stop_member(self, name: str, timeout: float = 60) -> None:
        """SIGTERM Patroni: it stops PostgreSQL cleanly (a switchover when it led)."""
        member = self.nodes[name]
        if member.proc is not None:
            terminate(member.proc, timeout)

    def _reap(self, name: str) -> None:
        member = self.nodes[name]
        if member.proc is not None:
            try:
                member.proc.wait(10)
            except subprocess.TimeoutExpired:
                pass
        wait_until(lambda: member.postmaster_pid() is None, 30,
                   f"{name}'s postmaster to be gone", interval=0.1)

    def pids(self) -> set[int]:
        """Every live process this cluster started (for leak checks)."""
        found: set[int] = set()
        for proc in [m.proc for m in self.nodes.values()] + [e.proc for e in self.etcd]:
            if proc is not None and pid_alive(proc.pid):
                found |= {proc.pid} | descendants(proc.pid)
        for member in self.nodes.values():
            pm = member.postmaster_pid()
            if pm is not None:
                found |= {pm} | descendants(pm)
        return found

    def log_tails(self, n: int = 25) -> str:
        out = []
        for path in sorted(self.root.glob("*.log")):
            lines = path.read_text(errors="replace").splitlines()[-n:]
            out.append(f"--- {path.name}\n" + "\n".join(lines))
        return "\n".join(out)

    # ------------------------------------------------------------ teardown

    def stop(self) -> None:
        """SIGTERM every Patroni and wait, SIGQUIT a postmaster left behind, SIGTERM etcd,
        remove the directory. Leaves no process."""
        for member in self.nodes.values():
            if member.proc is not None and member.proc.poll() is None:
                member.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 30
        for member in self.nodes.values():
            if member.proc is not None:
                try:
                    member.proc.wait(max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    os.killpg(member.proc.pid, signal.SIGKILL)
                    member.proc.wait()
        for member in self.nodes.values():
            pm = member.postmaster_pid()
            if pm is not None:
                os.kill(pm, signal.SIGQUIT)
        for member in self.nodes.values():
            try:
                wait_until(lambda m=member: m.postmaster_pid() is None, 10,  # type: ignore[misc]
                           f"{member.name}'s postmaster to stop", interval=0.1)
            except AssertionError:
                pm = member.postmaster_pid()
                if pm is not None:
                    os.kill(pm, signal.SIGKILL)
        for e in self.etcd:
            if e.proc is not None and e.proc.poll() is None:
                e.proc.terminate()
        for e in self.etcd:
            if e.proc is not None:
                try:    # the last members wait ~7 s for peers already gone: do not
                    e.proc.wait(1)
                except subprocess.TimeoutExpired:
                    e.proc.kill()
                    e.proc.wait()
        shutil.rmtree(self.root, ignore_errors=True)
