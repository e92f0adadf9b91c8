"""Admin API: model rollouts (``ctl rollout``) and node cordon and drain (``ctl nodes
cordon``/``uncordon``/``drain``). Admin token on every route; the rules are the control
core's (control/rollout_ops.py, drain_ops.py): these views only parse, call and answer.
docs/operations.md says what each does."""

from __future__ import annotations

from typing import Any

from flask import Blueprint, jsonify, request

from ..api.admin import DrainRequest
from ..api.parse import parse_json
from . import drain_ops, rollout_ops
from .web import by_whom, fleet_settings, now_of, require, store

bp = Blueprint("rollout", __name__, url_prefix="/api/v1")


@bp.get("/models/<path:name>/rollout")
@require("admin")
def rollout_status(name: str) -> Any:
    """Where the model's rollout stands: old and new replicas, what it waits for, the
    canary's requests per version (state none when every replica runs the definition)."""
    with store().begin() as conn:
        answer = rollout_ops.rollout_status(conn, name, now_of(conn), fleet_settings())
    return jsonify(answer.to_json())


@bp.post("/models/<path:name>/rollout/undo")
@require("admin")
def rollout_undo(name: str) -> Any:
    """Apply the model's previous definition again: its replicas roll back to it."""
    with store().begin() as conn:
        answer = rollout_ops.rollout_undo(conn, name, now_of(conn), by_whom())
    return jsonify(answer.to_json())


@bp.post("/models/<path:name>/rollout/promote")
@require("admin")
def rollout_promote(name: str) -> Any:
    """Promote the model's canary: the new definition replaces every old replica."""
    with store().begin() as conn:
        answer = rollout_ops.rollout_promote(conn, name, now_of(conn), by_whom())
    return jsonify(answer.to_json())


@bp.post("/nodes/<path:name>/cordon")
@require("admin")
def cordon(name: str) -> Any:
    """No new replica is placed on the node; what runs there keeps running."""
    with store().begin() as conn:
        answer = drain_ops.cordon(conn, name, now_of(conn), by_whom(), on=True)
    return jsonify(answer.to_json())


@bp.post("/nodes/<path:name>/uncordon")
@require("admin")
def uncordon(name: str) -> Any:
    """The node takes new replicas again (a drain in progress or done ends)."""
    with store().begin() as conn:
        answer = drain_ops.cordon(conn, name, now_of(conn), by_whom(), on=False)
    return jsonify(answer.to_json())


@bp.post("/nodes/<path:name>/drain")
@require("admin")
def drain(name: str) -> Any:
    """Cordon the node and move its replicas elsewhere, each replacement ready before the
    old one drains. Refused (409, naming the models that would lose capacity) where the
    fleet has no room for them, unless ``force``. An empty body is ``{}``."""
    body = request.get_data(cache=True)
    spec = (parse_json(DrainRequest, body, what="drain request") if body.strip()
            else DrainRequest())
    with store().begin() as conn:
        answer = drain_ops.drain_node(conn, name, now_of(conn), fleet_settings(),
                                      force=spec.force, by=by_whom())
    return jsonify(answer.to_json())


@bp.get("/nodes/<path:name>/drain")
@require("admin")
def drain_status(name: str) -> Any:
    """The node's drain: moved of total, what it waits for, done."""
    with store().begin() as conn:
        answer = drain_ops.node_drain_status(conn, name, now_of(conn), fleet_settings())
    return jsonify(answer.to_json())
