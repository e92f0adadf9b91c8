"""The fleet on loopback: a multi-node replica across two real agents of one fabric, with
llama.cpp's real RPC worker on one node and the real `llama-server --rpc` on the other
(`make llama-cpp` builds them), serving the demo model to the real openai client; a dead
worker failing the replica; fabrics as capacity; and weights fetched over HTTP by a real
agent for a real llama.cpp engine."""

from __future__ import annotations

import hashlib
import os
import signal
from pathlib import Path
from typing import Any

import openai
import pytest
from click.testing import CliRunner

from llmgw_runtime.cli.ctl import ctl as ctl_group
from llmgw_runtime.cli.up import demo_model_path
from llmgw_runtime.control.assignments import part_id
from tests.support.procs import free_port, pid_alive, wait_until

from .conftest import Cluster

pytestmark = pytest.mark.slow

BIG = """models:
  - name: big
    source: file://{model}
    engine: llama.cpp
    profile: {{class: cpu, gpus: 1, nodes: 2, tp: 2}}
    args: ["--ctx-size", "1024", "--threads", "1"]
"""


def rpc_agent(c: Cluster, bin_dir: Path, node: str, fabric: str) -> None:
    """An agent with the built llama-server; it finds ggml-rpc-server next to it."""
    c.start_agent(f"agent-{node}", node=node, extra=["--fabric", fabric],
                  env={"LLMGW_LLAMA_SERVER_BINARY": str(bin_dir / "llama-server")})


def engine_log(c: Cluster, node: str, replica_id: str) -> str:
    """The engine's log on ``node`` (a worker part's id is part_id(replica, rank))."""
    return (c.root / f"agent-{node}" / "run" / f"{replica_id}.log").read_text(errors="replace")


def test_a_two_node_replica_runs_across_one_fabric_and_a_dead_worker_fails_it(
        cluster_factory: Any, llama_cpp_bin: Path, tmp_path: Path) -> None:
    port = free_port()                 # the rendezvous port: none other tests may hold
    c: Cluster = cluster_factory()
    c.start_control(env={"LLMGW_RENDEZVOUS_PORTS": f"{port}-{port}"})
    c.start_router()
    rpc_agent(c, llama_cpp_bin, "node-a", "ib-a")
    rpc_agent(c, llama_cpp_bin, "node-c", "ib-b")       # alone on its fabric: never a partner
    rpc_agent(c, llama_cpp_bin, "node-b", "ib-a")
    wait_until(lambda: len(c.admin.get("/api/v1/nodes")["nodes"]) == 3, 30, "three nodes")
    c.apply(BIG.format(model=demo_model_path()))
    c.wait_ready("big", timeout=120)

    (rep,) = c.replicas("big")
    head, worker = rep["node"], rep["parts"][0]["node"]
    assert {head, worker} == {"node-a", "node-b"}, rep
    assert [p["rank"] for p in rep["parts"]] == [1] and rep["rendezvous_port"] == port
    client = openai.OpenAI(base_url=c.router_url + "/v1", api_key="unused", max_retries=0,
                           timeout=120)
    reply = client.chat.completions.create(
        model="big", temperature=0, max_tokens=16,
        messages=[{"role": "user", "content": "What is the capital of France?"}])
    answer = reply.choices[0].message.content or ""
    assert reply.model == "big" and any(w.isalpha() and len(w) > 2 for w in answer.split()), \
        answer
    # The head is the real llama-server given its worker with --rpc, and the worker served
    # the head's connection (it holds the model's layers: a head whose worker dies aborts
    # at its next step, "Remote RPC server crashed", docs/engines.md).
    head_log = engine_log(c, head, rep["id"])
    assert f"{llama_cpp_bin / 'llama-server'} -m {demo_model_path()}" in head_log
    assert f"--rpc 127.0.0.1:{port}" in head_log
    worker_log = engine_log(c, worker, part_id(rep["id"], 1))
    assert "ggml-rpc-server --host 127.0.0.1 --port" in worker_log
    assert "Accepted client connection" in worker_log, worker_log[-2000:]

    # a second two-node model cannot be placed: ib-a is taken, ib-b has one node
    entry = BIG.format(model=demo_model_path()).split("models:\n")[1]
    c.apply(BIG.format(model=demo_model_path()) + entry.replace("name: big", "name: big2"))
    plan = c.admin.get("/api/v1/plan")
    assert plan["unplaceable"]["big2"] == \
        "needs 2 whole nodes in one fabric; ib-a has 0 free, ib-b 1"
    code, out = ctl(c, "plan")
    assert code == 0, out
    assert "cannot place big2: needs 2 whole nodes in one fabric; ib-a has 0 free, ib-b 1" in out
    assert "FABRIC" in out and "ib-a" in out and "ib-b" in out
    code, out = ctl(c, "replicas")
    assert f"{head}:0 + {worker}:0" in out and "ready" in out

    # kill the worker's RPC server: its part fails, so does the replica, with the reason
    worker_pid = rep["parts"][0]["pid"]
    assert worker_pid and pid_alive(worker_pid)
    os.kill(worker_pid, signal.SIGKILL)

    def failure() -> str | None:
        events = c.admin.get("/api/v1/events?limit=200")["events"]
        return next((e["message"] for e in events if e["kind"] == "failure"
                     and e["subject"] == "big"), None)
    message = wait_until(failure, 30, "the replica's failure")
    assert f"part 1 on {worker} failed: engine exited with code -9" in message, c.logs()
    assert rep["id"] not in {r["id"] for r in c.replicas("big") if r["state"] == "ready"}


