"""Truthful replica state on the control side, on both store backends: a replica a router
cannot reach is taken out of the routes until its agent confirms it, a replica an agent
stopped says so, a ready replica clears stale errors, and the routes table carries the
current start streak so that routers can refuse a failing model at once."""

from __future__ import annotations

import time
from typing import Any

import pytest

from llmgw_runtime.store import repo

from .conftest import ADMIN, ROUTER, Api

CATALOG = """models:
  - name: tiny
    source: file:///models/tiny.gguf
    engine: llama.cpp
    profile: {class: cpu}
"""


def ready_replica(api: Api) -> tuple[str, str]:
    """The tiny model with one ready replica on n1; returns (credential, replica id)."""
    api.call("PUT", "/api/v1/catalog", data=CATALOG)
    cred = api.join()
    api.report(cred)
    api.reconciler.run_cycle()
    rid = api.report(cred).json["assignments"][0]["replica_id"]
    api.report(cred, replicas=[{"id": rid, "state": "ready", "port": 41000, "pid": 7}])
    return cred, rid


def routes(api: Api) -> dict[str, Any]:
    return {m["name"]: m for m in api.call("GET", "/api/v1/routes", ROUTER).json["models"]}


def replica(api: Api, rid: str) -> dict[str, Any]:
    return next(r for r in api.call("GET", "/api/v1/replicas").json["replicas"]
                if r["id"] == rid)


def events(api: Api, kind: str) -> list[str]:
    return [e["message"] for e in api.call("GET", "/api/v1/events?limit=200").json["events"]
            if e["kind"] == kind]


def unreachable(api: Api, rid: str, token: str = ROUTER, reason: str = "refused") -> Any:
    return api.call("POST", "/api/v1/unreachable", token,
                    json={"replica_id": rid, "reason": reason})


def test_an_unreachable_replica_leaves_the_routes_until_its_agent_confirms_it(
        api: Api) -> None:
    cred, rid = ready_replica(api)
    assert routes(api)["tiny"]["endpoints"]
    resp = unreachable(api, rid, reason="NewConnectionError: [Errno 111] Connection refused")
    assert resp.status_code == 204
    rep = replica(api, rid)
    assert rep["state"] == "unreachable" and "Connection refused" in rep["last_error"]
    route = routes(api)["tiny"]
    assert route["endpoints"] == [] and route["state"] != "ready"
    assert f"replica {rid} on n1" in route["reason"] and "its agent" in route["reason"]
    model = api.call("GET", "/api/v1/models/tiny").json
    assert model["state"] != "ready" and model["ready"] == 0
    [message] = events(api, "unreachable")
    assert rid in message and "not routed until its agent reports it ready" in message
    # the replica still holds its device: placement does not start a second one
    api.reconciler.run_cycle()
    assert [r["id"] for r in api.call("GET", "/api/v1/replicas").json["replicas"]] == [rid]
    # a second router's mark changes nothing
    assert unreachable(api, rid).status_code == 204 and len(events(api, "unreachable")) == 1

    # the agent's next report (received after the mark) says ready: routed again
    api.report(cred, replicas=[{"id": rid, "state": "ready", "port": 41000, "pid": 7}])
    rep = replica(api, rid)
    assert rep["state"] == "ready" and rep["last_error"] is None
    assert routes(api)["tiny"]["endpoints"][0]["replica_id"] == rid
    assert any("ready again" in m for m in events(api, "ready"))


def test_an_unreachable_replica_its_agent_no_longer_runs_is_failed(api: Api) -> None:
    cred, rid = ready_replica(api)
    unreachable(api, rid)
    api.report(cred, replicas=[])
    rep = replica(api, rid)
    assert rep["state"] == "failed" and "no longer runs this replica" in rep["last_error"]


def test_only_a_wanted_ready_replica_is_marked_and_only_routers_may_say_so(api: Api) -> None:
    cred, rid = ready_replica(api)
    assert unreachable(api, "r-nosuch").status_code == 204
    assert unreachable(api, rid, token=ADMIN).status_code == 403
    assert unreachable(api, rid, token=cred).status_code == 403
    bad = api.call("POST", "/api/v1/unreachable", ROUTER, json={"replica_id": rid})
    assert bad.status_code == 400 and "unreachable report" in bad.json["error"]["message"]
    assert any(d.startswith("reason") for d in bad.json["error"]["details"])
    extra = api.call("POST", "/api/v1/unreachable", ROUTER,
                     json={"replica_id": rid, "reason": "x", "state": "ready"})
    assert extra.status_code == 400
    api.report(cred, replicas=[{"id": rid, "state": "failed", "last_error": "exited"}])
    assert unreachable(api, rid).status_code == 204
    assert replica(api, rid)["state"] == "failed" and not events(api, "unreachable")


