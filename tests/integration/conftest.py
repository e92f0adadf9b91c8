"""A whole llmgw on loopback from real processes: control service, router, agent, and real
llama.cpp engines loading a tiny random-weight GGUF."""

from __future__ import annotations

import json
import math
import secrets
import signal
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
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


def model_entry(name: str, source: Path | str, ctx: int = 512, **extra: Any) -> str:
    """One catalog entry of a CPU llama.cpp model with ``--ctx-size ctx --threads 1`` (its
    args change with ``ctx``: a new definition) and ``extra`` fields as YAML text."""
    lines = [f"  - name: {name}", f"    source: file://{source}", "    engine: llama.cpp",
             "    profile: {class: cpu}",
             f"    args: [\"--ctx-size\", \"{ctx}\", \"--threads\", \"1\"]"]
    lines += [f"    {k}: {v}" for k, v in extra.items()]
    return "\n".join(lines) + "\n"


def catalog_of(*entries: str) -> str:
    return "models:\n" + "".join(entries)


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

    def start_two_nodes(self, env: dict[str, str] | None = None) -> None:
        """Control, router and two agents, node1 and node2 (class cpu), both reporting."""
        self.start_control(env=env)
        self.start_router()
        self.start_agent("agent", node="node1")
        self.start_agent("agent-node2", node="node2")
        wait_until(lambda: self.admin.get("/api/v1/status")["nodes"]["reporting"] == 2, 30,
                   "two agents' reports")

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

    # -- rollouts, drains, events (issue 27) ------------------------------------------------

    def rollout(self, name: str) -> dict[str, Any]:
        """The model's RolloutStatus."""
        return dict(self.admin.get(f"/api/v1/models/{name}/rollout"))

    def wait_rollout(self, name: str, states: str | tuple[str, ...], timeout: float = 60,
                     also: Any = None) -> dict[str, Any]:
        """Wait until the model's rollout is in one of ``states`` (and ``also(status)``
        holds when given); the last status is in the timeout's message."""
        wanted = (states,) if isinstance(states, str) else states

        def reached() -> dict[str, Any] | None:
            status = self.rollout(name)
            ok = status["state"] in wanted and (also is None or also(status))
            return status if ok else None
        return dict(wait_until(reached, timeout, f"rollout of {name} in {wanted}",
                               interval=0.2))

    def post(self, path: str, payload: Any = None) -> Any:
        return self.admin.post(path, {} if payload is None else payload)

    def node_drain(self, node: str) -> dict[str, Any]:
        return dict(self.admin.get(f"/api/v1/nodes/{node}/drain"))

    def events(self, kind: str | None = None, subject: str | None = None,
               limit: int = 1000) -> list[dict[str, Any]]:
        """Events, oldest first, of ``kind`` and ``subject`` when given."""
        events = self.admin.get(f"/api/v1/events?limit={limit}")["events"]
        found = [e for e in events if (kind is None or e["kind"] == kind)
                 and (subject is None or e["subject"] == subject)]
        return sorted(found, key=lambda e: e["id"])

    def live(self, model: str) -> list[dict[str, Any]]:
        """The model's replicas that are to run (desired), draining ones included."""
        return [r for r in self.replicas(model) if r["desired"]]

    def serving(self, model: str) -> list[dict[str, Any]]:
        """The model's ready replicas that take new requests (not draining)."""
        return [r for r in self.replicas(model)
                if r["desired"] and r["state"] == "ready" and not r.get("draining")]

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


# ------------------------------------------------------------------ a request loop (issue 27)


def metric(url: str, name: str, **labels: str) -> float | None:
    """The value of one sample on a /metrics page (summed over the samples that match
    ``labels``), or None when absent."""
    return metric_in(urllib.request.urlopen(url + "/metrics", timeout=10).read().decode(),
                     name, **labels)


def metric_in(text: str, name: str, **labels: str) -> float | None:
    """The value of one sample in a /metrics text, as :func:`metric` reads it."""
    from prometheus_client.parser import text_string_to_metric_families

    found: float | None = None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v
                                           for k, v in labels.items()):
                found = (found or 0.0) + float(sample.value)
    return found


