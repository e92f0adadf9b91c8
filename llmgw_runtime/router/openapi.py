"""The router's OpenAPI 3.1 document, served at ``GET /openapi.json``."""

from __future__ import annotations

from typing import Any

_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type", "code", "param"],
            "properties": {
                "message": {"type": "string", "description": "what is wrong and what to do"},
                "type": {"type": "string"},
                "code": {"type": "string", "enum": [
                    "invalid_json", "invalid_request", "invalid_api_key", "model_not_found",
                    "model_parked", "model_unplaceable", "model_not_ready", "upstream_error",
                    "not_found", "method_not_allowed", "http_error"]},
                "param": {"type": ["string", "null"]},
            },
        },
    },
}

_MODEL_LIST = {
    "type": "object",
    "required": ["object", "data"],
    "properties": {
        "object": {"const": "list"},
        "data": {"type": "array", "items": {
            "type": "object",
            "required": ["id", "object", "created", "owned_by"],
            "properties": {
                "id": {"type": "string"},
                "object": {"const": "model"},
                "created": {"type": "integer",
                            "description": "when this router first saw the model (Unix s)"},
                "owned_by": {"const": "llmgw"},
            },
        }},
    },
}

_HEALTHZ = {
    "type": "object",
    "required": ["status", "models"],
    "properties": {
        "status": {"type": "string", "enum": ["ok", "routes_unavailable"]},
        "models": {"type": "integer", "minimum": 0},
        "message": {"type": "string"},
    },
}

_PROXY_REQUEST = {
    "type": "object",
    "required": ["model"],
    "properties": {"model": {"type": "string"}, "stream": {"type": "boolean"}},
    "additionalProperties": True,
    "description": "an OpenAI request body; forwarded to the engine unchanged",
}


def _err(description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {
        "schema": {"$ref": "#/components/schemas/Error"}}}}


def _proxied(summary: str) -> dict[str, Any]:
    return {"post": {
        "summary": summary,
        "security": [{"apiKey": []}],
        "requestBody": {"required": True, "content": {"application/json": {
            "schema": {"$ref": "#/components/schemas/ProxyRequest"}}}},
        "responses": {
            "200": {"description": "the engine's answer; with `stream: true`, server-sent "
                                   "events passed through as they arrive, ending `data: [DONE]`",
                    "content": {"application/json": {"schema": {"type": "object"}},
                                "text/event-stream": {"schema": {"type": "string"}}}},
            "400": _err("invalid_json or invalid_request"),
            "401": _err("invalid_api_key"),
            "404": _err("model_not_found"),
            "502": _err("upstream_error: every tried replica failed before answering"),
            "503": _err("model_parked, model_unplaceable or model_not_ready"),
        },
    }}


def openapi_document(version: str) -> dict[str, Any]:
    return {
        "openapi": "3.1.0",
        "info": {"title": "llmgw router", "version": version,
                 "description": "OpenAI-compatible API in front of llmgw's engine replicas."},
        "paths": {
            "/v1/chat/completions": _proxied("Chat completion, proxied to a ready replica"),
            "/v1/completions": _proxied("Text completion, proxied to a ready replica"),
            "/v1/embeddings": _proxied("Embeddings, proxied to a ready replica"),
            "/v1/models": {"get": {
                "summary": "Every catalog model",
                "security": [{"apiKey": []}],
                "responses": {
                    "200": {"description": "the model list", "content": {"application/json": {
                        "schema": {"$ref": "#/components/schemas/ModelList"}}}},
                    "401": _err("invalid_api_key"),
                    "503": _err("model_not_ready: no routes table yet"),
                },
            }},
            "/healthz": {"get": {
                "summary": "Liveness and the number of routed models",
                "responses": {
                    "200": {"description": "ok", "content": {"application/json": {
                        "schema": {"$ref": "#/components/schemas/Healthz"}}}},
                    "503": {"description": "no routes table yet", "content": {
                        "application/json": {"schema": {"$ref": "#/components/schemas/Healthz"}}}},
                },
            }},
            "/metrics": {"get": {
                "summary": "Prometheus metrics (text exposition format), summed over the "
                           "router's workers; no API key",
                "responses": {"200": {"description": "the metrics", "content": {
                    "text/plain": {"schema": {"type": "string"}}}}},
            }},
            "/openapi.json": {"get": {
                "summary": "This document",
                "responses": {"200": {"description": "OpenAPI 3.1 document",
                                      "content": {"application/json": {
                                          "schema": {"type": "object"}}}}},
            }},
        },
        "components": {
            "schemas": {"Error": _ERROR, "ModelList": _MODEL_LIST, "Healthz": _HEALTHZ,
                        "ProxyRequest": _PROXY_REQUEST},
            "securitySchemes": {"apiKey": {"type": "http", "scheme": "bearer",
                                           "description": "an API key (sk-llmgw-...), "
                                                          "when the router requires keys"}},
        },
    }
