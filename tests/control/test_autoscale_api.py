"""Autoscaling through the control service: routers' load reports (POST /api/v1/idle)
summed over routers and not over one router's workers, hostile values refused at the
edge, the reconciler stepping up and down with an event that says why, and what ``ctl
status``, the console and ``/metrics`` show (current / min / max and the signal)."""

from __future__ import annotations

import json
import re
import time
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from llmgw_runtime.api.router import ModelCapacity
from llmgw_runtime.control.capacity import LOAD_WINDOW_S, MAX_LOAD_POSTS, load_of, record_load
from llmgw_runtime.status.render import render
from llmgw_runtime.store import repo

from .conftest import ADMIN, ROUTER, Api

CATALOG = """models:
  - name: tiny
    source: file:///models/tiny.gguf
    engine: llama.cpp
    profile: {class: cpu}
    slots: 2
    replicas: {min: 1, max: 3}
    autoscale: {wait_target_s: 1, up_after_s: 0.2s, busy_below: 0.3, down_after_s: 0.2s,
                cooldown_s: 0.1s}
  - name: fixed
    source: file:///models/fixed.gguf
    engine: llama.cpp
    profile: {class: cpu}
    replicas: 2
"""
LOADED = {"waiting": 3, "in_flight": 2, "slots": 2, "rejected": 0, "wait_p90_s": 0.5,
          "busy": 2, "oldest_wait_s": 4.0, "queued": 5, "at_capacity": True}
QUIET = {"waiting": 0, "in_flight": 0, "slots": 2, "rejected": 0, "wait_p90_s": 0.0,
         "busy": 0, "oldest_wait_s": 0.0, "queued": 0, "at_capacity": False}


def ready(api: Api) -> tuple[str, str]:
    """The catalog applied, tiny's first replica ready; (its id, the node's credential)."""
    assert api.call("PUT", "/api/v1/catalog", data=CATALOG).status_code == 200
    cred = api.join()
    api.report(cred)
    api.reconciler.run_cycle()
    tiny = [a for a in api.report(cred).json["assignments"] if a["model"] == "tiny"]
    rid = str(tiny[0]["replica_id"])
    api.report(cred, replicas=[{"id": rid, "state": "ready", "port": 41000, "pid": 1}])
    return rid, cred


def post(api: Api, rid: str, router: str | None, **models: dict[str, Any]) -> None:
    body: dict[str, Any] = {"replicas": {rid: 0.5}, "capacity": models}
    if router is not None:
        body["router"] = router
    resp = api.call("POST", "/api/v1/idle", ROUTER, json=body)
    assert resp.status_code == 204, resp.json


def scaling(api: Api, name: str = "tiny") -> Any:
    status = api.call("GET", "/api/v1/status").json
    [model] = [m for m in status["models"] if m["name"] == name]
    return model["scaling"]


def events(api: Api) -> list[str]:
    return [e["message"] for e in api.call("GET", "/api/v1/events").json["events"]
            if e["kind"] == "autoscale"]


def test_load_is_summed_over_routers_and_not_over_one_routers_workers(api: Api) -> None:
    rid, _ = ready(api)
    post(api, rid, "rt-a", tiny=LOADED)
    post(api, rid, "rt-a", tiny={**LOADED, "oldest_wait_s": 3.0})   # rt-a's second worker
    post(api, rid, "rt-b", tiny={**LOADED, "waiting": 1, "busy": 1, "in_flight": 1,
                                 "rejected": 2})
    signal = scaling(api)["signal"]
    assert signal == {"waiting": 4, "busy": 3, "slots": 2, "wait_s": 4.0, "rejected": 2,
                      "routers": 2}
    assert scaling(api, "fixed") is None


def test_a_report_not_at_capacity_is_load_only(api: Api) -> None:
    rid, _ = ready(api)
    post(api, rid, "rt-a", tiny={**QUIET, "busy": 1, "in_flight": 1})
    status = api.call("GET", "/api/v1/status").json
    assert status["at_capacity"] == []
    assert scaling(api)["signal"]["busy"] == 1


