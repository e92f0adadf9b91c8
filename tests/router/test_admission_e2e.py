"""Admission end to end: the real router (serve.run, gunicorn gevent workers) in front of
fake engines that record how many requests they served at once, and a stand-in control
service whose routes give replicas slots, queue bounds and routing modes."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import harness
import pytest
import requests

from llmgw_runtime.security import hash_token

from .conftest import ROUTER_TOKEN, Control, running_router

KEY_A, KEY_B, KEY_HIGH = "sk-llmgw-key-a", "sk-llmgw-key-b", "sk-llmgw-key-high"
KEYS = {"A": KEY_A, "B": KEY_B, "H": KEY_HIGH}


def limited(name: str, endpoints: Sequence[tuple[str, str, int | None]],
            **settings: Any) -> dict[str, Any]:
    """A ready model whose endpoints are (replica id, url, slots)."""
    return {"name": name, "state": "ready", "reason": None, "on_demand": False,
            "endpoints": [{"replica_id": rid, "url": url, "slots": slots}
                          for rid, url, slots in endpoints], **settings}


@pytest.fixture(scope="module")
def ctl(engines: dict[str, str]) -> Iterator[Control]:
    e1, e2 = engines["e1"], engines["e2"]
    models = [
        limited("lim", [("r-lim", e1, 2)]),
        limited("tiny-queue", [("r-tq", e1, 1)], max_queue=1),
        limited("short-wait", [("r-sw", e1, 1)], max_wait_s=0.3),
        limited("gone", [("r-gone", e1, 1)]),
        limited("fair", [("r-fair", e1, 1)]),
        limited("prio", [("r-prio", e1, 1)]),
        limited("affine", [("a1", e1, 4), ("a2", e2, 4)]),
        limited("least", [("l1", e1, 4), ("l2", e2, 4)], routing="least-outstanding"),
        limited("shared", [("r-shared", e1, 2)]),
        limited("stream1", [("r-stream", e1, 1)], max_wait_s=1.0),
        limited("crash", [("r-crash", e1, 1)], max_wait_s=1.0),
    ]
    routes = {"models": models,
              "api_key_hashes": [hash_token(k) for k in (KEY_A, KEY_B, KEY_HIGH)],
              "key_priorities": {hash_token(KEY_HIGH): "high"}}
    control = Control(routes, ROUTER_TOKEN)
    control.start()
    yield control
    control.stop()


@pytest.fixture(scope="module")
def router2(ctl: Control) -> Iterator[str]:
    """Two gevent workers: what the slot limits must hold across."""
    with running_router(ctl.url, workers=2) as url:
        yield url


@pytest.fixture(scope="module")
def router1(ctl: Control) -> Iterator[str]:
    """One worker: the order of service is exact (fairness and priority are per worker)."""
    with running_router(ctl.url, workers=1) as url:
        yield url


def reset(engine_url: str) -> None:
    requests.post(engine_url + "/stats", timeout=5)


def max_active(engine_url: str) -> int:
    return int(requests.get(engine_url + "/stats", timeout=5).json()["max_active"])


def chat(router: str, model: str, key: str = KEY_A, delay: float = 0.0,
         content: str = "hi", turns: int = 1, **extra: Any) -> requests.Response:
    messages = [{"role": "user", "content": content}]
    for i in range(1, turns):
        messages += [{"role": "assistant", "content": f"answer {i}"},
                     {"role": "user", "content": f"follow-up {i}"}]
    body = {"model": model, "messages": messages, "fake_delay_s": delay, **extra}
    return requests.post(router + "/v1/chat/completions", json=body, timeout=30,
                         headers={"Authorization": f"Bearer {key}"})


def timed(router: str, model: str, key: str = KEY_A, delay: float = 0.0
          ) -> tuple[int, float, float, requests.Response]:
    started = time.monotonic()
    resp = chat(router, model, key, delay)
    return resp.status_code, started, time.monotonic(), resp


def metric(router: str, name: str, **labels: str) -> float:
    """The sum of one metric's samples with these labels, as a scrape shows them."""
    text = requests.get(router + "/metrics", timeout=5).text
    total = 0.0
    for line in text.splitlines():
        m = re.match(r"^(\w+)\{(.*)\} (\S+)$", line)
        if not m or m.group(1) != name:
            continue
        have = dict(re.findall(r'(\w+)="([^"]*)"', m.group(2)))
        if all(have.get(k) == v for k, v in labels.items()):
            total += float(m.group(3))
    return total


def test_a_replica_never_serves_more_than_its_slots_across_workers(
        router2: str, engines: dict[str, str]) -> None:
    reset(engines["e1"])
    with ThreadPoolExecutor(8) as pool:
        started = time.monotonic()
        answers = list(pool.map(lambda _: chat(router2, "lim", delay=0.3), range(8)))
        took = time.monotonic() - started
    assert [a.status_code for a in answers] == [200] * 8
    assert max_active(engines["e1"]) == 2       # both slots used, never a third
    assert took >= 4 * 0.3 - 0.05               # 8 requests, 2 at a time
    assert {a.headers["X-Llmgw-Replica"] for a in answers} == {"r-lim"}


