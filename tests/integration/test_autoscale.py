"""Autoscaling with real processes: the control service, a router and an agent running the
demo model (SmolLM2-135M-Instruct) on real llama.cpp CPU engines. A burst of concurrent
requests against one slot makes a second replica start and the queue drain through both;
after the burst the extra replica stops. Short windows in the catalog keep it quick."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import openai
import pytest

from llmgw_runtime.cli.up import demo_model_path
from tests.support.procs import wait_until

from .conftest import Cluster

pytestmark = pytest.mark.slow

CATALOG = """models:
  - name: demo
    source: file://{path}
    engine: llama.cpp
    profile: {{class: cpu, memory_gb: 1}}
    args: ["--ctx-size", "512", "--threads", "1"]
    replicas: {{min: 1, max: 2}}
    max_wait_s: 120
    autoscale: {{wait_target_s: 0.5, up_after_s: 1s, busy_below: 0.5, down_after_s: 3s,
                cooldown_s: 1s}}
"""
BURST = 24


def ready_replicas(c: Cluster) -> list[dict[str, Any]]:
    return [r for r in c.replicas("demo") if r["desired"] and r["state"] == "ready"]


def autoscale_events(c: Cluster) -> list[str]:
    return [e["message"] for e in c.admin.get("/api/v1/events?limit=200")["events"]
            if e["kind"] == "autoscale" and e["subject"] == "demo"]


def scaling(c: Cluster) -> dict[str, Any]:
    [model] = [m for m in c.admin.get("/api/v1/status")["models"] if m["name"] == "demo"]
    return dict(model["scaling"])


def test_a_burst_adds_a_replica_the_queue_drains_and_the_extra_one_stops(
        cluster_factory: Any) -> None:
    c: Cluster = cluster_factory()
    c.start_control()
    c.apply(CATALOG.format(path=demo_model_path()))
    c.start_router()
    c.start_agent()
    c.wait_ready("demo", timeout=120)
    [first] = ready_replicas(c)
    client = openai.OpenAI(base_url=c.router_url + "/v1", api_key="unused", max_retries=0,
                           timeout=180)

    def ask(i: int) -> str:
        reply = client.chat.completions.create(
            model="demo", temperature=0, max_tokens=48,
            messages=[{"role": "user", "content": f"Tell a long story about ship {i}."}])
        return reply.choices[0].message.content or ""

    started = time.monotonic()
    with ThreadPoolExecutor(BURST) as pool:
        futures = [pool.submit(ask, i) for i in range(BURST)]
        wait_until(lambda: len(ready_replicas(c)) == 2, 90, "a second replica ready")
        second_at = time.monotonic() - started
        pending = sum(not f.done() for f in futures)
        answers = [f.result(timeout=180) for f in futures]
    burst_s = time.monotonic() - started
    assert all(answers), answers
    # the second replica came while requests still waited, and took its share of them
    assert pending > 0, f"the burst ended before the second replica was ready ({second_at:.1f} s)"
    up = [e for e in autoscale_events(c) if e.endswith(": 1 -> 2")]
    assert up and up[0].startswith("queue wait "), autoscale_events(c)
    second = [r for r in ready_replicas(c) if r["id"] != first["id"]]
    wait_until(lambda: all(r["last_used"] for r in ready_replicas(c)), 10,
               "both replicas used")
    assert second
    # the queue drained: nothing waits in the router any more
    wait_until(lambda: scaling(c)["signal"]["waiting"] == 0, 10, "the queue drained")

    # after the burst, quiet slots: the extra replica stops
    wait_until(lambda: any(e.endswith(": 2 -> 1") for e in autoscale_events(c)), 60,
               "the autoscaler stepping down")
    wait_until(lambda: len([r for r in c.replicas("demo") if r["desired"]]) == 1, 30,
               "one replica left")
    down = [e for e in autoscale_events(c) if e.endswith(": 2 -> 1")]
    assert down[0].startswith("busy "), down
    now = scaling(c)
    assert (now["target"], now["min"], now["max"]) == (1, 1, 2)
    print(f"second replica ready after {second_at:.1f} s with {pending} requests pending; "
          f"burst of {BURST} took {burst_s:.1f} s")
