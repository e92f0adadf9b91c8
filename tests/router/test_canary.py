"""Canary rollouts through the real router (serve.run, a gevent worker) and fake engines:
the share of requests the canary endpoints get, by request and by conversation, and the
counts per version the router posts (``IdleMap.versions``) and exports."""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import requests

from llmgw_runtime.api.router import IdleMap

from .conftest import API_KEY, ROUTER_TOKEN, Control, running_router, table

AUTH = {"Authorization": f"Bearer {API_KEY}"}
CANARY = {"c-new"}


def canary_model(name: str, engines: dict[str, str], routing: str) -> dict[str, Any]:
    """Two stable replicas and one canary, 10 % of the traffic to the canary."""
    eps = [("c-old1", engines["e1"], False), ("c-old2", engines["e1"], False),
           ("c-new", engines["e2"], True)]
    return {"name": name, "state": "ready", "reason": None, "on_demand": False,
            "routing": routing, "canary_percent": 10,
            "endpoints": [{"replica_id": rid, "url": url, "slots": 8, "canary": canary}
                          for rid, url, canary in eps]}


@pytest.fixture(scope="module")
def ctl(engines: dict[str, str]) -> Iterator[Control]:
    control = Control(table(canary_model("by-request", engines, "least-outstanding"),
                            canary_model("by-conversation", engines, "prefix-affinity"),
                            canary_model("only-canary-up", engines, "least-outstanding")),
                      ROUTER_TOKEN)
    control.start()
    yield control
    control.stop()


@pytest.fixture(scope="module")
def router(ctl: Control) -> Iterator[str]:
    with running_router(ctl.url, workers=1) as url:
        yield url


def _send(router: str, model: str, conversations: list[list[dict[str, str]]]) -> list[str]:
    """The replica that served each conversation's request (8 clients at once)."""
    def one(session: requests.Session, messages: list[dict[str, str]]) -> str:
        answer = session.post(router + "/v1/chat/completions", headers=AUTH, timeout=20,
                              json={"model": model, "messages": messages})
        assert answer.status_code == 200, answer.text
        return answer.headers["X-Llmgw-Replica"]

    sessions = [requests.Session() for _ in range(8)]
    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(lambda i: one(sessions[i % 8], conversations[i]),
                             range(len(conversations))))


def _versions(ctl: Control, model: str, since: int) -> dict[str, dict[str, Any]]:
    """The counts per version posted since idle map ``since``, summed."""
    total: dict[str, dict[str, Any]] = {}
    for posted in list(ctl.idle_maps)[since:]:
        versions = IdleMap.model_validate(posted).versions.get(model)
        if versions is None:
            continue
        for version in ("stable", "canary"):
            counts = getattr(versions, version).model_dump()
            into = total.setdefault(version, dict.fromkeys(counts, 0))
            for field, value in counts.items():
                into[field] += value
    return total


def _metric(router: str, model: str, version: str, outcome: str) -> float:
    text = requests.get(router + "/metrics", timeout=10).text
    for line in text.splitlines():
        name, _, rest = line.partition("{")
        if name != "llmgw_router_version_requests_total":
            continue
        labels, _, value = rest.partition("} ")
        found = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        if found == {"model": model, "version": version, "outcome": outcome}:
            return float(value)
    return 0.0


def test_a_canary_gets_its_share_of_requests_and_each_version_is_counted(
        router: str, ctl: Control) -> None:
    since = len(ctl.idle_maps)
    served = _send(router, "by-request",
                   [[{"role": "user", "content": "same prompt"}]] * 1000)
    on_canary = sum(rid in CANARY for rid in served)
    assert 70 <= on_canary <= 130, on_canary                  # 10 % +- 3 %
    assert {rid for rid in served if rid not in CANARY} == {"c-old1", "c-old2"}
    time.sleep(0.8)                                           # the ticks after the last one
    versions = _versions(ctl, "by-request", since)
    assert versions["canary"]["requests"] == on_canary
    assert versions["stable"]["requests"] == 1000 - on_canary
    for version in ("stable", "canary"):
        counts = versions[version]
        assert counts["errors"] == 0 and counts["answered"] == counts["requests"]
        assert counts["tokens"] == 8 * counts["requests"]     # the fake engine's usage
        assert 0 < counts["first_byte_s"] < 5 * counts["requests"]
    assert _metric(router, "by-request", "canary", "ok") == on_canary
    assert _metric(router, "by-request", "stable", "ok") == 1000 - on_canary


def test_a_conversation_stays_on_one_version(router: str) -> None:
    firsts = [[{"role": "system", "content": "be brief"},
               {"role": "user", "content": f"conversation {i}"}] for i in range(1000)]
    served = _send(router, "by-conversation", firsts)
    on_canary = [rid in CANARY for rid in served]
    assert 70 <= sum(on_canary) <= 130, sum(on_canary)
    # later turns (the history grows after the first user message) keep the version
    later = [[*firsts[i], {"role": "assistant", "content": "ok"},
              {"role": "user", "content": f"and then {turn}"}]
             for i in range(0, 1000, 5) for turn in range(2)]
    again = _send(router, "by-conversation", later)
    assert [rid in CANARY for rid in again] == [on_canary[i] for i in range(0, 1000, 5)
                                                 for _ in range(2)]


def test_a_version_with_no_usable_endpoint_leaves_its_requests_to_the_other(
        router: str, ctl: Control, engines: dict[str, str]) -> None:
    dead = f"http://127.0.0.1:{_free_port()}"
    model = canary_model("only-canary-up", engines, "least-outstanding")
    for ep in model["endpoints"]:
        if not ep["canary"]:
            ep["url"] = dead
    models = [m for m in ctl.routes["models"] if m["name"] != "only-canary-up"]
    ctl.set_routes(dict(ctl.routes, models=[*models, model]))
    time.sleep(0.5)
    served = _send(router, "only-canary-up", [[{"role": "user", "content": "x"}]] * 40)
    assert set(served) == CANARY


def _free_port() -> int:
    import harness
    return int(harness.free_port())