def test_a_full_queue_refuses_at_once_with_429_retry_after_and_why(
        router2: str, ctl: Control) -> None:
    with ThreadPoolExecutor(6) as pool:
        results = list(pool.map(lambda _: timed(router2, "tiny-queue", delay=1.0), range(6)))
    refused = [r for r in results if r[0] == 429]
    # one slot and a queue of one in the whole router (2 workers): 2 get through
    assert len(refused) >= 4 and sum(1 for r in results if r[0] == 200) == 6 - len(refused)
    for _status, started, ended, resp in refused:
        assert ended - started < 0.9      # a queued one is served after 1 s
        assert int(resp.headers["Retry-After"]) >= 1
        err = resp.json()["error"]
        assert (err["code"], err["type"], err["param"]) == ("model_at_capacity",
                                                            "rate_limit_error", "model")
        assert "model 'tiny-queue' is at capacity" in err["message"]
        assert "1 replica" in err["message"] and "max_queue 1" in err["message"]
    assert metric(router2, "llmgw_router_rejected_total", model="tiny-queue",
                  reason="queue_full") == len(refused)
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline:           # reported to the control service
        reports = [p["tiny-queue"] for p in list(ctl.capacity_posts) if "tiny-queue" in p]
        if sum(r["rejected"] for r in reports) >= len(refused):
            break
        time.sleep(0.1)
    assert sum(r["rejected"] for r in reports) == len(refused)
    assert all(r["slots"] == 1 for r in reports)


def test_a_request_waiting_past_max_wait_s_gets_429_naming_it(router2: str) -> None:
    with ThreadPoolExecutor(2) as pool:
        holder = pool.submit(chat, router2, "short-wait", KEY_A, 1.5)
        time.sleep(0.3)
        status, started, ended, resp = timed(router2, "short-wait")
        assert holder.result().status_code == 200
    assert status == 429
    assert 0.25 <= ended - started < 1.0
    err = resp.json()["error"]
    assert err["code"] == "model_at_capacity"
    assert "max_wait_s (0.3 s)" in err["message"]
    assert resp.headers["Retry-After"]
    assert metric(router2, "llmgw_router_rejected_total", model="short-wait",
                  reason="timeout") == 1


def test_a_client_that_goes_away_while_queued_leaves_the_queue_at_once(
        router2: str) -> None:
    port = int(router2.rsplit(":", 1)[1])
    body = json.dumps({"model": "gone", "messages": [{"role": "user", "content": "x"}]})
    raw = (f"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
           f"\r\nAuthorization: Bearer {KEY_A}\r\nContent-Length: {len(body)}\r\n\r\n{body}")
    with ThreadPoolExecutor(2) as pool:
        holder = pool.submit(chat, router2, "gone", KEY_A, 2.0)
        time.sleep(0.3)
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(raw.encode())
            deadline = time.monotonic() + 2
            while metric(router2, "llmgw_router_queue_depth", model="gone") < 1:
                assert time.monotonic() < deadline, "the request never queued"
                time.sleep(0.05)
        gone_at = time.monotonic()
        while metric(router2, "llmgw_router_queue_depth", model="gone") > 0:
            # queued, it would leave only when the holder ends (1.7 s on)
            assert time.monotonic() - gone_at < 1.0, "the closed request stayed queued"
            time.sleep(0.02)
        assert holder.result().status_code == 200
    assert metric(router2, "llmgw_router_rejected_total", model="gone",
                  reason="client_gone") == 1
    # the slot it would have taken is free: the next request is served at once
    status, started, ended, _ = timed(router2, "gone")
    assert status == 200 and ended - started < 0.5


def _served_order(router: str, model: str, first: list[tuple[str, float]],
                  then: list[tuple[str, float]]) -> list[str]:
    """Send ``first`` (key name, delay) one after another 20 ms apart, then ``then``; the
    key names in the order their answers arrived. The first request holds the model's one
    slot while all the others queue: the order is compared only once every one of them is
    waiting (the queue-depth gauge says so), so a slow machine that delays a send cannot
    change what is asked of the queue."""
    done: list[tuple[float, str]] = []
    sent = first + then

    def send(key: str, delay: float) -> None:
        resp = chat(router, model, KEYS[key], delay)
        assert resp.status_code == 200, resp.text
        done.append((time.monotonic(), key))

    with ThreadPoolExecutor(len(sent)) as pool:
        started = time.monotonic()
        futures = []
        for key, delay in sent:
            futures.append(pool.submit(send, key, delay))
            time.sleep(0.02)
        holds_until = started + sent[0][1]
        while metric(router, "llmgw_router_queue_depth", model=model) < len(sent) - 1:
            assert time.monotonic() < holds_until and not futures[0].done(), (
                "the requests did not all queue while the first one held the slot")
            time.sleep(0.05)
        for f in futures:
            f.result()
    return [key for _, key in sorted(done)]