def test_waiting_too_long_for_the_window_adds_a_replica(api: Api) -> None:
    rid, _ = ready(api)
    post(api, rid, "rt-a", tiny=LOADED)
    api.reconciler.run_cycle()                   # the window opens
    assert scaling(api)["up_for_s"] is not None and events(api) == []
    time.sleep(0.3)
    post(api, rid, "rt-a", tiny=LOADED)
    api.reconciler.run_cycle()                   # ... and is full: 1 -> 2
    [up] = events(api)
    assert re.fullmatch(r"queue wait 4\.0 s > 1 s for \d+ s: 1 -> 2", up), up
    now = scaling(api)
    assert (now["current"], now["target"], now["min"], now["max"]) == (1, 2, 1, 3)
    tiny = [r for r in api.call("GET", "/api/v1/replicas").json["replicas"]
            if r["model"] == "tiny"]
    assert len(tiny) == 2 and {r["state"] for r in tiny} == {"ready", "pending"}
    # the new replica is still starting: no second step, however long requests wait
    time.sleep(0.3)
    post(api, rid, "rt-a", tiny=LOADED)
    api.reconciler.run_cycle()
    assert len(events(api)) == 1 and scaling(api)["target"] == 2


def test_quiet_slots_for_the_window_take_the_extra_replica_away(api: Api) -> None:
    rid, cred = ready(api)
    with api.store.begin() as conn:              # as if an earlier burst had scaled it up
        repo.update_model(conn, "tiny", scale_target=2)
    api.reconciler.run_cycle()
    reps = [r["id"] for r in api.call("GET", "/api/v1/replicas").json["replicas"]]
    api.report(cred, replicas=[{"id": r, "state": "ready", "port": 41000 + i, "pid": 1 + i}
                               for i, r in enumerate(reps)])
    assert scaling(api)["current"] == 2
    post(api, rid, "rt-a", tiny={**QUIET, "busy": 1, "in_flight": 1})   # 1 of 4 busy
    api.reconciler.run_cycle()
    assert scaling(api)["down_for_s"] is not None
    time.sleep(0.3)
    api.reconciler.run_cycle()
    [down] = events(api)
    assert re.fullmatch(r"busy 1 of 4 slots \(25%\) < 30%, nothing waiting for \d+ s: "
                        r"2 -> 1", down), down
    tiny = [r for r in api.call("GET", "/api/v1/replicas").json["replicas"]
            if r["model"] == "tiny" and r["desired"]]
    # the one taken away finishes its requests in flight before it stops
    assert [r["draining"]["reason"] if r["draining"] else None for r in tiny].count(
        "scale-down") == 1
    assert len([r for r in tiny if not r["draining"]]) == 1 and scaling(api)["target"] == 1


