"""Rollouts, node drains and graceful stops with real processes (issue 27): the control
service, the router, two agents (node1 and node2, class cpu) and real llama.cpp engines of
the tiny GGUF (and of the demo model where a stream must last seconds), driven by the real
openai client. A request loop (4 clients, half streamed) runs through every change, and
every test counts its failures: a change that drops or cuts one request fails the test."""

from __future__ import annotations

import random
import re
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from llmgw_runtime.cli.up import demo_model_path
from tests.support.procs import wait_until

from .conftest import (
    Cluster,
    Outcome,
    RequestLoop,
    catalog_of,
    engine_props,
    metric,
    model_entry,
    one_request,
    router_client,
)

pytestmark = pytest.mark.slow

# Fast reconciling, and a failed start retried at once (a rollout's failure is one start).
CONTROL_ENV = {"LLMGW_BACKOFF_BASE_S": "0.2", "LLMGW_BACKOFF_CAP_S": "1"}


def two_nodes(c: Cluster) -> None:
    c.start_two_nodes(env=CONTROL_ENV)


def wait_serving(c: Cluster, model: str, count: int, timeout: float = 90) -> set[str]:
    """Wait until ``count`` replicas of the model serve (and no more are to run)."""
    def serving() -> set[str] | None:
        found = ids(c.serving(model))
        return found if len(found) == count == len(c.live(model)) else None
    return set(wait_until(serving, timeout, f"{count} replicas of {model} serving"))


def ids(replicas: list[dict[str, Any]]) -> set[str]:
    return {r["id"] for r in replicas}


def assert_no_failures(loop: RequestLoop, since: float, what: str,
                       until: float = float("inf")) -> list[Outcome]:
    """The loop's requests of [since, until): some ran, streamed and not, and none
    failed."""
    done = loop.done(since, until)
    failures = loop.failures(since, until)
    assert not failures, f"{what}: {len(failures)} of {len(done)} requests failed:\n" + \
        "\n".join(failures[:20])
    assert sum(o.streamed for o in done) >= 2 and sum(not o.streamed for o in done) >= 2, \
        f"{what}: the loop hardly ran ({len(done)} requests)"
    return done


