"""Fallback models (issue 17): a request for a model that is parked, unplaceable or at
capacity is served by the first of its fallback models that can serve it; the answer
names the model that served it and the metrics count it. The real router (gevent
workers), a stand-in control service, real fake engines, the real openai client."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import openai
import pytest
import requests

from .conftest import API_KEY, ROUTER_TOKEN, Control, model, running_router, table

BIG_ONLY = "sk-llmgw-big-only"
ASK = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def fleet(engines: dict[str, str]) -> Iterator[str]:
    def ep(rid: str, url: str, slots: int | None = None) -> dict[str, Any]:
        return {"replica_id": rid, "url": url, "slots": slots}

    routes = table(
        model("big", state="parked", reason="engine exited with code 1",
              fallback=["missing", "small"]),
        model("gone", state="unplaceable", reason="no device fits", fallback=["big"]),
        model("off", state="stopped", reason="replicas is 0 in the catalog",
              fallback=["small"]),
        model("small", endpoints=[("r-small", engines["e1"])]),
        keys=(API_KEY, BIG_ONLY), scopes={BIG_ONLY: ["big"]})
    routes["models"].append({"name": "busy", "state": "ready", "reason": None,
                             "on_demand": False, "endpoints": [ep("r-busy", engines["e2"], 1)],
                             "max_queue": 0, "fallback": ["small"]})
    ctl = Control(routes, ROUTER_TOKEN).start()
    try:
        with running_router(ctl.url, workers=1) as url:
            yield url
    finally:
        ctl.stop()


def test_a_parked_model_is_served_by_its_first_fallback_that_can(fleet: str) -> None:
    client = openai.OpenAI(base_url=fleet + "/v1", api_key=API_KEY, max_retries=0)
    raw = client.chat.completions.with_raw_response.create(model="big", messages=ASK)
    assert raw.headers["X-Llmgw-Model"] == "small"     # "missing" is not in the table
    assert raw.parse().model == "small"                # the engine was asked for "small"


def test_a_stopped_model_is_served_by_its_fallback_and_the_metrics_say_stopped(
        fleet: str) -> None:
    # Taking a model down (replicas: 0) is when its fallback is wanted (issue 28).
    client = openai.OpenAI(base_url=fleet + "/v1", api_key=API_KEY, max_retries=0)
    raw = client.chat.completions.with_raw_response.create(model="off", messages=ASK)
    assert raw.headers["X-Llmgw-Model"] == "small" and raw.parse().model == "small"
    text = requests.get(fleet + "/metrics", timeout=5).text
    assert 'llmgw_router_fallbacks_total{fallback="small",model="off",reason="stopped"} 1.0' \
        in text


def test_a_model_at_capacity_falls_back_and_the_metrics_count_it(fleet: str) -> None:
    client = openai.OpenAI(base_url=fleet + "/v1", api_key=API_KEY, max_retries=0)
    slow = threading.Thread(target=lambda: client.chat.completions.create(
        model="busy", messages=ASK, extra_body={"fake_delay_s": 2.0}))
    slow.start()
    try:
        for _ in range(50):       # until the slow request holds busy's one slot
            text = requests.get(fleet + "/metrics", timeout=5).text
            if 'llmgw_router_slots_in_use{model="busy"} 1.0' in text:
                break
            threading.Event().wait(0.05)
        raw = client.chat.completions.with_raw_response.create(model="busy", messages=ASK)
        assert raw.headers["X-Llmgw-Model"] == "small"
    finally:
        slow.join(10)
    text = requests.get(fleet + "/metrics", timeout=5).text
    [counted] = [line for line in text.splitlines()
                 if line.startswith("llmgw_router_fallbacks_total{") and 'model="busy"' in line]
    assert 'fallback="small"' in counted and 'reason="at_capacity"' in counted
    assert counted.endswith(" 1.0")


def test_fallbacks_are_one_step_and_within_the_keys_scope(fleet: str) -> None:
    # "gone" falls back to "big", which is parked: big's own fallbacks are not followed
    client = openai.OpenAI(base_url=fleet + "/v1", api_key=API_KEY, max_retries=0)
    with pytest.raises(openai.APIStatusError) as unplaceable:
        client.chat.completions.create(model="gone", messages=ASK)
    assert unplaceable.value.status_code == 503
    assert "cannot be placed: no device fits" in str(unplaceable.value)
    # a key limited to "big" gets big's own refusal, not a model outside its scope
    scoped = openai.OpenAI(base_url=fleet + "/v1", api_key=BIG_ONLY, max_retries=0)
    with pytest.raises(openai.APIStatusError) as parked:
        scoped.chat.completions.create(model="big", messages=ASK)
    assert parked.value.status_code == 503 and "is parked" in str(parked.value)
