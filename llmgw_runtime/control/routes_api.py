"""Router API: the routes table, the idle map and activation."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from flask import Blueprint, current_app, jsonify, request

from ..api.parse import parse_json
from ..api.router import ActivateRequest, IdleMap
from ..errors import NotFoundError
from ..placement import place
from ..store import repo
from . import snapshot
from .identity import url_host
from .states import model_state
from .web import clock, require, store

bp = Blueprint("routes", __name__, url_prefix="/api/v1")


@bp.get("/routes")
@require("router", "admin")
def routes() -> Any:
    now = clock()
    with store().begin() as conn:
        models = repo.list_models(conn)
        nodes = {n.name: n for n in repo.list_nodes(conn)}
        replicas = repo.list_replicas(conn)
        key_hashes = [a.token_hash for a in repo.accounts_of_kind(conn, "api_key")]
    by_model: dict[str, list[Any]] = defaultdict(list)
    for rep in replicas:
        by_model[rep.model].append(rep)
    out = []
    for model in models:
        reps = by_model.get(model.name, [])
        state = model_state(model, reps, now)
        endpoints = []
        for rep in reps:
            node = nodes.get(rep.node)
            if rep.desired and rep.state == "ready" and rep.port and node and node.address:
                endpoints.append({"replica_id": rep.id,
                                  "url": f"http://{url_host(node.address)}:{rep.port}"})
        out.append({"name": model.name, "state": state.state, "reason": state.reason,
                    "on_demand": bool(model.on_demand), "endpoints": endpoints})
    return jsonify({"models": out, "api_key_hashes": key_hashes})


@bp.post("/idle")
@require("router")
def idle() -> Any:
    last_used = parse_json(IdleMap, request.get_data(cache=True), what="idle map").replicas

    def write(conn: Any) -> None:      # idempotent (newest time wins): retried on failover
        known = {r.id: r for r in repo.list_replicas(conn)}
        for replica_id, when in last_used.items():
            row = known.get(replica_id)
            # Several routers post maps: keep the newest time seen.
            if row is not None and (row.last_used is None or when > row.last_used):
                repo.update_replica(conn, replica_id, last_used=float(when))
    store().write(write)
    return "", 204


@bp.post("/activate")
@require("router", "admin")
def activate() -> Any:
    name = parse_json(ActivateRequest, request.get_data(cache=True),
                      what="activation request").model
    config = current_app.config["LLMGW"]
    with store().begin() as conn:
        now = clock()
        model = repo.get_model(conn, name)
        if model is None:
            raise NotFoundError(f"model {name!r} is not in the catalog")
        # A fresh attempt: forget the last placement result, want the model now.
        repo.update_model(conn, name, placement_reason=None,
                          activated_at=now if model.on_demand else model.activated_at)
        models = repo.list_models(conn)
        replicas = repo.list_replicas(conn)
        nodes = repo.list_nodes(conn)
        live = [r for r in replicas if r.desired and r.state != "failed"]
        plan = place(snapshot.build(models, nodes, live, now, config.node_timeout_s,
                                    parts=repo.parts_by_replica(conn),
                                    replace_after_s=config.replace_after_s,
                                    backoff=config.backoff))
        reason = plan.unplaceable.get(name)
        if reason:
            repo.update_model(conn, name, placement_reason=reason)
        model = repo.get_model(conn, name)
        state = model_state(model, [r for r in replicas if r.model == name], now)
    if state.state in ("idle", "activating", "stopped") and not reason:
        answer = "starting"
    else:
        answer = state.state
    return jsonify({"model": name, "state": answer, "reason": state.reason})
