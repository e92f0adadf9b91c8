"""The OpenAPI document at /openapi.json matches what the control service really answers."""

from __future__ import annotations

from typing import Any

import jsonschema

from .conftest import ADMIN, JOIN, ROUTER, Api

CATALOG = "models: [{name: tiny, source: /m/tiny.gguf, engine: llama.cpp, profile: {class: cpu}}]"


def checker(doc: dict[str, Any]) -> Any:
    def check(resp: Any, path: str, method: str) -> None:
        operation = doc["paths"][path][method]
        status = str(resp.status_code)
        spec = operation["responses"].get(status) or operation["responses"]["default"]
        assert status in operation["responses"] or resp.status_code >= 400, \
            f"{method.upper()} {path} answered {status}, which the document does not list"
        content = spec.get("content")
        if content is None:
            return
        schema = {"$ref": content["application/json"]["schema"]["$ref"],
                  "components": doc["components"]}
        jsonschema.Draft202012Validator(schema).validate(resp.json)
    return check


def test_every_documented_response_matches_the_real_one(api: Api) -> None:
    doc = api.call("GET", "/openapi.json", None).json
    assert doc["openapi"].startswith("3.1")
    check = checker(doc)
    check(api.call("GET", "/healthz", None), "/healthz", "get")
    check(api.call("PUT", "/api/v1/catalog", ADMIN, data=CATALOG), "/api/v1/catalog", "put")
    check(api.call("PUT", "/api/v1/catalog", ADMIN, data="models: 3"), "/api/v1/catalog", "put")
    joined = api.call("POST", "/api/v1/agent/join", JOIN, json={"node": "n1"})
    check(joined, "/api/v1/agent/join", "post")
    cred = joined.json["credential"]
    check(api.report(cred), "/api/v1/agent/report", "post")
    api.reconciler.run_cycle()
    answer = api.report(cred)
    check(answer, "/api/v1/agent/report", "post")
    rid = answer.json["assignments"][0]["replica_id"]
    check(api.report(cred, replicas=[{"id": rid, "state": "ready", "port": 4000, "pid": 9}]),
          "/api/v1/agent/report", "post")
    check(api.call("GET", "/api/v1/routes", ROUTER), "/api/v1/routes", "get")
    check(api.call("POST", "/api/v1/idle", ROUTER, json={"replicas": {rid: 12.5}}),
          "/api/v1/idle", "post")
    check(api.call("POST", "/api/v1/activate", ROUTER, json={"model": "tiny"}),
          "/api/v1/activate", "post")
    for path in ("/api/v1/models", "/api/v1/nodes", "/api/v1/replicas", "/api/v1/events",
                 "/api/v1/keys", "/api/v1/status", "/api/v1/plan"):
        check(api.call("GET", path, ADMIN), path, "get")
    check(api.call("GET", "/api/v1/models/tiny", ADMIN), "/api/v1/models/{name}", "get")
    check(api.call("GET", "/api/v1/models/none", ADMIN), "/api/v1/models/{name}", "get")
    put = api.call("PUT", "/api/v1/catalog", ADMIN, data=CATALOG.replace(
        "class: cpu}", "class: cpu}, args: [--ctx-size, '4096']"))
    check(put, "/api/v1/catalog", "put")
    assert put.json["rolls"] == ["tiny"]
    for method, path in (("GET", "rollout"), ("POST", "rollout/undo"),
                         ("POST", "rollout/promote")):
        check(api.call(method, f"/api/v1/models/tiny/{path}", ADMIN),
              f"/api/v1/models/{{name}}/{path}", method.lower())
    check(api.call("GET", "/api/v1/models/none/rollout", ADMIN),
          "/api/v1/models/{name}/rollout", "get")
    for method, path, body in (("POST", "cordon", None), ("POST", "uncordon", None),
                               ("POST", "drain", {"force": "no"}),
                               ("POST", "drain", {"force": True}), ("GET", "drain", None)):
        check(api.call(method, f"/api/v1/nodes/n1/{path}", ADMIN, json=body),
              f"/api/v1/nodes/{{name}}/{path}", method.lower())
    check(api.call("POST", "/api/v1/keys", ADMIN, json={"name": "k"}), "/api/v1/keys", "post")
    check(api.call("POST", "/api/v1/models/tiny/retry", ADMIN, json={}),
          "/api/v1/models/{name}/retry", "post")
    check(api.call("DELETE", "/api/v1/models/tiny", ADMIN), "/api/v1/models/{name}", "delete")
    check(api.call("PATCH", "/api/v1/keys/k", ADMIN, json={"priority": "low"}),
          "/api/v1/keys/{name}", "patch")
    check(api.call("DELETE", "/api/v1/keys/k", ADMIN), "/api/v1/keys/{name}", "delete")
    check(api.call("GET", "/api/v1/usage", ADMIN), "/api/v1/usage", "get")
    check(api.call("POST", "/api/v1/nodes/n1/reset", ADMIN), "/api/v1/nodes/{name}/reset",
          "post")
    check(api.call("DELETE", "/api/v1/nodes/n1?force=true", ADMIN), "/api/v1/nodes/{name}",
          "delete")


def test_the_document_lists_every_route_the_service_has(api: Api) -> None:
    doc = api.call("GET", "/openapi.json", None).json
    app = api.client.application
    served = {rule.rule.replace("<path:name>", "{name}") for rule in app.url_map.iter_rules()
              if rule.endpoint != "static"
              and not rule.endpoint.startswith("console.")}    # HTML pages: docs/console.md
    assert served - {"/openapi.json"} == set(doc["paths"])
