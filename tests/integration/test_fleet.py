"""The fleet on loopback: a multi-node replica across two real agents of one fabric, routed
with the real openai client; a failed part failing the replica; fabrics as capacity; and
weights fetched over HTTP by a real agent for a real llama.cpp engine."""

from __future__ import annotations

import hashlib
import os
import signal
import sys
from pathlib import Path
from typing import Any

import openai
import pytest
from click.testing import CliRunner

from llmgw_runtime.cli.ctl import ctl as ctl_group
from tests.support.procs import pid_alive, wait_until

from .conftest import Cluster

pytestmark = pytest.mark.slow

STANDIN = Path(__file__).resolve().parents[1] / "support" / "rpc_standin.py"

BIG = """models:
  - name: big
    source: file://{model}
    engine: llama.cpp
    profile: {{class: cpu, gpus: 1, nodes: 2, tp: 2}}
"""


def standin(tmp: Path, name: str) -> str:
    """An executable named like llama.cpp's that runs the RPC stand-in."""
    path = tmp / "bin" / name
    path.parent.mkdir(exist_ok=True)
    path.write_text(f"#!/bin/sh\nexec {sys.executable} {STANDIN} {name} \"$@\"\n")
    path.chmod(0o755)
    return str(path)


def rpc_agent(c: Cluster, tmp: Path, node: str, fabric: str) -> None:
    c.start_agent(f"agent-{node}", node=node, extra=["--fabric", fabric], env={
        "LLMGW_LLAMA_SERVER_BINARY": standin(tmp, "llama-server"),
        "LLMGW_LLAMA_RPC_BINARY": standin(tmp, "rpc-server")})


def test_a_two_node_replica_runs_across_one_fabric_and_a_dead_part_fails_it(
        cluster_factory: Any, tiny_model: Path, tmp_path: Path) -> None:
    c: Cluster = cluster_factory()
    c.start_control()
    c.start_router()
    rpc_agent(c, tmp_path, "node-a", "ib-a")
    rpc_agent(c, tmp_path, "node-c", "ib-b")       # alone on its fabric: never a partner
    rpc_agent(c, tmp_path, "node-b", "ib-a")
    wait_until(lambda: len(c.admin.get("/api/v1/nodes")["nodes"]) == 3, 30, "three nodes")
    c.apply(BIG.format(model=tiny_model))
    c.wait_ready("big", timeout=60)

    (rep,) = c.replicas("big")
    nodes = {rep["node"], *(p["node"] for p in rep["parts"])}
    assert nodes == {"node-a", "node-b"}, rep
    assert [p["rank"] for p in rep["parts"]] == [1] and rep["rendezvous_port"] == 29500
    client = openai.OpenAI(base_url=c.router_url + "/v1", api_key="unused", max_retries=0)
    reply = client.chat.completions.create(
        model="big", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    # the head was started with --rpc naming its worker on the other node of ib-a
    assert reply.system_fingerprint == "big+rpc:127.0.0.1:29500"

    # a second two-node model cannot be placed: ib-a is taken, ib-b has one node
    entry = BIG.format(model=tiny_model).split("models:\n")[1]
    c.apply(BIG.format(model=tiny_model) + entry.replace("name: big", "name: big2"))
    plan = c.admin.get("/api/v1/plan")
    assert plan["unplaceable"]["big2"] == \
        "needs 2 whole nodes in one fabric; ib-a has 0 free, ib-b 1"
    code, out = ctl(c, "plan")
    assert code == 0, out
    assert "cannot place big2: needs 2 whole nodes in one fabric; ib-a has 0 free, ib-b 1" in out
    assert "FABRIC" in out and "ib-a" in out and "ib-b" in out
    code, out = ctl(c, "replicas")
    assert f"{rep['node']}:0 + {rep['parts'][0]['node']}:0" in out and "ready" in out

    # kill the worker's engine: the part fails, so does the replica, with the reason
    worker_pid = rep["parts"][0]["pid"]
    assert worker_pid and pid_alive(worker_pid)
    os.kill(worker_pid, signal.SIGKILL)

    def failure() -> str | None:
        events = c.admin.get("/api/v1/events?limit=200")["events"]
        return next((e["message"] for e in events if e["kind"] == "failure"
                     and e["subject"] == "big"), None)
    message = wait_until(failure, 30, "the replica's failure")
    assert "part 1 on node-b failed" in message, c.logs()


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
