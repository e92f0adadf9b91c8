"""The control service's OpenAPI 3.1 document, served at /openapi.json. A test checks the
real responses against these schemas, so the document cannot drift from the code."""

from __future__ import annotations

from typing import Any

from .. import __version__

NUM = {"type": "number"}
STR = {"type": "string"}
INT = {"type": "integer"}
BOOL = {"type": "boolean"}


def _nullable(schema: dict[str, Any]) -> dict[str, Any]:
    return {"anyOf": [schema, {"type": "null"}]}


def _obj(props: dict[str, Any], required: list[str] | None = None) -> dict[str, Any]:
    return {"type": "object", "properties": props,
            "required": list(props) if required is None else required}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


SCHEMAS: dict[str, Any] = {
    "Error": _obj({"error": _obj({"code": INT, "reason": STR, "message": STR,
                                  "details": {"type": "array", "items": STR}})}),
    "Health": _obj({"status": {"enum": ["ok", "store_unavailable"]},
                    "leader": _nullable(STR), "version": STR}, ["status", "version"]),
    "Profile": _obj({"class": STR, "gpus": INT, "tp": INT, "pp": INT, "nodes": INT,
                     "memory_gb": NUM}, ["class", "gpus", "tp", "pp", "nodes"]),
    "Model": _obj({
        "name": STR, "source": STR, "engine": {"enum": ["llama.cpp", "vllm"]},
        "profile": _ref("Profile"), "replicas": INT, "on_demand": BOOL,
        "idle_stop_after_s": _nullable(NUM), "args": {"type": "array", "items": STR},
        "definition_hash": STR, "parked": BOOL, "consecutive_failures": INT,
        "last_error": _nullable(STR), "last_failure_at": _nullable(NUM),
        "activated_at": _nullable(NUM), "placement_reason": _nullable(STR),
        "created": NUM, "updated": NUM, "strategy": {"enum": ["binpack", "spread"]},
        "sha256": _nullable(STR), "size_bytes": _nullable(INT),
        "state": {"enum": ["ready", "starting", "activating", "idle", "parked",
                           "unplaceable", "stopped"]},
        "reason": _nullable(STR), "ready": INT, "wanted": INT}),
    "Device": _obj({"id": INT, "uuid": STR, "card": INT, "mig": _nullable(INT), "class": STR,
                    "memory_total_mb": INT, "memory_used_mb": INT,
                    "healthy": BOOL, "reason": _nullable(STR)},
                   ["id", "class", "healthy"]),
    "Node": _obj({"name": STR, "fabric": _nullable(STR), "address": _nullable(STR),
                  "last_report": _nullable(NUM), "agent_version": _nullable(STR),
                  "devices": {"type": "array", "items": _ref("Device")},
                  "engines": {"type": "array", "items": STR}, "weights": {"type": "object"},
                  "hardware": _obj({"source": _nullable(STR),
                                    "driver_version": _nullable(STR),
                                    "cards": {"type": "array", "items": _ref("Card")},
                                    "problems": {"type": "array", "items": STR}}, [])}),
    "Card": _obj({"index": INT, "uuid": _nullable(STR), "name": STR, "klass": _nullable(STR),
                  "mig_current": _nullable(BOOL), "mig_pending": _nullable(BOOL),
                  "instances": INT, "problem": _nullable(STR), "hint": _nullable(STR)},
                 ["index", "name"]),
    "Replica": _obj({"id": STR, "model": STR, "node": STR,
                     "devices": {"type": "array", "items": INT}, "port": _nullable(INT),
                     "pid": _nullable(INT),
                     "state": {"enum": ["pending", "fetching", "starting", "ready", "failed",
                                        "stopping"]},
                     "desired": BOOL, "started": NUM, "updated": NUM,
                     "last_used": _nullable(NUM), "last_error": _nullable(STR),
                     "rendezvous_port": _nullable(INT),
                     "progress": _nullable(_obj({"bytes": NUM, "total": _nullable(NUM),
                                                 "rate_bps": NUM}, [])),
                     "parts": {"type": "array", "items": _ref("Part")}}),
    "Part": _obj({"rank": INT, "node": STR, "devices": {"type": "array", "items": INT},
                  "state": STR, "pid": _nullable(INT), "last_error": _nullable(STR)}),
    "Event": _obj({"id": INT, "time": NUM, "kind": STR, "subject": STR, "message": STR}),
    "CatalogResult": _obj({k: {"type": "array", "items": STR}
                           for k in ("created", "updated", "unchanged", "deleted")}),
    "Assignment": _obj({"replica_id": STR, "model": STR, "engine": STR, "source": STR,
                        "args": {"type": "array", "items": STR},
                        "devices": {"type": "array", "items": INT},
                        "device_uuids": {"type": "array", "items": _nullable(STR)},
                        "device_kind": {"enum": ["cpu", "gpu", "mig"]},
                        "sha256": _nullable(STR), "size_bytes": _nullable(INT),
                        "profile": _obj({k: INT for k in ("gpus", "tp", "pp", "nodes")}),
                        "role": {"enum": ["head", "worker"]}, "rank": INT, "nodes": INT,
                        "rendezvous_port": _nullable(INT), "head_address": _nullable(STR),
                        "replica": STR,
                        "peers": {"type": "array", "items": _obj({
                            "rank": INT, "node": STR, "address": _nullable(STR)})}},
                       ["replica_id", "model", "engine", "source", "args", "devices",
                        "device_uuids", "device_kind", "profile"]),
    "ReportAnswer": _obj({"assignments": {"type": "array", "items": _ref("Assignment")},
                          "report_interval_s": NUM,
                          "sources": {"type": "array", "items": STR}, "sources_hash": STR},
                         ["assignments", "report_interval_s"]),
    "JoinAnswer": _obj({"node": STR, "credential": STR}),
    "Routes": _obj({
        "models": {"type": "array", "items": _obj({
            "name": STR, "state": STR, "reason": _nullable(STR), "on_demand": BOOL,
            "endpoints": {"type": "array", "items": _obj({"replica_id": STR, "url": STR})}})},
        "api_key_hashes": {"type": "array", "items": STR}}),
    "DeviceCounts": {"type": "object", "additionalProperties": _obj(
        {k: INT for k in ("total", "used", "free", "unhealthy", "unreachable")})},
    "UnusableCard": _obj({"node": STR, "card": _nullable(INT), "name": _nullable(STR),
                          "problem": STR, "hint": _nullable(STR)}),
    "Status": _obj({
        "nodes": _obj({"total": INT, "reporting": INT, "silent": INT}),
        "devices": _ref("DeviceCounts"),
        "cards_unusable": {"type": "array", "items": _ref("UnusableCard")},
        "replicas": {"type": "object", "additionalProperties": INT},
        "models": {"type": "array", "items": _obj({
            "name": STR, "state": STR, "ready": INT, "wanted": INT,
            "reason": _nullable(STR), "on_demand": BOOL,
            "fabrics_with_weights": {"type": "array", "items": STR},
            "nodes_with_weights": INT})},
        "fabrics": _ref("Fabrics")}),
    "Fabrics": {"type": "object", "additionalProperties": _obj({
        "nodes": INT, "reporting": INT, "models": {"type": "array", "items": STR}})},
    "Plan": _obj({
        "starts": {"type": "array", "items": _obj({
            "model": STR, "node": STR, "devices": {"type": "array", "items": INT},
            "parts": {"type": "array", "items": _obj({
                "rank": INT, "node": STR, "devices": {"type": "array", "items": INT}})},
            "why": STR})},
        "stops": {"type": "array", "items": _obj({
            "replica": STR, "model": _nullable(STR), "node": _nullable(STR), "why": STR})},
        "unplaceable": {"type": "object", "additionalProperties": STR},
        "devices": _ref("DeviceCounts"),
        "cards_unusable": {"type": "array", "items": _ref("UnusableCard")},
        "fabrics": _ref("Fabrics"),
        "models": {"type": "object", "additionalProperties": _obj({
            "fabrics_with_weights": {"type": "array", "items": STR},
            "nodes_with_weights": INT})}}),
    "Activation": _obj({"model": STR, "state": STR, "reason": _nullable(STR)}),
    "KeyCreated": _obj({"name": STR, "key": STR}),
    "Keys": _obj({"keys": {"type": "array", "items": _obj({"name": STR, "created": NUM})}}),
}


