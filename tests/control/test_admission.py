"""What routers read to admit and route (routes: slots, routing, queue, key priorities)
and what they report back (models at capacity, merged into the status summary)."""

from __future__ import annotations

from typing import Any

import pytest

from llmgw_runtime.api.router import ModelCapacity, Routes
from llmgw_runtime.control.capacity import CAPACITY_WINDOW_S, merge
from llmgw_runtime.security import hash_token

from .conftest import ADMIN, ROUTER, Api

CATALOG = """models:
  - name: tiny
    source: file:///models/tiny.gguf
    engine: llama.cpp
    profile: {class: cpu}
    routing: least-outstanding
    slots: 3
    max_queue: 7
    max_wait_s: 4.5
  - name: plain
    source: file:///models/plain.gguf
    engine: llama.cpp
    profile: {class: cpu}
    on_demand: true
"""


def ready(api: Api) -> str:
    """Apply the catalog and bring tiny's replica to ready; its id."""
    assert api.call("PUT", "/api/v1/catalog", data=CATALOG).status_code == 200
    cred = api.join()
    api.report(cred)
    api.reconciler.run_cycle()
    [assignment] = api.report(cred).json["assignments"]
    assert assignment["slots"] == 3           # the driver adds --parallel 3
    rid = str(assignment["replica_id"])
    api.report(cred, replicas=[{"id": rid, "state": "ready", "port": 41000, "pid": 1}])
    return rid


def test_routes_carry_each_models_admission_settings_and_replica_slots(api: Api) -> None:
    rid = ready(api)
    routes = api.call("GET", "/api/v1/routes", ROUTER).json
    Routes.model_validate(routes)              # the router's own parser takes it
    by_name = {m["name"]: m for m in routes["models"]}
    tiny, plain = by_name["tiny"], by_name["plain"]
    assert (tiny["routing"], tiny["max_queue"], tiny["max_wait_s"]) == (
        "least-outstanding", 7, 4.5)
    assert tiny["endpoints"] == [{"replica_id": rid, "url": "http://127.0.0.1:41000",
                                  "slots": 3, "canary": False}]
    assert (plain["routing"], plain["max_queue"], plain["max_wait_s"]) == (
        "prefix-affinity", 100, 30.0)


def test_models_listing_shows_the_admission_settings(api: Api) -> None:
    api.call("PUT", "/api/v1/catalog", data=CATALOG)
    tiny = api.call("GET", "/api/v1/models/tiny").json
    assert {k: tiny[k] for k in ("routing", "slots", "max_queue", "max_wait_s")} == {
        "routing": "least-outstanding", "slots": 3, "max_queue": 7, "max_wait_s": 4.5}
    changed = CATALOG.replace("max_queue: 7", "max_queue: 8")
    result = api.call("PUT", "/api/v1/catalog/dry-run", data=changed).json
    assert result["updated"] == ["tiny"] and result["dry_run"]


def test_key_priority_is_set_listed_changed_and_routed(api: Api) -> None:
    vip = api.call("POST", "/api/v1/keys", json={"name": "vip", "priority": "high"})
    assert vip.status_code == 201 and vip.json["priority"] == "high"
    batch = api.call("POST", "/api/v1/keys", json={"name": "batch"}).json
    assert batch["priority"] == "normal"
    keys = {k["name"]: k["priority"] for k in api.call("GET", "/api/v1/keys").json["keys"]}
    assert keys == {"vip": "high", "batch": "normal"}
    routes = api.call("GET", "/api/v1/routes", ROUTER).json
    assert routes["key_priorities"] == {hash_token(vip.json["key"]): "high"}

    changed = api.call("PATCH", "/api/v1/keys/batch", json={"priority": "low"})
    assert changed.status_code == 200 and changed.json["priority"] == "low"
    routes = api.call("GET", "/api/v1/routes", ROUTER).json
    assert routes["key_priorities"] == {hash_token(vip.json["key"]): "high",
                                        hash_token(batch["key"]): "low"}
    api.call("PATCH", "/api/v1/keys/vip", json={"priority": "normal"})
    routes = api.call("GET", "/api/v1/routes", ROUTER).json
    assert routes["key_priorities"] == {hash_token(batch["key"]): "low"}
    events = [e["message"] for e in api.call("GET", "/api/v1/events").json["events"]]
    assert any("API key priority normal -> low" in m for m in events)


