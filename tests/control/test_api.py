"""The control service's APIs on both store backends: auth, bad input, the report loop."""

from __future__ import annotations

import io

import pytest

from llmgw_runtime.control.bootstrap import bootstrap
from llmgw_runtime.control.config import ControlConfig
from llmgw_runtime.security import hash_token
from llmgw_runtime.store import Store

from .conftest import JOIN, ROUTER, Api

CATALOG = """models:
  - name: tiny
    source: file:///models/tiny.gguf
    engine: llama.cpp
    profile: {class: cpu}
"""


def test_admin_api_needs_an_admin_token(api: Api) -> None:
    assert api.call("GET", "/api/v1/models", token=None).status_code == 401
    wrong = api.call("GET", "/api/v1/models", token="nope")
    assert wrong.status_code == 401 and wrong.json["error"]["reason"] == "unauthorized"
    cred = api.join()
    forbidden = api.call("GET", "/api/v1/models", token=cred)
    assert forbidden.status_code == 403
    assert forbidden.json["error"]["message"] == \
        "a node token cannot call this API; use an admin token"
    assert api.call("GET", "/api/v1/routes", token=JOIN).status_code == 403


@pytest.mark.parametrize("method,path,token", [
    ("POST", "/api/v1/agent/join", JOIN),
    ("POST", "/api/v1/idle", ROUTER),
    ("POST", "/api/v1/activate", ROUTER),
    ("POST", "/api/v1/keys", "admin"),
])
def test_bad_json_is_a_clear_400_on_every_api(api: Api, method: str, path: str,
                                              token: str) -> None:
    tok = api.config.admin_token if token == "admin" else token
    resp = api.call(method, path, tok, data="{not json", content_type="application/json")
    assert resp.status_code == 400
    assert resp.json["error"]["reason"] == "invalid_json"
    assert "not valid JSON" in resp.json["error"]["message"]


def test_bad_json_on_report_is_400_and_the_node_keeps_its_state(api: Api) -> None:
    cred = api.join()
    assert api.report(cred).status_code == 200
    resp = api.call("POST", "/api/v1/agent/report", cred, data="[1,", content_type="x")
    assert resp.status_code == 400 and resp.json["error"]["reason"] == "invalid_json"
    nodes = api.call("GET", "/api/v1/nodes").json["nodes"]
    assert nodes[0]["devices"][0]["class"] == "cpu"


def test_a_malformed_report_lists_every_problem(api: Api) -> None:
    cred = api.join()
    resp = api.report(cred, devices=[{"id": "zero"}], replicas=[{"id": "r", "state": "weird"}])
    assert resp.status_code == 400
    details = resp.json["error"]["details"]
    assert any("devices[0]" in d for d in details)
    assert any(d.startswith("replicas[0].state:") and "'weird'" in d for d in details)


def test_a_node_cannot_report_as_another(api: Api) -> None:
    cred = api.join("n1")
    resp = api.report(cred, node="n2")
    assert resp.status_code == 403 and "belongs to node 'n1'" in resp.json["error"]["message"]


def test_a_bad_catalog_writes_nothing_and_lists_every_problem(api: Api) -> None:
    bad = CATALOG + "  - {name: b, source: x, engine: tgi, profile: {class: cpu}}\n"
    resp = api.call("PUT", "/api/v1/catalog", data=bad)
    assert resp.status_code == 400 and resp.json["error"]["reason"] == "invalid_catalog"
    assert len(resp.json["error"]["details"]) == 2
    assert "nothing was applied" in resp.json["error"]["message"]
    assert api.call("GET", "/api/v1/models").json["models"] == []
    yaml_error = api.call("PUT", "/api/v1/catalog", data="models: [\n")
    assert yaml_error.status_code == 400 and "not valid YAML" in \
        yaml_error.json["error"]["message"]
    # A JSON catalog that is not JSON: the same reason, the line and column in the message.
    json_error = api.call("PUT", "/api/v1/catalog", data='{"models": [\n',
                          headers={"Content-Type": "application/json"})
    error = json_error.json["error"]
    assert (json_error.status_code, error["reason"]) == (400, "invalid_catalog")
    assert "at line 2, column 1" in error["message"] and "nothing was applied" in error["message"]
    # JSON read as JSON (catalog/bounds.load_json): too deep, or holding a constant JSON
    # does not have, it is still a 400 that says why
    for hostile, words in (('{"models": ' + "[" * 100_000 + "]" * 100_000 + "}", "MAX_DEPTH"),
                           ('{"models": [{"name": NaN}]}', "models[0]")):
        resp = api.call("PUT", "/api/v1/catalog", data=hostile,
                        headers={"Content-Type": "application/json"})
        assert (resp.status_code, resp.json["error"]["reason"]) == (400, "invalid_catalog")
        assert words in resp.json["error"]["message"] + " ".join(resp.json["error"]["details"])
    assert api.call("GET", "/api/v1/models").json["models"] == []