def test_status_console_and_metrics_show_current_min_max_and_the_signal(api: Api) -> None:
    rid, _ = ready(api)
    post(api, rid, "rt-a", tiny=LOADED)
    post(api, rid, "rt-b", tiny=LOADED)
    api.reconciler.run_cycle()
    status = api.call("GET", "/api/v1/status").json
    text = render(status, width=160)
    [line] = [ln for ln in text.split("autoscaling:")[1].splitlines()
              if ln.split()[:2] == ["tiny", "1/1"]]
    assert "(1-3)" in line and ("up in" in line or "up pending" in line) and "wait 4.0 s (target 1 s), 4/2 slots busy, 6 waiting" in line
    assert "autoscaling:" in text and "fixed  " not in text.split("autoscaling:")[1]

    metrics = api.call("GET", "/metrics").get_data(as_text=True)
    for sample in ('llmgw_model_replicas_min{model="tiny"} 1.0',
                   'llmgw_model_replicas_max{model="tiny"} 3.0',
                   'llmgw_model_replicas_min{model="fixed"} 2.0',
                   'llmgw_model_replicas_max{model="fixed"} 2.0',
                   'llmgw_model_autoscale_target_replicas{model="tiny"} 1.0',
                   'llmgw_model_load_waiting_requests{model="tiny"} 6.0',
                   'llmgw_model_load_busy_slots{model="tiny"} 4.0',
                   'llmgw_model_load_slots{model="tiny"} 2.0',
                   'llmgw_model_load_wait_seconds{model="tiny"} 4.0'):
        assert sample in metrics, sample
    assert 'llmgw_model_autoscale_target_replicas{model="fixed"}' not in metrics

    # ctl reads the same through the typed admin answer (api/admin.Model)
    from llmgw_runtime.api.admin import ModelList
    models = {m.name: m for m in ModelList.model_validate(
        api.call("GET", "/api/v1/models").json).models}
    scaling = models["tiny"].scaling
    assert scaling is not None and (scaling.min, scaling.max, scaling.current) == (1, 3, 1)
    assert scaling.signal.waiting == 6 and scaling.settings.wait_target_s == 1
    assert models["tiny"].replicas_max == 3 and models["fixed"].scaling is None

    assert api.client.post("/console/login", data={"token": ADMIN}).status_code in (302, 303)
    page = api.client.get("/console/models").get_data(as_text=True)
    # The cell is short (it fits 1280 px): ready/target (min-max) and the step, the signal
    # under it, and how long the requests waited too long in its title.
    cell = re.findall(r'<td class="scaling">(.*?)</td>', page, re.S)[-1]
    # "up in N s" until the signal has lasted its sustain time, "up pending" after it (a
    # slow machine gets there before the page is read)
    assert ("1/1 (1-3), up in" in cell or "1/1 (1-3), up pending" in cell) \
        and "waiting too long for" in cell
    assert ">wait 4.0 s (target 1 s), 4/2 slots busy, 6 waiting<" in cell
    assert '<span class="muted">fixed</span>' in page


HOSTILE = [
    {"busy": -1}, {"busy": "2"}, {"busy": 2.0}, {"busy": 10**7}, {"busy": True},
    {"oldest_wait_s": -0.1}, {"oldest_wait_s": 3601}, {"oldest_wait_s": 1e300},
    {"oldest_wait_s": "4"}, {"queued": 2**60}, {"queued": -1}, {"queued": None},
    {"at_capacity": "yes"}, {"at_capacity": 1}, {"at_capacity": None},
    {"first_byte": [-1]}, {"first_byte": [1] * 12}, {"first_byte": [1.5]},
    {"first_byte": ["1"]}, {"first_byte": [10**7]}, {"first_byte": [[1]]},
    {"first_byte": {"0.1": 1}},
]


@pytest.mark.parametrize("bad", HOSTILE)
def test_a_hostile_load_field_is_a_400_and_nothing_is_stored(api: Api,
                                                             bad: dict[str, Any]) -> None:
    rid, _ = ready(api)
    resp = api.call("POST", "/api/v1/idle", ROUTER, json={
        "replicas": {rid: 0.5}, "router": "rt-a", "capacity": {"tiny": {**LOADED, **bad}}})
    assert resp.status_code == 400, resp.json
    [field] = bad
    assert any(d.startswith(f"capacity.tiny.{field}") for d in resp.json["error"]["details"])
    assert scaling(api)["signal"]["routers"] == 0


@pytest.mark.parametrize("keys_optional", ["yes", 1, None, [True], {"a": True}])
def test_a_hostile_keys_optional_is_a_400(api: Api, keys_optional: Any) -> None:
    rid, _ = ready(api)
    resp = api.call("POST", "/api/v1/idle", ROUTER, json={
        "replicas": {rid: 0.5}, "router": "rt-a", "keys_optional": keys_optional})
    assert resp.status_code == 400, resp.json
    assert any(d.startswith("keys_optional") for d in resp.json["error"]["details"])


@pytest.mark.parametrize("router", ["", "rt a", "rt-\x1b[2J", "x" * 81, 5, ["rt"], "/rt"])
def test_a_hostile_router_id_is_a_400(api: Api, router: Any) -> None:
    rid, _ = ready(api)
    resp = api.call("POST", "/api/v1/idle", ROUTER, json={
        "replicas": {rid: 0.5}, "router": router, "capacity": {"tiny": LOADED}})
    assert resp.status_code == 400, resp.json
    assert any(d.startswith("router") for d in resp.json["error"]["details"])
    assert scaling(api)["signal"]["routers"] == 0


