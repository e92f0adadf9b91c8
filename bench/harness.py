"""Starting and stopping the processes that router tests and the benchmark need.

Everything binds 127.0.0.1 on free ports; every process started here is stopped by
:func:`stop` (SIGINT, then SIGKILL after a grace period).
"""

from __future__ import annotations

import json
import math
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
FAKE_ENGINE = ROOT / "bench" / "fake_engine.py"

_ROUTER_MAIN = ("import json, sys\n"
                "from llmgw_runtime.router.config import RouterConfig\n"
                "from llmgw_runtime.router.serve import run\n"
                "run(RouterConfig(**json.loads(sys.argv[1])))\n")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def wait_http(url: str, timeout_s: float = 15.0, proc: subprocess.Popen[Any] | None = None,
              ok: tuple[int, ...] = (200,)) -> None:
    """Wait until ``url`` answers one of ``ok``; fail early if ``proc`` died."""
    deadline = time.monotonic() + timeout_s
    last: object = None
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"process for {url} exited with {proc.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                if resp.status in ok:
                    return
        except urllib.error.HTTPError as exc:
            if exc.code in ok:
                return
            last = exc
        except OSError as exc:
            last = exc
        time.sleep(0.05)
    raise TimeoutError(f"{url} not ready after {timeout_s} s: {last}")


def start_engine(name: str, port: int | None = None, chunks: int = 5) -> tuple[subprocess.Popen[bytes], str]:
    port = port or free_port()
    proc = subprocess.Popen([sys.executable, str(FAKE_ENGINE), "--port", str(port),
                             "--name", name, "--chunks", str(chunks)],
                            stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(url + "/health", proc=proc)
    except Exception:
        stop(proc)
        raise
    return proc, url


def start_router(control_url: str, token: str, **settings: Any) -> tuple[subprocess.Popen[bytes], str]:
    """``serve.run`` in a subprocess (real gunicorn gevent workers); waits for /openapi.json."""
    port = settings.pop("port", None) or free_port()
    cfg = {"control_url": control_url, "router_token": token, "host": "127.0.0.1",
           "port": port, **settings}
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    proc = subprocess.Popen([sys.executable, "-c", _ROUTER_MAIN, json.dumps(cfg)], env=env,
                            cwd=str(ROOT))
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(url + "/openapi.json", proc=proc)
    except Exception:
        stop(proc)
        raise
    return proc, url


def stop(proc: subprocess.Popen[Any], grace_s: float = 10.0) -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(grace_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


# ------------------------------------------------ the control benchmark (control_bench.py)

PASS_LINE = re.compile(r"reconcile passes last 10s: n=(\d+) full=(\d+) p50_ms=([\d.]+) "
                       r"p99_ms=([\d.]+) max_ms=([\d.]+)"
                       r"(?: cpu_p50_ms=([\d.]+) cpu_p99_ms=([\d.]+))?")


def catalog_json(models: int, replicas: int, more: bool = False) -> bytes:
    """``models`` one-GPU models of the simulated agents' class, ``replicas`` each; with
    ``more`` the first has one replica more (an apply that moves the fleet's generation and
    places or stops a replica, and leaves the catalog's sources as they are)."""
    entries = [{"name": f"bench-{i:04d}", "source": f"hf://bench/model-{i:04d}/model.gguf",
                "engine": "vllm", "profile": {"class": "a100-80g", "gpus": 1},
                "replicas": replicas + (1 if more and i == 0 else 0),
                "args": ["--max-model-len", "8192"]} for i in range(models)]
    return json.dumps({"models": entries}).encode()


class Control:
    """`llmgw server` (web workers and reconciler process) in its own session on a free
    loopback port, logging to ``workdir/control.log``; a second one shares the first's
    tokens and database."""

    def __init__(self, store_url: str, workdir: Path, name: str, first: Control | None,
                 workers: str = "", connections: int = 5000) -> None:
        import secrets

        workdir.mkdir(parents=True, exist_ok=True)
        self.name, self.port = name, free_port()
        tokens = (first.admin_token, first.join_token, first.router_token) if first else \
            tuple(f"llmgw-{k}-" + secrets.token_urlsafe(16) for k in ("admin", "join", "router"))
        self.admin_token: str = tokens[0]
        self.join_token: str = tokens[1]
        self.router_token: str = tokens[2]
        router = self.router_token
        env = {k: v for k, v in os.environ.items() if not k.startswith("LLMGW_")}
        env.update(LLMGW_HOST="127.0.0.1", LLMGW_PORT=str(self.port),
                   LLMGW_DATABASE_URL=store_url, LLMGW_STATE_DIR=str(workdir),
                   LLMGW_ADMIN_TOKEN=self.admin_token, LLMGW_JOIN_TOKEN=self.join_token,
                   LLMGW_ROUTER_TOKEN=router, LLMGW_INSTANCE_NAME=name, PYTHONPATH=str(ROOT),
                   # every agent keeps a connection open to its host
                   LLMGW_WORKER_CONNECTIONS=str(max(5000, connections)),
                   # The simulated agents claim 10.x addresses and report from loopback.
                   LLMGW_AGENT_NETWORKS="10.0.0.0/8")
        if workers:
            w, _, t = workers.partition("x")
            env.update(LLMGW_WORKERS=w, **({"LLMGW_THREADS": t} if t else {}))
        self.log = workdir / "control.log"
        with open(self.log, "ab") as fh:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "llmgw_runtime.cli.main", "server"], env=env,
                cwd=str(workdir), stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                start_new_session=True)
        deadline = time.monotonic() + 60
        while self.call("GET", "/healthz")[0] != 200:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"the control service {name} did not start:\n" + self.tail())
            time.sleep(0.2)

    def call(self, method: str, path: str, body: bytes = b"",
             content_type: str = "application/json") -> tuple[int, bytes]:
        import http.client

        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        try:
            conn.request(method, path, body, {"Authorization": f"Bearer {self.admin_token}",
                                              "Content-Type": content_type})
            resp = conn.getresponse()
            return resp.status, resp.read()
        except OSError:
            return 0, b""
        finally:
            conn.close()

    def wait_placed(self, expected: int, timeout_s: float) -> float:
        started = time.monotonic()
        last = ""
        while time.monotonic() - started < timeout_s:
            status, body = self.call("GET", "/api/v1/replicas")
            if status == 200:
                states = [r["state"] for r in json.loads(body)["replicas"]]
                ready = states.count("ready")
                last = f"{len(states)} replicas, {ready} ready"
                if len(states) >= expected and ready == len(states):
                    return time.monotonic() - started
            time.sleep(1.0)
        raise RuntimeError(f"replicas not all placed and ready after {timeout_s:.0f} s: {last}")

    def log_size(self) -> int:
        return self.log.stat().st_size

    def log_since(self, offset: int) -> str:
        with open(self.log, "rb") as fh:
            fh.seek(offset)
            return fh.read().decode(errors="replace")

    def tail(self, n: int = 30) -> str:
        return "\n".join(self.log.read_text(errors="replace").splitlines()[-n:])

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()


