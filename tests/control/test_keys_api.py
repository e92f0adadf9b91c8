"""API keys with a scope and an expiry (issue 17): the admin API keeps them, the routes
table carries them to the routers, bad values are refused naming what is wrong."""

from __future__ import annotations

import pytest

from llmgw_runtime.api.router import Routes
from llmgw_runtime.security import hash_token

from .conftest import ROUTER, Api


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