def test_a_non_finite_oldest_wait_is_a_400(api: Api) -> None:
    rid, _ = ready(api)
    body = json.dumps({"replicas": {rid: 0.5}, "capacity": {"tiny": LOADED}})
    body = body.replace('"oldest_wait_s": 4.0', '"oldest_wait_s": Infinity')
    resp = api.call("POST", "/api/v1/idle", ROUTER, data=body,
                    headers={"Content-Type": "application/json"})
    assert resp.status_code == 400


# -- the load record (control/capacity.py), pure ---------------------------------------------


def report(**over: Any) -> ModelCapacity:
    return ModelCapacity(**{**LOADED, **over})


def test_posts_older_than_the_window_are_dropped_and_the_record_is_bounded() -> None:
    stored = record_load(None, "rt-a", report(), 100.0)
    stored = record_load(stored, "rt-b", report(waiting=1), 100.0 + LOAD_WINDOW_S)
    assert [p[0] for p in stored["posts"]] == ["rt-a", "rt-b"]
    stored = record_load(stored, "rt-b", report(waiting=1), 100.1 + LOAD_WINDOW_S)
    assert [p[0] for p in stored["posts"]] == ["rt-b", "rt-b"]          # rt-a's aged out
    for i in range(MAX_LOAD_POSTS + 10):
        stored = record_load(stored, f"rt-{i % 7}", report(), 200.0)
    assert len(stored["posts"]) == MAX_LOAD_POSTS
    assert load_of(stored, 200.0).routers == 7


@pytest.mark.parametrize("stored", [None, {}, {"posts": "x"}, [1, 2],
                                    {"posts": [["rt", "now", 1, 1, 1, 1], ["rt", 1.0],
                                               [5, 100.0, 1, 1, 1, 1],
                                               ["rt", 100.0, True, 1, 1, 1]]}])
def test_a_malformed_record_is_no_load(stored: Any) -> None:
    assert load_of(stored, 100.0).routers == 0
    assert record_load(stored, "rt", report(), 100.0)["posts"] == [
        ["rt", 100.0, 3, 2, 4.0, 0]]


def test_an_older_router_counts_as_one_and_its_in_flight_as_busy() -> None:
    old = ModelCapacity(waiting=2, in_flight=3, slots=4, rejected=1, wait_p90_s=2.5)
    stored = record_load(None, None, old, 10.0)
    assert stored["posts"] == [["-", 10.0, 2, 3, 2.5, 1]]
    assert old.at_capacity is True


@given(value=st.none() | st.booleans() | st.integers(min_value=-2**70, max_value=2**70)
       | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=20)
       | st.lists(st.integers(), max_size=3),
       field=st.sampled_from(sorted(LOADED) + ["router"]))
@settings(max_examples=60, deadline=None, database=None,
          suppress_health_check=list(HealthCheck))
def test_any_value_of_any_load_field_is_parsed_or_refused_never_a_500(
        api_once: Api, field: str, value: Any) -> None:
    body: dict[str, Any] = {"replicas": {}, "router": "rt-f", "capacity": {"tiny": dict(LOADED)}}
    if field == "router":
        body["router"] = value
    else:
        body["capacity"]["tiny"][field] = value
    resp = api_once.call("POST", "/api/v1/idle", ROUTER,
                         data=json.dumps(body, allow_nan=True),
                         headers={"Content-Type": "application/json"})
    assert resp.status_code in (204, 400), resp.get_data()[:300]
    assert api_once.call("GET", "/api/v1/status").status_code == 200


@pytest.fixture
def api_once(api: Api) -> Api:
    """The catalog applied once for every example of a hypothesis test."""
    if api.call("GET", "/api/v1/models/tiny").status_code != 200:
        assert api.call("PUT", "/api/v1/catalog", data=CATALOG).status_code == 200
    return api