class Sim:
    """bench/agent_sim.py in its own process group, driven over its stdin/stdout."""

    def __init__(self, ports: list[int], join_token: str, reports: str, shared_weights: bool,
                 log: Path) -> None:
        self.init_args = {"hosts": [["127.0.0.1", p] for p in ports], "join_token": join_token,
                          "reports": reports, "shared_weights": shared_weights}
        self.period = 0.0
        self.log = log
        with open(log, "ab") as fh:
            self.proc = subprocess.Popen(
                [sys.executable, str(ROOT / "bench" / "agent_sim.py")], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=fh, text=True, start_new_session=True)

    def call(self, cmd: str, **args: Any) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        if cmd == "init":
            args = {**self.init_args, **args}
        self.proc.stdin.write(json.dumps({"cmd": cmd, **args}) + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline()
        if not answer:
            raise RuntimeError(f"the agent simulator exited: {self.log.read_text()[-2000:]}")
        out: dict[str, Any] = json.loads(answer)
        if not out.get("ok"):
            raise RuntimeError(f"agent simulator, {cmd}: {out.get('error')}")
        return out

    def stop(self) -> None:
        """SIGTERM to its process group (also while it runs a command: joining thousands of
        agents on a saturated server takes minutes), SIGKILL if it lingers."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()


class Cpu:
    """CPU time of named process trees, this process and the whole machine. A process of a
    tree whose command line holds ``RECONCILER`` counts under ``<name>/reconciler``."""

    RECONCILER = b"llmgw_runtime.control.reconcile"

    def __init__(self, roots: dict[str, int]) -> None:
        self.roots = roots
        self.hz = os.sysconf("SC_CLK_TCK")

    def sample(self) -> dict[str, float]:
        from tests.support.procs import descendants

        out: dict[str, float] = {}
        for name, root in self.roots.items():
            out[name] = out[name + "/reconciler"] = 0.0
            for pid in {root} | descendants(root):
                try:
                    with open(f"/proc/{pid}/stat") as fh:
                        fields = fh.read().rsplit(")", 1)[1].split()
                    with open(f"/proc/{pid}/cmdline", "rb") as fh:
                        part = name + "/reconciler" if self.RECONCILER in fh.read() else name
                    # utime, stime and the reaped children's (PostgreSQL backends, pools)
                    out[part] += sum(int(f) for f in fields[11:15]) / self.hz
                except (OSError, ValueError, IndexError):
                    continue
        out["bench"] = sum(os.times()[:2])
        with open("/proc/stat") as fh:
            ticks = [int(x) for x in fh.readline().split()[1:]]
        out["machine"] = (sum(ticks[:8]) - ticks[3] - ticks[4]) / self.hz
        return out

    def percent(self, before: dict[str, float], after: dict[str, float],
                span: float) -> dict[str, float]:
        """% of one core each used over ``span`` seconds; ``other``: the rest of the box. A
        reconciler that started again within the span counts from zero."""
        pct = {k: max(0.0, after[k] - before.get(k, 0.0)) / span * 100 for k in after}
        pct["other"] = pct.pop("machine") - sum(pct.values())
        return pct


def pass_stats(logs: list[str]) -> dict[str, float]:
    """The reconciler's pass durations from its every-10-s lines in ``logs`` (the leader's:
    lines of no pass are skipped); p50 and p99 are the largest of the lines'. Empty when no
    line was logged."""
    rows = [tuple(float(x or "nan") for x in m.groups()) for text in logs
            for m in PASS_LINE.finditer(text)]
    rows = [r for r in rows if r[0] > 0]
    if not rows:
        return {}
    return {"n": sum(r[0] for r in rows), "full": sum(r[1] for r in rows),
            "p50_ms": max(r[2] for r in rows), "p99_ms": max(r[3] for r in rows),
            "max_ms": max(r[4] for r in rows), "cpu_p50_ms": max(r[5] for r in rows),
            "cpu_p99_ms": max(r[6] for r in rows), "lines": len(rows)}


def leaders(controls: list[Control]) -> dict[str, float]:
    """Each control service's llmgw_leader gauge (1: its reconciler holds the lease)."""
    out = {}
    for c in controls:
        status, body = c.call("GET", "/metrics")
        found = re.search(rb'^llmgw_leader\{[^}]*\} ([\d.]+)', body, re.M) if status == 200 \
            else None
        out[c.name] = float(found.group(1)) if found else math.nan
    return out


