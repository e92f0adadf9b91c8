"""API keys with a scope and an expiry (issue 17): the admin API keeps them, the routes
table carries them to the routers, bad values are refused naming what is wrong."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from llmgw_runtime.api.router import Routes
from llmgw_runtime.security import hash_token
from llmgw_runtime.store import routers, schema
from tests.cli.test_commands import invoke

from .conftest import ADMIN, ROUTER, Api, served


def _routes(api: Api) -> Routes:
    return Routes.model_validate(api.call("GET", "/api/v1/routes", token=ROUTER).json)


def test_a_scoped_expiring_key_is_kept_listed_and_carried_to_routers(api: Api) -> None:
    made = api.call("POST", "/api/v1/keys", json={"name": "app", "models": ["b", "a", "b"],
                                                   "expires_in_s": 86400})
    assert made.status_code == 201
    assert made.json["models"] == ["a", "b"] and made.json["expires_at"] > 0
    [key] = api.call("GET", "/api/v1/keys").json["keys"]
    assert (key["name"], key["models"], key["expired"]) == ("app", ["a", "b"], False)
    assert 86000 < key["expires_at"] - key["created"] <= 86400
    routes = _routes(api)
    digest = hash_token(made.json["key"])
    assert routes.key_models == {digest: ["a", "b"]}
    assert 86000 < routes.key_expires_in_s[digest] <= 86400
    events = api.call("GET", "/api/v1/events").json["events"]
    assert any(e["message"] == "API key created for models a, b, expiring in 23 h"
               or e["message"] == "API key created for models a, b, expiring in 1 d"
               for e in events), events


def test_a_scope_and_an_expiry_can_be_lifted(api: Api) -> None:
    made = api.call("POST", "/api/v1/keys", json={"name": "app", "models": ["a"],
                                                   "expires_in_s": 60}).json
    changed = api.call("PATCH", "/api/v1/keys/app",
                       json={"models": "all", "expires_in_s": "never"})
    assert changed.status_code == 200
    assert (changed.json["models"], changed.json["expires_at"]) == (None, None)
    routes = _routes(api)
    assert hash_token(made["key"]) in routes.api_key_hashes
    assert routes.key_models == {} and routes.key_expires_in_s == {}
    messages = [e["message"] for e in api.call("GET", "/api/v1/events").json["events"]]
    assert any(m.startswith("API key may use every model by ") for m in messages)
    assert any(m.startswith("API key never expires by ") for m in messages)


def test_an_expired_key_is_listed_as_expired_and_still_carried(api: Api) -> None:
    made = api.call("POST", "/api/v1/keys", json={"name": "old", "expires_in_s": 1}).json
    api.call("PATCH", "/api/v1/keys/old", json={"expires_in_s": 0.001})
    import time
    time.sleep(0.05)
    [key] = api.call("GET", "/api/v1/keys").json["keys"]
    assert key["expired"] is True
    # routers are told, so that they can say why it is refused
    assert _routes(api).key_expires_in_s[hash_token(made["key"])] <= 0


@pytest.mark.parametrize(("method", "path", "body", "says"), [
    ("POST", "/api/v1/keys", {"name": "k", "models": []}, "models"),
    ("POST", "/api/v1/keys", {"name": "k", "models": "a"}, "models"),
    ("POST", "/api/v1/keys", {"name": "k", "models": ["no spaces"]}, "models"),
    ("POST", "/api/v1/keys", {"name": "k", "models": [["a"]]}, "models"),
    ("POST", "/api/v1/keys", {"name": "k", "models": ["a\x1b[31m"]}, "models"),
    ("POST", "/api/v1/keys", {"name": "k", "models": ["m"] * 5000}, "models"),
    ("POST", "/api/v1/keys", {"name": "k", "expires_in_s": [60]}, "expires_in_s"),
    ("POST", "/api/v1/keys", {"name": "k", "expires_in_s": 0}, "expires_in_s"),
    ("POST", "/api/v1/keys", {"name": "k", "expires_in_s": 1e12}, "expires_in_s"),
    ("POST", "/api/v1/keys", {"name": "k", "expires_in_s": "never"}, "expires_in_s"),
    ("PATCH", "/api/v1/keys/k", {}, "nothing to change"),
    ("PATCH", "/api/v1/keys/k", {"models": "some"}, "models"),
    ("PATCH", "/api/v1/keys/k", {"expires_in_s": -5}, "expires_in_s"),
])
def test_bad_scopes_and_expiries_are_refused_naming_the_field(
        api: Api, method: str, path: str, body: dict[str, object], says: str) -> None:
    api.call("POST", "/api/v1/keys", json={"name": "k"})
    resp = api.call(method, path, json=body)
    assert resp.status_code == 400, resp.json
    error = resp.json["error"]
    assert says in error["message"] or any(d.startswith(says) or d.startswith(f"(the body): {says}")
                                           for d in error["details"]), error


def _idle(api: Api, router: str, keys_optional: bool) -> None:
    resp = api.call("POST", "/api/v1/idle", token=ROUTER, json={
        "replicas": {}, "router": router, "worker": "w1", "keys_optional": keys_optional})
    assert resp.status_code == 204, resp.json


def _heard(api: Api) -> dict[str, tuple[int, float]]:
    with api.store.begin() as conn:
        return {r.id: (r.keys_optional, r.heard)
                for r in conn.execute(sa.select(schema.routers))}


def test_creating_a_key_says_when_routers_heard_lately_serve_without_keys(api: Api) -> None:
    """Issue 28: under `llmgw up` the router serves requests without a key, so a key's
    scope and limits bind only clients that send it: creating one says so, as long as
    such a router was heard from in the last minute; `ctl keys create` prints it."""
    assert api.call("POST", "/api/v1/keys", json={"name": "a"}).json["note"] is None
    _idle(api, "router-strict", False)
    assert api.call("POST", "/api/v1/keys", json={"name": "b"}).json["note"] is None
    _idle(api, "router-up", True)
    note = api.call("POST", "/api/v1/keys", json={"name": "c"}).json["note"]
    assert note.startswith("1 router heard from in the last minute serves requests "
                           "without any key (started with --no-require-api-key")
    assert "`llmgw up --require-api-key` or LLMGW_REQUIRE_API_KEY=1" in note
    with served(api.client.application) as url:
        code, out = invoke("ctl", "--url", url, "--token", ADMIN, "keys", "create", "d")
    assert code == 0, out
    lines = out.splitlines()
    assert lines[0] == "note: " + note
    assert lines[-1].startswith("sk-llmgw-")          # the key stays the last line
    # a router silent for over a minute no longer counts
    with api.store.begin() as conn:
        conn.execute(schema.routers.update().values(heard=schema.routers.c.heard - 61))
    assert api.call("POST", "/api/v1/keys", json={"name": "e"}).json["note"] is None


def test_a_router_s_posts_write_only_when_the_word_changed_or_is_old(api: Api) -> None:
    _idle(api, "router-up", True)
    first = _heard(api)["router-up"]
    _idle(api, "router-up", True)                      # the same word within 10 s: kept
    assert _heard(api)["router-up"] == first
    _idle(api, "router-up", False)                     # changed: written at once
    assert _heard(api)["router-up"][0] == 0
    assert routers.needs_write(None, True, 5.0)
    assert not routers.needs_write((True, 0.0), True, routers.REFRESH_S - 0.1)
    assert routers.needs_write((True, 0.0), True, routers.REFRESH_S)
    assert routers.needs_write((True, 0.0), False, 1.0)