def engine_props(port: int) -> dict[str, Any]:
    """llama.cpp's /props of an engine on this machine: ``n_ctx`` (per slot) and
    ``total_slots`` say which args it runs with."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/props", timeout=5) as resp:
        props = json.loads(resp.read())
    return {"n_ctx": props["default_generation_settings"]["n_ctx"],
            "total_slots": props["total_slots"]}


@dataclass
class Outcome:
    """One request of a RequestLoop: when it ran, whether it streamed, which replica
    answered (the router's X-Llmgw-Replica header) and its error (None: it succeeded; a
    stream that ended without a finish_reason is "stream cut")."""

    model: str
    streamed: bool
    start: float
    end: float
    replica: str | None
    error: str | None
    tokens: int = 0

    @property
    def latency(self) -> float:
        return self.end - self.start


def one_request(client: openai.OpenAI, model: str, stream: bool, max_tokens: int,
                prompt: str = "hello world", on_token: Any = None, **extra: Any) -> Outcome:
    """A chat completion through the router with the real openai client; never raises.
    ``on_token()`` is called at each streamed chunk with content."""
    start = time.monotonic()
    replica: str | None = None
    tokens = 0
    try:
        raw = client.chat.completions.with_raw_response.create(
            model=model, messages=[{"role": "user", "content": prompt}],
            max_tokens=max_tokens, stream=stream, **extra)
        replica = raw.headers.get("x-llmgw-replica")
        if stream:
            finished = None
            for chunk in raw.parse():
                for choice in chunk.choices:
                    if choice.delta.content:
                        tokens += 1
                        if on_token is not None:
                            on_token()
                    finished = choice.finish_reason or finished
            error = None if finished else f"stream cut after {tokens} chunks"
        else:
            reply = raw.parse()
            tokens = reply.usage.completion_tokens if reply.usage else 0
            error = None if reply.choices and reply.choices[0].finish_reason else \
                "no finish_reason"
    except Exception as exc:  # noqa: BLE001 - every failure is recorded, with its error
        error = f"{type(exc).__name__}: {exc}"
    return Outcome(model, stream, start, time.monotonic(), replica, error, tokens)


def router_client(url: str, timeout: float = 60) -> openai.OpenAI:
    return openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0,
                         timeout=timeout)


class RequestLoop:
    """``threads`` clients sending chat completions of ``model`` through the router back
    to back (odd-numbered threads stream), each with its own openai client, until
    stopped, ``pause_s`` apart; every outcome is kept. ``max_tokens`` small keeps the tiny
    model's answers to milliseconds."""

    def __init__(self, router_url: str, model: str, threads: int = 4, max_tokens: int = 8,
                 timeout: float = 60, pause_s: float = 0.05) -> None:
        self.router_url, self.model = router_url, model
        self.threads, self.max_tokens, self.timeout = threads, max_tokens, timeout
        self.pause_s = pause_s        # between one client's requests: CPU left for the rest
        self.outcomes: list[Outcome] = []
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._workers: list[threading.Thread] = []

    def _run(self, index: int) -> None:
        client = router_client(self.router_url, self.timeout)
        while not self._stop.is_set():
            outcome = one_request(client, self.model, index % 2 == 1, self.max_tokens,
                                  prompt=f"hello world {index}")
            with self._lock:
                self.outcomes.append(outcome)
            self._stop.wait(self.pause_s)

    def start(self) -> RequestLoop:
        for i in range(self.threads):
            worker = threading.Thread(target=self._run, args=(i,), daemon=True,
                                      name=f"request-loop-{i}")
            worker.start()
            self._workers.append(worker)
        return self

    def stop(self) -> list[Outcome]:
        self._stop.set()
        for worker in self._workers:
            worker.join(self.timeout + 5)
        return self.done()

    def __enter__(self) -> RequestLoop:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def done(self, since: float = 0.0, until: float = float("inf")) -> list[Outcome]:
        """The outcomes of requests that started in [since, until) (time.monotonic())."""
        with self._lock:
            return [o for o in self.outcomes if since <= o.start < until]

    def failures(self, since: float = 0.0, until: float = float("inf")) -> list[str]:
        return [f"{'stream' if o.streamed else 'request'} at {o.start:.1f} "
                f"(replica {o.replica}): {o.error}"
                for o in self.done(since, until) if o.error]

    def wait_requests(self, count: int, timeout: float = 30) -> None:
        """Wait until ``count`` more requests have succeeded (the loop is running)."""
        with self._lock:
            target = sum(1 for o in self.outcomes if not o.error) + count

        def enough() -> bool:
            with self._lock:
                return sum(1 for o in self.outcomes if not o.error) >= target
        wait_until(enough, timeout, f"{count} more requests of the loop", interval=0.05)


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0-100), nearest rank; 0.0 for no values."""
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[min(rank, len(ordered)) - 1]
