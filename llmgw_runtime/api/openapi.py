"""Both services' OpenAPI 3.1 documents, generated from the messages of this package: the
schema a client reads and the parser a service runs are the same definitions.

Each route is one row: method, path, who may call it, its parameters, the message of its
body and of its answer. Tests check that every served route is listed and that real
answers (and schemathesis' generated requests) match."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from typing import Any

import pydantic
from pydantic.json_schema import models_json_schema

from ..catalog.bounds import MAX_MODELS
from . import admin, agent, catalog, history, router, usage
from .fields import MAX_NAME

REF = "#/components/schemas/{model}"


@dataclass(frozen=True)
class Param:
    name: str
    where: str                       # path | query
    schema: dict[str, Any]
    description: str = ""


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    summary: str
    auth: tuple[str, ...] | None     # security schemes; None: open
    answer: type[pydantic.BaseModel] | str | None = None   # a message, a raw schema name
    body: type[pydantic.BaseModel] | str | None = None
    status: str = "200"
    params: tuple[Param, ...] = ()
    errors: tuple[int, ...] = (400, 401, 403)
    content: str = "application/json"
    extra: dict[str, Any] = field(default_factory=dict)


NAME = Param("name", "path", {"type": "string", "minLength": 1, "maxLength": MAX_NAME})
ADMIN = ("admin",)

CONTROL_ROUTES = (
    Route("get", "/healthz", "liveness and the current leader", None, admin.Health,
          errors=(503,)),
    Route("post", "/api/v1/agent/join", "a node joins with the join token (409: the name "
          "has joined already; it needs its credential or `llmgw ctl nodes reset`)",
          ("join",), agent.JoinAnswer, agent.JoinRequest, errors=(400, 401, 403, 409)),
    Route("post", "/api/v1/agent/report", "a node reports; the answer is its assignments",
          ("node",), agent.ReportAnswer, agent.Report),
    Route("post", "/api/v1/agent/heartbeat", "a steady node's heartbeat (the digest of its "
          "last full report, replica states and device readings when they changed); the "
          "answer is its assignments, or full_report", ("node",), agent.HeartbeatAnswer,
          agent.Heartbeat),
    Route("get", "/api/v1/routes", "what routers route", ("router", "admin"), router.Routes),
    Route("post", "/api/v1/idle", "last use per replica", ("router",), None, router.IdleMap,
          status="204"),
    Route("post", "/api/v1/unreachable", "a router could not connect to a replica: not "
          "routed until its agent reports it ready again", ("router",), None,
          router.Unreachable, status="204"),
    Route("post", "/api/v1/usage", "tokens per API key and model since this reporter's "
          "previous report; applied once per reporter and seq", ("router",), usage.UsageAck,
          usage.UsageReport),
    Route("post", "/api/v1/activate", "someone wants this model now", ("router", "admin"),
          router.ActivateAnswer, router.ActivateRequest, errors=(400, 401, 403, 404)),
    Route("put", "/api/v1/catalog", "apply a catalog (YAML or JSON, docs/catalog.md)", ADMIN,
          admin.CatalogResult, "Catalog",
          params=(Param("prune", "query", {"type": "boolean"},
                        "delete models the catalog does not name"),)),
    Route("put", "/api/v1/catalog/dry-run", "what applying this catalog would change; "
          "nothing changes", ADMIN, admin.CatalogResult, "Catalog",
          params=(Param("prune", "query", {"type": "boolean"},
                        "delete models the catalog does not name"),)),
    Route("get", "/api/v1/models", "every model with its state", ADMIN, admin.ModelList),
    Route("get", "/api/v1/models/{name}", "one model", ADMIN, admin.Model, params=(NAME,),
          errors=(401, 403, 404)),
    Route("delete", "/api/v1/models/{name}", "remove a model", ADMIN, admin.Deleted,
          params=(NAME,), errors=(401, 403, 404)),
    Route("post", "/api/v1/models/{name}/retry", "unpark a model", ADMIN, admin.Retried,
          params=(NAME,), errors=(401, 403, 404)),
    Route("get", "/api/v1/nodes", "nodes and their devices", ADMIN, admin.NodeList),
    Route("post", "/api/v1/nodes/{name}/reset", "clear a node's credential (a reinstalled "
          "host joins again)", ADMIN, admin.NodeReset, params=(NAME,), errors=(401, 403, 404)),
    Route("delete", "/api/v1/nodes/{name}", "remove a node that is gone", ADMIN,
          admin.NodeDeleted, errors=(400, 401, 403, 404, 409),
          params=(NAME, Param("force", "query", {"type": "boolean"},
                              "also when the node reported recently"))),
    Route("get", "/api/v1/models/{name}/rollout", "a model's rollout: old and new replicas "
          "ready, what it waits for, a failed one's error, a canary's requests per version",
          ADMIN, admin.RolloutStatus, params=(NAME,), errors=(401, 403, 404)),
    Route("post", "/api/v1/models/{name}/rollout/undo", "apply the model's previous "
          "definition again: its replicas roll back (409: there is none)", ADMIN,
          admin.RolloutStatus, params=(NAME,), errors=(401, 403, 404, 409)),
    Route("post", "/api/v1/models/{name}/rollout/promote", "the canary's definition "
          "replaces every old replica (409: the model runs no canary)", ADMIN,
          admin.RolloutStatus, params=(NAME,), errors=(401, 403, 404, 409)),
    Route("post", "/api/v1/nodes/{name}/cordon", "place no new replica on the node; what "
          "runs there keeps running", ADMIN, admin.NodeDrain, params=(NAME,),
          errors=(401, 403, 404)),
    Route("post", "/api/v1/nodes/{name}/uncordon", "the node takes new replicas again (a "
          "drain ends)", ADMIN, admin.NodeDrain, params=(NAME,), errors=(401, 403, 404)),
    Route("post", "/api/v1/nodes/{name}/drain", "cordon the node and move its replicas "
          "elsewhere, each replacement ready before the old one drains (409: models would "
          "lose capacity; force drains them anyway); an empty body is {}", ADMIN,
          admin.NodeDrain, admin.DrainRequest, params=(NAME,),
          errors=(400, 401, 403, 404, 409)),
    Route("get", "/api/v1/nodes/{name}/drain", "the node's drain: moved of total, what it "
          "waits for, done", ADMIN, admin.NodeDrain, params=(NAME,), errors=(401, 403, 404)),
    Route("get", "/api/v1/status", "the fleet summary behind every status view", ADMIN,
          "Status", params=(Param("idle_after_s", "query",
                                  {"type": "number", "minimum": 0, "maximum": 1e9}),)),
    Route("get", "/api/v1/plan", "what placement would do now (a dry run)", ADMIN,
          admin.Plan),
    Route("get", "/api/v1/replicas", "replicas", ADMIN, admin.ReplicaList),
    Route("get", "/api/v1/events", "recent events, newest first", ADMIN, admin.EventList,
          params=(Param("limit", "query", {"type": "integer", "minimum": 1,
                                           "maximum": 1000}),)),
    Route("get", "/api/v1/keys", "router API keys (names only)", ADMIN, admin.Keys),
    Route("post", "/api/v1/keys", "create a router API key, shown once", ADMIN,
          admin.KeyCreated, admin.KeyCreate, status="201", errors=(400, 401, 403, 409)),
    Route("patch", "/api/v1/keys/{name}", "change a router API key's priority, scope, "
          "expiry or limits", ADMIN,
          admin.KeyInfo, admin.KeyUpdate, params=(NAME,), errors=(400, 401, 403, 404)),
    Route("delete", "/api/v1/keys/{name}", "delete a router API key", ADMIN, admin.Deleted,
          params=(NAME,), errors=(401, 403, 404)),
    Route("get", "/api/v1/usage", "tokens per API key and model over a period", ADMIN,
          usage.UsageList, params=(
              Param("since", "query", {"type": "string", "maxLength": 32},
                    "how far back: 24h (the default), 7d, 90m or seconds"),
              Param("by", "query", {"enum": ["key", "model", "key,model"]},
                    "what to sum by (default key,model)"))),
    Route("get", "/api/v1/history", "the fleet's history per model and device class: "
          "minute points of the last day (24h) or hour points of the last week (7d)",
          ADMIN, history.History, params=(
              Param("range", "query", {"enum": list(history.RANGES)}, "24h (the default) "
                    "or 7d"),
              Param("model", "query", {"type": "string", "minLength": 1,
                                       "maxLength": MAX_NAME},
                    "one model's points only (no device classes then)"))),
    Route("get", "/api/v1/usage/gpu-hours", "device-hours of the models' replicas per "
          "device class, per model or shared per API key by tokens, priced by "
          "LLMGW_COST_PER_DEVICE_HOUR", ADMIN, usage.DeviceHoursList, params=(
              Param("since", "query", {"type": "string", "maxLength": 32},
                    "how far back: 24h (the default), 7d, 90m or seconds"),
              Param("by", "query", {"enum": ["key", "model", "key,model"]},
                    "what to sum by (default key,model)"))),
    Route("get", "/metrics", "Prometheus metrics (text exposition format); open unless "
          "LLMGW_METRICS_TOKEN is set", None, "MetricsText", content="text/plain",
          errors=(401,), extra={"security": [{}, {"metrics": []}]}),
)

RAW: dict[str, Any] = {
    "Catalog": {"type": "object", "required": ["models"], "additionalProperties": False,
                "properties": {"models": {"type": "array", "maxItems": MAX_MODELS,
                                          "items": {"$ref": REF.format(model="CatalogEntry")}}},
                "description": "a catalog: models, a list of entries (docs/catalog.md)"},
    "MetricsText": {"type": "string"},
}


def _status_schema() -> dict[str, Any]:
    """The fleet summary's own JSON Schema (status/status.schema.json), its ``$defs``
    moved into components so that references resolve inside the document."""
    text = resources.files("llmgw_runtime.status").joinpath("status.schema.json").read_text()
    text = text.replace('"#/$defs/', '"#/components/schemas/Status_')
    doc = json.loads(text)
    for key in ("$schema", "$id"):
        doc.pop(key, None)
    defs = doc.pop("$defs", {})
    return {"Status": doc, **{f"Status_{k}": v for k, v in defs.items()}}


def _catalog_entry_schema() -> dict[str, Any]:
    """One catalog entry as the catalog writes it, generated from its one definition
    (api/catalog.py ``catalog_schema``), its ``$defs`` (the nested entries: profile,
    autoscale, max_tokens) moved into components as ``CatalogEntry_<name>``."""
    text = json.dumps(catalog.catalog_schema())
    doc = json.loads(text.replace('"#/$defs/', '"#/components/schemas/CatalogEntry_'))
    defs = doc.pop("$defs", {})
    return {"CatalogEntry": doc, **{f"CatalogEntry_{k}": v for k, v in defs.items()}}


def _schemas(messages: list[type[pydantic.BaseModel]]) -> dict[str, Any]:
    _, top = models_json_schema([(m, "validation") for m in messages], ref_template=REF)
    return dict(top.get("$defs", {}))


def _ref(what: type[pydantic.BaseModel] | str) -> dict[str, str]:
    return {"$ref": REF.format(model=what if isinstance(what, str) else what.__name__)}


def _operation(route: Route, error: str) -> dict[str, Any]:
    responses: dict[str, Any] = {}
    if route.answer is None:
        responses[route.status] = {"description": "done"}
    else:
        responses[route.status] = {"description": "ok", "content": {
            route.content: {"schema": _ref(route.answer)}}}
    for code in sorted({*route.errors, 405, 413, 429, 500, 503} - {int(route.status)}):
        responses[str(code)] = {"description": "error", "content": {
            "application/json": {"schema": _ref(error)}}}
    op: dict[str, Any] = {"summary": route.summary, "responses": responses}
    if route.auth:
        op["security"] = [{a: []} for a in route.auth]
    op.update(route.extra)
    if route.params:
        op["parameters"] = [{"name": p.name, "in": p.where, "required": p.where == "path",
                             "schema": p.schema, **({"description": p.description}
                                                    if p.description else {})}
                            for p in route.params]
    if route.body is not None:
        content = {"application/json": {"schema": _ref(route.body)}}
        if route.body == "Catalog":
            content["application/yaml"] = {"schema": {"type": "string"}}
        op["requestBody"] = {"required": True, "content": content}
    return op


def _paths(routes: tuple[Route, ...], error: str) -> dict[str, Any]:
    paths: dict[str, Any] = {}
    for route in routes:
        paths.setdefault(route.path, {})[route.method] = _operation(route, error)
    return paths


def _messages(routes: tuple[Route, ...], *more: type[pydantic.BaseModel]
              ) -> list[type[pydantic.BaseModel]]:
    out: list[type[pydantic.BaseModel]] = list(more)
    for route in routes:
        for what in (route.answer, route.body):
            if isinstance(what, type) and what not in out:
                out.append(what)
    return out


@cache
def control_document(version: str) -> dict[str, Any]:
    bearer = {"type": "http", "scheme": "bearer"}
    schemas = _schemas(_messages(CONTROL_ROUTES, admin.Error))
    schemas.update(RAW)
    schemas.update(_catalog_entry_schema())
    schemas.update(_status_schema())
    return {
        "openapi": "3.1.0",
        "info": {"title": "llmgw control service", "version": version},
        "paths": _paths(CONTROL_ROUTES, "Error"),
        "components": {"schemas": schemas,
                       "securitySchemes": {k: bearer for k in ("admin", "join", "node",
                                                               "router", "metrics")}},
    }


ROUTER_ROUTES = tuple(
    Route("post", path, summary, ("apiKey",), "ProxyAnswer", router.ProxyRequest,
          errors=(400, 401, 404, 502))
    for path, summary in (
        ("/v1/chat/completions", "Chat completion, proxied to a ready replica"),
        ("/v1/completions", "Text completion, proxied to a ready replica"),
        ("/v1/embeddings", "Embeddings, proxied to a ready replica"),
        ("/v1/responses", "OpenAI's Responses API, passed through to a ready replica "
         "(404 unsupported_endpoint: its engine does not serve it)"),
        ("/v1/messages", "Anthropic's Messages API, passed through to a ready replica "
         "(404 unsupported_endpoint: its engine does not serve it)"))) + (
    Route("get", "/v1/models", "Every catalog model", ("apiKey",), router.ModelsList,
          errors=(401,)),
    Route("get", "/v1/models/{model}", "One catalog model (404: not in the catalog)",
          ("apiKey",), router.ModelEntry, errors=(401, 404),
          params=(Param("model", "path", {"type": "string", "minLength": 1}),)),
    Route("get", "/healthz", "Liveness and the number of routed models", None,
          router.RouterHealth, errors=()),
    Route("get", "/health", "The same as /healthz, where the engines answer it", None,
          router.RouterHealth, errors=()),
    Route("get", "/metrics", "Prometheus metrics (text exposition format), summed over the "
          "router's workers; no API key", None, "MetricsText", content="text/plain",
          errors=()),
    Route("get", "/openapi.json", "This document", None, "Document", errors=()),
)


@cache
def router_document(version: str) -> dict[str, Any]:
    schemas = _schemas(_messages(ROUTER_ROUTES, router.OpenAIError))
    schemas.update({"MetricsText": {"type": "string"}, "Document": {"type": "object"},
                    "ProxyAnswer": {"type": "object", "description":
                                    "the engine's answer; with `stream: true`, server-sent "
                                    "events passed through as they arrive"}})
    doc: dict[str, Any] = {
        "openapi": "3.1.0",
        "info": {"title": "llmgw router", "version": version,
                 "description": "OpenAI-compatible API in front of llmgw's engine replicas."},
        "paths": _paths(ROUTER_ROUTES, "OpenAIError"),
        "components": {"schemas": schemas, "securitySchemes": {"apiKey": {
            "type": "http", "scheme": "bearer",
            "description": "an API key (sk-llmgw-...), when the router requires keys"}}},
    }
    for path in ("/v1/chat/completions", "/v1/completions", "/v1/embeddings",
                 "/v1/responses", "/v1/messages"):
        ok = doc["paths"][path]["post"]["responses"]["200"]["content"]
        ok["text/event-stream"] = {"schema": {"type": "string"}}
    for path in ("/healthz", "/health"):
        health = doc["paths"][path]["get"]["responses"]
        health["503"] = {"description": "no routes table yet", "content": {
            "application/json": {"schema": _ref(router.RouterHealth)}}}
    return doc
