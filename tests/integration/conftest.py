"""A whole llmgw on loopback from real processes: control service, router, agent, and real
llama.cpp engines loading a tiny random-weight GGUF."""

from __future__ import annotations

import secrets
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from llmgw_runtime.agent.supervisor import stop_recorded_engines
from llmgw_runtime.cli.client import Client
from tests.support.procs import LlmgwProcess, free_port, http_ok, wait_until
from tests.support.tiny_gguf import write_tiny_gguf


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_gguf(tmp_path_factory.mktemp("models") / "tiny.gguf")


def tiny_catalog(path: Path, name: str = "tiny", **extra: Any) -> str:
    lines = [f"  - name: {name}", f"    source: file://{path}", "    engine: llama.cpp",
             "    profile: {class: cpu}", "    args: [\"--ctx-size\", \"512\"]"]
    lines += [f"    {k}: {v}" for k, v in extra.items()]
    return "models:\n" + "\n".join(lines) + "\n"


class Cluster:
    def __init__(self, store_url: str, root: Path, pki: Path | None = None) -> None:
        self.root = root
        self.pki = pki            # a directory with ca.crt, control.*, router.*: HTTPS
        self.store_url = store_url
        self.admin_token = "llmgw-admin-" + secrets.token_urlsafe(16)
        self.join_token = "llmgw-join-" + secrets.token_urlsafe(16)
        self.router_token = "llmgw-router-" + secrets.token_urlsafe(16)
        self.control_port, self.router_port = free_port(), free_port()
        scheme = "https" if pki else "http"
        self.ca_file = str(pki / "ca.crt") if pki else None
        self.control_url = f"{scheme}://127.0.0.1:{self.control_port}"
        self.router_url = f"{scheme}://127.0.0.1:{self.router_port}"
        self.agent_dir = root / "agent"
        self.agent_dirs = [self.agent_dir]
        self.procs: dict[str, LlmgwProcess] = {}
        self.admin = Client(self.control_url, self.admin_token, ca_file=self.ca_file)

    def _tls(self, name: str) -> dict[str, str]:
        if not self.pki:
            return {}
        return {"LLMGW_TLS_CERT": str(self.pki / f"{name}.crt"),
                "LLMGW_TLS_KEY": str(self.pki / f"{name}.key"),
                "LLMGW_CA_FILE": str(self.pki / "ca.crt")}

    def _start(self, name: str, args: list[str], env: dict[str, str]) -> LlmgwProcess:
        proc = LlmgwProcess(name, args, env, self.root)
        self.procs[name] = proc
        return proc

    def start_control(self, env: dict[str, str] | None = None) -> None:
        proc = self._start("control", [
            "server", "--host", "127.0.0.1", "--port", str(self.control_port),
            "--database-url", self.store_url, "--state-dir", str(self.root), "--workers", "1",
        ], {"LLMGW_ADMIN_TOKEN": self.admin_token, "LLMGW_JOIN_TOKEN": self.join_token,
            "LLMGW_ROUTER_TOKEN": self.router_token, "LLMGW_RECONCILE_INTERVAL_S": "0.3",
            "LLMGW_LEASE_TTL_S": "3", "LLMGW_REPORT_INTERVAL_S": "0.5", **self._tls("control"),
            **(env or {})})
        wait_until(lambda: http_ok(self.control_url + "/healthz", self.ca_file) or
                   proc.proc.poll() is not None, 30, "the control service")
        assert proc.proc.poll() is None, proc.tail()

    def start_router(self, require_api_key: bool = False, workers: int = 1,
                     env: dict[str, str] | None = None) -> None:
        proc = self._start("router", [
            "router", "--control-url", self.control_url, "--host", "127.0.0.1",
            "--port", str(self.router_port), "--workers", str(workers),
            "--require-api-key" if require_api_key else "--no-require-api-key",
        ], {"LLMGW_ROUTER_TOKEN": self.router_token, "LLMGW_REFRESH_INTERVAL_S": "0.3",
            **self._tls("router"), **(env or {})})
        wait_until(lambda: http_ok(self.router_url + "/healthz", self.ca_file) or
                   proc.proc.poll() is not None, 30, "the router")
        assert proc.proc.poll() is None, proc.tail()

    def start_agent(self, name: str = "agent", devices: str = "cpu",
                    env: dict[str, str] | None = None, node: str = "node1",
                    extra: list[str] | None = None) -> LlmgwProcess:
        """An agent; a node other than node1 keeps its state in <root>/agent-<node>."""
        state = self.agent_dir if node == "node1" else self.root / f"agent-{node}"
        if state not in self.agent_dirs:
            self.agent_dirs.append(state)
        return self._start(name, [
            "agent", "--control-url", self.control_url, "--state-dir", str(state),
            "--devices", devices, "--node-name", node, *(extra or []),
        ], {"LLMGW_JOIN_TOKEN": self.join_token, "LLMGW_REPORT_INTERVAL_S": "0.5",
            **({"LLMGW_CA_FILE": self.ca_file} if self.ca_file else {}), **(env or {})})

    def apply(self, text: str) -> Any:
        return self.admin.request("PUT", "/api/v1/catalog", text.encode(), "application/yaml")

    def model(self, name: str) -> dict[str, Any]:
        return dict(self.admin.get(f"/api/v1/models/{name}"))

    def replicas(self, model: str | None = None) -> list[dict[str, Any]]:
        reps = self.admin.get("/api/v1/replicas")["replicas"]
        return [r for r in reps if model is None or r["model"] == model]

    def wait_ready(self, name: str, timeout: float = 60) -> dict[str, Any]:
        def ready() -> dict[str, Any] | None:
            model = self.model(name)
            return model if model["state"] == "ready" else None
        return dict(wait_until(ready, timeout, f"model {name} ready"))

    def logs(self) -> str:
        return "\n".join(f"--- {n}\n{p.tail()}" for n, p in self.procs.items())

    def stop(self) -> None:
        # SIGTERM to all at once, then wait for each: every one stops gracefully, and the
        # teardown takes the slowest one's time instead of the sum (seconds per test).
        procs = list(reversed(list(self.procs.values())))
        for proc in procs:
            proc.signal(signal.SIGTERM)
        for proc in procs:
            proc.stop(signalled=True)
        for state in self.agent_dirs:
            stop_recorded_engines(state)


@pytest.fixture
def cluster_factory(tmp_path: Path) -> Iterator[Any]:
    made: list[Cluster] = []

    def make(store_url: str | None = None, pki: Path | None = None) -> Cluster:
        url = store_url or f"sqlite:///{tmp_path}/llmgw.db"
        cluster = Cluster(url, tmp_path, pki)
        made.append(cluster)
        return cluster

    yield make
    for cluster in made:
        cluster.stop()


@pytest.fixture
def cluster(cluster_factory: Any, tiny_model: Path) -> Cluster:
    """Control, router and agent on SQLite, with the tiny model ready."""
    c: Cluster = cluster_factory()
    c.start_control()
    c.apply(tiny_catalog(tiny_model))
    c.start_router()
    c.start_agent()
    c.wait_ready("tiny")
    return c