@pytest.mark.parametrize(("method", "path", "body"), [
    ("POST", "/api/v1/keys", {"name": "k", "priority": "urgent"}),
    ("PATCH", "/api/v1/keys/k", {"priority": "urgent"}),
    ("PATCH", "/api/v1/keys/k", {"priority": 1}),
])
def test_an_unknown_priority_is_a_400_naming_the_allowed_ones(api: Api, method: str,
                                                               path: str, body: Any) -> None:
    api.call("POST", "/api/v1/keys", json={"name": "k"})
    resp = api.call(method, path, json=body)
    assert resp.status_code == 400
    error = resp.json["error"]
    assert [d for d in error["details"]
            if d.startswith("priority:") and "use high, normal (the default) or low" in d], error


def test_changing_a_missing_keys_priority_is_a_404(api: Api) -> None:
    resp = api.call("PATCH", "/api/v1/keys/nope", json={"priority": "low"})
    assert resp.status_code == 404 and "ctl keys list" in resp.json["error"]["message"]


def post_capacity(api: Api, rid: str, **models: dict[str, Any]) -> None:
    resp = api.call("POST", "/api/v1/idle", ROUTER,
                    json={"replicas": {rid: 0.5}, "capacity": models})
    assert resp.status_code == 204, resp.json


def test_a_model_reported_at_capacity_is_at_capacity_in_the_status(api: Api) -> None:
    rid = ready(api)
    report = {"waiting": 6, "in_flight": 3, "slots": 3, "rejected": 2, "wait_p90_s": 1.5}
    post_capacity(api, rid, tiny=report, unknown=report)     # an unknown model: ignored
    post_capacity(api, rid, tiny={**report, "waiting": 2, "rejected": 5})   # another router
    status = api.call("GET", "/api/v1/status").json
    [tiny] = [m for m in status["models"] if m["name"] == "tiny"]
    c = tiny["at_capacity"]
    assert (c["waiting"], c["in_flight"], c["slots"], c["rejected"]) == (6, 3, 3, 7)
    assert c["note"].startswith("6 waiting, 7 refused in the last")
    assert [m["name"] for m in status["at_capacity"]] == ["tiny"]
    [plain] = [m for m in status["models"] if m["name"] == "plain"]
    assert plain["at_capacity"] is None
    metrics = api.call("GET", "/metrics").get_data(as_text=True)
    assert 'llmgw_model_at_capacity{model="tiny"} 1.0' in metrics
    assert 'llmgw_model_at_capacity{model="plain"} 0.0' in metrics
    # the console reads the same summary: the model's state, and the list
    assert api.client.post("/console/login", data={"token": ADMIN}).status_code in (302, 303)
    page = api.client.get("/console/").get_data(as_text=True)
    assert 'id="at-capacity"' in page and 'class="at-capacity">at capacity' in page
    models = api.client.get("/console/models").get_data(as_text=True)
    assert 'class="at-capacity" title="6 waiting, 7 refused' in models


GOOD = {"waiting": 1, "in_flight": 2, "slots": 2, "rejected": 0, "wait_p90_s": 0.5}