class Watch:
    """Polls the replicas of a model in the background and remembers every replica seen
    draining (its first drain answer, with the most requests in flight seen): a stop
    that went through draining shows there."""

    def __init__(self, c: Cluster, model: str | None = None) -> None:
        self.c, self.model = c, model
        self.drained: dict[str, dict[str, Any]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                for rep in self.c.replicas(self.model):
                    if rep.get("draining"):
                        seen = self.drained.setdefault(rep["id"], {
                            **rep["draining"], "model": rep["model"], "node": rep["node"]})
                        seen["in_flight"] = max(seen["in_flight"],
                                                rep["draining"]["in_flight"])
            except Exception:  # noqa: BLE001 - a busy control service: poll again
                pass
            self._stop.wait(0.2)

    def stop(self) -> dict[str, dict[str, Any]]:
        self._stop.set()
        self._thread.join(5)
        return self.drained


def long_stream(c: Cluster, model: str, max_tokens: int, box: list[Outcome],
                started: threading.Event) -> threading.Thread:
    """One streamed completion of ``max_tokens`` tokens (ignore_eos: exactly that many
    unless cut) in a thread, judged as the request loop judges its streams; ``started`` is
    set at its first token (and when it ends)."""

    def run() -> None:
        client = router_client(c.router_url, timeout=180)
        box.append(one_request(client, model, True, max_tokens, "Tell me a long story.",
                               on_token=started.set, extra_body={"ignore_eos": True}))
        started.set()

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


# ------------------------------------------------------------------------------ 1


def test_roll_drain_scale_down_idle_stop_and_delete_under_load_drop_nothing(
        cluster_factory: Any, tiny_model: Path) -> None:
    c: Cluster = cluster_factory()
    two_nodes(c)
    demo = demo_model_path()
    lazy = model_entry("lazy", tiny_model, on_demand="true", idle_stop_after="3s")
    story = model_entry("story", demo, ctx=1024)

    def apply(ctx: int, replicas: int) -> Any:
        tiny = model_entry("tiny", tiny_model, ctx=ctx, replicas=replicas, strategy="spread")
        return c.apply(catalog_of(tiny, lazy, story))
    apply(512, 2)
    wait_serving(c, "tiny", 2)
    wait_serving(c, "story", 1)
    assert {r["node"] for r in c.serving("tiny")} == {"node1", "node2"}, c.replicas()

    with RequestLoop(c.router_url, "tiny") as loop:
        loop.wait_requests(40)
        timings: dict[str, float] = {}

        # (i) drain node2: its replicas move to node1 first, then drain there (spread put
        # one of tiny's there).
        t0 = time.monotonic()
        on_node2 = [r for r in c.live("tiny") + c.live("story") if r["node"] == "node2"]
        assert [r for r in on_node2 if r["model"] == "tiny"], c.replicas()
        watch = Watch(c)
        answer = c.post("/api/v1/nodes/node2/drain", {"force": False})
        assert answer["node"] == "node2" and answer["cordoned"] and answer["draining"], answer
        drain = wait_until(lambda: (d := c.node_drain("node2"))["done"] and d, 90,
                           "node2 drained")
        timings["drain"] = time.monotonic() - t0
        drained = watch.stop()
        assert drain["moved"] == drain["total"] == len(on_node2), drain
        assert not [r for r in c.replicas() if r["desired"] and r["node"] == "node2"]
        assert {r["node"] for r in c.serving("tiny")} == {"node1"}
        assert len(c.serving("tiny")) == 2
        assert ids(on_node2) <= set(drained), (on_node2, drained)      # drained, not cut
        node2 = [n for n in c.admin.get("/api/v1/nodes")["nodes"] if n["name"] == "node2"]
        assert node2[0]["cordoned"], node2
        wait_until(lambda: any("node node2 drained" in e["message"]
                               for e in c.events("node", "node2")), 10, "node2's event")
        loop.wait_requests(20)
        assert_no_failures(loop, t0, "the drain of node2")
        answer = c.post("/api/v1/nodes/node2/uncordon")
        assert not answer["cordoned"] and not answer["draining"], answer

        # (ii) new args roll both replicas, one at a time, surge first.
        t0 = time.monotonic()
        first = c.live("tiny")
        result = apply(768, 2)
        assert result["rolls"] == ["tiny"] and result["updated"] == ["tiny"], result

        def rolled() -> list[dict[str, Any]] | None:
            live, serving = c.live("tiny"), c.serving("tiny")
            done = (len(live) == 2 and len(serving) == 2 and not ids(live) & ids(first)
                    and c.rollout("tiny")["state"] == "none")
            return serving if done else None
        second = wait_until(rolled, 90, "the rollout of tiny's new args")
        timings["rollout"] = time.monotonic() - t0
        for rep in second:
            assert engine_props(rep["port"]) == {"n_ctx": 768, "total_slots": 1}, rep
        loop.wait_requests(20)
        assert_no_failures(loop, t0, "the rollout")
        assert any("rollout of tiny done" in e["message"] for e in c.events()), \
            c.events(subject="tiny")

        # (iii) replicas 2 -> 1: one drains, then stops.
        t0 = time.monotonic()
        watch = Watch(c, "tiny")
        before = ids(c.serving("tiny"))
        apply(768, 1)
        wait_until(lambda: len(c.live("tiny")) == 1 and len(c.serving("tiny")) == 1, 60,
                   "tiny down to one replica")
        timings["scale down"] = time.monotonic() - t0
        drained = watch.stop()
        (gone,) = before - ids(c.live("tiny"))
        assert gone in drained, drained
        loop.wait_requests(20)
        assert_no_failures(loop, t0, "replicas 2 -> 1")

        # (iv) the on-demand model starts on a request and, idle, drains, then stops.
        client = router_client(c.router_url)
        assert one_request(client, "lazy", False, 4).error is None
        (lazy_rep,) = c.live("lazy")
        t0 = time.monotonic()
        watch = Watch(c, "lazy")
        wait_until(lambda: not c.replicas("lazy") and c.model("lazy")["state"] == "idle", 60,
                   "the idle stop of lazy")
        timings["idle stop"] = time.monotonic() - t0
        drained = watch.stop()
        assert lazy_rep["id"] in drained, drained
        assert drained[lazy_rep["id"]]["in_flight"] == 0
        assert any(e["subject"] == "lazy" for e in c.events("idle-stop"))
        assert any(lazy_rep["id"] in e["message"] and "drained" in e["message"]
                   for e in c.events()), c.events(subject="lazy")

        # (v) a model deleted while a stream to it runs: the stream completes.
        box: list[Outcome] = []
        started = threading.Event()
        (story_rep,) = c.live("story")
        stream = long_stream(c, "story", 300, box, started)
        assert started.wait(60), box
        t0 = time.monotonic()
        watch = Watch(c, "story")
        c.admin.delete("/api/v1/models/story")
        assert "story" not in [m["name"] for m in c.admin.get("/api/v1/models")["models"]]
        stream.join(180)
        wait_until(lambda: not c.replicas("story"), 60, "story's replica stopped")
        timings["delete"] = time.monotonic() - t0
        drained = watch.stop()
        (story_out,) = box
        assert story_out.error is None and story_out.tokens >= 290, story_out
        assert story_rep["id"] in drained, drained
        assert drained[story_rep["id"]]["in_flight"] == 1, drained

        loop.wait_requests(20)
    outcomes = loop.done()
    assert not loop.failures(), loop.failures()[:20]
    assert sum(o.streamed for o in outcomes) >= 50, len(outcomes)
    print("timings:", {k: round(v, 1) for k, v in timings.items()}, "requests:",
          len(outcomes))


# ------------------------------------------------------------------------------ 2


def test_a_rollout_to_a_corrupt_gguf_fails_and_the_old_replicas_keep_serving(
        cluster_factory: Any, tiny_model: Path, tmp_path: Path) -> None:
    corrupt = tmp_path / "corrupt.gguf"
    corrupt.write_bytes(b"GGUF" + b"\x03\x00\x00\x00" + b"\xff" * 4096)
    c: Cluster = cluster_factory()
    two_nodes(c)
    good = model_entry("tiny", tiny_model, replicas=2)
    c.apply(catalog_of(good))
    old = wait_serving(c, "tiny", 2)

    with RequestLoop(c.router_url, "tiny") as loop:
        loop.wait_requests(20)
        t0 = time.monotonic()
        rolls = c.apply(catalog_of(model_entry("tiny", corrupt, replicas=2)))["rolls"]
        assert rolls == ["tiny"]
        status = c.wait_rollout("tiny", "failed", timeout=90)
        assert "gguf" in (status["error"] or "").lower(), status     # the engine's words
        assert status["old_ready"] == 2 and status["new_ready"] == 0, status
        time.sleep(3)                                   # no second try, nothing stopped
        assert ids(c.serving("tiny")) == old
        assert c.rollout("tiny")["state"] == "failed"
        model = c.model("tiny")
        assert not model["parked"] and model["consecutive_failures"] == 0, model
        assert any(e["subject"] == "tiny" for e in c.events("rollout"))
        assert metric(c.control_url, "llmgw_model_rollout_failed", model="tiny") == 1
        loop.wait_requests(20)

        undone = c.post("/api/v1/models/tiny/rollout/undo")
        assert undone["model"] == "tiny", undone
        c.wait_rollout("tiny", "none", timeout=30)
        assert c.model("tiny")["source"] == f"file://{tiny_model}"
        assert ids(c.serving("tiny")) == old                # back, nothing restarted
        wait_until(lambda: metric(c.control_url, "llmgw_model_rollout_failed",
                                  model="tiny") == 0, 10, "llmgw_model_rollout_failed 0")
        loop.wait_requests(20)
    done = assert_no_failures(loop, t0, "the failed rollout")
    assert {o.replica for o in done} == old, {o.replica for o in done}


# ------------------------------------------------------------------------------ 3


def test_a_stream_that_outlives_drain_timeout_is_cut_and_counted(
        cluster_factory: Any) -> None:
    c: Cluster = cluster_factory()
    c.start_control(env=CONTROL_ENV)
    c.start_router()
    c.start_agent()
    story = model_entry("story", demo_model_path(), ctx=1024, drain_timeout_s=2)
    c.apply(catalog_of(story))
    c.wait_ready("story", timeout=90)
    (rep,) = c.live("story")

    box: list[Outcome] = []
    started = threading.Event()
    stream = long_stream(c, "story", 900, box, started)       # 7-30 s uncut
    assert started.wait(60), box
    t0 = time.monotonic()
    c.apply(catalog_of(model_entry("story", demo_model_path(), ctx=1024, drain_timeout_s=2,
                                   replicas=0)))
    stream.join(120)
    cut_after = time.monotonic() - t0
    (out,) = box
    # cut, and the request loop's own check (one_request) says so: it can fail
    assert out.error is not None and out.tokens < 900, out
    print(f"cut after {cut_after:.1f} s: {out.error}")
    # at the timeout (2 s), plus the agent hearing of it and the engine's 2 s to stop
    # (xllamacpp_launcher.STOP_GRACE_S; llama.cpp's own teardown waits for the stream),
    # never at the stream's own end
    assert cut_after < 9, cut_after
    wait_until(lambda: not c.replicas("story"), 30, "the replica stopped")
    cut = [e for e in c.events(subject="story") + c.events(subject=rep["id"])
           if "cut" in e["message"]]
    assert cut and re.search(r"(?<!\d)1 request", cut[-1]["message"]), c.events()
    assert metric(c.control_url, "llmgw_drain_cut_requests_total", model="story") == 1


# ------------------------------------------------------------------------------ 4

CANARY_REQUESTS = 1000


def test_a_canary_takes_its_share_then_promote_rolls_and_undo_rolls_back(
        cluster_factory: Any, tiny_model: Path) -> None:
    c: Cluster = cluster_factory()
    two_nodes(c)
    c.apply(catalog_of(model_entry("tiny", tiny_model, replicas=2, strategy="spread")))
    stable = wait_serving(c, "tiny", 2)
    canary_rollout = "{canary_percent: 10}"

    v2 = model_entry("tiny", tiny_model, ctx=768, replicas=2, strategy="spread",
               rollout=canary_rollout)
    assert c.apply(catalog_of(v2))["rolls"] == ["tiny"]
    status = c.wait_rollout("tiny", "canary", also=lambda s: s["new_ready"] == 1,
                            timeout=60)
    assert status["old_ready"] == 2 and status["canary_percent"] == 10, status
    canary = ids(c.serving("tiny")) - stable
    assert len(canary) == 1, c.replicas("tiny")
    time.sleep(1.5)                              # the routers' next routes refresh

    # 1,000 requests, each its own conversation: about 10 % reach the canary.
    clients = [router_client(c.router_url) for _ in range(8)]
    salt = random.randrange(1 << 30)

    def ask(i: int) -> Outcome:
        return one_request(clients[i % len(clients)], "tiny", False, 1,
                           prompt=f"{salt}-{i}: hello")
    t0 = time.monotonic()
    with ThreadPoolExecutor(len(clients)) as pool:
        outcomes = list(pool.map(ask, range(CANARY_REQUESTS)))
    took = time.monotonic() - t0
    failed = [o.error for o in outcomes if o.error]
    assert not failed, failed[:10]
    to_canary = sum(o.replica in canary for o in outcomes)
    to_stable = sum(o.replica in stable for o in outcomes)
    assert to_canary + to_stable == CANARY_REQUESTS, {o.replica for o in outcomes}
    assert 70 <= to_canary <= 130, (to_canary, took)
    # The routers' per-version counts reach the rollout status.
    def counted(status: dict[str, Any]) -> bool:
        versions = status["versions"]
        return (versions.get("canary", {}).get("requests", 0) >= to_canary
                and versions.get("stable", {}).get("requests", 0) >= to_stable)
    status = c.wait_rollout("tiny", "canary", timeout=15, also=counted)
    assert status["versions"]["canary"]["errors"] == 0, status
    assert status["versions"]["canary"]["first_byte_s"] is not None, status
    print(f"canary: {to_canary} of {CANARY_REQUESTS} requests in {took:.1f} s")

    with RequestLoop(c.router_url, "tiny") as loop:
        loop.wait_requests(20)
        # promote: the rest rolls, the canary stays.
        t1 = time.monotonic()
        assert c.post("/api/v1/models/tiny/rollout/promote")["model"] == "tiny"
        c.wait_rollout("tiny", "none", timeout=90,
                       also=lambda s: s["new_ready"] == 2 and s["old_total"] == 0)
        wait_until(lambda: len(c.live("tiny")) == 2, 30, "the old replicas stopped")
        promoted = ids(c.serving("tiny"))
        assert canary <= promoted and not promoted & stable, (canary, promoted, stable)
        for rep in c.serving("tiny"):
            assert engine_props(rep["port"])["n_ctx"] == 768
        loop.wait_requests(20)
        assert_no_failures(loop, t1, "promote")

        # a third version as a canary, then undo: back to the promoted one.
        t2 = time.monotonic()
        v3 = model_entry("tiny", tiny_model, ctx=640, replicas=2, strategy="spread",
                   rollout=canary_rollout)
        assert c.apply(catalog_of(v3))["rolls"] == ["tiny"]
        c.wait_rollout("tiny", "canary", also=lambda s: s["new_ready"] == 1, timeout=60)
        (canary3,) = ids(c.serving("tiny")) - promoted
        loop.wait_requests(40)
        undone = c.post("/api/v1/models/tiny/rollout/undo")
        assert undone["model"] == "tiny", undone
        c.wait_rollout("tiny", "none", timeout=60)
        wait_until(lambda: ids(c.live("tiny")) == promoted, 30, "the canary stopped")
        assert c.model("tiny")["args"] == ["--ctx-size", "768", "--threads", "1"]
        assert c.model("tiny")["rollout"]["canary_percent"] == 10
        loop.wait_requests(20)
        assert_no_failures(loop, t2, "canary then undo")
    assert not loop.failures(), loop.failures()[:20]
    assert canary3 not in {r["id"] for r in c.live("tiny")}
