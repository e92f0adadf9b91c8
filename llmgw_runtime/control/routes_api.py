"""Router API: the routes table, the idle map, activation and unreachable replicas."""

from __future__ import annotations

import json
from collections import defaultdict
from typing import Any

from flask import Blueprint, current_app, jsonify, request

from ..api.catalog import ROUTE_FIELDS
from ..api.fields import clean
from ..api.parse import parse_json
from ..api.router import ActivateRequest, IdleMap, Unreachable
from ..api.states import ReplicaState
from ..engines.slots import slots_of
from ..store import accounts, repo
from ..store.models import row_to_spec
from . import capacity, fleet
from .identity import url_host
from .states import model_state, start_streak
from .web import fleet_settings, now_of, require, store

bp = Blueprint("routes", __name__, url_prefix="/api/v1")


@bp.get("/routes")
@require("router", "admin")
def routes() -> Any:
    backoff = current_app.config["LLMGW"].backoff
    with store().begin() as conn:
        now = now_of(conn)
        models = repo.list_models(conn)
        nodes = {n.name: n for n in repo.list_nodes(conn)}
        replicas = repo.list_replicas(conn)
        keys = accounts.accounts_of_kind(conn, "api_key")
    by_model: dict[str, list[Any]] = defaultdict(list)
    for rep in replicas:
        by_model[rep.model].append(rep)
    out = []
    for model in models:
        reps = by_model.get(model.name, [])
        state = model_state(model, reps, now)
        endpoints = []
        spec = row_to_spec(model)
        slots = slots_of(spec)
        for rep in reps:
            node = nodes.get(rep.node)
            if rep.desired and rep.state == ReplicaState.READY and rep.port and node \
                    and node.address:
                endpoints.append({"replica_id": rep.id,
                                  "url": f"http://{url_host(node.address)}:{rep.port}",
                                  "slots": slots})
        reason = state.reason
        if not endpoints and state.state not in ("parked", "unplaceable"):
            # Say why a model with replicas running is not routed: a router could not reach
            # them, and their agents have not reported since.
            unreachable = [r for r in reps
                           if r.desired and r.state == ReplicaState.UNREACHABLE]
            if unreachable:
                reason = (f"replica {unreachable[0].id} on {unreachable[0].node}: "
                          f"{unreachable[0].last_error}; waiting for its agent's next report")
        out.append({**spec.model_dump(mode="json", include=set(ROUTE_FIELDS)),
                    "state": state.state, "reason": clean(reason), "endpoints": endpoints,
                    "engine": spec.engine, **clean(start_streak(model, now, backoff))})
    return jsonify({"models": out, "api_key_hashes": [k.token_hash for k in keys],
                    "key_priorities": {k.token_hash: k.priority for k in keys
                                       if k.priority != "normal"},
                    "key_models": {k.token_hash: accounts.key_models(k) for k in keys
                                   if k.models is not None},
                    "key_expires_in_s": {k.token_hash: k.expires_at - now for k in keys
                                         if k.expires_at is not None},
                    "key_limits": {k.token_hash: {"name": k.name.removeprefix("key:"),
                                                  "rpm": k.rpm, "tpm": k.tpm}
                                   for k in keys if k.rpm is not None or k.tpm is not None}})


@bp.post("/idle")
@require("router")
def idle() -> Any:
    body = parse_json(IdleMap, request.get_data(cache=True), what="idle map")
    idle_s = body.replicas

    def write(conn: Any) -> None:      # idempotent (newest time wins): retried on failover
        # Routers send seconds since last use; the store's clock makes them times, so a
        # router host's clock never decides idleness.
        now = now_of(conn)
        known = {r.id: r for r in repo.list_replicas(conn)}
        for replica_id, ago in idle_s.items():
            when = now - ago
            row = known.get(replica_id)
            # Several routers post maps: keep the newest time seen.
            if row is not None and (row.last_used is None or when > row.last_used):
                repo.update_replica(conn, replica_id, last_used=float(when))
        # Each model's load joins its router's posts (control/capacity.py: what autoscaling
        # reads); one at capacity is merged into the window of such reports too. A retry
        # after a failover may count one post's refusals twice: a display figure, and
        # one more reason to scale up.
        rows = repo.models_named(conn, set(body.capacity))
        for name, report in body.capacity.items():
            row = rows.get(name)
            if row is None:
                continue
            values: dict[str, Any] = {"load": json.dumps(capacity.record_load(
                json.loads(row.load) if row.load else None, body.router, report, now))}
            if report.at_capacity:
                stored = json.loads(row.capacity) if row.capacity else None
                values.update(capacity_at=now,
                              capacity=json.dumps(capacity.merge(stored, report, now)))
            repo.update_model(conn, name, **values)
    store().write(write)
    return "", 204


@bp.post("/unreachable")
@require("router")
def unreachable() -> Any:
    """A router could not connect to a replica: it is no longer routed (routes list only
    ready replicas) until a report of its agent, received after this mark, says ready."""
    body = parse_json(Unreachable, request.get_data(cache=True), what="unreachable report")

    def write(conn: Any) -> None:      # idempotent: only a ready replica is marked
        now = now_of(conn)
        row = repo.mark_unreachable(conn, body.replica_id, now,
                                    f"a router could not connect to it: {body.reason}")
        if row is not None:
            repo.add_event(conn, now, "unreachable", row.model,
                           f"replica {row.id} on {row.node} is unreachable from a router "
                           f"({body.reason}); not routed until its agent reports it ready "
                           "again")
    store().write(write)
    return "", 204


@bp.post("/activate")
@require("router", "admin")
def activate() -> Any:
    name = parse_json(ActivateRequest, request.get_data(cache=True),
                      what="activation request").model
    with store().begin() as conn:
        state, reason, streak = fleet.activate(conn, name, now_of(conn), fleet_settings())
    answer = state
    return jsonify({"model": name, "state": answer, "reason": clean(reason),
                    **clean(streak)})
