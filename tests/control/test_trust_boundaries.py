"""What crosses into the control service is checked at its edge: regressions of issue 13,
black-box through the HTTP API (on SQLite and PostgreSQL)."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import sqlalchemy as sa

from llmgw_runtime.control.app import create_app
from llmgw_runtime.store import schema

from .conftest import ADMIN, CPU, JOIN, ROUTER, Api

CATALOG = ("models: [{name: tiny, source: /m/tiny.gguf, engine: llama.cpp, "
           "profile: {class: cpu, memory_gb: 1}}]")
SECOND = ("models: [{name: tiny, source: /m/tiny.gguf, engine: llama.cpp, "
          "profile: {class: cpu, memory_gb: 1}}, {name: other, source: /m/o.gguf, "
          "engine: llama.cpp, profile: {class: cpu, memory_gb: 1}}]")


def placed_on(api: Api) -> dict[str, str]:
    return {r["model"]: r["node"] for r in api.call("GET", "/api/v1/replicas").json["replicas"]}


def test_a_non_finite_memory_figure_is_refused_and_placement_goes_on(api: Api) -> None:
    bad, good = api.join("bad"), api.join("good")
    for value in ("Infinity", "NaN", "1e999"):
        body = json.dumps({"node": "bad", "devices": [CPU]}).replace(
            '"memory_used_mb": 1000', f'"memory_used_mb": {value}')
        resp = api.call("POST", "/api/v1/agent/report", bad, data=body,
                        content_type="application/json")
        assert resp.status_code == 400, resp.json
    resp = api.report(bad, "bad", devices=[{**CPU, "memory_used_mb": 2**70}])
    assert resp.status_code == 400
    assert any("devices[0].memory_used_mb" in d for d in resp.json["error"]["details"])
    assert api.report(good, "good").status_code == 200
    api.call("PUT", "/api/v1/catalog", data=CATALOG)
    api.reconciler.run_cycle()
    assert placed_on(api) == {"tiny": "good"}
    for path in ("/api/v1/status", "/api/v1/nodes", "/api/v1/plan"):
        assert api.call("GET", path).status_code == 200


def test_non_scalar_fields_and_bad_cards_are_a_400_and_every_view_still_answers(
        api: Api) -> None:
    cred = api.join()
    for extra in ({"address": {"a": 1}}, {"fabric": ["x"]}, {"agent_version": {"v": 1}},
                  {"cards": [5]}, {"devices": [{k: v for k, v in CPU.items()
                                                if k != "memory_total_mb"}]}):
        resp = api.report(cred, **extra)
        assert resp.status_code == 400, (extra, resp.json)
        assert resp.json["error"]["details"], resp.json
    # A device without memory_used_mb is fine: it means none used.
    assert api.report(cred, devices=[{k: v for k, v in CPU.items()
                                      if k != "memory_used_mb"}]).status_code == 200
    for path in ("/api/v1/status", "/api/v1/nodes", "/api/v1/replicas"):
        assert api.call("GET", path).status_code == 200
    assert api.call("GET", "/console/nodes").status_code in (200, 302, 303)


def test_deeply_nested_json_is_a_400_not_a_traceback(api: Api) -> None:
    cred = api.join()
    deep = b'{"node": "n1", "weights": ' + b"[" * 50_000 + b"]" * 50_000 + b"}"
    for path, token in (("/api/v1/agent/report", cred), ("/api/v1/idle", ROUTER),
                        ("/api/v1/keys", ADMIN), ("/api/v1/agent/join", JOIN)):
        resp = api.call("POST", path, token, data=deep, content_type="application/json")
        assert resp.status_code == 400, path
        assert resp.json["error"]["reason"] == "invalid_json"
    resp = api.call("PUT", "/api/v1/catalog", data="models: " + "[" * 5000 + "]" * 5000)
    assert resp.status_code == 400


def test_an_infinite_idle_time_is_refused_and_replicas_stay_valid_json(api: Api) -> None:
    cred = api.join()
    api.report(cred)
    api.call("PUT", "/api/v1/catalog", data=CATALOG)
    api.reconciler.run_cycle()
    rid = api.report(cred).json["assignments"][0]["replica_id"]
    for raw in (b'{"replicas": {"%s": Infinity}}', b'{"replicas": {"%s": 1e999}}',
                b'{"replicas": {"%s": -1}}', b'{"replicas": {"%s": "soon"}}'):
        resp = api.call("POST", "/api/v1/idle", ROUTER, data=raw.replace(b"%s", rid.encode()),
                        content_type="application/json")
        assert resp.status_code == 400, raw
    resp = api.call("GET", "/api/v1/replicas")
    assert resp.status_code == 200
    json.loads(resp.get_data(), parse_constant=lambda c: (_ for _ in ()).throw(ValueError(c)))
    assert resp.json["replicas"][0]["last_used"] is None
    # A router says how long ago it used the replica; the store's clock makes it a time.
    assert api.call("POST", "/api/v1/idle", ROUTER,
                    json={"replicas": {rid: 120.0}}).status_code == 204
    with api.store.begin() as conn:
        now = api.store.now(conn)
    last_used = api.call("GET", "/api/v1/replicas").json["replicas"][0]["last_used"]
    assert now - 130 < last_used < now - 110


def test_the_join_token_cannot_take_over_a_node(api: Api) -> None:
    cred = api.join("gpu1")
    assert api.report(cred, "gpu1").status_code == 200
    taken = api.call("POST", "/api/v1/agent/join", JOIN, json={"node": "gpu1"})
    assert taken.status_code == 409
    assert "llmgw ctl nodes reset gpu1" in taken.json["error"]["message"]
    wrong = api.call("POST", "/api/v1/agent/join", JOIN,
                     json={"node": "gpu1", "credential": "llmgw-node-guess"})
    assert wrong.status_code == 409
    # The old credential still works: nothing was replaced.
    assert api.report(cred, "gpu1").status_code == 200
    # The node itself may renew with its credential; the old one then stops working.
    renewed = api.call("POST", "/api/v1/agent/join", JOIN,
                       json={"node": "gpu1", "credential": cred})
    assert renewed.status_code == 200
    assert api.report(cred, "gpu1").status_code == 401
    assert api.report(renewed.json["credential"], "gpu1").status_code == 200
    # After an admin reset, a reinstalled host joins again with the join token alone.
    assert api.call("POST", "/api/v1/nodes/gpu1/reset").status_code == 200
    assert api.call("POST", "/api/v1/agent/join", JOIN, json={"node": "gpu1"}).status_code \
        == 200


def test_a_node_may_only_claim_an_address_it_reports_from(api: Api) -> None:
    cred = api.join()
    api.call("PUT", "/api/v1/catalog", data=CATALOG)

    def report_from(peer: str, address: str, **kw: Any) -> Any:
        return api.call("POST", "/api/v1/agent/report", cred, environ_base={
            "REMOTE_ADDR": peer}, json={"node": "n1", "address": address, "devices": [CPU],
                                        "engines": ["llama.cpp"], **kw})
    answer = report_from("10.9.9.9", "10.0.0.5")
    assert answer.status_code == 200
    assert "10.0.0.5" in answer.json["problems"][0]
    node = api.call("GET", "/api/v1/nodes").json["nodes"][0]
    assert node["address"] is None and "LLMGW_AGENT_NETWORKS" in node["problem"]
    events = api.call("GET", "/api/v1/events").json["events"]
    assert any(e["kind"] == "node" and "10.0.0.5" in e["message"] for e in events)
    api.reconciler.run_cycle()
    rid = report_from("10.9.9.9", "10.0.0.5").json["assignments"][0]["replica_id"]
    report_from("10.9.9.9", "10.0.0.5", replicas=[{"id": rid, "state": "ready",
                                                    "port": 4000, "pid": 9}])
    routes = api.call("GET", "/api/v1/routes", ROUTER).json["models"]
    assert routes[0]["endpoints"] == []          # no prompt goes to an unproven address
    ok = report_from("10.9.9.9", "10.9.9.9", replicas=[{"id": rid, "state": "ready",
                                                         "port": 4000, "pid": 9}])
    assert ok.json.get("problems", []) == []
    assert api.call("GET", "/api/v1/nodes").json["nodes"][0]["problem"] is None
    routes = api.call("GET", "/api/v1/routes", ROUTER).json["models"]
    assert routes[0]["endpoints"][0]["url"] == "http://10.9.9.9:4000"


def test_configured_networks_allow_an_address_behind_a_nat(api: Api, tmp_path: Path) -> None:
    config = replace(api.config, agent_networks="10.20.0.0/16, fd00::/8")
    natted = Api(create_app(config, store_=api.store).test_client(), api.store, config)
    cred = natted.join()
    for address in ("10.20.3.4", "fd00::7"):
        resp = natted.call("POST", "/api/v1/agent/report", cred,
                           environ_base={"REMOTE_ADDR": "192.0.2.1"},
                           json={"node": "n1", "address": address, "devices": [CPU]})
        assert resp.json.get("problems", []) == [], address
    resp = natted.call("POST", "/api/v1/agent/report", cred,
                       environ_base={"REMOTE_ADDR": "192.0.2.1"},
                       json={"node": "n1", "address": "10.21.0.1", "devices": [CPU]})
    assert "10.20.0.0/16" in resp.json["problems"][0]
    assert "LLMGW_AGENT_NETWORKS" in "\n".join(
        replace(config, agent_networks="10.0.0.0/33").validate())


def test_a_405_says_which_methods_the_path_has(api: Api) -> None:
    resp = api.call("DELETE", "/api/v1/routes", ROUTER)
    assert resp.status_code == 405
    assert set(resp.headers["Allow"].replace(" ", "").split(",")) >= {"GET"}
    assert resp.json["error"]["code"] == 405


def test_a_stored_report_the_planner_cannot_use_leaves_that_node_out(api: Api) -> None:
    """A row written before reports were parsed strictly: that node is skipped (shown with
    the reason), every other node is still placed on."""
    good = api.join("good")
    api.join("old")
    api.report(good, "good")
    with api.store.begin() as conn:
        conn.execute(sa.update(schema.nodes).where(schema.nodes.c.name == "old").values(
            last_report=9e9, devices=json.dumps([{**CPU, "memory_total_mb": 1e308,
                                                  "id": "zero"}])))
    api.call("PUT", "/api/v1/catalog", data=SECOND)
    api.reconciler.run_cycle()
    assert placed_on(api) == {"tiny": "good", "other": "good"}
    old = next(n for n in api.call("GET", "/api/v1/nodes").json["nodes"] if n["name"] == "old")
    assert "cannot be used" in old["problem"]
    assert any(e["subject"] == "old" and "left out of placement" in e["message"]
               for e in api.call("GET", "/api/v1/events").json["events"])


def test_the_agent_renews_with_its_credential_and_a_stranger_is_told_how_to_reset(
        api: Api, tmp_path: Path) -> None:
    """The real agent client over real HTTP: it joins, renews showing its credential, and
    a second host claiming the same name is refused with the reset command."""
    from llmgw_runtime.agent.client import ControlClient
    from llmgw_runtime.api.agent import Report
    from llmgw_runtime.errors import LlmgwError

    from .conftest import served
    app = create_app(api.config, store_=api.store)
    with served(app) as url:
        first = ControlClient(url, JOIN, "gpu7", tmp_path / "a" / "credential")
        answer = first.report(Report(node="gpu7", address="127.0.0.1"))
        assert answer.assignments == [] and answer.report_interval_s > 0
        old = first.credential()
        first.join()                                       # renewal shows the credential
        assert first.credential() != old
        stranger = ControlClient(url, JOIN, "gpu7", tmp_path / "b" / "credential")
        try:
            stranger.report(Report(node="gpu7", address="127.0.0.1"))
            raise AssertionError("a second host took over gpu7")
        except LlmgwError as exc:
            assert "409" in str(exc) and "llmgw ctl nodes reset gpu7" in str(exc)
        assert first.report(Report(node="gpu7", address="127.0.0.1")).problems == []


def test_a_node_problem_shows_in_ctl_nodes_and_the_console(api: Api) -> None:
    from llmgw_runtime.cli.ctl import node_rows

    cred = api.join()
    api.call("POST", "/api/v1/agent/report", cred, environ_base={"REMOTE_ADDR": "10.9.9.9"},
             json={"node": "n1", "address": "10.0.0.5", "devices": [CPU]})
    nodes = api.call("GET", "/api/v1/nodes").json["nodes"]
    rows = node_rows(nodes, 0.0)
    assert any("PROBLEM" in cell and "10.0.0.5" in cell for row in rows for cell in row)
    login = api.client.post("/console/login", data={"token": ADMIN})
    assert login.status_code in (302, 303)
    page = api.client.get("/console/nodes").get_data(as_text=True)
    assert "10.0.0.5" in page and "LLMGW_AGENT_NETWORKS" in page


@pytest.mark.parametrize("extra", [
    {"in_flight": {"r-1": -1}},
    {"in_flight": {"r-1": 1.5}},
    {"in_flight": {"r-1": "3"}},
    {"in_flight": {"r-1": 10**30}},
    {"in_flight": {"../x": 1}},
    {"in_flight": {"r-1": {"n": 1}}},
    {"in_flight": [1, 2]},
    {"worker": "\x1b[2J"},
    {"worker": "w" * 500},
    {"worker": 7},
    {"versions": {"m": {"stable": {"requests": -1}}}},
    {"versions": {"m": {"canary": {"first_byte_s": "Infinity"}}}},
    {"versions": {"m": {"canary": {"tokens": 10**30}}}},
    {"versions": {"m": {"beta": {"requests": 1}}}},
    {"versions": {"m": {"canary": {"requests": 1, "extra": 1}}}},
    {"versions": {"has space": {"canary": {"requests": 1}}}},
])
def test_hostile_in_flight_worker_and_version_counts_are_a_400(api: Api,
                                                              extra: dict[str, object]) -> None:
    resp = api.call("POST", "/api/v1/idle", ROUTER,
                    json={"replicas": {}, "router": "rt-1", **extra})
    assert resp.status_code == 400, (extra, resp.get_data()[:300])
    assert resp.json["error"]["message"]
    assert api.call("POST", "/api/v1/idle", ROUTER,
                    json={"replicas": {}, "router": "rt-1", "worker": "w-1",
                          "in_flight": {"r-1": 2}}).status_code == 204


def test_a_non_finite_first_byte_sum_is_a_400(api: Api) -> None:
    raw = (b'{"replicas": {}, "versions": {"m": {"canary": {"requests": 1, '
           b'"first_byte_s": NaN}}}}')
    resp = api.call("POST", "/api/v1/idle", ROUTER, data=raw, content_type="application/json")
    assert resp.status_code == 400
