"""Per-key limits through the real router in front of the real llama.cpp engine: requests
per minute hold across the two gevent workers of one router and across two routers (each
taking its share, LLMGW_SLOT_SHARE), tokens per minute are counted from the engine's usage
(an over-estimate is given back when the request ends), and a refusal is OpenAI's 429
with Retry-After and a message naming the key and the limit."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import requests

from llmgw_runtime.security import hash_token
from tests.engines.conftest import cpu_engine
from tests.support.tiny_gguf import write_tiny_gguf

from .conftest import ROUTER_TOKEN, model, table
from .usage_support import UsageControl, router_at

CHAT = "/v1/chat/completions"
BODY = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2,
        "temperature": 0}
LIMITS = {"burst": {"rpm": 4}, "shared": {"rpm": 6}, "tokens": {"tpm": 300},
          "settled": {"tpm": 300}}
KEYS = {name: f"sk-llmgw-limit-{name}" for name in LIMITS}


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    where = tmp_path_factory.mktemp("limits")
    with cpu_engine(write_tiny_gguf(where / "tiny.gguf"), where / "engine.log",
                    "--parallel", "4", "--ctx-size", "2048") as url:
        yield url


@pytest.fixture(scope="module")
def control(engine: str) -> Iterator[UsageControl]:
    routes = table(model("tiny", endpoints=[("r-tiny", engine)]), keys=list(KEYS.values()))
    routes["key_limits"] = {hash_token(KEYS[name]): {"name": name, **limits}
                            for name, limits in LIMITS.items()}
    ctl = UsageControl(routes, ROUTER_TOKEN).start()
    yield ctl
    ctl.stop()


def _post(url: str, key: str, body: dict[str, Any] | None = None) -> requests.Response:
    # a new connection each time (requests.post): gunicorn's workers take turns accepting
    return requests.post(url + CHAT, json=body or BODY,
                         headers={"Authorization": f"Bearer {key}"}, timeout=60)


def _burst(url: str, key: str, n: int) -> list[requests.Response]:
    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(lambda _: _post(url, key), range(n)))


def _refusal(resp: requests.Response, key: str, kind: str) -> None:
    assert resp.status_code == 429, resp.text
    error = resp.json()["error"]
    assert (error["code"], error["type"]) == ("rate_limit_exceeded", kind)
    assert f"API key '{key}' is over its limit" in error["message"]
    assert f"{kind} per minute" in error["message"]
    assert 1 <= int(resp.headers["Retry-After"]) <= 61


def test_requests_per_minute_hold_across_the_workers_of_one_router(
        control: UsageControl) -> None:
    """40 requests at once on 40 connections, spread over both workers: exactly the
    key's 4 get through (each worker counting alone would let up to 8 through)."""
    with router_at(control.url, workers=2) as url:
        answers = _burst(url, KEYS["burst"], 40)
    ok = [r for r in answers if r.status_code == 200]
    assert len(ok) == 4, [r.status_code for r in answers]
    for resp in answers:
        if resp.status_code != 200:
            _refusal(resp, "burst", "requests")


def test_two_routers_each_let_through_their_share_and_together_the_limit(
        control: UsageControl) -> None:
    with router_at(control.url, workers=2, slot_share="1/2") as one, \
            router_at(control.url, workers=2, slot_share="2/2") as two:
        first = _burst(one, KEYS["shared"], 20)
        second = _burst(two, KEYS["shared"], 20)
    passed = [sum(r.status_code == 200 for r in answers) for answers in (first, second)]
    assert passed == [3, 3]
    refused = next(r for r in first if r.status_code == 429)
    _refusal(refused, "shared", "requests")
    assert "1/2" in refused.json()["error"]["message"]


def _used(resp: requests.Response) -> int:
    usage = resp.json()["usage"]
    return int(usage["prompt_tokens"] + usage["completion_tokens"])


def test_tokens_per_minute_count_the_engines_usage(control: UsageControl) -> None:
    """Requests pass while the key has tokens left; the refusal comes once what the
    engine said they used reaches the limit (plus what refilled meanwhile)."""
    used = []
    with router_at(control.url, workers=2) as url:
        started = time.monotonic()
        for _ in range(40):
            resp = _post(url, KEYS["tokens"])
            if resp.status_code != 200:
                break
            used.append(_used(resp))
        refill = 300 / 60 * (time.monotonic() - started)
    _refusal(resp, "tokens", "tokens")
    assert sum(used) >= 300 - 1                  # not refused before the limit was used
    assert sum(used[:-1]) < 300 + refill + 1     # nor let through after it


def test_an_over_estimate_is_given_back_when_the_request_ends(control: UsageControl) -> None:
    """Each request is charged about 250 tokens before it goes (its body's bytes / 4 and
    max_tokens) and uses about 50; three in a row pass under a 300-token limit only when
    each one's estimate is replaced by what it used."""
    padded = {**BODY, "user": "x" * 900}          # counted by the estimate, not the engine
    with router_at(control.url, workers=1) as url:
        answers = [_post(url, KEYS["settled"], padded) for _ in range(3)]
    assert [r.status_code for r in answers] == [200, 200, 200], answers[-1].text
    assert all(_used(r) < 100 for r in answers)