def _op(summary: str, ok: str | None, status: str = "200", auth: str | None = "admin",
        body: str | None = None) -> dict[str, Any]:
    responses: dict[str, Any] = {
        "default": {"description": "error",
                    "content": {"application/json": {"schema": _ref("Error")}}}}
    if ok is None:
        responses[status] = {"description": "done"}
    else:
        responses[status] = {"description": "ok",
                             "content": {"application/json": {"schema": _ref(ok)}}}
    op: dict[str, Any] = {"summary": summary, "responses": responses}
    if auth:
        op["security"] = [{auth: []}]
    if body:
        op["requestBody"] = {"required": True, "content": {
            "application/json": {"schema": {"type": "object", "description": body}}}}
    return op


def _list(key: str, item: str) -> dict[str, Any]:
    return _obj({key: {"type": "array", "items": _ref(item)}})


SCHEMAS["ModelList"] = _list("models", "Model")
SCHEMAS["NodeList"] = _list("nodes", "Node")
SCHEMAS["ReplicaList"] = _list("replicas", "Replica")
SCHEMAS["EventList"] = _list("events", "Event")

PATHS: dict[str, Any] = {
    "/healthz": {"get": _op("liveness and the current leader", "Health", auth=None)},
    "/api/v1/agent/join": {"post": _op("a node joins with the join token", "JoinAnswer",
                                       auth="join", body="{node}")},
    "/api/v1/agent/report": {"post": _op("a node reports; the answer is its assignments",
                                         "ReportAnswer", auth="node",
                                         body="node, address, devices, engines, replicas")},
    "/api/v1/routes": {"get": _op("what routers route", "Routes", auth="router")},
    "/api/v1/idle": {"post": _op("last use per replica", None, "204", auth="router",
                                 body="{replicas: {id: unix time}}")},
    "/api/v1/activate": {"post": _op("someone wants this model now", "Activation",
                                     auth="router", body="{model}")},
    "/api/v1/catalog": {"put": _op("apply a catalog (YAML or JSON)", "CatalogResult",
                                   body="{models: [...]}")},
    "/api/v1/models": {"get": _op("every model with its state", "ModelList")},
    "/api/v1/models/{name}": {"get": _op("one model", "Model"),
                              "delete": _op("remove a model", None)},
    "/api/v1/models/{name}/retry": {"post": _op("unpark a model", None)},
    "/api/v1/nodes": {"get": _op("nodes and their devices", "NodeList")},
    "/api/v1/status": {"get": _op("the fleet summary behind every status view", "Status")},
    "/api/v1/plan": {"get": _op("what placement would do now (a dry run)", "Plan")},
    "/api/v1/replicas": {"get": _op("replicas", "ReplicaList")},
    "/api/v1/events": {"get": _op("recent events, newest first", "EventList")},
    "/api/v1/keys": {"get": _op("router API keys (names only)", "Keys"),
                     "post": _op("create a router API key, shown once", "KeyCreated", "201",
                                 body="{name}")},
    "/metrics": {"get": {
        "summary": "Prometheus metrics (text exposition format); open unless "
                   "LLMGW_METRICS_TOKEN is set",
        "security": [{}, {"metrics": []}],
        "responses": {
            "200": {"description": "ok", "content": {"text/plain": {"schema": STR}}},
            "default": {"description": "error",
                        "content": {"application/json": {"schema": _ref("Error")}}}}}},
}


def document() -> dict[str, Any]:
    bearer = {"type": "http", "scheme": "bearer"}
    return {
        "openapi": "3.1.0",
        "info": {"title": "llmgw control service", "version": __version__},
        "paths": PATHS,
        "components": {"schemas": SCHEMAS,
                       "securitySchemes": {k: bearer for k in ("admin", "join", "node",
                                                               "router", "metrics")}},
    }
