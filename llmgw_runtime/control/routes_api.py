"""Router API: the routes table, the idle map, activation and unreachable replicas."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, current_app, jsonify, request

from ..api.parse import parse_json
from ..api.router import ActivateRequest, IdleMap, Unreachable
from ..store import routers
from . import fleet
from .web import fleet_settings, now_of, require, store

bp = Blueprint("routes", __name__, url_prefix="/api/v1")


@bp.get("/routes")
@require("router", "admin")
def routes() -> Any:
    backoff = current_app.config["LLMGW"].backoff
    with store().begin() as conn:
        table = fleet.routes(conn, now_of(conn), backoff)
    return jsonify(table.to_json())


@bp.post("/idle")
@require("router")
def idle() -> Any:
    body = parse_json(IdleMap, request.get_data(cache=True), what="idle map")

    def record(conn: Any) -> None:
        now = now_of(conn)
        fleet.record_idle(conn, body, now)
        if body.router is not None:     # whether it serves without keys (keys.py's note)
            routers.heard(conn, body.router, body.keys_optional, now)

    # Idempotent (the newest time wins): retried through a store failover.
    store().write(record)
    return "", 204


@bp.post("/unreachable")
@require("router")
def unreachable() -> Any:
    """A router could not connect to a replica: it is no longer routed (routes list only
    ready replicas) until a report of its agent, received after this mark, says ready."""
    body = parse_json(Unreachable, request.get_data(cache=True), what="unreachable report")
    # Idempotent (only a ready replica is marked): retried through a store failover.
    store().write(lambda conn: fleet.mark_unreachable(conn, body, now_of(conn)))
    return "", 204


@bp.post("/activate")
@require("router", "admin")
def activate() -> Any:
    name = parse_json(ActivateRequest, request.get_data(cache=True),
                      what="activation request").model
    with store().begin() as conn:
        answer = fleet.activate(conn, name, now_of(conn), fleet_settings())
    return jsonify(answer.to_json())