def test_report_gets_assignments_and_routes_follow_replica_states(api: Api) -> None:
    assert api.call("PUT", "/api/v1/catalog", data=CATALOG).json["created"] == ["tiny"]
    cred = api.join()
    assert api.report(cred).json["assignments"] == []
    assert api.reconciler.run_cycle()
    [assignment] = api.report(cred).json["assignments"]
    assert assignment["model"] == "tiny" and assignment["device_kind"] == "cpu"
    assert assignment["device_uuids"] == ["cpu-host"]
    rid = assignment["replica_id"]
    routes = api.call("GET", "/api/v1/routes", ROUTER).json
    assert routes["models"][0]["state"] == "starting" and routes["models"][0]["endpoints"] == []
    api.report(cred, replicas=[{"id": rid, "state": "ready", "port": 41000, "pid": 1}])
    routes = api.call("GET", "/api/v1/routes", ROUTER).json
    assert routes["models"][0]["state"] == "ready"
    # slots: the CPU engine's default (--parallel 1), as the catalog sets none
    assert routes["models"][0]["endpoints"] == [{"replica_id": rid,
                                                "url": "http://127.0.0.1:41000", "slots": 1,
                                                   "canary": False}]


def test_a_failed_replica_keeps_the_engines_message(api: Api) -> None:
    api.call("PUT", "/api/v1/catalog", data=CATALOG)
    cred = api.join()
    api.report(cred)
    api.reconciler.run_cycle()
    rid = api.report(cred).json["assignments"][0]["replica_id"]
    api.report(cred, replicas=[{"id": rid, "state": "failed", "port": None, "pid": None,
                                "last_error": "model file not found: /models/tiny.gguf"}])
    [rep] = api.call("GET", "/api/v1/replicas").json["replicas"]
    assert rep["state"] == "failed" and "model file not found" in rep["last_error"]
    api.reconciler.run_cycle()
    [model] = api.call("GET", "/api/v1/models").json["models"]
    assert model["consecutive_failures"] == 1
    assert model["last_error"] == "model file not found: /models/tiny.gguf"
    kinds = [e["kind"] for e in api.call("GET", "/api/v1/events").json["events"]]
    assert "failure" in kinds and "backoff" in kinds


def test_unplaceable_model_says_why(api: Api) -> None:
    api.call("PUT", "/api/v1/catalog", data=CATALOG.replace("class: cpu", "class: h100-80g"))
    api.report(api.join())
    api.reconciler.run_cycle()
    [model] = api.call("GET", "/api/v1/models").json["models"]
    assert model["state"] == "unplaceable"
    assert "no reporting node has a device of class h100-80g (classes seen: cpu)" == \
        model["reason"]


def test_api_keys_are_shown_once_and_stored_hashed(api: Api) -> None:
    resp = api.call("POST", "/api/v1/keys", json={"name": "app"})
    assert resp.status_code == 201
    key = resp.json["key"]
    assert api.call("POST", "/api/v1/keys", json={"name": "app"}).status_code == 409
    assert api.call("GET", "/api/v1/keys").json["keys"][0]["name"] == "app"
    hashes = api.call("GET", "/api/v1/routes", ROUTER).json["api_key_hashes"]
    assert hashes == [hash_token(key)]
    with api.store.begin() as conn:
        dump = str([tuple(r) for r in conn.exec_driver_sql("SELECT * FROM accounts")])
    assert key not in dump


def test_bootstrap_generates_missing_secrets_once_and_stores_hashes(store: Store,
                                                                    tmp_path) -> None:  # type: ignore[no-untyped-def]
    out = io.StringIO()
    first = bootstrap(store, ControlConfig(state_dir=tmp_path), out)
    again = bootstrap(store, ControlConfig(state_dir=tmp_path), io.StringIO())
    assert set(first) == {"admin", "join", "router"} and again == {}
    assert first["admin"] in out.getvalue() and "shown once" in out.getvalue()
    with store.begin() as conn:
        dump = str([tuple(r) for r in conn.exec_driver_sql("SELECT * FROM accounts")])
    assert first["admin"] not in dump and hash_token(first["admin"]) in dump


def test_healthz_names_the_leader(api: Api) -> None:
    assert api.call("GET", "/healthz", None).json["leader"] is None
    api.reconciler.run_cycle()
    assert api.call("GET", "/healthz", None).json["leader"] == "test"


def test_retry_unparks(api: Api) -> None:
    api.call("PUT", "/api/v1/catalog", data=CATALOG)
    from llmgw_runtime.store import repo

    with api.store.begin() as conn:
        repo.update_model(conn, "tiny", parked=1, consecutive_failures=5, last_error="x")
    assert api.call("GET", "/api/v1/models/tiny").json["state"] == "parked"
    assert api.call("POST", "/api/v1/models/tiny/retry", json={}).status_code == 200
    model = api.call("GET", "/api/v1/models/tiny").json
    assert not model["parked"] and model["consecutive_failures"] == 0
    assert api.call("GET", "/api/v1/models/nope").status_code == 404
