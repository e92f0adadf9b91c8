"""Two control services on one PostgreSQL (issue 30): agents spread over both hosts, both
answer reports and heartbeats, a catalog applied through one host gets replicas placed and
assigned to the agents of the other, one reconciler leads, and when the leading host stops
the other keeps serving and its reconciler takes over.

The agents are simulated here (a thread each, one request per report on a fresh connection)
and speak the heartbeat protocol of api/agent.py as the real agent does."""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import threading
import urllib.error
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

from tests.support.postgres import PostgresServer
from tests.support.procs import LlmgwProcess, children, free_port, http_ok, nice, wait_until

CLASS = "test-gpu"
TOKENS = {k: f"llmgw-{k}-" + secrets.token_urlsafe(16) for k in ("admin", "join", "router")}


def call(url: str, path: str, body: Any = None, token: str = TOKENS["admin"],
         method: str | None = None, raw: bytes | None = None,
         content_type: str = "application/json") -> tuple[int, bytes]:
    data = raw if raw is not None else None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url + path, data=data, method=method, headers={
        "Authorization": f"Bearer {token}", "Content-Type": content_type})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


class Host:
    """One `llmgw server` (web workers and its reconciler) on the shared database."""

    def __init__(self, name: str, store_url: str, root: Path) -> None:
        self.name, self.port = name, free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        state = root / name
        state.mkdir()
        self.proc = LlmgwProcess(name, [
            "server", "--host", "127.0.0.1", "--port", str(self.port),
            "--database-url", store_url, "--state-dir", str(state), "--workers", "1",
        ], {"LLMGW_ADMIN_TOKEN": TOKENS["admin"], "LLMGW_JOIN_TOKEN": TOKENS["join"],
            "LLMGW_ROUTER_TOKEN": TOKENS["router"], "LLMGW_INSTANCE_NAME": name,
            "LLMGW_RECONCILE_INTERVAL_S": "0.3", "LLMGW_LEASE_TTL_S": "3",
            "LLMGW_REPORT_INTERVAL_S": "0.3"}, root)
        wait_until(lambda: http_ok(self.url + "/healthz") or self.proc.proc.poll() is not None,
                   30, f"control service {name}")
        assert self.proc.proc.poll() is None, self.proc.tail()

    def leads(self) -> bool:
        """This host's llmgw_leader gauge: its reconciler holds the lease."""
        status, body = call(self.url, "/metrics")
        found = re.search(rb"^llmgw_leader\{[^}]*\} ([\d.]+)", body, re.M)
        return status == 200 and found is not None and float(found.group(1)) == 1.0


class Agent:
    """A simulated agent with two devices, running (as ready at once) what it is assigned;
    a full report first and on change or when asked, heartbeats otherwise."""

    def __init__(self, name: str, host: Host) -> None:
        self.name, self.host = name, host
        status, body = call(host.url, "/api/v1/agent/join", {"node": name},
                            token=TOKENS["join"])
        assert status == 200, body
        self.credential = json.loads(body)["credential"]
        self.assigned: dict[str, dict[str, Any]] = {}
        self.digest: str | None = None
        self.sent: str | None = None            # the last full report's body
        self.seen: Counter[tuple[str, str]] = Counter()   # (host, what was answered)
        self.failures: list[str] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def report(self) -> dict[str, Any]:
        devices = [{"id": i, "uuid": f"GPU-{self.name}-{i}", "class": CLASS,
                    "memory_total_mb": 81920} for i in range(2)]
        replicas = [{"id": rid, "model": a["model"], "state": "ready", "port": 20000 + n,
                     "pid": 1000 + n} for n, (rid, a) in enumerate(sorted(self.assigned.items()))]
        return {"node": self.name, "address": "127.0.0.1", "devices": devices,
                "engines": ["vllm"], "replicas": replicas}

    def once(self) -> None:
        body = json.dumps(self.report(), sort_keys=True)
        host = self.host
        if self.digest is not None and body == self.sent:
            status, raw = call(host.url, "/api/v1/agent/heartbeat",
                               {"node": self.name, "digest": self.digest},
                               token=self.credential)
            if status != 200:
                self.failures.append(f"heartbeat to {host.name}: HTTP {status} {raw[:200]!r}")
                return
            beat = json.loads(raw)
            if not beat.get("full_report"):
                self.seen[(host.name, "heartbeat")] += 1
                self.follow(beat["answer"])
                return
            self.seen[(host.name, "full_report asked")] += 1
        status, raw = call(host.url, "/api/v1/agent/report", raw=body.encode(),
                           token=self.credential)
        if status != 200:
            self.failures.append(f"report to {host.name}: HTTP {status} {raw[:200]!r}")
            return
        self.seen[(host.name, "report")] += 1
        self.digest, self.sent = hashlib.sha256(body.encode()).hexdigest(), body
        self.follow(json.loads(raw))

    def follow(self, answer: dict[str, Any]) -> None:
        self.assigned = {a["replica_id"]: a for a in answer["assignments"]}

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                self.once()
            except OSError as exc:           # its host stopping: the test says when
                self.failures.append(f"{self.host.name}: {exc}")
            except Exception as exc:  # noqa: BLE001 - the test fails on it, with what it was
                self.failures.append(f"{self.host.name}: {exc!r}")
            self.stop.wait(0.3)


