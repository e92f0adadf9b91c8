"""Honest answers from the router: a failing model is refused at once with its error and
a Retry-After, a replica it cannot connect to is marked down and reported to the control
service, and a model added a moment ago is never answered 404. The Flask app in-process,
a stand-in control service and fake engines (real processes)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import pytest
from flask import Flask

from llmgw_runtime.router.app import create_app
from llmgw_runtime.router.config import RouterConfig
from tests.control.test_routes_of import ENGINE_LOG, TELLING

from .conftest import ROUTER_TOKEN, Control, model, table

FAILING = dict(failures=2, last_error="engine exited with code 1; last log lines:\n"
               "gguf_init_from_file: invalid magic characters", retry_after_s=7.5)


@pytest.fixture
def control(engines: dict[str, str], dead_url: str) -> Iterator[Control]:
    ctl = Control(table(
        model("chat", endpoints=[("r-e1", engines["e1"])]),
        model("failing", "starting", **FAILING),
        model("failing-now", "starting", failures=1, last_error="engine exited",
              retry_after_s=0.0),
        model("first", "starting"),
        model("halfdead", endpoints=[("r-dead", dead_url), ("r-live", engines["e2"])]),
        model("gone", endpoints=[("r-gone", dead_url)]),
        keys=()), ROUTER_TOKEN).start()
    yield ctl
    ctl.stop()


def _app(control: Control, **kw: Any) -> Flask:
    settings: dict[str, Any] = dict(refresh_interval_s=0.2, activation_timeout_s=5.0,
                                    require_api_key=False)
    settings.update(kw)
    return create_app(RouterConfig(control_url=control.url, router_token=ROUTER_TOKEN,
                                   **settings))


@pytest.fixture
def app(control: Control) -> Iterator[Flask]:
    made = _app(control)
    yield made
    made.extensions["llmgw_router"].routes.stop()


def _chat(app: Flask, name: str) -> tuple[float, Any]:
    started = time.monotonic()
    resp = app.test_client().post("/v1/chat/completions",
                                  json={"model": name, "messages": []})
    return time.monotonic() - started, resp


def _set_model(control: Control, entry: dict[str, Any]) -> None:
    models = [m for m in control.routes["models"] if m["name"] != entry["name"]]
    control.set_routes(dict(control.routes, models=[*models, entry]))


def test_a_failing_model_is_refused_at_once_with_its_error_and_retry_after(
        app: Flask, control: Control) -> None:
    elapsed, resp = _chat(app, "failing")
    assert resp.status_code == 503 and elapsed < 1.0, elapsed
    err = resp.get_json()["error"]
    assert err["code"] == "model_failing" and err["param"] == "model"
    assert "invalid magic characters" in err["message"]       # the engine's own words
    assert "2 failures in a row" in err["message"]
    assert "next start may begin in" in err["message"]
    assert resp.headers["Retry-After"] in ("7", "8")
    assert "failing" not in control.activations                # nothing to wait for


def test_a_failing_model_whose_next_start_is_under_way_says_so(app: Flask) -> None:
    _, resp = _chat(app, "failing-now")
    assert resp.status_code == 503 and resp.headers["Retry-After"] == "1"
    err = resp.get_json()["error"]
    assert err["code"] == "model_failing"
    assert "1 failure in a row" in err["message"] and "under way" in err["message"]


@pytest.mark.parametrize("entry,activation", [
    (model("broken", "parked", reason=ENGINE_LOG), None),
    (model("broken", "starting"), {"model": "broken", "state": "starting", "failures": 2,
                                   "last_error": ENGINE_LOG, "retry_after_s": 5.0}),
])
def test_a_refusal_gives_the_engines_telling_line_and_where_its_log_is(
        app: Flask, control: Control, entry: dict[str, Any],
        activation: dict[str, Any] | None) -> None:
    # A whole engine log (from a control service before issue 28, or an activation
    # answer) is not dumped to the client: its telling line, and where the rest is.
    _set_model(control, entry)
    control.on_activate["broken"] = lambda: activation
    app.extensions["llmgw_router"].routes.refresh()
    _, resp = _chat(app, "broken")
    err = resp.get_json()["error"]
    assert resp.status_code == 503 and err["code"] in ("model_parked", "model_failing")
    assert TELLING in err["message"] and "\n" not in err["message"]
    assert "llama_model_loader" not in err["message"] and len(err["message"]) < 800
    assert "run/<replica>.log" in err["message"] and "llmgw ctl events" in err["message"]


def test_a_waiting_request_is_refused_as_soon_as_the_first_start_fails(
        app: Flask, control: Control) -> None:
    def fail_soon() -> dict[str, Any]:
        threading.Timer(0.6, _set_model, (control, model(
            "first", "starting", failures=1, last_error="engine exited: out of memory",
            retry_after_s=5.0))).start()
        return {"model": "first", "state": "starting", "reason": None}

    control.on_activate["first"] = fail_soon
    elapsed, resp = _chat(app, "first")
    assert "first" in control.activations                      # a first start waits
    assert resp.status_code == 503 and 0.5 < elapsed < 2.5, elapsed
    assert resp.get_json()["error"]["code"] == "model_failing"
    assert "out of memory" in resp.get_json()["error"]["message"]


def test_an_activation_answer_saying_failing_is_refused_at_once(
        app: Flask, control: Control) -> None:
    control.on_activate["first"] = lambda: {
        "model": "first", "state": "starting", "reason": None, "failures": 3,
        "last_error": "engine not healthy after 600 s", "retry_after_s": 20.0}
    elapsed, resp = _chat(app, "first")
    assert resp.status_code == 503 and elapsed < 1.0
    assert resp.get_json()["error"]["code"] == "model_failing"
    assert resp.headers["Retry-After"] == "20"


def test_a_replica_refusing_connections_is_marked_down_and_reported_once(
        app: Flask, control: Control) -> None:
    state = app.extensions["llmgw_router"]
    for _ in range(6):
        _, resp = _chat(app, "halfdead")
        assert resp.status_code == 200 and resp.get_json()["system_fingerprint"] == "e2"
    assert state.balancer.down("r-dead") is not None
    assert state.balancer.down("r-live") is None
    deadline = time.monotonic() + 3
    while time.monotonic() < deadline and not control.unreachable_posts:
        time.sleep(0.05)
    time.sleep(0.5)                                            # a few more ticks
    posts = [p for p in control.unreachable_posts if p["replica_id"] == "r-dead"]
    assert len(posts) == 1 and "Connection refused" in posts[0]["reason"]


def test_an_unreachable_only_replica_gets_the_control_services_answer_not_a_502(
        app: Flask, control: Control) -> None:
    # The control service takes the replica out, and its agent then reports it failed.
    control.on_unreachable = lambda body: _set_model(control, model(
        "gone", "starting", reason=None, failures=1,
        last_error="the agent on node1 stopped this replica", retry_after_s=5.0))
    elapsed, resp = _chat(app, "gone")
    assert resp.status_code == 503 and elapsed < 3.0, elapsed
    err = resp.get_json()["error"]
    assert err["code"] == "model_failing"
    assert "the agent on node1 stopped this replica" in err["message"]
    assert control.unreachable_posts[0]["replica_id"] == "r-gone"
    # the table no longer lists it: the mark is dropped, a later listing is tried again
    assert app.extensions["llmgw_router"].balancer.down("r-gone") is None


def test_a_model_applied_a_moment_ago_is_never_404(control: Control,
                                                   engines: dict[str, str]) -> None:
    app = _app(control, refresh_interval_s=30.0)   # the loop will not refresh in time
    try:
        assert _chat(app, "chat")[1].status_code == 200   # the table is fetched
        _set_model(control, model("new", endpoints=[("r-new", engines["e1"])]))
        _, resp = _chat(app, "new")
        assert resp.status_code == 200, resp.get_json()
        _set_model(control, model("newer", "starting"))
        control.on_activate["newer"] = lambda: (
            _set_model(control, model("newer", endpoints=[("r-nr", engines["e2"])])) or
            {"model": "newer", "state": "starting", "reason": None})
        _, resp = _chat(app, "newer")
        assert resp.status_code == 200 and resp.get_json()["system_fingerprint"] == "e2"
    finally:
        app.extensions["llmgw_router"].routes.stop()


def test_unknown_models_share_table_fetches_and_are_404(control: Control) -> None:
    app = _app(control, refresh_interval_s=30.0)
    try:
        assert _chat(app, "chat")[1].status_code == 200
        before = control.route_gets
        started = time.monotonic()
        with ThreadPoolExecutor(20) as pool:
            answers = list(pool.map(lambda i: _chat(app, f"nope{i}")[1], range(40)))
        elapsed = time.monotonic() - started
        assert {r.status_code for r in answers} == {404}
        assert answers[0].get_json()["error"]["code"] == "model_not_found"
        # at most one fetch per 0.2 s, shared by the requests waiting for it
        assert control.route_gets - before <= elapsed / 0.2 + 2, \
            (control.route_gets - before, elapsed)
    finally:
        app.extensions["llmgw_router"].routes.stop()
