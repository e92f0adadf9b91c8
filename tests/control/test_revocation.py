"""Revocation on both store backends: deleting an API key (and a router refusing it after
its next refresh), resetting and deleting nodes, and console sessions that end when the
admin token is rotated through start-up (``bootstrap``)."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import pytest
import sqlalchemy as sa

from llmgw_runtime.control.app import create_app
from llmgw_runtime.control.bootstrap import bootstrap
from llmgw_runtime.router.app import create_app as create_router
from llmgw_runtime.router.config import RouterConfig
from llmgw_runtime.store import accounts, repo
from llmgw_runtime.store.schema import console_sessions, nodes

from .conftest import ADMIN, ROUTER, Api, served

CATALOG = """models:
  - {name: tiny, source: file:///models/tiny.gguf, engine: llama.cpp, profile: {class: cpu}}
"""


def events(api: Api, kind: str) -> list[dict[str, Any]]:
    with api.store.begin() as conn:
        return [e for e in repo.list_events(conn, 1000) if e["kind"] == kind]


def silence(api: Api, node: str, for_s: float = 3600) -> None:
    with api.store.begin() as conn:
        conn.execute(nodes.update().where(nodes.c.name == node)
                     .values(last_report=time.time() - for_s))


# ---------------------------------------------------------------- API keys


def test_a_deleted_key_is_gone_from_the_list_and_the_routes_and_says_so(api: Api) -> None:
    made = api.call("POST", "/api/v1/keys", json={"name": "ci"}).json
    api.call("POST", "/api/v1/keys", json={"name": "other"})
    resp = api.call("DELETE", "/api/v1/keys/ci")
    assert resp.status_code == 200 and resp.json == {"deleted": "ci"}
    assert [k["name"] for k in api.call("GET", "/api/v1/keys").json["keys"]] == ["other"]
    hashes = api.call("GET", "/api/v1/routes", ROUTER).json["api_key_hashes"]
    assert len(hashes) == 1 and not any(made["key"] in h for h in hashes)
    [event] = [e for e in events(api, "key") if e["subject"] == "ci"
               and "deleted" in e["message"]]
    assert event["message"].startswith("API key deleted by admin")
    again = api.call("DELETE", "/api/v1/keys/ci")
    assert again.status_code == 404 and "'ci'" in again.json["error"]["message"]
    # only API keys: the admin account is not a key
    assert api.call("DELETE", "/api/v1/keys/admin").status_code == 404
    assert api.call("GET", "/api/v1/models").status_code == 200


def test_a_router_refuses_a_deleted_key_after_its_next_refresh(api: Api) -> None:
    key = api.call("POST", "/api/v1/keys", json={"name": "app"}).json["key"]
    with served(api.client.application) as url:
        router = create_router(RouterConfig(control_url=url, router_token=ROUTER,
                                            refresh_interval_s=60.0))
        state = router.extensions["llmgw_router"]
        try:
            client = router.test_client()
            auth = {"Authorization": f"Bearer {key}"}
            assert client.get("/v1/models", headers=auth).status_code == 200
            assert api.call("DELETE", "/api/v1/keys/app").status_code == 200
            assert client.get("/v1/models", headers=auth).status_code == 200   # cached
            assert state.routes.refresh() is not None
            refused = client.get("/v1/models", headers=auth)
            assert refused.status_code == 401
            assert refused.get_json()["error"]["code"] == "invalid_api_key"
        finally:
            state.routes.stop()


def test_a_router_refuses_an_address_that_keeps_sending_wrong_keys(api: Api) -> None:
    key = api.call("POST", "/api/v1/keys", json={"name": "app"}).json["key"]
    with served(api.client.application) as url:
        router = create_router(RouterConfig(control_url=url, router_token=ROUTER,
                                            refresh_interval_s=60.0))
        state = router.extensions["llmgw_router"]
        try:
            client = router.test_client()
            wrong = {"Authorization": "Bearer sk-llmgw-guess"}
            for _ in range(31):
                assert client.get("/v1/models", headers=wrong).status_code == 401
            refused = client.get("/v1/models", headers={"Authorization": f"Bearer {key}"})
            assert refused.status_code == 429
            assert int(refused.headers["Retry-After"]) >= 1
            error = refused.get_json()["error"]
            assert error["code"] == "too_many_failed_keys"
            assert set(error) == {"message", "type", "code", "param"}
            elsewhere = client.get("/v1/models", headers={"Authorization": f"Bearer {key}"},
                                   environ_base={"REMOTE_ADDR": "10.1.2.3"})
            assert elsewhere.status_code == 200
        finally:
            state.routes.stop()


# ---------------------------------------------------------------- nodes


def test_reset_refuses_the_old_credential_and_lets_the_host_join_again(api: Api) -> None:
    old = api.join("n1")
    assert api.report(old, "n1").status_code == 200
    resp = api.call("POST", "/api/v1/nodes/n1/reset")
    assert resp.status_code == 200 and resp.json == {"node": "n1", "credential": None}
    assert api.report(old, "n1").status_code == 401
    [event] = [e for e in events(api, "node") if e["subject"] == "n1"]
    assert "credential reset by admin" in event["message"]
    assert "join token" in event["message"]
    new = api.join("n1")                                  # the reinstalled host
    assert new != old and api.report(new, "n1").status_code == 200
    missing = api.call("POST", "/api/v1/nodes/nope/reset")
    assert missing.status_code == 404 and "'nope'" in missing.json["error"]["message"]


def test_a_node_that_still_reports_is_not_deleted_without_force(api: Api) -> None:
    cred = api.join("n1")
    api.report(cred, "n1")
    refused = api.call("DELETE", "/api/v1/nodes/n1")
    assert refused.status_code == 409
    message = refused.json["error"]["message"]
    assert "reported 0 s ago" in message and "node timeout of 30 s" in message
    assert "joins again with the join token" in message and "--force" in message
    assert api.call("GET", "/api/v1/nodes").json["nodes"][0]["name"] == "n1"
    forced = api.call("DELETE", "/api/v1/nodes/n1?force=true")
    assert forced.status_code == 200 and forced.json == {"deleted": "n1", "replicas": []}
    assert api.call("GET", "/api/v1/nodes").json["nodes"] == []
    assert api.report(cred, "n1").status_code == 401
    assert "(forced)" in events(api, "node")[0]["message"]
    assert api.call("DELETE", "/api/v1/nodes/n1").status_code == 404


def test_deleting_a_gone_node_deletes_the_replicas_that_used_it(api: Api) -> None:
    assert api.call("PUT", "/api/v1/catalog", data=CATALOG).status_code == 200
    api.report(api.join("n1"), "n1")
    api.report(api.join("n2"), "n2")
    now = time.time()
    with api.store.begin() as conn:
        repo.add_replica(conn, "r-on-n1", "tiny", "n1", (0,), now)
        repo.add_replica(conn, "r-part-on-n1", "tiny", "n2", (0,), now,
                         parts=((1, "n1", (0,)),), rendezvous_port=29500)
        repo.add_replica(conn, "r-on-n2", "tiny", "n2", (0,), now)
    silence(api, "n1")
    resp = api.call("DELETE", "/api/v1/nodes/n1")
    assert resp.status_code == 200
    assert sorted(resp.json["replicas"]) == ["r-on-n1", "r-part-on-n1"]
    with api.store.begin() as conn:
        left = repo.parts_by_replica(conn)
        assert [r.id for r in repo.list_replicas(conn)] == ["r-on-n2"]
        assert left == {} and repo.get_node(conn, "n1") is None
    stops = {e["message"] for e in events(api, "stop")}
    assert {f"replica {r} deleted with node n1; it is placed again elsewhere"
            for r in ("r-on-n1", "r-part-on-n1")} == stops
    assert "with 2 replica(s) that used it" in events(api, "node")[0]["message"]


def test_the_reconciler_places_a_deleted_nodes_replica_elsewhere(api: Api) -> None:
    assert api.call("PUT", "/api/v1/catalog", data=CATALOG).status_code == 200
    api.report(api.join("n1"), "n1")
    api.reconciler.run_cycle()
    with api.store.begin() as conn:
        [first] = repo.list_replicas(conn)
    assert first.node == "n1"
    api.report(api.join("n2"), "n2")
    silence(api, "n1", 60)             # silent, but not yet replaced (replace_after_s)
    assert api.call("DELETE", "/api/v1/nodes/n1").json["replicas"] == [first.id]
    api.reconciler.run_cycle()
    with api.store.begin() as conn:
        [second] = repo.list_replicas(conn)
    assert second.node == "n2" and second.id != first.id


# ---------------------------------------------------------------- admin token rotation


def test_rotating_the_admin_token_ends_its_console_sessions(api: Api) -> None:
    client = api.client
    assert client.post("/console/login", data={"token": ADMIN}).status_code == 303
    assert client.get("/console/").status_code == 200
    bootstrap(api.store, api.config)                       # a restart, same token: kept
    assert client.get("/console/").status_code == 200
    rotated = dataclasses.replace(api.config, admin_token="llmgw-admin-rotated")
    bootstrap(api.store, rotated)                          # the real start-up path
    app = create_app(rotated, store_=api.store)            # the restarted service
    client.application = app
    resp = client.get("/console/nodes")
    assert resp.status_code == 303 and resp.location.startswith("/console/login")
    assert "ended=1" in resp.location
    with api.store.begin() as conn:
        assert conn.execute(sa.select(sa.func.count()).select_from(console_sessions)
                            ).scalar_one() == 0
    old = client.post("/console/login", data={"token": ADMIN})
    assert old.status_code == 401
    assert client.post("/console/login", data={"token": "llmgw-admin-rotated"}
                       ).status_code == 303
    assert client.get("/console/").status_code == 200


@pytest.mark.parametrize("kind", ["router", "api_key"])
def test_an_account_that_is_no_longer_an_admin_keeps_no_session(api: Api,
                                                               kind: str) -> None:
    assert api.client.post("/console/login", data={"token": ADMIN}).status_code == 303
    with api.store.begin() as conn:
        accounts.put_account(conn, "admin", kind, "0" * 64, time.time())
    assert api.client.get("/console/").status_code == 303