def ctl(c: Cluster, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(ctl_group, ["--url", c.control_url, "--token", c.admin_token,
                                            *args])
    return result.exit_code, result.output


def served(tmp: Path, payload: bytes) -> tuple[Any, str]:
    """A loopback HTTP server serving ``payload`` as /m/tiny.gguf; (server, url)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802
            if self.path != "/m/tiny.gguf":
                self.send_error(404)
                return
            self.send_response(200)
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/m/tiny.gguf"


def test_an_agent_fetches_weights_over_http_then_reports_holding_them(
        cluster_factory: Any, tiny_model: Path, tmp_path: Path) -> None:
    payload = tiny_model.read_bytes()
    server, url = served(tmp_path, payload)
    try:
        c: Cluster = cluster_factory()
        c.start_control()
        c.start_router()
        weights = tmp_path / "weights"
        weights.mkdir()
        c.start_agent(extra=["--fabric", "eth-a", "--weights-dir", str(weights)],
                      env={"LLMGW_WEIGHTS_SCAN_INTERVAL_S": "0.5"})
        c.apply(f"""models:
  - name: fetched
    source: {url}
    sha256: {hashlib.sha256(payload).hexdigest()}
    size_bytes: {len(payload)}
    engine: llama.cpp
    profile: {{class: cpu}}
    args: ["--ctx-size", "512"]
""")
        c.wait_ready("fetched", timeout=90)
        assert (weights / "tiny.gguf").read_bytes() == payload
        assert not list(weights.glob("*.part"))
        client = openai.OpenAI(base_url=c.router_url + "/v1", api_key="unused",
                               max_retries=0)
        reply = client.chat.completions.create(
            model="fetched", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
        assert reply.choices[0].message.role == "assistant"

        def holds() -> dict[str, Any] | None:
            status = c.admin.get("/api/v1/status")
            return status if status["fabrics"].get("eth-a", {}).get("models") else None
        status = wait_until(holds, 20, "the fabric to hold the weights")
        assert status["fabrics"]["eth-a"]["models"] == ["fetched"]
        (model,) = status["models"]
        assert model["fabrics_with_weights"] == ["eth-a"] and model["nodes_with_weights"] == 1
    finally:
        server.shutdown()


def test_a_checksum_mismatch_is_a_start_failure_with_both_sums(
        cluster_factory: Any, tiny_model: Path, tmp_path: Path) -> None:
    server, url = served(tmp_path, tiny_model.read_bytes())
    try:
        c: Cluster = cluster_factory()
        c.start_control()
        c.start_agent()
        c.apply(f"""models:
  - name: wrong
    source: {url}
    sha256: "{"0" * 64}"
    engine: llama.cpp
    profile: {{class: cpu}}
""")

        def failed() -> str | None:
            return c.model("wrong")["last_error"]
        error = wait_until(failed, 60, "the failed start")
        assert "0" * 64 in error and hashlib.sha256(tiny_model.read_bytes()).hexdigest() in error
    finally:
        server.shutdown()