@pytest.mark.parametrize("capacity", [
    {"tiny": {**GOOD, "waiting": "6"}},                  # wrong type
    {"tiny": {**GOOD, "waiting": -1}},
    {"tiny": {**GOOD, "waiting": 10**9}},                # huge
    {"tiny": {**GOOD, "rejected": 2**60}},
    {"tiny": {**GOOD, "wait_p90_s": 1e300}},
    {"tiny": {**GOOD, "slots": 2.5}},
    {"tiny": {**GOOD, "in_flight": True}},
    {"tiny": {**GOOD, "extra": 1}},                      # unknown field
    {"tiny": {**GOOD, "waiting": {"nested": [1]}}},      # nested
    {"tiny\x1b[31m": GOOD},                              # an escape sequence in the name
    {"x" * 201: GOOD},                                    # a name too long
    {"tiny": [GOOD]},
    [GOOD],
])
def test_a_hostile_capacity_report_is_a_400_and_nothing_is_stored(
        api: Api, capacity: Any) -> None:
    rid = ready(api)
    resp = api.call("POST", "/api/v1/idle", ROUTER,
                    json={"replicas": {rid: 0.5}, "capacity": capacity})
    assert resp.status_code == 400, resp.json
    assert any(d.startswith("capacity") for d in resp.json["error"]["details"])
    assert api.call("GET", "/api/v1/status").json["at_capacity"] == []


def test_a_non_finite_wait_in_a_capacity_report_is_a_400(api: Api) -> None:
    rid = ready(api)
    body = ('{"replicas": {"' + rid + '": 0.5}, "capacity": {"tiny": {"waiting": 1, '
            '"in_flight": 2, "slots": 2, "rejected": 0, "wait_p90_s": NaN}}}')
    resp = api.call("POST", "/api/v1/idle", ROUTER, data=body,
                    headers={"Content-Type": "application/json"})
    assert resp.status_code == 400
    assert api.call("GET", "/api/v1/status").json["at_capacity"] == []


def test_an_idle_map_without_capacity_is_still_accepted(api: Api) -> None:
    rid = ready(api)
    resp = api.call("POST", "/api/v1/idle", ROUTER, json={"replicas": {rid: 1.0}})
    assert resp.status_code == 204
    status = api.call("GET", "/api/v1/status").json
    assert status["at_capacity"] == []


def cap(waiting: int = 1, in_flight: int = 4, slots: int = 4, rejected: int = 0,
        p90: float = 0.0) -> ModelCapacity:
    return ModelCapacity(waiting=waiting, in_flight=in_flight, slots=slots,
                         rejected=rejected, wait_p90_s=p90)


@pytest.mark.parametrize(("stored", "now", "expected"), [
    # nothing stored: the report as it is, its window starting now
    (None, 100.0, {"since": 100.0, "reports": 1, "waiting": 5, "in_flight": 4, "slots": 4,
                   "rejected": 3, "wait_p90_s": 1.0}),
    # within the window: the largest snapshot, the refusals summed
    ({"since": 90.0, "reports": 2, "waiting": 9, "in_flight": 2, "slots": 8, "rejected": 4,
      "wait_p90_s": 0.5}, 100.0,
     {"since": 90.0, "reports": 3, "waiting": 9, "in_flight": 4, "slots": 8, "rejected": 7,
      "wait_p90_s": 1.0}),
    # a window that began too long ago: a new one
    ({"since": 100.0 - CAPACITY_WINDOW_S - 1, "reports": 2, "waiting": 9, "in_flight": 2,
      "slots": 8, "rejected": 4, "wait_p90_s": 0.5}, 100.0,
     {"since": 100.0, "reports": 1, "waiting": 5, "in_flight": 4, "slots": 4, "rejected": 3,
      "wait_p90_s": 1.0}),
    # garbage stored: a new window
    ({"since": "yesterday"}, 100.0,
     {"since": 100.0, "reports": 1, "waiting": 5, "in_flight": 4, "slots": 4, "rejected": 3,
      "wait_p90_s": 1.0}),
])
def test_reports_of_several_routers_merge_within_a_window(
        stored: dict[str, Any] | None, now: float, expected: dict[str, Any]) -> None:
    assert merge(stored, cap(waiting=5, rejected=3, p90=1.0), now) == expected