class DbStats:
    """The benchmark database's write counters (pg_stat_database), the WAL written (by the
    whole server: only the benchmark writes to it) and table sizes."""

    COUNTERS = ("xact_commit", "tup_inserted", "tup_updated", "tup_deleted")

    def __init__(self, url: str) -> None:
        import psycopg2

        self.conn = psycopg2.connect(url)
        self.conn.autocommit = True

    def sample(self) -> dict[str, float]:
        with self.conn.cursor() as cur:
            cur.execute("SELECT pg_stat_clear_snapshot()")
            cur.execute(f"SELECT {', '.join(self.COUNTERS)}, "
                        "pg_wal_lsn_diff(pg_current_wal_lsn(), '0/0') FROM pg_stat_database "
                        "WHERE datname = current_database()")
            row = cur.fetchone()
        return dict(zip((*self.COUNTERS, "wal_bytes"), (float(x) for x in row or ()),
                        strict=True))

    def tables(self, top: int = 8) -> list[tuple[str, int, int]]:
        """The largest tables: (name, live rows, bytes with indexes and TOAST)."""
        with self.conn.cursor() as cur:
            cur.execute("SELECT relname, n_live_tup, pg_total_relation_size(relid) FROM "
                        "pg_stat_user_tables ORDER BY 3 DESC LIMIT %s", (top,))
            return [(str(n), int(r), int(b)) for n, r, b in cur.fetchall()]

    def close(self) -> None:
        self.conn.close()