def test_a_replica_the_agent_stopped_says_so_and_the_model_is_not_ready(api: Api) -> None:
    cred, rid = ready_replica(api)
    why = ("the agent on n1 stopped this replica: the agent is shutting down and stops its "
           "engines on exit (stop_engines_on_exit)")
    api.report(cred, replicas=[{"id": rid, "state": "stopped", "last_error": why}])
    rep = replica(api, rid)
    assert rep["state"] == "failed" and rep["last_error"] == why
    [message] = events(api, "stopped")
    assert message == f"replica {rid} on n1 stopped: {why}"
    model = api.call("GET", "/api/v1/models/tiny").json
    assert model["state"] != "ready" and model["ready"] == 0
    assert routes(api)["tiny"]["endpoints"] == []


def test_a_replica_ready_again_clears_its_and_its_models_last_error(api: Api) -> None:
    api.call("PUT", "/api/v1/catalog", data=CATALOG)
    with api.store.begin() as conn:
        repo.update_model(conn, "tiny", last_error="engine exited: out of memory")
    cred = api.join()
    api.report(cred)
    api.reconciler.run_cycle()
    rid = api.report(cred).json["assignments"][0]["replica_id"]
    with api.store.begin() as conn:
        repo.update_replica(conn, rid, last_error="an earlier run's error")
    api.report(cred, replicas=[{"id": rid, "state": "starting", "port": 41000, "pid": 7}])
    assert replica(api, rid)["last_error"] == "an earlier run's error"
    api.report(cred, replicas=[{"id": rid, "state": "ready", "port": 41000, "pid": 7}])
    assert replica(api, rid)["last_error"] is None
    model = api.call("GET", "/api/v1/models/tiny").json
    assert model["state"] == "ready" and model["last_error"] is None


def test_routes_carry_the_current_start_streak(api: Api) -> None:
    api.call("PUT", "/api/v1/catalog", data=CATALOG)
    route = routes(api)["tiny"]
    assert (route["failures"], route["last_error"], route["retry_after_s"]) == (0, None, None)
    now = time.time()
    with api.store.begin() as conn:
        repo.update_model(conn, "tiny", consecutive_failures=2, last_failure_at=now - 1,
                          last_error="gguf_init_from_file: invalid magic characters")
    route = routes(api)["tiny"]
    assert route["failures"] == 2 and "invalid magic" in route["last_error"]
    # backoff after 2 failures: base 5 s doubled = 10 s, 1 s of it gone
    assert 8.0 < route["retry_after_s"] <= 9.0
    with api.store.begin() as conn:
        repo.update_model(conn, "tiny", last_failure_at=now - 60)
    assert routes(api)["tiny"]["retry_after_s"] == 0.0


@pytest.mark.parametrize("activated_ago,failed_ago,current", [
    (None, 100, False),     # idle since the streak: a new activation is a new streak
    (100, 10, True),        # failed since it was activated
    (10, 100, False),       # activated after the failure
])
def test_an_on_demand_models_streak_counts_only_since_its_activation(
        api: Api, activated_ago: float | None, failed_ago: float, current: bool) -> None:
    api.call("PUT", "/api/v1/catalog", data=CATALOG + "    on_demand: true\n")
    now = time.time()
    with api.store.begin() as conn:
        repo.update_model(conn, "tiny", consecutive_failures=1,
                          last_failure_at=now - failed_ago, last_error="exited",
                          activated_at=None if activated_ago is None else now - activated_ago)
    assert (routes(api)["tiny"]["failures"] == 1) is current


def test_activating_a_failing_model_answers_the_streak_and_keeps_it_current(api: Api) -> None:
    api.call("PUT", "/api/v1/catalog", data=CATALOG + "    on_demand: true\n")
    now = time.time()
    with api.store.begin() as conn:
        repo.update_model(conn, "tiny", consecutive_failures=1, last_failure_at=now - 1,
                          last_error="engine exited", activated_at=now - 30)
    answer = api.call("POST", "/api/v1/activate", ROUTER, json={"model": "tiny"}).json
    assert answer["failures"] == 1 and answer["last_error"] == "engine exited"
    assert 3.0 < answer["retry_after_s"] <= 4.0
    assert routes(api)["tiny"]["failures"] == 1          # still current for every router
