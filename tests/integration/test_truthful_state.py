"""Truthful state with real processes (control service, router, agent, llama.cpp engines on
a tiny model): an agent that stops its engines says so before it exits, a replica the
router cannot connect to is taken out and shown unreachable, and a model applied a moment
ago is never answered 404."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.support.procs import LlmgwProcess, http_ok, wait_until

from .conftest import Cluster, tiny_catalog

pytestmark = pytest.mark.slow


def start_router(c: Cluster, **env: str) -> LlmgwProcess:
    """The router as Cluster.start_router starts it, with other settings."""
    proc = c._start("router", [
        "router", "--control-url", c.control_url, "--host", "127.0.0.1",
        "--port", str(c.router_port), "--workers", "1", "--no-require-api-key",
    ], {"LLMGW_ROUTER_TOKEN": c.router_token, "LLMGW_REFRESH_INTERVAL_S": "0.3", **env})
    wait_until(lambda: http_ok(c.router_url + "/healthz") or proc.proc.poll() is not None,
               30, "the router")
    assert proc.proc.poll() is None, proc.tail()
    return proc


def chat(c: Cluster, model: str, timeout: float = 120) -> tuple[float, requests.Response]:
    started = time.monotonic()
    resp = requests.post(c.router_url + "/v1/chat/completions", timeout=timeout, json={
        "model": model, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
    return time.monotonic() - started, resp


def events(c: Cluster, kind: str, subject: str) -> list[str]:
    return [e["message"] for e in c.admin.get("/api/v1/events?limit=500")["events"]
            if e["kind"] == kind and e["subject"] == subject]


def test_an_agent_stopping_its_engines_reports_them_stopped_before_it_exits(
        cluster_factory: Any, tiny_model: Path) -> None:
    c: Cluster = cluster_factory()
    c.start_control()
    c.apply(tiny_catalog(tiny_model))
    c.start_router()
    agent = c.start_agent(extra=["--stop-engines-on-exit"])
    c.wait_ready("tiny")
    assert chat(c, "tiny")[1].status_code == 200

    agent.signal(signal.SIGTERM)
    agent.proc.wait(60)
    exited = time.monotonic()
    # the last report came before the exit: not ready within one report period (0.5 s)
    model = wait_until(lambda: (m := c.model("tiny"))["state"] != "ready" and m, 0.5,
                       "the model not ready")
    assert time.monotonic() - exited < 1.0, c.logs()
    assert model["ready"] == 0
    (message,) = events(c, "stopped", "tiny")
    assert "the agent on node1 stopped this replica" in message, message
    assert "stop_engines_on_exit" in message
    assert not c.model("tiny")["state"] == "ready"
    # The node is no longer capacity, and says why (it said "ok" until it went silent).
    (node,) = c.admin.get("/api/v1/nodes")["nodes"]
    assert node["last_report"] is None and "agent stopped" in node["problem"], node

    def refused() -> tuple[float, requests.Response] | None:
        elapsed, resp = chat(c, "tiny", timeout=30)
        return (elapsed, resp) if resp.json()["error"]["code"] == "model_failing" else None
    elapsed, resp = wait_until(refused, 10, "an honest refusal")
    assert resp.status_code == 503 and elapsed < 1.0, (elapsed, resp.text)
    assert "the agent on node1 stopped this replica" in resp.json()["error"]["message"]
    assert int(resp.headers["Retry-After"]) >= 1


def test_a_replica_the_router_cannot_reach_is_shown_unreachable_and_never_a_502(
        cluster_factory: Any, tiny_model: Path) -> None:
    c: Cluster = cluster_factory()
    c.start_control()
    c.apply(tiny_catalog(tiny_model))
    start_router(c, LLMGW_ACTIVATION_TIMEOUT_S="3")
    agent = c.start_agent()
    c.wait_ready("tiny")
    assert chat(c, "tiny")[1].status_code == 200
    (rep,) = c.replicas("tiny")

    agent.signal(signal.SIGKILL)            # nobody left to report the engine's death
    agent.proc.wait(30)
    os.killpg(rep["pid"], signal.SIGKILL)
    wait_until(lambda: not _alive(rep["pid"]), 10, "the engine gone")

    elapsed, resp = chat(c, "tiny", timeout=60)
    assert resp.status_code == 503, resp.text
    err = resp.json()["error"]
    assert err["code"] == "model_not_ready" and elapsed < 10, (elapsed, err)
    assert "unreachable" in err["message"] or "could not connect" in err["message"], err
    (now,) = c.replicas("tiny")
    assert now["state"] == "unreachable" and "Connection refused" in now["last_error"]
    (message,) = events(c, "unreachable", "tiny")
    assert rep["id"] in message
    assert c.model("tiny")["state"] != "ready"

    # a new agent does not run it: failed, replaced, served again
    c.procs.pop("agent")
    c.start_agent()
    wait_until(lambda: any(r["state"] == "ready" for r in c.replicas("tiny")), 90,
               "a new replica ready")
    # served once the router's next table lists it (until then: an honest 503)
    wait_until(lambda: chat(c, "tiny", timeout=30)[1].status_code == 200, 5,
               "the new replica served")
    failed = [m for m in events(c, "failure", "tiny") if "no longer runs" in m]
    assert failed, c.admin.get("/api/v1/events?limit=50")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def test_a_model_applied_a_moment_ago_is_never_404(cluster_factory: Any,
                                                   tiny_model: Path) -> None:
    c: Cluster = cluster_factory()
    c.start_control()
    start_router(c, LLMGW_REFRESH_INTERVAL_S="30")    # its own refresh is far away
    c.start_agent()
    wait_until(lambda: c.admin.get("/api/v1/status")["nodes"]["reporting"] == 1, 20,
               "the agent's report")
    assert chat(c, "nope")[1].status_code == 404        # the router has a table

    c.apply(tiny_catalog(tiny_model, name="fresh"))
    _, resp = chat(c, "fresh")
    assert resp.status_code == 200, resp.text
    assert resp.json()["choices"][0]["message"]["role"] == "assistant"

    # A model kept with replicas: 0 is refused at once and says how to start it, instead
    # of waiting out the activation window for a start that never comes.
    c.apply(tiny_catalog(tiny_model, name="held", replicas=0))
    elapsed, resp = chat(c, "held")
    error = resp.json()["error"]
    assert (resp.status_code, error["code"]) == (503, "model_stopped"), resp.text
    assert "replicas: 0" in error["message"] and "llmgw ctl apply" in error["message"]
    assert elapsed < 5, elapsed
