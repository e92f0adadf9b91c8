"""The router's OpenAPI 3.1 document, served at ``GET /openapi.json``: generated from the
messages in ``llmgw_runtime/api`` (``api.openapi.router_document``)."""

from __future__ import annotations

from typing import Any

from ..api.openapi import router_document


def openapi_document(version: str) -> dict[str, Any]:
    return router_document(version)