def test_a_key_flooding_the_queue_does_not_hold_back_another_key(router1: str) -> None:
    holder = [("A", 3.0)]       # holds the only slot while everything else queues
    flood = [("A", 0.1)] * 10
    order = _served_order(router1, "fair", holder + flood, [("B", 0.1)] * 2)
    assert order.count("B") == 2
    b_places = [i for i, k in enumerate(order) if k == "B"]
    assert max(b_places) <= 5, order     # served before most of A's ten


def test_a_high_priority_key_queued_last_is_served_first(router1: str) -> None:
    order = _served_order(router1, "prio", [("A", 3.0)] + [("A", 0.1)] * 3, [("H", 0.1)])
    assert order[:2] == ["A", "H"], order   # the holder, then the high key


def test_prefix_affinity_keeps_a_conversation_on_one_replica_and_spreads_others(
        router2: str) -> None:
    for conversation in range(3):
        replicas = {chat(router2, "affine", content=f"conversation {conversation}",
                         turns=turn).headers["X-Llmgw-Replica"] for turn in (1, 2, 3, 4)}
        assert len(replicas) == 1
    spread = {chat(router2, "affine", content=f"topic {i}").headers["X-Llmgw-Replica"]
              for i in range(12)}
    assert spread == {"a1", "a2"}


def test_least_outstanding_spreads_what_affinity_keeps_together(router2: str) -> None:
    def together(model: str) -> set[str]:
        with ThreadPoolExecutor(2) as pool:
            answers = list(pool.map(lambda _: chat(router2, model, delay=0.5,
                                                   content="same prompt"), range(2)))
        return {a.headers["X-Llmgw-Replica"] for a in answers}

    assert together("least") == {"l1", "l2"}
    assert len(together("affine")) == 1


def test_two_routers_share_a_replicas_slots(ctl: Control, engines: dict[str, str]) -> None:
    routers = [harness.start_router(ctl.url, ROUTER_TOKEN, workers=2, refresh_interval_s=0.2,
                                    slot_share=share) for share in ("1/2", "2/2")]
    try:
        reset(engines["e1"])
        urls = [url for _, url in routers] * 4
        with ThreadPoolExecutor(8) as pool:
            answers = list(pool.map(lambda url: chat(url, "shared", delay=0.3), urls))
        assert [a.status_code for a in answers] == [200] * 8    # both routers serve
        assert max_active(engines["e1"]) == 2                   # one slot each
    finally:
        for proc, _ in routers:
            harness.stop(proc)


def test_a_stream_holds_its_slot_until_it_ends_or_its_client_leaves(router2: str) -> None:
    def stream(chunks: int, delay: float) -> requests.Response:
        return requests.post(router2 + "/v1/chat/completions", stream=True, timeout=30,
                             headers={"Authorization": f"Bearer {KEY_A}"},
                             json={"model": "stream1", "stream": True, "messages": [],
                                   "fake_chunks": chunks, "fake_chunk_delay_s": delay})

    whole = stream(3, 0.05)
    assert whole.headers["X-Llmgw-Replica"] == "r-stream"
    assert whole.content.endswith(b"data: [DONE]\n\n")
    status, started, ended, _ = timed(router2, "stream1")
    assert status == 200 and ended - started < 0.9       # its slot came back at the end
    left = stream(100, 0.1)                               # 10 s long
    next(left.iter_content(None))
    for _ in range(2):                                    # whichever worker answers
        assert metric(router2, "llmgw_router_slots_in_use", model="stream1") == 1
    left.close()                                          # the client walks away
    time.sleep(0.3)     # the router sees it at its next write (a chunk every 0.1 s)
    status, started, ended, _ = timed(router2, "stream1")
    assert status == 200 and ended - started < 0.9    # held, it would be a 429 after 1 s


def test_slots_held_by_a_worker_that_died_are_given_back(ctl: Control) -> None:
    proc, url = harness.start_router(ctl.url, ROUTER_TOKEN, workers=2, refresh_interval_s=0.2)
    try:
        with ThreadPoolExecutor(1) as pool:
            held = pool.submit(chat, url, "crash", KEY_A, 3.0)
            time.sleep(0.5)
            with open(f"/proc/{proc.pid}/task/{proc.pid}/children") as f:
                workers = [int(pid) for pid in f.read().split()]
            assert len(workers) == 2
            for pid in workers:          # the one holding the slot dies with it
                os.kill(pid, signal.SIGKILL)
            with pytest.raises(requests.RequestException):
                held.result()
        deadline = time.monotonic() + 10
        while True:                      # gunicorn starts new workers
            try:
                if timed(url, "crash")[0] == 200:
                    break
            except requests.ConnectionError:
                pass
            assert time.monotonic() < deadline, "the dead worker's slot was never freed"
            time.sleep(0.2)
        time.sleep(1.0)                  # both new workers have loaded the app
        for _ in range(4):               # a leaked slot would make these wait, then 429
            status, started, ended, _ = timed(url, "crash")
            assert status == 200 and ended - started < 0.95   # leaked: 429 after 1 s
    finally:
        harness.stop(proc)
