"""Draining replicas through the real router (serve.run, a gevent worker) and fake engines:
a replica the routes table lists as draining gets no new request while what it has in
flight finishes uncut and is posted (``IdleMap.in_flight``) until it ends; requests waiting
for a slot move to the model's other replicas, and a model left with no endpoint while its
replacement starts makes requests wait instead of failing."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
import requests

from llmgw_runtime.api.router import IdleMap

from .conftest import API_KEY, ROUTER_TOKEN, Control, running_router, table

AUTH = {"Authorization": f"Bearer {API_KEY}"}


def entry(name: str, endpoints: Sequence[tuple[str, str, int | None]], state: str = "ready",
          draining: Sequence[str] = (), **settings: Any) -> dict[str, Any]:
    """A routes-table model: endpoints are (replica id, url, slots)."""
    return {"name": name, "state": state, "reason": None, "on_demand": False,
            "endpoints": [{"replica_id": rid, "url": url, "slots": slots}
                          for rid, url, slots in endpoints],
            "draining": list(draining), **settings}


def put(ctl: Control, *models: dict[str, Any]) -> None:
    """Replace these models in the control's table (by name)."""
    names = {m["name"] for m in models}
    kept = [m for m in ctl.routes["models"] if m["name"] not in names]
    ctl.set_routes(dict(ctl.routes, models=kept + list(models)))


@pytest.fixture(scope="module")
def ctl(engines: dict[str, str]) -> Iterator[Control]:
    e1, e2 = engines["e1"], engines["e2"]
    control = Control(table(
        entry("drainme", [("r-d1", e1, 4), ("r-d2", e2, 4)], routing="least-outstanding"),
        entry("queued", [("r-q1", e1, 1)], max_wait_s=10.0),
        entry("swap", [("r-s-old", e1, None)]),
        entry("readyless", [("r-z-old", e1, None)]),
    ), ROUTER_TOKEN)
    control.start()
    yield control
    control.stop()


@pytest.fixture(scope="module")
def router(ctl: Control) -> Iterator[str]:
    """One worker: its idle maps name everything in flight."""
    with running_router(ctl.url, workers=1) as url:
        yield url


def chat(router: str, model: str, timeout: float = 20, **extra: Any) -> requests.Response:
    return requests.post(router + "/v1/chat/completions", headers=AUTH, timeout=timeout,
                         json={"model": model, "messages": [{"role": "user", "content": "hi"}],
                               **extra})


def refreshed(ctl: Control) -> None:
    """Wait until the router has fetched the table at least twice since now."""
    seen = ctl.route_gets
    deadline = time.monotonic() + 5
    while ctl.route_gets < seen + 2 and time.monotonic() < deadline:
        time.sleep(0.05)


def test_a_draining_replica_gets_no_new_request_and_its_stream_ends_uncut(
        router: str, ctl: Control, engines: dict[str, str]) -> None:
    stream = requests.post(router + "/v1/chat/completions", headers=AUTH, stream=True,
                           timeout=30,
                           json={"model": "drainme", "stream": True, "fake_chunks": 12,
                                 "fake_chunk_delay_s": 0.25,
                                 "messages": [{"role": "user", "content": "long"}]})
    assert stream.status_code == 200
    draining = stream.headers["X-Llmgw-Replica"]
    other = "r-d2" if draining == "r-d1" else "r-d1"
    url = {"r-d1": engines["e1"], "r-d2": engines["e2"]}[other]
    chunks: list[bytes] = []
    reader = threading.Thread(target=lambda: chunks.extend(stream.iter_content(None)))
    reader.start()
    marked = len(ctl.idle_maps)
    put(ctl, entry("drainme", [(other, url, 4)], draining=[draining],
                   routing="least-outstanding"))
    refreshed(ctl)
    served = [chat(router, "drainme").headers["X-Llmgw-Replica"] for _ in range(20)]
    assert served == [other] * 20
    reader.join(20)
    text = b"".join(chunks).decode()
    assert "tok11" in text and text.rstrip().endswith("data: [DONE]")   # uncut
    # Each tick's idle map names this worker and the draining replica's stream, and drops
    # it once the stream ended (posted still: the table names a draining replica).
    time.sleep(0.6)
    maps = [IdleMap.model_validate(m) for m in list(ctl.idle_maps)[marked:]]
    assert all(m.worker and m.router for m in maps)
    assert len({m.worker for m in maps}) == 1
    counts = [m.in_flight.get(draining, 0) for m in maps]
    assert 1 in counts, counts
    assert counts[-1] == 0 and counts.index(1) < len(counts) - 1
    assert maps[-1].in_flight == {}
    put(ctl, entry("drainme", [("r-d1", engines["e1"], 4), ("r-d2", engines["e2"], 4)],
                   routing="least-outstanding"))


def test_a_request_waiting_for_a_slot_moves_to_the_replica_left(
        router: str, ctl: Control, engines: dict[str, str]) -> None:
    with ThreadPoolExecutor(2) as pool:
        holder = pool.submit(chat, router, "queued", fake_delay_s=3.0)
        time.sleep(0.5)                           # it holds r-q1's only slot
        started = time.monotonic()
        waiter = pool.submit(chat, router, "queued")
        time.sleep(0.5)                           # it waits for the slot
        put(ctl, entry("queued", [("r-q2", engines["e2"], 1)], draining=["r-q1"],
                       max_wait_s=10.0))
        moved = waiter.result(10)
        took = time.monotonic() - started
        held = holder.result(10)
    assert moved.status_code == 200 and moved.headers["X-Llmgw-Replica"] == "r-q2"
    assert took < 2.0, took                       # not after the holder's 3 s
    assert held.status_code == 200 and held.headers["X-Llmgw-Replica"] == "r-q1"


@pytest.mark.parametrize(("model", "state", "old"), [("swap", "starting", "r-s-old"),
                                                     ("readyless", "ready", "r-z-old")])
def test_a_model_whose_replica_drains_while_its_replacement_starts_makes_requests_wait(
        router: str, ctl: Control, engines: dict[str, str], model: str, state: str,
        old: str) -> None:
    assert chat(router, model).headers["X-Llmgw-Replica"] == old
    put(ctl, entry(model, [], state=state, draining=[old]))
    refreshed(ctl)
    new = old.replace("old", "new")
    threading.Timer(1.0, lambda: put(ctl, entry(model, [(new, engines["e2"], None)],
                                                 draining=[old]))).start()
    with ThreadPoolExecutor(4) as pool:
        answers = list(pool.map(lambda _: chat(router, model), range(8)))
    assert [a.status_code for a in answers] == [200] * 8, [a.text for a in answers]
    assert {a.headers["X-Llmgw-Replica"] for a in answers} == {new}
