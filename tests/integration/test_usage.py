"""API keys as a product across the whole fleet (issue 17): real control service, agent,
llama.cpp engine and router. A key's requests-per-minute limit refuses the sixth request
with OpenAI's 429; its usage reaches the store (a router that stops posts what it has not
reported yet), survives a router restart, and is what ``ctl usage`` and ``/metrics`` show,
equal to the usage objects the engine returned."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.support.procs import wait_until

from .conftest import Cluster, tiny_catalog

pytestmark = pytest.mark.slow

BODY = {"model": "tiny", "messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4,
        "temperature": 0}


def _usage(c: Cluster) -> dict[str, Any]:
    rows = c.admin.get("/api/v1/usage?since=1h")["rows"]
    return {(r["key"], r["model"]): (r["requests"], r["prompt_tokens"],
                                     r["completion_tokens"]) for r in rows}


def test_limits_and_usage_through_the_fleet_and_a_router_restart(
        cluster_factory: Any, tiny_model: Path) -> None:
    c: Cluster = cluster_factory()
    c.start_control()
    key = c.admin.post("/api/v1/keys", {"name": "app", "rpm": 5})["key"]
    c.apply(tiny_catalog(tiny_model))
    c.start_agent()
    c.wait_ready("tiny")
    # A tick only every 30 s: the usage can reach the control service only by the
    # workers' last report when the router stops.
    c.start_router(require_api_key=True, workers=2,
                   env={"LLMGW_REFRESH_INTERVAL_S": "30"})
    auth = {"Authorization": f"Bearer {key}"}
    answers = [requests.post(c.router_url + "/v1/chat/completions", headers=auth,
                             json=BODY if n % 2 else {**BODY, "stream": True,
                                                      "stream_options": {"include_usage": True}},
                             timeout=60) for n in range(7)]
    assert [r.status_code for r in answers] == [200] * 5 + [429] * 2, answers[-1].text
    assert answers[-1].json()["error"]["code"] == "rate_limit_exceeded"
    assert int(answers[-1].headers["Retry-After"]) >= 1
    prompt = completion = 0
    for resp in answers[:5]:
        if resp.headers["Content-Type"].startswith("text/event-stream"):
            usage = [line for line in resp.text.splitlines() if '"usage":{' in line]
            doc = json.loads(usage[-1][len("data: "):])
        else:
            doc = resp.json()
        prompt += doc["usage"]["prompt_tokens"]
        completion += doc["usage"]["completion_tokens"]
    assert _usage(c) == {}                       # nothing reported yet: the tick is far
    c.procs["router"].stop()                     # SIGTERM: graceful
    assert _usage(c) == {("app", "tiny"): (5, prompt, completion)}

    c.start_router(require_api_key=True)         # a new router: the usage stays stored
    more = requests.post(c.router_url + "/v1/chat/completions", headers=auth, json=BODY,
                         timeout=60)
    # the limit is per router process's table: a new router starts with a full minute
    assert more.status_code == 200, more.text
    used = more.json()["usage"]
    want = (6, prompt + used["prompt_tokens"], completion + used["completion_tokens"])
    wait_until(lambda: _usage(c) == {("app", "tiny"): want}, 15, "the new router's report")
    metrics = requests.get(c.control_url + "/metrics", timeout=10).text
    assert f'llmgw_key_tokens_total{{key="app",model="tiny",kind="prompt"}} {want[1]}.0' \
        in metrics
    assert 'llmgw_key_requests_total{key="app",model="tiny"} 6.0' in metrics