def catalog(*models: tuple[str, int]) -> bytes:
    lines = ["models:"]
    for name, replicas in models:
        lines += [f"  - name: {name}", f"    source: hf://test/{name}/model.gguf",
                  "    engine: vllm", f"    profile: {{class: {CLASS}, gpus: 1}}",
                  f"    replicas: {replicas}", "    strategy: spread"]
    return ("\n".join(lines) + "\n").encode()


def ready_replicas(host: Host, model: str) -> list[dict[str, Any]]:
    status, body = call(host.url, "/api/v1/replicas")
    assert status == 200, body
    return [r for r in json.loads(body)["replicas"]
            if r["model"] == model and r["state"] == "ready"]


def test_two_control_hosts_share_the_agents_and_one_reconciler(
        postgres: PostgresServer, tmp_path: Path) -> None:
    store_url = postgres.create_database(f"two_{secrets.token_hex(4)}")
    hosts = [Host("host-a", store_url, tmp_path)]
    a = hosts[0]
    agents: list[Agent] = []
    try:
        # Host A leads before host B starts (B would otherwise race it to the lease).
        wait_until(a.leads, 15, "host A's reconciler to lead")
        hosts.append(Host("host-b", store_url, tmp_path))
        b = hosts[1]
        agents = [Agent(f"node{i}", a if i % 2 else b) for i in range(1, 5)]
        for agent in agents:
            agent.thread.start()
        # Every node reported once (placement spreads over the nodes it has heard from: a
        # catalog applied before the last one's first report doubles a replica elsewhere).
        wait_until(lambda: all(ag.seen[(ag.host.name, "report")] >= 1 for ag in agents), 15,
                   "each agent's first report")

        # A catalog applied through A: B's agents get their replicas through B.
        status, body = call(a.url, "/api/v1/catalog", raw=catalog(("m1", 4)), method="PUT",
                            content_type="application/yaml")
        assert status == 200, body
        wait_until(lambda: len(ready_replicas(b, "m1")) == 4, 20, "m1's 4 replicas ready")
        nodes_of = {r["node"] for r in ready_replicas(a, "m1")}
        assert nodes_of == {"node1", "node2", "node3", "node4"}     # spread over both hosts
        for agent in agents:
            assert len(agent.assigned) == 1, (agent.name, agent.assigned)

        # Both hosts answer heartbeats from memory; one reconciler leads.
        wait_until(lambda: all(ag.seen[(ag.host.name, "heartbeat")] >= 3 for ag in agents),
                   10, "heartbeats answered by both hosts")
        assert a.leads() and not b.leads()
        assert "took leadership" not in b.proc.log.read_text()
        # each host's web worker runs below its reconciler's CPU priority (LLMGW_WEB_NICE,
        # 5): on a busy host a pass does not wait for a core behind the workers
        for host in hosts:
            kids = children(host.proc.pid)
            reconciler = [pid for pid, argv in kids if "llmgw_runtime.control.reconcile" in argv]
            workers = [pid for pid, argv in kids if "server" in argv]
            assert len(reconciler) == 1 and len(workers) == 1, kids
            assert nice(workers[0]) == nice(reconciler[0]) + 5 == nice(host.proc.pid) + 5

        # Host A stops: its agents move to B (as a load balancer in front would send them),
        # whose answer to their first heartbeat asks for the full report it does not hold.
        a.proc.stop()
        # a clean stop: each gevent worker's teardown printed a traceback here before
        # (logging's handler references, control/serve.py ``quiet_exit``)
        stopped = a.proc.log.read_text()
        assert "Worker exiting" in stopped and "Exception ignored" not in stopped, stopped[-2000:]
        moved = agents[0::2]
        for agent in moved:
            agent.host = b
        wait_until(b.leads, 10, "host B's reconciler to take over")
        wait_until(lambda: all(ag.seen[("host-b", "heartbeat")] >= 2 for ag in moved), 10,
                   "the moved agents' heartbeats answered by B")
        for agent in moved:
            assert agent.seen[("host-b", "full_report asked")] >= 1, agent.seen

        # B's reconciler now places what is applied through B.
        status, body = call(b.url, "/api/v1/catalog", raw=catalog(("m1", 4), ("m2", 4)),
                            method="PUT", content_type="application/yaml")
        assert status == 200, body
        wait_until(lambda: len(ready_replicas(b, "m2")) == 4, 20, "m2's 4 replicas ready")
        assert len(ready_replicas(b, "m1")) == 4
        stray = [f for ag in agents for f in ag.failures if "host-a" not in f]
        assert not stray, stray
    finally:
        for agent in agents:
            agent.stop.set()
        for agent in agents:
            agent.thread.join(5)
        for host in hosts:
            host.proc.stop()
